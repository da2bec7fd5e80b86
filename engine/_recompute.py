"""Activation recomputation (checkpointing): what each policy keeps for backward, what it brings
back while a layer recomputes, and the forward FLOPs it repeats.

Policies (codes of the `recompute` vocabulary): none; selective (the attention core is
recomputed, Korthikanti et al. 2022 Sec. 5; `selective` first resolves to the framework's own
selective mode, engine/_frameworks.py); full (only each block's input is kept, the block runs
forward again in backward); selective-op (per-op SAC as torchtitan's SelectiveAC: the outputs of
the attention kernel and of every other matmul are kept, the rest recomputed); selective-layer
(every N-th block checkpointed whole, the others keep everything).
"""

from __future__ import annotations

import numpy as np

from ._activations import SMALL_TENSOR_BYTES, attention_score_bytes_per_elem
from ._codes import (
    RECOMPUTE_FULL,
    RECOMPUTE_NONE,
    RECOMPUTE_SELECTIVE,
    RECOMPUTE_SELECTIVE_LAYER,
    RECOMPUTE_SELECTIVE_OP,
)
from ._model import ModelSpec


def attention_core_bytes(
    m: ModelSpec, *, T, s, e, tp, eager, amp=False, transformers=False
) -> np.ndarray:
    """Bytes of the attention core one layer saves: what selective recomputation drops.

    Flash: the attention output and the fp32 logsumexp [b, a, s]; eager adds what the
    materialised scores save per element, as the layer counts them
    (attention_score_bytes_per_elem: the softmax output and its 16-bit cast, or with attention
    dropout its mask and output; GPT-2's and BERT's softmax in the scores' own dtype without
    autocast), so that the core dropped is never more than the core saved.
    Source: Korthikanti et al. 2022 Sec. 5 (selective activation recomputation of the core
    attention); hf_attention_bytes for the tensors.
    """
    a_r = m.num_attention_heads / tp
    flash_core = e * T * m.o_dim / tp + 4.0 * a_r * T
    per_score = attention_score_bytes_per_elem(m, e, amp, transformers)
    eager_core = flash_core + per_score * a_r * s * T
    return np.where(eager, eager_core, flash_core)


def eager_softmax_backward_bytes(m: ModelSpec, *, T, s, tp, e, applies) -> np.ndarray:
    """Bytes a recomputed block of a transformers model with eager attention holds while its
    softmax backward runs, its checkpointed input apart: the q, k and v the score and context
    matmuls saved, the fp32 softmax output (saved by softmax), the fp32 gradient of the
    probabilities (the backward of their cast back to the compute dtype upcasts it; an fp32
    model's context matmul writes it in fp32 directly) and the softmax backward's fp32 output:
    12 bytes per score, whatever the compute dtype. The block's MLP has run its backward (its
    tensors are freed), the 16-bit probabilities went with the context matmul's backward. -inf
    where it does not apply (`applies`: eager, transformers' blocks, full recompute).

    Source: transformers modeling_llama.py eager_attention_forward (softmax(dtype=float32)
    .to(query.dtype); 4.31's LlamaAttention.forward the same ops); torch 2.13 autograd:
    _softmax saves its result, _softmax_backward_data writes a new fp32 tensor. Traced:
    tests/data/framework_traces/llama_recipes_fsdp1.json (Llama-2-7b dims, world 4, pure bf16,
    full and LoRA: three [4, 32, 2048, 2048] fp32 tensors at the backward peak).
    Ignores: repeat_kv's copies under GQA (k, v counted at kv_dim), a LoRA adapter's saved input.
    """
    a_r = m.num_attention_heads / tp
    q_k_v = e * T * (m.q_dim + 2.0 * m.kv_dim) / tp
    return np.where(applies, q_k_v + 12.0 * a_r * s * T, -np.inf)


def block_matmul_widths(m: ModelSpec, tp, *, fused_qkv: bool = False) -> list:
    """Output width (elements per token, per tensor-parallel rank) of each matmul of a dense
    block, in forward order: q, k, v (or one qkv: the model's own, or `fused_qkv` where the
    framework fuses them), o, gate, up (or fused gate_up / fc1), down. Row-parallel outputs
    (o, down) are full width (partial sums before their reduce)."""
    h, f = m.hidden_size, m.intermediate_size
    if m.fused_qkv or fused_qkv:
        attention = [(m.q_dim + 2 * m.kv_dim) / tp]
    else:
        attention = [m.q_dim / tp, m.kv_dim / tp, m.kv_dim / tp]
    gated_up = [2 * f / tp] if m.fused_gate_up else [f / tp, f / tp]
    return [*attention, h, *(gated_up if m.gated_mlp else [f / tp]), h]


def op_sac_saved_bytes(m: ModelSpec, *, T, s, e, r, tp, sp, eager, fused_qkv) -> np.ndarray:
    """Bytes one dense block keeps for backward under per-op selective checkpointing.

    Kept: the block's input (the checkpoint's argument, residual dtype); the output of every
    other matmul, counted per block from the first (q, v, gate, down in a Llama block; the
    others, the norms and pointwise ops are recomputed); the attention kernel's outputs (flash:
    the output, the fp32 logsumexp and the rng seed and offset; eager: both bmm outputs, the
    scores and the context); under sequence parallelism the two reduce-scatter outputs
    (communication is saved). `fused_qkv` (rows): the framework projects q, k, v at once.
    Source: torchtitan 0.3.0 torchtitan/distributed/activation_checkpoint.py (SelectiveAC: save
    ops = torch._functorch.partitioners default compute-intensive ops + SDPA + reduce_scatter;
    `meta[mm_count] % 2 == 0` recomputes every second mm; the count restarts per block).
    Ignores: MLA and MoE blocks (their unreduced formulas apply, an upper bound).
    """
    a_r = m.num_attention_heads / tp
    sp_div = np.where(sp, tp, 1.0)
    zero = np.zeros_like(np.asarray(T, dtype=np.float64))
    kept_width = np.where(
        fused_qkv,
        sum(block_matmul_widths(m, tp, fused_qkv=True)[0::2], zero),
        sum(block_matmul_widths(m, tp)[0::2], zero),
    )
    flash_kept = 4.0 * a_r * T + 2.0 * SMALL_TENSOR_BYTES
    attention_out = e * T * m.o_dim / tp + np.where(eager, e * a_r * s * T, flash_kept)
    reduce_scatter = np.where(sp, 2.0 * e * T * m.hidden_size / tp, 0.0)
    block_input = r * T * m.hidden_size / sp_div
    return block_input + e * T * kept_width + attention_out + reduce_scatter


def op_sac_down_kept(m: ModelSpec, *, fused_qkv) -> np.ndarray:
    """Whether per-op SAC keeps the down projection's output: it is the last matmul of the
    block, kept when its count in the block is odd (see op_sac_saved_bytes)."""
    own = len(block_matmul_widths(m, 1.0)) % 2 == 1
    fused = len(block_matmul_widths(m, 1.0, fused_qkv=True)) % 2 == 1
    return np.where(fused_qkv, fused, own)


def op_sac_top_block_bytes(m: ModelSpec, *, T, e, r, tp, sp, fused_qkv, top_saved) -> np.ndarray:
    """Bytes a dense top block holds at its busiest backward moment under per-op SAC, its
    `top_saved` bytes (op_sac_saved_bytes) included: what it kept, less the kept outputs no
    backward reads (the q/k/v projection's, rope and the kernel hold copies; the down
    projection's; the reduce-scatter outputs under sequence parallelism), plus what it
    recomputed and holds (the rope'd q, k, v; the two norm outputs the matmuls read, all-gathered
    under SP beside one local copy; the mid-block residual) and the incoming residual gradient;
    then the larger of two MLP moments: the down projection's backward (its recomputed inputs,
    act, up and their product, and under SP the all-gathered output gradient with its
    rearranged copy; the down output and its reduce-scatter's not yet freed) and the gated
    activation's (act, up, the product's gradient, and the
    gradients of act and up).
    Source: torchtitan 0.3.0 distributed/activation_checkpoint.py (SelectiveAC; torch 2.13
    torch/utils/checkpoint.py: the cached outputs move into the recomputed graph and are freed
    with the nodes that read them), models/llama3 (fused wqkv, rope copies, SequenceParallel
    norms); read off the traced debug and debug-tp4 cases
    (tests/data/framework_traces/torchtitan_trainer_defaults.json backward_snap: the tensors
    made in backward alive at the peak).
    Ignores: a non-gated MLP's exact moment (counted as its activation output, one and three
    [T, f] tensors); separate q/k/v projections whose v feeds the kernel without a copy."""
    h, f_r = m.hidden_size, m.intermediate_size / tp
    sp_div = np.where(sp, tp, 1.0)
    zero = np.zeros_like(np.asarray(T, dtype=np.float64))
    n_attn = 1 if m.fused_qkv else 3
    own = block_matmul_widths(m, tp)
    fused = block_matmul_widths(m, tp, fused_qkv=True)
    kept_attention = np.where(fused_qkv, sum(fused[0:1], zero), sum(own[0:n_attn:2], zero))
    down_kept = op_sac_down_kept(m, fused_qkv=fused_qkv)
    freed = e * T * (kept_attention + np.where(down_kept, h, 0.0)) + np.where(
        sp, 2.0 * e * T * h / tp, 0.0
    )
    qkv_copies = e * T * (m.q_dim + 2.0 * m.kv_dim) / tp
    norm_outputs = np.where(sp, 2.0 * e * T * h + e * T * h / tp, 2.0 * e * T * h)
    residuals = 2.0 * r * T * h / sp_div
    gated = m.gated_mlp
    # The down projection's output and its reduce-scatter's (SP) are freed only after its
    # backward: still held at the down moment (traced debug-tp4), gone by the activation's.
    down_still = e * T * np.where(down_kept, h, 0.0) + np.where(sp, e * T * h / tp, 0.0)
    down_moment = (
        (3.0 if gated else 1.0) * e * T * f_r + np.where(sp, 2.0 * e * T * h, 0.0) + down_still
    )
    act_moment = (5.0 if gated else 3.0) * e * T * f_r
    held = qkv_copies + norm_outputs + residuals + np.maximum(down_moment, act_moment)
    return top_saved - freed + held


def checkpointed_layers(policy, *, num_layers, every) -> np.ndarray:
    """Blocks of the stage that are checkpointed whole: all (full), every `every`-th
    (selective-layer: floor(L / every)), none otherwise.

    Source: torchtune 0.6.1 torchtune/training/activations.py checkpoint_wrapper (a running
    count; block number k is wrapped when k % every == 0); torchtitan <= 0.2 the same
    (`selective_ac_option` an integer).
    """
    layer_k = np.floor(num_layers / np.maximum(every, 1))
    return np.where(
        policy == RECOMPUTE_FULL,
        num_layers,
        np.where(policy == RECOMPUTE_SELECTIVE_LAYER, layer_k, 0.0),
    )


def saved_blocks_bytes(
    policy, *, blocks, core, checkpointed, num_layers, op_saved, num_checkpointed
) -> np.ndarray:
    """Bytes the stage's `num_layers` blocks keep for backward under `policy`: all of `blocks`
    (none), less each layer's attention `core` (selective), each layer's `checkpointed` input
    only (full), `op_saved` (selective-op, the stage's bytes), and under selective-layer the
    `num_checkpointed` blocks keep their input, the others everything."""
    per_block = blocks / np.maximum(num_layers, 1.0)
    layerwise = blocks - num_checkpointed * (per_block - checkpointed)
    return np.select(
        [
            policy == RECOMPUTE_FULL,
            policy == RECOMPUTE_SELECTIVE,
            policy == RECOMPUTE_SELECTIVE_OP,
            policy == RECOMPUTE_SELECTIVE_LAYER,
        ],
        [checkpointed * num_layers, blocks - core * num_layers, op_saved, layerwise],
        blocks,
    )


def recompute_excess_bytes(
    policy, *, multi, last, layer_recomputed, core, outside, rope, zero_col
) -> np.ndarray:
    """What a pipeline stage recomputing one layer in backward holds beyond what is stored, the
    loss tensors being freed by then: the excess over `outside` less the `rope` tables, if any.

    `layer_recomputed`: what one layer brings back (full and selective-layer: the framework's
    no-recompute layer; selective-op: the layer less what it kept); selective: the core.
    Assumes: one layer recomputes at a time, after the stage's loss tensors are freed.
    """
    return np.where(
        multi & (policy != RECOMPUTE_NONE),
        np.maximum(
            np.where(policy == RECOMPUTE_SELECTIVE, core, layer_recomputed)
            - np.where(last, outside - rope, zero_col),
            0.0,
        ),
        0.0,
    )


def single_stage_recompute_delta(
    policy, *, multi, layer_at_work, top_saved, outside, full_top=False
) -> np.ndarray:
    """Bytes a single stage under selective, selective-op or selective-layer holds while its top
    block recomputes and runs its backward, beyond what it stored at the end of forward: that
    block's working set `layer_at_work` (its recomputed activations and gradient temporaries,
    as layer 0's at the end of backward; under selective its recomputed attention core), less
    what it had kept (`top_saved`) and the tensors
    saved outside the blocks (the loss's, freed by the head's backward). May be negative; -inf
    where the moment does not apply (pipelines: recompute_excess_bytes).
    Full recompute where `full_top` (FrameworkSpec.full_recompute_top_moment): the second
    block from the top at work, the top block's input freed, every other block's checkpointed
    input held; its own input is the one `layer_at_work` keeps apart, so the stage holds
    (L - 1) inputs besides the working set: the same expression. Else (and before this
    reading) the end-of-backward moment in layer 0 stood for it, which holds only while the
    checkpointed inputs are small against the gradients (the tiny models).
    Source: torch.utils.checkpoint (non-reentrant): a block recomputes when its backward
    starts, the blocks below still holding their saved tensors; the traced torchtitan cases
    (tests/data/framework_traces/torchtitan_llama3_ac.json); full recompute: the real-size
    FSDP2 traces (tests/data/real_size_traces.json, 70B dims on 64 ranks).
    """
    partial = (
        (policy == RECOMPUTE_SELECTIVE)
        | (policy == RECOMPUTE_SELECTIVE_OP)
        | (policy == RECOMPUTE_SELECTIVE_LAYER)
        | ((policy == RECOMPUTE_FULL) & full_top)
    )
    return np.where(partial & ~multi, layer_at_work - top_saved - outside, -np.inf)


def op_sac_recomputed_matmul_fraction(m: ModelSpec) -> float:
    """Share of a dense block's matmul FLOPs that per-op SAC runs again (the even-numbered
    matmuls, see op_sac_saved_bytes); the attention kernel is not recomputed.
    Assumes: separate q, k, v projections (a fused one shifts the count by a few percent)."""
    widths = [float(w) for w in block_matmul_widths(m, 1.0)]
    h, f = m.hidden_size, m.intermediate_size
    inner = [h] * (len(widths) - 1) + [f]  # every matmul reads h features but down (f)
    flops = [w * k for w, k in zip(widths, inner, strict=True)]
    return sum(flops[1::2]) / sum(flops)


def recompute_flop_factors(m: ModelSpec, policy, *, num_layers, every) -> tuple:
    """(blocks, attention): the share of the blocks' forward FLOPs run again in backward and of
    the attention core's: full 1 and 1; selective 0 and 1; selective-op the recomputed matmuls'
    share and 0; selective-layer the checkpointed blocks' share for both."""
    layer_share = checkpointed_layers(
        np.where(policy == RECOMPUTE_SELECTIVE_LAYER, policy, RECOMPUTE_NONE),
        num_layers=num_layers,
        every=every,
    ) / np.maximum(num_layers, 1.0)
    blocks = np.select(
        [policy == RECOMPUTE_FULL, policy == RECOMPUTE_SELECTIVE_OP],
        [1.0, op_sac_recomputed_matmul_fraction(m)],
        layer_share,
    )
    attention = np.select(
        [(policy == RECOMPUTE_FULL) | (policy == RECOMPUTE_SELECTIVE)], [1.0], layer_share
    )
    return blocks.astype(np.float64), attention.astype(np.float64)
