"""Data parallelism with sharding: ZeRO-1/2/3 (DeepSpeed), FSDP2 (HF accelerate, torchtitan);
the element sizes the frameworks keep, their bucket and all-gather buffers, the gradient
reduction and parameter gathers of the step time.

Dim-0 sharding of each tensor is in engine/_states.py (`local_tensors`), which builds the
rank's inventory with `zero3_shard_numel`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ._codes import OFFLOAD_OPTIMIZER
from ._collectives import exposed_s, group_bandwidth, ring_time_s
from ._frameworks import (
    FSDP2_FRAMEWORKS,
    ZERO3_MODULE_COLLECTIVES,
    ZERO_BUCKET_BUFFERS,
    state_shard_degree,
)
from ._model import BLOCK_GROUPS, ModelSpec
from ._precision import GRAD_BYTES, IS_MIXED, MASTER_BYTES, PARAM_BYTES
from ._time_params import TimeParams

if TYPE_CHECKING:  # the step's shape and links (engine/_time.py imports this module)
    from ._time import Links, StepShape

ZERO_STATES, ZERO_GRADIENTS, ZERO_PARAMETERS = 1, 2, 3
"""The ZeRO stage from which optimizer states, gradients and parameters are sharded over the
data-parallel ranks. Source: Rajbhandari et al. 2020 (ZeRO), Sec. 5 (P_os, P_os+g, P_os+g+p)."""
DEEPSPEED_BUCKET_ELEMS_PER_H2 = 1.0
"""HF Trainer's DeepSpeed "auto" values: reduce_bucket_size = h*h, stage3_prefetch_bucket_size
= 0.9*h*h. Source: transformers/integrations/deepspeed.py (trainer_config_finalize)."""
DEEPSPEED_PREFETCH_ELEMS_PER_H2 = 0.9
"""stage3_prefetch_bucket_size = 0.9*h*h (same source as DEEPSPEED_BUCKET_ELEMS_PER_H2)."""


def zero3_shard_numel(numel, local_dim0, group_dp, shard) -> np.ndarray:
    """A tensor's elements on one rank when `shard`: its local dim 0 split over `group_dp`
    ranks, padded up (rows of numel / local_dim0 elements each).

    Source: torch.distributed.fsdp.fully_shard (FSDP2: per-parameter dim-0 sharding, padded).
    """
    per_row = numel / local_dim0
    return np.where(shard, np.ceil(local_dim0 / group_dp) * per_row, numel)


def is_fsdp2(fw, zero) -> np.ndarray:
    """Rows sharded by FSDP2 (FrameworkSpec.fsdp2: HF accelerate, torchtitan, torchtune) rather
    than DeepSpeed or Megatron."""
    return FSDP2_FRAMEWORKS[np.asarray(fw, dtype=np.int64)] & (zero == ZERO_PARAMETERS)


def gradient_element_bytes(prec, *, fsdp2, main_grad_buffer) -> np.ndarray:
    """Gradient bytes per element: the precision's, fp32 under mixed precision where FSDP2
    (fp32 reduced gradients) or Megatron (an fp32 main-grad buffer) keeps them so.

    Source: torch.distributed.fsdp.fully_shard MixedPrecisionPolicy (gradients land in the
    fp32 sharded parameters' .grad); megatron/core/distributed/param_and_grad_buffer.py (fp32
    `main_grad` buffers).
    """
    return np.where(IS_MIXED[prec] & (fsdp2 | main_grad_buffer), 4.0, GRAD_BYTES[prec])


def model_state_element_bytes(prec, *, fsdp2, main_grad_buffer) -> tuple[np.ndarray, ...]:
    """(parameter, master, gradient) bytes per element as the framework keeps them.

    FSDP2 mixed precision keeps fp32 sharded parameters (they are the master copy) and fp32
    reduced gradients; Megatron keeps an fp32 main-grad buffer.
    Source: torch.distributed.fsdp.fully_shard MixedPrecisionPolicy (param_dtype casts the fp32
    sharded parameter per all-gather); gradient_element_bytes.
    """
    mixed = IS_MIXED[prec]
    param_e = np.where(mixed & fsdp2, 4.0, PARAM_BYTES[prec])
    master_e = np.where(fsdp2, 0.0, MASTER_BYTES[prec])
    return (
        param_e,
        master_e,
        gradient_element_bytes(prec, fsdp2=fsdp2, main_grad_buffer=main_grad_buffer),
    )


def unsharded_accumulated_gradient_bytes(
    *, active, trainable_numel, element_bytes, gradient_bytes
) -> np.ndarray:
    """Bytes a rank's gradients take beyond `gradient_bytes` (its sharded gradients) while FSDP
    accumulates unsharded gradients over micro-batches (FrameworkSpec.fsdp_accumulates_unsharded;
    `active`: such rows with more than one micro-batch per step): the unsharded gradient of each
    of its `trainable_numel` trainable elements (its tensor / pipeline slice, whole over data
    parallelism), in the dtype the parameters are gathered in (`element_bytes`), alive from the
    first accumulating backward to the last micro-batch's reduce-scatter, so in the forward and
    backward of every micro-batch after the first. At the optimizer step only the shards are
    left.
    Source: torch 2.13 distributed/fsdp/_runtime_utils.py _post_backward_hook (FSDP1: `if not
    state._sync_gradients: return` before the reduce-scatter, the unsharded flat_param.grad
    kept); _fully_shard/_fsdp_param_group.py post_backward (FSDP2: without reduce_grads the
    unsharded grad is kept; to_accumulated_grad_if_needed upcasts it only where reduce_dtype
    differs, which accelerate's policy does not: reduce_dtype = param_dtype). Traced:
    tests/data/framework_traces/fsdp1_llama.json cases D and E (the forward peak of the
    synchronising micro-step is case A's plus the whole unsharded bf16 gradient).
    Ignores: the last micro-batch's reduce-scatters freeing unsharded gradients unit by unit
    while the shards are written (the peak is the moment before)."""
    unsharded = element_bytes * np.asarray(trainable_numel, dtype=np.float64)
    return np.where(active, np.maximum(unsharded - gradient_bytes, 0.0), 0.0)


def fp32_gradient_partition_bytes(
    state_numel, *, mixed, fsdp2, main_grad_buffer, lora
) -> np.ndarray:
    """The fp32 gradient partition the optimizer steps on, outside FSDP2 and Megatron.

    Source: DeepSpeed BF16_Optimizer / ZeRO `single_partition_of_fp32_groups` grads.
    """
    return np.where(mixed & ~fsdp2 & ~main_grad_buffer & ~lora, 4.0 * state_numel, 0.0)


def deepspeed_buffer_bytes(
    m: ModelSpec,
    *,
    fw,
    zero,
    dp,
    layer_numel,
    offload=0,
    bucket_elems=0.0,
    overlap_off=False,
) -> np.ndarray:
    """DeepSpeed ZeRO's 16-bit bucket buffers (FrameworkSpec.zero_bucket_buffers): the reduce
    buckets of `bucket_elems` elements each (reduce_bucket_size; 0: the HF Trainer's "auto",
    DEEPSPEED_BUCKET_ELEMS_PER_H2 * h^2), two of them (ZeRO 1-2 with overlap_comm: a second
    buffer; ZeRO-3: the bucket and its flattened reduce-scatter input) or one (ZeRO 1-2 with
    `overlap_off`); under ZeRO-3 also the prefetch bucket and one gathered block. With more
    than one rank, or on one rank with an offloaded optimizer (ZeRO-Offload reduces through
    the same buckets on a single GPU).

    Source: deepspeed 0.19.8 runtime/zero/stage_1_and_2.py setup_buckets (buf_0 of
    reduce_bucket_size elements, buf_1 only with overlap_comm), zero/stage3.py (the IPG bucket's
    buffer of reduce_bucket_size elements per communication dtype); DEEPSPEED_BUCKET_ELEMS_PER_H2
    (HF Trainer's "auto" bucket sizes).
    Ignores: a non-"auto" stage3_prefetch_bucket_size (the Trainer's 0.9 h^2 is used).
    """
    h2 = float(m.hidden_size) ** 2
    fw = np.asarray(fw, dtype=np.int64)
    bucket = np.where(
        np.asarray(bucket_elems) > 0, bucket_elems, DEEPSPEED_BUCKET_ELEMS_PER_H2 * h2
    )
    buffers = np.where((zero < ZERO_PARAMETERS) & np.asarray(overlap_off, dtype=bool), 1.0, 2.0)
    return np.where(
        ZERO_BUCKET_BUFFERS[fw]
        & (zero >= ZERO_STATES)
        & ((dp > 1) | (offload >= OFFLOAD_OPTIMIZER)),
        buffers * bucket * 2.0
        + np.where(
            zero >= ZERO_PARAMETERS,
            DEEPSPEED_PREFETCH_ELEMS_PER_H2 * h2 * 2.0 + 2.0 * layer_numel,
            0.0,
        ),
        0.0,
    )


def fsdp2_buffer_bytes(
    *,
    active,
    root_numel,
    layer_numel,
    root_grad_numel=None,
    layers_in_flight=1.0,
    element_bytes=2.0,
    reduce_bytes=4.0,
) -> tuple[np.ndarray, np.ndarray]:
    """(forward, end of backward) bytes of FSDP2's unsharded buffers, gathered in
    `element_bytes` per element (16-bit under mixed precision).

    Forward: the root's unsharded copy (`root_numel`: what stays unsharded from forward to the
    end of backward) and `layers_in_flight` blocks' all-gather outputs. End of backward (in
    the blocks' backward): two layers unsharded (current + prefetch), the reduce-scatter input
    of one layer (in `reduce_bytes`: fp32 under mixed precision's reduce_dtype, else the
    parameters' dtype), and the root's unsharded gradients that exist by then
    (`root_grad_numel`, default all of the root: the head's and final norm's, not an untied
    embedding's, whose backward comes after every block's).
    Source: torch.distributed.fsdp.fully_shard (FSDP2: reshard_after_forward, prefetching of
    the next block's all-gather; _fsdp_param_group.py post_backward keeps one reduce-scatter
    input in flight); the traced torchtitan 8B steps (no block gathered at the loss); the
    conformance matrix (HF Mixtral at 64 ranks: the layers' buffers, the root's parameters and
    the head's gradient at the backward peak, not the embedding's).
    """
    e = element_bytes
    root_grad_numel = root_numel if root_grad_numel is None else root_grad_numel
    fwd = np.where(active, e * root_numel + e * layers_in_flight * layer_numel, 0.0)
    bwd = np.where(
        active,
        e * (root_numel + root_grad_numel) + 2.0 * e * layer_numel + reduce_bytes * layer_numel,
        0.0,
    )
    return fwd, bwd


def fsdp2_block_gradient_bytes(*, active, mlp_numel, mlp_mats, element_bytes=2.0) -> np.ndarray:
    """Bytes of a block's unsharded parameter gradients alive in its MLP backward under FSDP2:
    autograd writes each weight's gradient on the unsharded (all-gathered) parameter, in its
    dtype (MixedPrecisionPolicy's param_dtype under mixed precision), and FSDP2 reduce-scatters
    them only in the block's post-backward; in the MLP's backward the down projection's and,
    of a gated MLP, one of gate/up's are done (`mlp_mats` - 1 of `mlp_mats` matrices of the
    block's `mlp_numel` gathered elements).
    Source: torch 2.13 torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py
    (post_backward: unsharded_accumulated_grad / unsharded_param.grad, then foreach_reduce);
    _fsdp_collectives.py foreach_reduce (the reduce-scatter input made from those gradients);
    traced: tests/data/real_size_traces.json (70B dims: the [8192, 28672] down and one
    [28672, 8192] gradient in bf16 at the blocks' backward peak).
    Ignores: the attention projections' gradients (written after the MLP's, in the same
    block's backward, when the MLP's working set is freed).
    """
    return np.where(active, element_bytes * mlp_numel * (mlp_mats - 1.0) / mlp_mats, 0.0)


def modules_per_layer(m: ModelSpec) -> int:
    """Parameter-holding modules in one block (a Linear or a norm, weight and bias together)."""
    return len({p.name.rsplit(".", 1)[0] for p in m.param_tensors() if p.group in BLOCK_GROUPS})


class StateTraffic(NamedTuple):
    """What one rank's model states put on the data-parallel links per step: its ZeRO stage,
    its parameters (all, trainable) on this tp x pp rank, their gradient and 16-bit bytes per
    element, and the dp x cp group with its ring bandwidth."""

    zero: np.ndarray
    local: np.ndarray
    local_trainable: np.ndarray
    dp_group: np.ndarray
    dp_bw: np.ndarray
    grad_bytes: np.ndarray
    param_bytes: np.ndarray


def dp_exposed_s(traffic: StateTraffic, *, last_backward, params: TimeParams) -> np.ndarray:
    """Exposed time of DDP / ZeRO-1/2: the gradient all-reduce (reduce-scatter under ZeRO)
    behind `dp_overlap_fraction` of the last micro-batch's backward, and ZeRO-1/2's all-gather
    of the updated weights after the step; 0 under ZeRO-3 (see fsdp_exposed_s).

    Source: Li et al. 2020 (PyTorch Distributed, VLDB) Sec. 3.2.3; ring_time_s.
    """
    zero, local, local_trainable, dp_group, dp_bw, grad_bytes, param_bytes = traffic
    reduce_s = ring_time_s(
        local_trainable * grad_bytes, dp_group, dp_bw, all_reduce=zero < ZERO_STATES, params=params
    )
    gather_s = ring_time_s(local * param_bytes, dp_group, dp_bw, all_reduce=False, params=params)
    exposed = exposed_s(reduce_s, params.dp_overlap_fraction * last_backward, params) + np.where(
        zero >= ZERO_STATES, gather_s, 0.0
    )
    return np.where(zero < ZERO_PARAMETERS, exposed, 0.0)


class HsdpGroups(NamedTuple):
    """Hybrid sharding's groups per row: `on` where dp_shard > 0 leaves more than one replica;
    `shard` ranks (dp_shard x cp, contiguous after tp) hold one copy of the states between
    them, `replicas` such groups hold it again (state_shard_degree)."""

    on: np.ndarray
    shard: np.ndarray
    replicas: np.ndarray


def hsdp_groups(x: StepShape, dp_group) -> HsdpGroups:
    """The HSDP groups of rows `x` whose full data-parallel group (dp x cp) is `dp_group`."""
    dp_shard = np.asarray(x.columns["dp_shard"], dtype=np.float64)
    shard = state_shard_degree(x.d, x.c, dp_shard)
    replicas = np.asarray(dp_group, dtype=np.float64) / shard
    return HsdpGroups(on=(dp_shard > 0) & (replicas > 1), shard=shard, replicas=replicas)


def hsdp_replica_all_reduce_s(
    hsdp: HsdpGroups, grad_bytes, *, t, links: Links, params: TimeParams, num_calls
) -> np.ndarray:
    """HSDP's second gradient collective: after the reduce-scatter inside its shard group, each
    rank all-reduces its gradient shard (`grad_bytes` / shard) with the same shard of the other
    replicas, ranks spaced t x shard apart (across nodes once a shard group fills a node).
    Source: torch 2.13 distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce
    (reduce_scatter on the shard mesh dim, then all_reduce on the replicate dim); torchtitan
    ParallelDims (dp_replicate x dp_shard). Ignores: gradient accumulation without the
    all-reduce on the micro-batches but the last (set_requires_all_reduce(False))."""
    gpn, intra, inter = links.network()
    bw = group_bandwidth(hsdp.replicas, t * hsdp.shard, gpn, intra, inter)
    reduce = ring_time_s(
        np.asarray(grad_bytes, dtype=np.float64) / hsdp.shard,
        hsdp.replicas,
        bw,
        all_reduce=True,
        params=params,
        num_calls=num_calls,
    )
    return np.where(hsdp.on, reduce, 0.0)


def fsdp_exposed_s(
    m: ModelSpec,
    x: StepShape,
    links: Links,
    traffic: StateTraffic,
    *,
    per_micro,
    fwd_share,
    params: TimeParams,
) -> np.ndarray:
    """Exposed time of ZeRO-3 / FSDP: each micro-batch gathers the weights forward and again
    backward and reduce-scatters the gradients, prefetched behind compute.

    FSDP one collective per block, DeepSpeed one per module and, fitted to Narayanan et al. 2021
    Table 2, at the per-GPU network share. Under HSDP (dp_shard > 0) the gathers and
    reduce-scatters run inside the shard group, at its links, and the gradient shards are
    all-reduced over the replicas (hsdp_replica_all_reduce_s). Source: Rajbhandari et al.
    2020 Sec. 7.2.2 (1.5x DDP's volume); TimeParams.fsdp_overlap_fraction.
    """
    zero, local, local_trainable, dp_group, dp_bw, grad_bytes, param_bytes = traffic
    fw, t, p, num_micro = x.fw, x.t, x.p, x.num_micro
    gpn, intra, inter = links.network()
    deepspeed = ZERO3_MODULE_COLLECTIVES[np.asarray(fw, dtype=np.int64)]
    calls = m.num_hidden_layers / p * np.where(deepspeed, float(modules_per_layer(m)), 1.0)
    hsdp = hsdp_groups(x, dp_group)
    any_hsdp = bool(np.any(hsdp.on))
    shard_bw = group_bandwidth(hsdp.shard, t, gpn, intra, inter) if any_hsdp else dp_bw
    bw3 = np.where(
        deepspeed, np.where(dp_group * t > gpn, inter, intra), np.where(hsdp.on, shard_bw, dp_bw)
    )
    group3 = np.where(hsdp.on, hsdp.shard, dp_group)
    gather3 = ring_time_s(
        local * param_bytes, group3, bw3, all_reduce=False, params=params, num_calls=calls
    )
    reduce3 = ring_time_s(
        local_trainable * grad_bytes,
        group3,
        bw3,
        all_reduce=False,
        params=params,
        num_calls=calls,
    )
    if any_hsdp:
        reduce3 = reduce3 + hsdp_replica_all_reduce_s(
            hsdp, local_trainable * grad_bytes, t=t, links=links, params=params, num_calls=calls
        )
    hideable = params.fsdp_overlap_fraction * fwd_share * per_micro
    fsdp_fwd = exposed_s(gather3, hideable, params)
    fsdp_bwd = exposed_s(
        gather3 + reduce3, params.fsdp_overlap_fraction * (1.0 - fwd_share) * per_micro, params
    )
    return np.where(zero == ZERO_PARAMETERS, (fsdp_fwd + fsdp_bwd) * num_micro, 0.0)
