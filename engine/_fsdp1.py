"""torch FSDP1 (FullyShardedDataParallel) where it differs from FSDP2 (fully_shard) in what a
rank holds: the stacks that run it (FrameworkSpec.fsdp1_full_finetune: LitGPT's full
fine-tune through Lightning's FSDPStrategy).

What FSDP1 shares with FSDP2, and the engine counts as FSDP2's (engine/_data_parallel.py
fsdp2_buffer_bytes, engine/_rank_states.py _fsdp2_buffers): sharded states (the flat
parameter's shard in the model's dtype, fp32 under MixedPrecision with fp32 parameters, its
gradient shard cast back to that dtype), the root unit (embedding, final norm and head: FSDP1
does not reshard the root after forward under FULL_SHARD) unsharded from forward to the end of
backward with the head's unsharded gradient, and two blocks unsharded in the blocks' backward
(the block at work and the one BACKWARD_PRE prefetches; limit_all_gathers' rate limiter lets
at most two all-gathers be in flight, _limiter_utils.py _FreeEventQueue(max 2)).

What differs, here: the blocks' forward gathers are freed as each block returns (no
forward_prefetch by default), and each block's unsharded flat gradient is reduce-scattered and
dropped in its own post-backward hook.

Ignores: FSDP1 pads each unit's flat parameter to a multiple of the world size, FSDP2 each
parameter's dim 0 (fewer than `world` elements a unit either way at the dims models use); on a
GPU, record_stream keeps a freed unsharded buffer from reuse until its stream's work is done
(what the caching allocator reserves, not what is allocated; the fake device runs the streams
in program order, tests/data/framework_traces/make_fsdp1_traces.py).
"""

from __future__ import annotations

import numpy as np


def fsdp1_forward_blocks_in_flight(fsdp1, fsdp2_blocks) -> np.ndarray:
    """Blocks whose all-gathered flat parameter is alive at the forward peak (the loss): none
    under FSDP1, whose post-forward reshard frees every non-root unit's unsharded flat
    parameter as the unit returns; else FSDP2's count (`fsdp2_blocks`).

    Source: torch 2.13 torch/distributed/fsdp/_runtime_utils.py _post_forward_reshard
    (free_unsharded_flat_param = not root and FULL_SHARD), _flat_param.py
    FlatParamHandle.reshard / _free_unsharded_flat_param; traced:
    tests/data/framework_traces/fsdp1_llama.json (no block's _full_param_padded at the
    forward peak).
    """
    return np.where(fsdp1, 0.0, fsdp2_blocks)


def fsdp1_reduce_scatter_input_element_bytes(fsdp1, fsdp2_reduce_bytes) -> np.ndarray:
    """Bytes per gathered element of the previous block's reduce-scatter input still held in a
    block's backward: 0 under FSDP1, whose post-backward hook takes the unsharded flat gradient
    (`flat_param.grad`, cast to reduce_dtype), reduce-scatters it into a new shard and drops
    it before the next block's backward; else FSDP2's (`fsdp2_reduce_bytes`, kept until the
    next reduce-scatter).

    Source: torch 2.13 torch/distributed/fsdp/_runtime_utils.py _post_backward_hook,
    _reduce_grad (unsharded_grad = flat_param.grad.data; flat_param.grad = None;
    reduce_scatter into new_sharded_grad), _get_reduce_scatter_tensors; traced:
    tests/data/framework_traces/fsdp1_llama.json (the backward peak one gathered block below
    FSDP2's, in the reduce dtype: bf16-true and fp32-reduced mixed precision).
    """
    return np.where(fsdp1, 0.0, fsdp2_reduce_bytes)


def fsdp1_backward_prefetch_bytes(active, *, layer_numel, element_bytes) -> np.ndarray:
    """Bytes of the block FSDP1 all-gathers ahead at the start of backward (the loss's
    backward, before any block's): the root's pre-backward hook prefetches the first block in
    backward order (the last block), with BACKWARD_PRE, torch's default backward_prefetch.
    `layer_numel` gathered elements in `element_bytes` (the all-gather dtype).

    Source: torch 2.13 torch/distributed/fsdp/_runtime_utils.py _pre_backward_hook
    (_prefetch_handle(state, handle, _PrefetchMode.BACKWARD)), _get_handle_to_prefetch
    (BACKWARD_PRE); traced: tests/data/framework_traces/fsdp1_llama.json (case B, no
    recompute: one block's _full_param_padded at the backward peak, in the loss's backward).
    """
    return np.where(active, element_bytes * layer_numel, 0.0)
