"""One row's peak assembly and layout rules as plain scalar functions: the single-configuration
path (engine/_scalar.py) runs them as Python, the compiled loop (engine/_kernel_numba.py)
compiles the very same functions with numba. Both follow numpy's blocks in engine/_estimate.py
(_phase_peaks, _assemble, _worst_rank, _device_columns, _block_reason) operation for operation,
in the same order, so all three agree to the bit (tests/unit/engine/test_kernel.py).

Only builtins and module-level ints here: numba freezes those into the compiled code.
"""

from __future__ import annotations

from ._codes import OFFLOAD_OPTIMIZER, OFFLOAD_PARAMS
from ._data_parallel import ZERO_PARAMETERS, ZERO_STATES
from ._estimate import _A_TERMS, _S_TERMS, DP_SHARD_LAYOUT, OPTIMIZER_IN_BACKWARD_LAYOUT

# Positions of the terms in a key's row of the per-key tables (_estimate._S_TERMS / _A_TERMS).
S_GRADIENTS = _S_TERMS.index("gradients")
S_GRADS_PERSISTENT = _S_TERMS.index("grads_persistent")
S_PERSISTENT = _S_TERMS.index("persistent")
S_FSDP_FWD = _S_TERMS.index("fsdp_fwd")
S_END_GRADS = _S_TERMS.index("end_grads")
S_TOP_GRADS = _S_TERMS.index("top_grads")
S_TIED_EMBEDDING_GRAD = _S_TERMS.index("tied_embedding_grad")
S_OPTIMIZER_PEAK = _S_TERMS.index("optimizer_peak")
S_STATES = _S_TERMS.index("states")
S_PARAMETERS = _S_TERMS.index("parameters")
S_MASTER_WEIGHTS = _S_TERMS.index("master_weights")
S_OPTIMIZER_STATES = _S_TERMS.index("optimizer_states")
S_ACCUM_END_GRADS = _S_TERMS.index("accum_end_grads")
A_STAGE_ACT = _A_TERMS.index("stage_act")
A_RECOMPUTE_EXCESS = _A_TERMS.index("recompute_excess")
A_AUTOCAST = _A_TERMS.index("activations_autocast_weight_copies")
A_PIPE_PER_MICRO = _A_TERMS.index("pipe_per_micro")
A_PIPE_FIXED = _A_TERMS.index("pipe_fixed")
A_FWD_MAX = _A_TERMS.index("fwd_max")
A_BWD_START_EXTRA = _A_TERMS.index("bwd_start_extra")
A_BWD_END_EXTRA = _A_TERMS.index("bwd_end_extra")
A_EMBED_EXTRA = _A_TERMS.index("embed_extra")
A_RECOMPUTE_EXTRA = _A_TERMS.index("recompute_extra")
A_SMALL = _A_TERMS.index("small")
A_LARGEST_BLOCK = _A_TERMS.index("largest_block")

STAGE_PEAKS = (
    "peak_forward_bytes",
    "peak_backward_bytes",
    "peak_optimizer_step_bytes",
    "peak_allocated_bytes",
    "gradients",
    "activations",
    "transient",
    "gradients_total",
    "activations_total",
    "in_flight",
    "peak_phase",
)
"""What stage_peaks returns, in order (gradients / activations: at the peak)."""
ALLOCATED = STAGE_PEAKS.index("peak_allocated_bytes")
GRADS_AT_PEAK = STAGE_PEAKS.index("gradients")


def maximum(a: float, b: float) -> float:
    """np.maximum of two floats: NaN where either is NaN."""
    if a != a:
        return a
    if b != b:
        return b
    return a if a >= b else b


def stage_peaks(s, a, pp: int, v: int, stage: int, num_micro: float) -> tuple:
    """_estimate._phase_peaks and _assemble of one row on one pipeline stage, from the row's
    state terms `s` and activation terms `a` (indexable by S_* / A_*): the STAGE_PEAKS."""
    multi = pp > 1
    if multi:
        interleave = 1.0 + (pp - 1.0) / float(pp * v) if v > 1 else 1.0
        in_flight = min(float(pp - stage), num_micro) * (interleave if stage == 0 else 1.0)
    else:
        in_flight = 1.0
    stored = in_flight * a[A_STAGE_ACT]
    activations = stored + a[A_RECOMPUTE_EXCESS] + a[A_AUTOCAST]
    gradients = s[S_GRADIENTS]
    grads_live = gradients if (num_micro > 1) or multi else s[S_GRADS_PERSISTENT]
    per_micro = num_micro * a[A_PIPE_PER_MICRO]
    pipe_fixed = a[A_PIPE_FIXED]
    base = s[S_PERSISTENT] + per_micro + pipe_fixed
    live = base + grads_live
    fsdp_fwd = s[S_FSDP_FWD]
    forward = live + stored + fsdp_fwd + a[A_FWD_MAX]
    live_acts = live + activations
    backward_start = live_acts + fsdp_fwd + a[A_BWD_START_EXTRA]
    accum = s[S_ACCUM_END_GRADS] if num_micro > 1 else 0.0
    backward_end = base + s[S_END_GRADS] + accum + stored + a[A_BWD_END_EXTRA]
    backward_embed = base + gradients + accum + a[A_EMBED_EXTRA] + s[S_TIED_EMBEDDING_GRAD]
    top_grads = 0.0 if multi else s[S_TOP_GRADS]
    backward_recompute = live_acts + a[A_RECOMPUTE_EXTRA] + top_grads
    backward = maximum(
        maximum(backward_start, backward_end), maximum(backward_embed, backward_recompute)
    )
    optimizer = s[S_OPTIMIZER_PEAK] + a[A_SMALL] + per_micro + pipe_fixed
    fb = maximum(forward, backward)
    in_optimizer = optimizer >= fb
    allocated = maximum(fb, optimizer)
    grads_at_peak = gradients if in_optimizer else grads_live
    acts_at_peak = 0.0 if in_optimizer else activations
    transient = allocated - s[S_STATES] - grads_at_peak - acts_at_peak
    # peak_phase: 2 in the optimizer step, else 1 where backward's peak is not below forward's
    # (a float, so that the tuple is homogeneous: the compiled loop indexes it)
    phase = 2.0 if in_optimizer else (1.0 if backward >= forward else 0.0)
    return (
        forward,
        backward,
        optimizer,
        allocated,
        grads_at_peak,
        acts_at_peak,
        transient,
        gradients,
        activations,
        in_flight,
        phase,
    )


def fragmentation(s, a, allocated: float, grads_at_peak: float, expandable: bool, consts) -> float:
    """_estimate._device_columns' allocator slack of one row (consts: cuBLAS workspace,
    fragmentation fraction native and expandable, largest-block factor)."""
    non_persistent = (
        allocated - s[S_PARAMETERS] - s[S_MASTER_WEIGHTS] - s[S_OPTIMIZER_STATES] - grads_at_peak
    )
    if expandable:
        return maximum(consts[2] * maximum(non_persistent, 0.0), 0.0)
    return maximum(consts[1] * maximum(non_persistent, 0.0), consts[3] * a[A_LARGEST_BLOCK])


def rule_numbers(m) -> tuple[int, int, int, int, int, int]:
    """The model's numbers reason_code reads (its `model`): attention heads, key/value heads,
    layers, MoE (0/1), experts, expert width (0 for a dense model). Not compiled: the callers
    pass the tuple."""
    return (
        m.num_attention_heads,
        m.num_key_value_heads,
        m.num_hidden_layers,
        int(bool(m.is_moe)),
        int(m.num_experts or 0),
        int(m.moe_intermediate_size or 0),
    )


def reason_code(
    micro: int,
    seq_len: int,
    num_gpus: int,
    global_batch: int,
    tp: int,
    pp: int,
    cp: int,
    virtual_stages: int,
    zero: int,
    dp_shard: int,
    ep: int,
    etp: int,
    capacity_factor_pct: int,
    lora_rank: int,
    offload: int,
    qlora: bool,
    optimizer_in_backward: bool,
    model,
) -> int:
    """_estimate._block_reason of one row of a model without a traced profile: the first rule
    broken (an index into REASONS), 0 for a valid layout. model: attention heads, key/value
    heads, layers, MoE (0/1), experts, expert width."""
    kv_heads = model[1]
    safe_tp = max(tp, 1)
    safe_par = max(tp * pp * cp, 1)
    dp = max(num_gpus // safe_par, 1)
    per_step = micro * dp
    if min(micro, seq_len, num_gpus, tp, pp, cp, virtual_stages) < 1:
        return 1
    if zero < 0 or zero > ZERO_PARAMETERS:
        return 2
    if num_gpus % safe_par != 0:
        return 3
    if model[0] % safe_tp != 0:
        return 4
    if kv_heads % safe_tp != 0 and safe_tp % max(kv_heads, 1) != 0:
        return 5
    if model[2] % max(pp * virtual_stages, 1) != 0:
        return 6
    if seq_len % max(cp, 1) != 0:
        return 7
    if global_batch > 0 and global_batch % max(per_step, 1) != 0:
        return 8
    if experts_broken(ep, etp, dp * cp, tp, capacity_factor_pct, model):
        return 9
    if (offload >= OFFLOAD_OPTIMIZER and zero < ZERO_STATES) or (
        offload == OFFLOAD_PARAMS and zero < ZERO_PARAMETERS
    ):
        return 10
    if qlora and lora_rank < 1:
        return 11
    if dp_shard > 0 and dp % max(dp_shard, 1) != 0:
        return DP_SHARD_LAYOUT
    accum = global_batch // max(per_step, 1) if global_batch > 0 else 1
    if optimizer_in_backward and (pp > 1 or accum > 1):
        return OPTIMIZER_IN_BACKWARD_LAYOUT
    return 0


def experts_broken(ep: int, etp: int, dp_cp: int, tp: int, capacity_factor_pct: int, model) -> bool:
    """The expert-parallel rule (REASONS[9]) broken: ep must divide the experts and dp x cp, etp
    the expert width, ep x etp the dp x cp x tp ranks (both 1 for a dense model)."""
    is_moe, experts, expert_width = model[3], model[4], model[5]
    return (
        ep < 1
        or (ep > 1 and (is_moe == 0 or experts % max(ep, 1) != 0))
        or dp_cp % max(ep, 1) != 0
        or etp < 1
        or (etp > 1 and (is_moe == 0 or expert_width % max(etp, 1) != 0))
        or (dp_cp * tp) % max(ep * etp, 1) != 0
        or capacity_factor_pct < 0
    )
