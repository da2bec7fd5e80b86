"""Step time and cost of every row of a grid. Columns in, columns out, like `estimate`.

One GPU's optimizer step takes

    step_time = compute_time + communication_exposed + bubble_time

compute: GEMM FLOPs at the dense peak times a work-size efficiency, the attention core, the
memory-bound kernels (norms, activation functions, residuals, eager softmax) at HBM bandwidth, and
the optimizer update. communication_exposed: what overlap leaves of the tensor-, context-,
pipeline- and expert-parallel traffic on the critical path, of the data-parallel gradient
reduction and ZeRO-3 parameter gathers, and of offload over PCIe. bubble: pipeline fill and
drain. Every constant is a `TimeParams` field with its source; `python -m bench.calibrate_time`
refits the fitted ones against published tables.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ._codes import FLASH, FP32, OFFLOAD_OPTIMIZER
from ._collectives import group_bandwidth
from ._context_parallel import cp_exposed_s
from ._data_parallel import (
    ZERO_STATES,
    StateTraffic,
    dp_exposed_s,
    fsdp_exposed_s,
    gradient_element_bytes,
    is_fsdp2,
)
from ._estimate import batch_layout, layout_reason
from ._expert_parallel import expert_exposed_s
from ._flops import block_linear_widths, matmul_parameters, mlp_width, model_flops_per_token
from ._frameworks import FP32_MAIN_GRAD_BUFFER, recompute_policy
from ._grid import Grid
from ._lora import lora_width, qlora_dequant_traffic_bytes_per_weight
from ._model import ModelSpec
from ._mx import CAST_BYTES_PER_ELEMENT
from ._offload import offload_time_s
from ._optimizers import optimizer_step_s
from ._pipeline import bubble_fraction as bubble_fraction  # re-exported (engine/__init__.py)
from ._pipeline import bubble_time_s, p2p_time_s
from ._precision import (
    COMPUTE_BYTES,
    IS_AMP,
    IS_FP4,
    IS_FP8,
    PARAM_BYTES,
    autocast_traffic_bytes_per_weight,
)
from ._recompute import recompute_flop_factors
from ._rl import RL_NONE, trainer_time_columns
from ._rl_time import RL_TIME_COLUMNS, rl_time_columns
from ._tensor_parallel import sequence_parallel_on, tp_exposed_s
from ._time_params import TimeParams

NF4_BYTES = 0.5
"""Bytes per element of an NF4 (4-bit) weight that ZeRO-3 gathers and offload streams."""

TIME_COLUMNS = (
    "step_time_s",
    "compute_time_s",
    "communication_exposed_s",
    "bubble_time_s",
    "tokens_per_second",
    "mfu",
    "cost_per_million_tokens",
)
"""The headline outputs of `estimate_time` (with `tokens` also time_to_train_s and
cost_to_train_usd)."""
EXPOSED_COLUMNS = (
    "tp_exposed_s",
    "cp_exposed_s",
    "pp_p2p_s",
    "dp_exposed_s",
    "fsdp_exposed_s",
    "offload_s",
    "expert_s",
)
"""The exposed communication of each parallelism, `estimate_time` columns in this order."""


def gemm_efficiency(work: np.ndarray, params: TimeParams) -> np.ndarray:
    """Achieved fraction of the dense peak for GEMMs of a per-GPU work size: e w / (w + w_half).

    work = tokens per micro-batch per GPU x hidden_size / tp. Source: TimeParams.gemm_*.
    """
    w = np.asarray(work, dtype=np.float64)
    return params.gemm_efficiency_max * w / (w + params.gemm_half_work)


def estimate_time(
    m: ModelSpec,
    g: Grid,
    *,
    peak_flops: float | np.ndarray,
    fp32_peak_flops: float | np.ndarray,
    hbm_bytes_per_s: float | np.ndarray,
    intra_node_bytes_per_s: float | np.ndarray,
    inter_node_bytes_per_s: float | np.ndarray,
    gpus_per_node: float | np.ndarray,
    pcie_bytes_per_s: float | np.ndarray,
    price_per_gpu_hour_usd: float | np.ndarray,
    fp8_peak_flops: float | np.ndarray = 0.0,
    fp4_peak_flops: float | np.ndarray = 0.0,
    tokens: float | np.ndarray | None = None,
    params: TimeParams | None = None,
    reason: np.ndarray | None = None,
    columns: Collection[str] | None = None,
) -> dict[str, np.ndarray]:
    """Step time, throughput, MFU and cost of every row of `g` for model `m`.

    GPU values are scalars or per-row arrays; `time_inputs(profile)` gives them for one profile.
    fp32 rows run at fp32_peak_flops, the others at peak_flops (dense 16-bit); fp8-mixed rows
    run their block GEMMs at fp8_peak_flops (where it is > 0) and the rest at peak_flops, and so
    do mxfp8 rows; nvfp4 rows run them at fp4_peak_flops (where it is > 0).
    Returns float64 columns, NaN where the layout is invalid: step_time_s = compute_time_s +
    communication_exposed_s + bubble_time_s; tokens_per_second (whole job: global batch tokens /
    step time) and tokens_per_second_per_gpu; mfu (model FLOPs / (step time x GPUs x peak)) and
    hfu (recomputation counted); cost_per_million_tokens (USD); the parts of compute
    (gemm_time_s, attention_time_s, memory_bound_time_s, optimizer_time_s) and of communication
    (tp_exposed_s, cp_exposed_s, pp_p2p_s, expert_s, dp_exposed_s, fsdp_exposed_s, offload_s: PCIe
    traffic and the host's optimizer update);
    model_flops_per_step, hardware_flops_per_step, achieved_flops_per_gpu; with `tokens`,
    time_to_train_s and cost_to_train_usd.

    Source: each helper and TimeParams. Assumes: equal pipeline stages (the LM head's work is
    spread over all of them), balanced MoE routing, no stragglers or data-loader stalls, one GPU
    type per row; activation offload is not timed.
    `reason`: layout_reason(m, g) when the caller has it already, or any code that is nonzero
    at least where it is (e.g. a sweep's own reasons added): rows with a nonzero code get NaN.
    `columns`: only these of the columns above (the same values).

    Only the valid rows are evaluated (every formula is elementwise, so each value is the same
    to the bit as in a whole-grid pass); a sweep's grid is mostly invalid layouts.
    """
    valid = (layout_reason(m, g) if reason is None else reason) == 0
    links = Links(
        peak_flops,
        fp32_peak_flops,
        hbm_bytes_per_s,
        intra_node_bytes_per_s,
        inter_node_bytes_per_s,
        gpus_per_node,
        pcie_bytes_per_s,
        price_per_gpu_hour_usd,
        fp8_peak_flops,
        fp4_peak_flops,
    )
    return _on_valid_rows(m, g, valid, links, tokens=tokens, params=params, columns=columns)


class Links(NamedTuple):
    """One GPU's rates and bandwidths, scalars or per row, as estimate_time takes them: what
    the step-time formulas read of the hardware (engine-owned; hardware/ fills it)."""

    peak_flops: Any
    fp32_peak_flops: Any
    hbm_bytes_per_s: Any
    intra_node_bytes_per_s: Any
    inter_node_bytes_per_s: Any
    gpus_per_node: Any
    pcie_bytes_per_s: Any
    price_per_gpu_hour_usd: Any
    fp8_peak_flops: Any = 0.0
    """Dense fp8 peak; 0: the GPU has none (fp8 rows then run at peak_flops)."""
    fp4_peak_flops: Any = 0.0
    """Dense fp4 peak (block-scaled); 0: the GPU has none (nvfp4 rows then run at peak_flops)."""

    def network(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(GPUs per node, intra-node and inter-node bytes/s), float64: a collective's links."""
        return tuple(  # type: ignore[return-value]
            np.asarray(v, dtype=np.float64)
            for v in (self.gpus_per_node, self.intra_node_bytes_per_s, self.inter_node_bytes_per_s)
        )

    def rows(self, rows: np.ndarray) -> Links:
        """The values of the rows `rows` (a scalar stays as it is)."""
        return Links(*(x if np.ndim(x) == 0 else np.asarray(x)[rows] for x in self))


def _on_valid_rows(
    m: ModelSpec,
    g: Grid,
    valid: np.ndarray,
    links: Links,
    *,
    tokens: float | np.ndarray | None,
    params: TimeParams | None,
    columns: Collection[str] | None,
) -> dict[str, np.ndarray]:
    """_time_columns of the `valid` rows (GPU values and tokens per row subset alike), NaN
    elsewhere."""
    num_rows = len(valid)
    every = bool(valid.all())
    if every:
        out = _time_columns(m, g, links, tokens=tokens, params=params)
    else:
        rows = np.flatnonzero(valid)
        if tokens is not None and np.ndim(tokens) != 0:
            tokens = np.asarray(tokens)[rows]
        sub = {k: x[rows] for k, x in g.items()}
        out = _time_columns(m, sub, links.rows(rows), tokens=tokens, params=params)
    if columns is not None:
        unknown = sorted(set(columns) - out.keys())
        if unknown:
            raise ValueError(f"columns: unknown {', '.join(unknown)}; allowed: {', '.join(out)}")
        out = {k: x for k, x in out.items() if k in columns}
    if every:
        return {k: np.array(x, dtype=np.float64) for k, x in out.items()}
    full: dict[str, np.ndarray] = {}
    for k, x in out.items():
        full[k] = np.full(num_rows, np.nan)
        full[k][rows] = x
    return full


@dataclass(frozen=True, slots=True)
class StepShape:
    """The symbols of one step, per row: s sequence, b micro-batch, t tp, p pp, c cp, v virtual
    stages, n GPUs, d dp; dp and micro-batches per step exactly as estimate() derives them."""

    s: np.ndarray
    b: np.ndarray
    t: np.ndarray
    p: np.ndarray
    c: np.ndarray
    v: np.ndarray
    n: np.ndarray
    d: np.ndarray
    ep: np.ndarray
    num_micro: np.ndarray
    prec: np.ndarray
    fw: np.ndarray
    zero: np.ndarray
    offload: np.ndarray
    eager: np.ndarray
    sp: np.ndarray
    lora: np.ndarray
    qlora: np.ndarray
    full: np.ndarray
    """Share of the blocks' forward run again in backward (1.0 under full recompute)."""
    rc_attention: np.ndarray
    """Share of the attention core run again (1.0 under full or selective)."""
    act_bytes: np.ndarray
    tokens_per_step: np.ndarray
    tokens_per_micro: np.ndarray
    """One GPU's tokens in one micro-batch."""
    tokens_per_gpu: np.ndarray
    """One tp x pp group's tokens per step."""
    columns: Grid
    """The rows' grid columns: a technique reads a field the symbols above do not name (a new
    knob) from the step, with no edit here."""


def step_shape(m: ModelSpec, g: Grid) -> StepShape:
    """The symbols of the rows of `g`, bound once."""
    s = g["seq_len"].astype(np.float64)
    b = g["micro_batch_size"].astype(np.float64)
    c = np.maximum(g["cp"], 1).astype(np.float64)
    dp, gbs, num_micro = batch_layout(g)
    d = dp.astype(np.float64)
    prec = g["precision"].astype(int)
    full, rc_attention = recompute_flop_factors(
        m,
        recompute_policy(g["framework"], g["recompute"]),
        num_layers=float(m.num_hidden_layers) / np.maximum(g["pp"], 1),
        every=g["recompute_every"],
    )
    lora = g["lora_rank"] > 0
    tokens_per_step = gbs.astype(np.float64) * s
    return StepShape(
        s=s,
        b=b,
        t=np.maximum(g["tp"], 1).astype(np.float64),
        p=np.maximum(g["pp"], 1).astype(np.float64),
        c=c,
        v=np.maximum(g["virtual_stages"], 1).astype(np.float64),
        n=g["num_gpus"].astype(np.float64),
        d=d,
        ep=g["ep"],
        num_micro=num_micro,
        prec=prec,
        fw=g["framework"].astype(int),
        zero=g["zero"],
        offload=g["offload"].astype(int),
        eager=g["attention"].astype(int) != FLASH,
        sp=sequence_parallel_on(g["sequence_parallel"], g["tp"], g["framework"]),
        lora=lora,
        qlora=g["qlora"] & lora,
        full=full,
        rc_attention=rc_attention,
        act_bytes=COMPUTE_BYTES[prec],
        tokens_per_step=tokens_per_step,
        tokens_per_micro=b * s / c,
        tokens_per_gpu=tokens_per_step / (d * c),
        columns=g,
    )


def _memory_bound_s(m: ModelSpec, x: StepShape, gemm_weights: float, hbm, pr: TimeParams):
    """Memory-bound kernels of one step at HBM bandwidth: forward 1, backward 2, recomputed
    forward 1; per micro-batch weight traffic (autocast's casts, QLoRA's dequantisation).

    Under autocast the residual stream and norms stay fp32 (the embedding is fp32); the MLP's
    activations are matmul outputs, in 16 bits. Source: TimeParams.pointwise_bytes_per_width,
    eager_attention_bytes_per_score; autocast_traffic_bytes_per_weight,
    qlora_dequant_traffic_bytes_per_weight.
    """
    L, h, a, s, t, p = m.num_hidden_layers, m.hidden_size, m.num_attention_heads, x.s, x.t, x.p
    act_bytes, full, amp = x.act_bytes, x.full, IS_AMP[x.prec]
    residual_bytes = np.where(amp, 4.0, act_bytes)
    pointwise = pr.pointwise_bytes_per_width * (
        residual_bytes / 2.0 * L * h / np.where(x.sp, t, 1.0) + act_bytes / 2.0 * mlp_width(m) / t
    )
    scores = np.where(x.eager, pr.eager_attention_bytes_per_score * L * a * s / t, 0.0)
    token_bytes = pointwise * (3.0 + full) + act_bytes / 2.0 * scores * (3.0 + x.rc_attention)
    casts = autocast_traffic_bytes_per_weight(amp, full=full, lora=x.lora)
    dequant = qlora_dequant_traffic_bytes_per_weight(x.qlora, full=full)
    weight_bytes = x.num_micro * gemm_weights * (casts + dequant) / (t * p)
    fp8_token, fp8_weight = fp8_cast_bytes(m, x, pr)
    return (x.tokens_per_gpu / p * (token_bytes + fp8_token) + weight_bytes + fp8_weight) / hbm


def fp8_cast_bytes(m: ModelSpec, x: StepShape, pr: TimeParams) -> tuple[np.ndarray, np.ndarray]:
    """(HBM bytes per token, per step) of an fp8 recipe's dynamic casts around the block GEMMs
    (0 off `fp8-mixed`): per token each linear's input in forward (again when recomputed) and
    in backward (the weight gradient's operand), and its output gradient twice (the two GEMM
    layouts); per micro-batch each weight in forward (again when recomputed) and transposed
    in backward; fp8_cast_bytes_per_element each, on this rank's tp x pp share.
    Source: torchao float8 float8_linear.py matmul_with_hp_or_float8_args (tensorwise: input,
    weight and grad_output cast per GEMM); Transformer Engine's cast-transpose does the same
    traffic in one kernel. Ignores: delayed scaling's amax history (no amax pass)."""
    fp8 = IS_FP8[x.prec]
    if not np.any(fp8):  # no fp8 row: nothing cast (and no work per row)
        return np.zeros(1), np.zeros(1)
    widths = block_linear_widths(m)
    per_element = cast_bytes_per_element(x.prec, pr)
    per_token = per_element * widths * (2.0 + x.full) / x.t
    blocks, _ = matmul_parameters(m)
    weights = per_element * blocks * (2.0 + x.full) * x.num_micro / (x.t * x.p)
    return np.where(fp8, per_token, 0.0), np.where(fp8, weights, 0.0)


def cast_bytes_per_element(prec, pr: TimeParams):
    """HBM bytes per element a recipe's quantizing cast moves: the calibrated
    TimeParams.fp8_cast_bytes_per_element under fp8-mixed, the block-scaled recipes' own
    (_mx.py CAST_BYTES_PER_ELEMENT: mxfp8 3.03125, nvfp4 4.5625) under mxfp8 and nvfp4.
    Source: _mx.py MXFP8_CAST_BYTES_PER_ELEMENT, NVFP4_CAST_BYTES_PER_ELEMENT."""
    own = CAST_BYTES_PER_ELEMENT[prec]
    return np.where(own > 0.0, own, pr.fp8_cast_bytes_per_element)


def _gemm_s(x: StepShape, linear_flops, blocks: float, *, peak, peak8, eff, pr: TimeParams):
    """GEMM time: every linear FLOP at the 16-bit peak x gemm efficiency; under fp8-mixed the
    block GEMMs' (not the head's, not LoRA adapters') at `peak8` x gemm efficiency (`peak8`:
    the fp8 peak x fp8_gemm_efficiency_ratio; the 16-bit peak on a GPU without fp8).
    Source: torchtitan 0.3 float8 converter (filter_fqns keeps the output projection in
    bf16), Transformer Engine (te.Linear inside the blocks only)."""
    fp8 = IS_FP8[x.prec]
    if not np.any(fp8):
        return linear_flops / (peak * eff)
    block_share = blocks * (4.0 + np.where(x.lora, 0.0, 2.0) + 2.0 * x.full) / (x.t * x.p)
    fp8_flops = np.where(fp8, x.tokens_per_gpu * block_share, 0.0)
    mixed = (linear_flops - fp8_flops) / (peak * eff) + fp8_flops / (peak8 * eff)
    return np.where(fp8, mixed, linear_flops / (peak * eff))


def _compute_s(
    m: ModelSpec, x: StepShape, g: Grid, *, peak, peak8, hbm, pr: TimeParams
) -> dict[str, Any]:
    """Compute time of one step (GEMMs, attention core, memory-bound kernels, the optimizer
    update) and the FLOP and parameter counts the rest needs.

    Linear: 2 fwd + 2 input-gradient + 2 weight-gradient FLOPs per weight per token, +2
    recomputed (not the head); LoRA: frozen weights get no weight gradient, only the adapters
    train, reduce and step. Attention core per token and layer: QK^T 2sq + AV 2sq forward, twice
    that backward, the forward again when recomputed (full or selective).
    Source: gemm_efficiency; TimeParams.flash_attention_efficiency, attention_flops_per_hbm_byte,
    causal_attention_fraction (BERT: bidirectional).
    """
    L, h = m.num_hidden_layers, m.hidden_size
    blocks, head = matmul_parameters(m)
    adapters = g["lora_rank"] * lora_width(m, g["lora_targets"])
    trainable = np.where(x.lora, adapters, float(m.num_parameters))
    weight_grad = np.where(x.lora, 0.0, 2.0)
    per_token = (blocks + head) * (4.0 + weight_grad) + 2.0 * x.full * blocks + 6.0 * adapters
    linear_flops = x.tokens_per_gpu * per_token / (x.t * x.p)
    qo = m.q_dim + m.o_dim
    attention_flops = x.tokens_per_gpu * L * x.s * qo * (6.0 + 2.0 * x.rc_attention) / (x.t * x.p)
    gemm_eff = gemm_efficiency(x.tokens_per_micro * h / x.t, pr)
    causal = 1.0 if m.family == "bert" else pr.causal_attention_fraction
    flash_s = (attention_flops * causal) * (
        1.0 / (peak * pr.flash_attention_efficiency) + 1.0 / (hbm * pr.attention_flops_per_hbm_byte)
    )
    attention_s = np.where(x.eager, attention_flops / (peak * gemm_eff), flash_s)
    gemm_s = _gemm_s(x, linear_flops, blocks, peak=peak, peak8=peak8, eff=gemm_eff, pr=pr)
    memory_s = _memory_bound_s(m, x, blocks + head, hbm, pr)
    shard = np.where(x.zero >= ZERO_STATES, x.d * x.c, 1.0)
    step_params = trainable / (x.t * x.p * shard)  # parameters this GPU's optimizer updates
    optimizer_s = optimizer_step_s(
        g,
        g["optimizer"].astype(int),
        step_params=step_params,
        hbm=hbm,
        offloaded=x.offload >= OFFLOAD_OPTIMIZER,
    )
    busy = gemm_s + attention_s + memory_s  # forward + backward, all micro-batches
    return {
        "gemm_s": gemm_s,
        "attention_s": attention_s,
        "memory_s": memory_s,
        "optimizer_s": optimizer_s,
        "busy": busy,
        "fwd_share": 1.0 / (3.0 + x.full),
        "linear_flops": linear_flops,
        "attention_flops": attention_flops,
        "blocks": blocks,
        "head": head,
        "adapters": adapters,
        "trainable": trainable,
        "shard": shard,
        "step_params": step_params,
    }


def _communication_s(
    m: ModelSpec, x: StepShape, work: dict[str, Any], *, links: Links, pr: TimeParams
) -> dict[str, np.ndarray]:
    """Exposed communication of one step, per parallelism, and the pipeline bubble.

    Source: each technique's module (tp_exposed_s, cp_exposed_s, p2p_time_s, expert_exposed_s,
    bubble_time_s); _state_traffic_s (DP, FSDP, offload).
    """
    out = {
        "tp_exposed_s": tp_exposed_s(m, x, links, params=pr),
        "cp_exposed_s": cp_exposed_s(m, x, links, attention_s=work["attention_s"], params=pr),
        "pp_p2p_s": p2p_time_s(m, x, links),
        "expert_s": expert_exposed_s(m, x, links, params=pr),
    }
    pipelined = (
        work["busy"] + out["tp_exposed_s"] + out["cp_exposed_s"] + out["pp_p2p_s"] + out["expert_s"]
    )
    out["bubble_time_s"] = bubble_time_s(pipelined, x)
    out.update(_state_traffic_s(m, x, work, links=links, pr=pr))
    return out


def _state_traffic_s(
    m: ModelSpec,
    x: StepShape,
    work: dict[str, Any],
    *,
    links: Links,
    pr: TimeParams,
) -> dict[str, np.ndarray]:
    """Exposed weight and gradient traffic of one step: DP / ZeRO-1/2, ZeRO-3 / FSDP, offload.

    DP runs over the dp x cp ranks holding the same weights (stride tp); gradients travel in
    fp32 where the framework keeps them so (AMP, Megatron main grads, FSDP2 mixed precision).
    Source: dp_exposed_s, fsdp_exposed_s, offload_time_s.
    """
    busy, num_micro = work["busy"], x.num_micro
    gpn, intra, inter = links.network()
    out: dict[str, np.ndarray] = {}
    dp_group = x.d * x.c
    traffic = StateTraffic(
        zero=x.zero,
        local=m.num_parameters / (x.t * x.p),
        local_trainable=work["trainable"] / (x.t * x.p),
        dp_group=dp_group,
        dp_bw=group_bandwidth(dp_group, x.t, gpn, intra, inter),
        grad_bytes=gradient_element_bytes(
            x.prec,
            fsdp2=is_fsdp2(x.fw, x.zero),
            main_grad_buffer=FP32_MAIN_GRAD_BUFFER[np.asarray(x.fw, dtype=np.int64)],
        ),
        param_bytes=np.where(x.qlora, NF4_BYTES, PARAM_BYTES[x.prec]),
    )
    fwd_share, per_micro = work["fwd_share"], busy / num_micro
    last_backward = busy / num_micro * (1.0 - fwd_share)
    out["dp_exposed_s"] = dp_exposed_s(traffic, last_backward=last_backward, params=pr)
    out["fsdp_exposed_s"] = fsdp_exposed_s(
        m, x, links, traffic, per_micro=per_micro, fwd_share=fwd_share, params=pr
    )
    out["offload_s"] = offload_time_s(
        offload=x.offload,
        step_params=work["step_params"],
        grad_bytes=traffic.grad_bytes,
        local=traffic.local,
        shard=work["shard"],
        param_bytes=traffic.param_bytes,
        pcie_bytes_per_s=links.pcie_bytes_per_s,
        per_micro=per_micro,
        fwd_share=fwd_share,
        num_micro=num_micro,
        params=pr,
    )
    return out


def _time_columns(
    m: ModelSpec,
    g: Grid,
    links: Links,
    *,
    tokens: float | np.ndarray | None,
    params: TimeParams | None,
) -> dict[str, np.ndarray]:
    """`estimate_time`'s columns for every row of `g`, valid or not (see estimate_time)."""
    out = time_values(m, g, links, tokens=tokens, params=params)
    return {
        k: np.broadcast_to(np.asarray(v, dtype=np.float64), (len(g["tp"]),)) for k, v in out.items()
    }


def time_values(
    m: ModelSpec,
    g: Grid,
    links: Links,
    *,
    tokens: float | np.ndarray | None,
    params: TimeParams | None,
    rl_rows: bool | None = None,
) -> dict[str, Any]:
    """_time_columns before broadcasting: each column as its formulas give it (a scalar where
    no row value enters it). The single-configuration path traces this function
    (engine/_fast/_time_row.py), once for RL rows and once for the others (`rl_rows`; None:
    whether any row of `g` is one)."""
    pr = params or TimeParams()
    # An RL row's trainer trains on its real tokens (DPO's pairs, padding removed:
    # engine/_rl.trainer_time_columns); its RL terms read the rollout's fields (g). A grid
    # without RL rows skips both (the same values: the formulas give rl none rows g's own).
    has_rl = bool(np.any(np.asarray(g["rl"]) != RL_NONE)) if rl_rows is None else rl_rows
    x = step_shape(m, trainer_time_columns(g) if has_rl else g)
    peak = np.where(x.prec == FP32, links.fp32_peak_flops, links.peak_flops).astype(np.float64)
    hbm = np.asarray(links.hbm_bytes_per_s, dtype=np.float64) * pr.memory_bandwidth_efficiency
    fp8_peak = np.asarray(links.fp8_peak_flops, dtype=np.float64)
    if np.any(IS_FP4[x.prec]):  # nvfp4 rows: their quantized GEMMs at the fp4 rate
        fp8_peak = np.where(IS_FP4[x.prec], np.asarray(links.fp4_peak_flops, np.float64), fp8_peak)
    fp8_on = IS_FP8[x.prec] & (fp8_peak > 0.0)  # what fp8 GEMMs sustain, as a peak
    peak8 = np.where(fp8_on, fp8_peak * pr.fp8_gemm_efficiency_ratio, peak)
    work = _compute_s(m, x, g, peak=peak, peak8=peak8, hbm=hbm, pr=pr)
    comm = _communication_s(m, x, work, links=links, pr=pr)
    n, price = x.n, np.asarray(links.price_per_gpu_hour_usd, dtype=np.float64)
    rl: dict[str, Any] = dict.fromkeys(RL_TIME_COLUMNS, 0.0)
    if has_rl:
        rl = rl_time_columns(
            m,
            g,
            trainer_step_s=_trainer_step_s(work, comm),
            trainer_forward_s=work["busy"] * work["fwd_share"],
            trainable=work["trainable"],
            adapters=work["adapters"],
            links=links,
            hbm=hbm,
            peak=peak,
            pr=pr,
        )
    out = _step_columns(m, x, work, comm, rl, peak=peak, price=price)
    if tokens is not None:
        time_to_train = np.asarray(tokens, dtype=np.float64) / out["tokens_per_second"]
        out["time_to_train_s"] = time_to_train
        out["cost_to_train_usd"] = n * price * time_to_train / 3600.0
    return out


def _trainer_step_s(work: dict[str, Any], comm: dict[str, np.ndarray]) -> np.ndarray:
    """The trainer's own step: compute, exposed communication and the pipeline bubble."""
    return (work["busy"] + work["optimizer_s"]) + _communication_total(comm) + comm["bubble_time_s"]


def _communication_total(comm: dict[str, np.ndarray]) -> np.ndarray:
    """The exposed communication of a step (its pipeline bubble apart)."""
    communication = (
        comm["tp_exposed_s"]
        + comm["cp_exposed_s"]
        + comm["pp_p2p_s"]
        + comm["expert_s"]
        + comm["dp_exposed_s"]
        + comm["fsdp_exposed_s"]
    )
    return communication + comm["offload_s"]


def _step_columns(
    m: ModelSpec,
    x: StepShape,
    work: dict[str, Any],
    comm: dict[str, np.ndarray],
    rl: dict[str, Any],
    *,
    peak: np.ndarray,
    price: np.ndarray,
) -> dict[str, Any]:
    """The step, its parts, throughput, FLOP utilisation and cost (see estimate_time); an RL
    row's step adds its rollout, score, critic, sync and offload time (engine/_rl_time.py)."""
    compute = work["busy"] + work["optimizer_s"]
    communication = _communication_total(comm)
    rl_total = sum(rl[k] for k in RL_TIME_COLUMNS)  # left to right, from 0: exact
    step = _trainer_step_s(work, comm) + rl_total
    n = x.n
    tokens_per_second = x.tokens_per_step / step
    blocks_head = work["blocks"] + work["head"]
    model_flops = x.tokens_per_step * (
        model_flops_per_token(m, x.s)
        - np.where(x.lora, 2.0 * blocks_head, 0.0)
        + 6.0 * work["adapters"]
    )
    hardware_flops = (work["linear_flops"] + work["attention_flops"]) * n
    return {
        "step_time_s": step,
        "compute_time_s": compute,
        "communication_exposed_s": communication,
        "bubble_time_s": comm["bubble_time_s"],
        "tokens_per_second": tokens_per_second,
        "tokens_per_second_per_gpu": tokens_per_second / n,
        "mfu": model_flops / (step * n * peak),
        "hfu": hardware_flops / (step * n * peak),
        "cost_per_million_tokens": n * price / 3600.0 / tokens_per_second * 1e6,
        "gemm_time_s": work["gemm_s"],
        "attention_time_s": work["attention_s"],
        "memory_bound_time_s": work["memory_s"],
        "optimizer_time_s": work["optimizer_s"],
        **{k: comm[k] for k in EXPOSED_COLUMNS},
        **rl,
        "model_flops_per_step": model_flops,
        "hardware_flops_per_step": hardware_flops,
        "achieved_flops_per_gpu": hardware_flops / (step * n),
    }
