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
from typing import Any

import numpy as np

from ._estimate import layout_reason
from ._flops import (
    BLOCK_GROUPS,
    lora_width,
    matmul_parameters,
    mlp_width,
    model_flops_per_token,
)
from ._grid import Grid
from ._model import ModelSpec
from ._time_params import TimeParams

FP32, BF16, FP16, AMP_BF16, AMP_FP16, MIXED_BF16, MIXED_FP16, FP8_MIXED = range(8)
HF, MEGATRON, DEEPSPEED, TORCHTITAN = range(4)
NONE, SELECTIVE, FULL = range(3)
FLASH, EAGER = range(2)
OFFLOAD_NONE, OFFLOAD_OPTIMIZER, OFFLOAD_PARAMS = range(3)
AUTOCAST_BYTES_PER_WEIGHT = 6.0
"""HBM bytes torch.autocast moves per fp32 GEMM weight per forward pass: read 4, write the 16-bit
copy 2 (cached within the pass). Its backward writes the 16-bit weight gradient (2), reads it
and writes the fp32 .grad (2 + 4): 8 more. Source: torch.autocast's cast policy (CUDA ops list)."""
QLORA_DEQUANT_BYTES_PER_WEIGHT = 2.5
"""HBM bytes to dequantize one NF4 weight before each use: read 0.5 (4 bits), write 2 (bf16).
Source: bitsandbytes Linear4bit (dequantize_4bit, then a 16-bit matmul), forward and backward."""

OPTIMIZER_STEP_BYTES_PER_PARAMETER = (28.0, 28.0, 16.0, 12.0, 20.0, 24.0, 20.0)
"""HBM bytes the optimizer update moves per local parameter, in OPTIMIZERS order (adamw,
adamw-fused, adamw-8bit, sgd, sgd-momentum, adafactor, lion): fp32 parameter read + write 8,
gradient read 4, each fp32 state read + write 8 (8-bit AdamW: 2 per state; Adafactor: small
factored statistics, two gradient-sized temporaries). Source: the tensors each torch.optim update
reads and writes. Assumes: no savings from fused kernels, no 16-bit weight copy refresh."""

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


def gemm_efficiency(work: np.ndarray, params: TimeParams) -> np.ndarray:
    """Achieved fraction of the dense peak for GEMMs of a per-GPU work size: e w / (w + w_half).

    work = tokens per micro-batch per GPU x hidden_size / tp. Source: TimeParams.gemm_*.
    """
    w = np.asarray(work, dtype=np.float64)
    return params.gemm_efficiency_max * w / (w + params.gemm_half_work)


def modules_per_layer(m: ModelSpec) -> int:
    """Parameter-holding modules in one block (a Linear or a norm, weight and bias together)."""
    return len({p.name.rsplit(".", 1)[0] for p in m.param_tensors() if p.group in BLOCK_GROUPS})


def ring_time_s(
    num_bytes: np.ndarray,
    group_size: np.ndarray,
    bytes_per_s: np.ndarray,
    *,
    all_reduce: bool | np.ndarray,
    params: TimeParams,
    num_calls: float | np.ndarray = 1.0,
) -> np.ndarray:
    """Ring collectives moving `num_bytes` (full, unsharded size) over `group_size` ranks.

    all-reduce 2(n-1)/n x bytes / bandwidth, all-gather or reduce-scatter (n-1)/n x bytes /
    bandwidth, plus a step latency per ring step of each of `num_calls` calls; 0 for one rank.
    Source: Patarasuk & Yuan 2009 (bandwidth-optimal ring all-reduce); nccl-tests
    doc/PERFORMANCE.md (bus bandwidth).
    """
    n = np.asarray(group_size, dtype=np.float64)
    passes = np.where(all_reduce, 2.0, 1.0)
    bw = np.asarray(bytes_per_s, dtype=np.float64) * params.collective_bandwidth_efficiency
    transfer = passes * (n - 1.0) / np.maximum(n, 1.0) * num_bytes / bw
    latency = num_calls * passes * (n - 1.0) * params.ring_step_latency_s
    return np.where(n > 1, transfer + latency, 0.0)


def group_bandwidth(
    group_size: np.ndarray,
    stride: np.ndarray,
    gpus_per_node: np.ndarray,
    intra: np.ndarray,
    inter: np.ndarray,
) -> np.ndarray:
    """Bus bandwidth per rank of a collective over `group_size` ranks spaced `stride` apart.

    Within one node: the intra-node link. Across nodes: the group's k ranks on a node each drive
    their own NIC (NCCL runs one ring per NIC), so node-to-node hops see k x the per-GPU network
    share, capped by the intra-node link. Source: NCCL multi-rail rings; DGX A100/H100 reference
    architecture (one compute HCA per GPU). Assumes: rail-optimized network, no SHARP, ranks
    numbered tp fastest, then cp, dp, pp (Megatron-LM's order).
    """
    span = np.asarray(group_size) * np.asarray(stride)
    k = np.clip(np.floor(np.asarray(gpus_per_node) / np.asarray(stride)), 1.0, group_size)
    return np.where(span <= gpus_per_node, intra, np.minimum(intra, inter * k))


def exposed_s(comm_s: np.ndarray, hideable_s: np.ndarray, params: TimeParams) -> np.ndarray:
    """What overlap leaves of `comm_s` run behind `hideable_s` of compute: the excess, plus
    `overlap_slowdown_fraction` of the hidden part. Source: TimeParams.overlap_slowdown_fraction.
    """
    hidden = np.minimum(comm_s, hideable_s)
    return comm_s - hidden + params.overlap_slowdown_fraction * hidden


def bubble_fraction(
    pp: np.ndarray | int, num_microbatches: np.ndarray | int, virtual_stages: np.ndarray | int
) -> np.ndarray:
    """Share of the step the pipeline sits idle: (p-1) / (m v + p - 1).

    Source: Narayanan et al. 2021 Sec. 2.2.1 (bubble / ideal time = (p-1)/m) and Sec. 2.2.2
    (interleaving divides it by v). Assumes: 1F1B, equal stages.
    """
    p = np.asarray(pp, dtype=np.float64)
    mv = np.asarray(num_microbatches, dtype=np.float64) * np.asarray(virtual_stages)
    return (p - 1.0) / (mv + p - 1.0)


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
    tokens: float | np.ndarray | None = None,
    params: TimeParams | None = None,
    reason: np.ndarray | None = None,
    columns: Collection[str] | None = None,
) -> dict[str, np.ndarray]:
    """Step time, throughput, MFU and cost of every row of `g` for model `m`.

    GPU values are scalars or per-row arrays; `time_inputs(profile)` gives them for one profile.
    fp32 rows run at fp32_peak_flops, the others at peak_flops (dense 16-bit).
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
    type per row; fp8-mixed rows run at the 16-bit peak and activation offload is not timed.
    `reason`: layout_reason(m, g) when the caller has it already, or any code that is nonzero
    at least where it is (e.g. a sweep's own reasons added): rows with a nonzero code get NaN.
    `columns`: only these of the columns above (the same values).

    Only the valid rows are evaluated (every formula is elementwise, so each value is the same
    to the bit as in a whole-grid pass); a sweep's grid is mostly invalid layouts.
    """
    valid = (layout_reason(m, g) if reason is None else reason) == 0
    num_rows = len(valid)
    gpu: dict[str, Any] = {
        "peak_flops": peak_flops,
        "fp32_peak_flops": fp32_peak_flops,
        "hbm_bytes_per_s": hbm_bytes_per_s,
        "intra_node_bytes_per_s": intra_node_bytes_per_s,
        "inter_node_bytes_per_s": inter_node_bytes_per_s,
        "gpus_per_node": gpus_per_node,
        "pcie_bytes_per_s": pcie_bytes_per_s,
        "price_per_gpu_hour_usd": price_per_gpu_hour_usd,
        "tokens": tokens,
    }
    every = bool(valid.all())
    if every:
        out = _time_columns(m, g, params=params, **gpu)
    else:
        rows = np.flatnonzero(valid)
        gpu = {
            k: x if x is None or np.ndim(x) == 0 else np.asarray(x)[rows] for k, x in gpu.items()
        }
        out = _time_columns(m, {k: x[rows] for k, x in g.items()}, params=params, **gpu)
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


def _time_columns(
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
    tokens: float | np.ndarray | None,
    params: TimeParams | None,
) -> dict[str, np.ndarray]:
    """`estimate_time`'s columns for every row of `g`, valid or not (see estimate_time)."""
    pr = params or TimeParams()
    num_rows = len(g["tp"])
    # Symbols: s sequence, b micro-batch, t tp, p pp, c cp, v virtual stages, d dp, n GPUs.
    s = g["seq_len"].astype(np.float64)
    b = g["micro_batch_size"].astype(np.float64)
    t = np.maximum(g["tp"], 1).astype(np.float64)
    p = np.maximum(g["pp"], 1).astype(np.float64)
    c = np.maximum(g["cp"], 1).astype(np.float64)
    v = np.maximum(g["virtual_stages"], 1).astype(np.float64)
    n = g["num_gpus"].astype(np.float64)
    # dp and micro-batches per step exactly as estimate() derives them.
    dp = np.maximum(g["num_gpus"] // np.maximum(g["tp"] * g["pp"] * g["cp"], 1), 1)
    gbs = np.where(g["global_batch_size"] > 0, g["global_batch_size"], g["micro_batch_size"] * dp)
    num_micro = np.maximum(gbs // np.maximum(g["micro_batch_size"] * dp, 1), 1).astype(float)
    d = dp.astype(np.float64)
    L, h, kv, a = m.num_hidden_layers, m.hidden_size, m.kv_dim, m.num_attention_heads
    prec, fw, zero = g["precision"].astype(int), g["framework"].astype(int), g["zero"]
    recompute = g["recompute"].astype(int)
    eager = g["attention"].astype(int) == EAGER
    sp = g["sequence_parallel"] & (g["tp"] > 1)
    full = (recompute == FULL).astype(np.float64)
    rc_attention = (recompute != NONE).astype(np.float64)  # selective recomputes the core

    peak = np.where(prec == FP32, fp32_peak_flops, peak_flops).astype(np.float64)
    hbm = np.asarray(hbm_bytes_per_s, dtype=np.float64) * pr.memory_bandwidth_efficiency
    gpn = np.asarray(gpus_per_node, dtype=np.float64)
    intra = np.asarray(intra_node_bytes_per_s, dtype=np.float64)
    inter = np.asarray(inter_node_bytes_per_s, dtype=np.float64)
    act_bytes = np.where(prec == FP32, 4.0, 2.0)

    # ---- compute (one GPU, one step) --------------------------------------------------------
    tokens_per_step = gbs.astype(np.float64) * s
    tokens_per_micro = b * s / c  # one GPU's tokens in one micro-batch
    tokens_per_gpu = tokens_per_step / (d * c)  # one tp x pp group's tokens per step
    blocks, head = matmul_parameters(m)
    # LoRA: frozen weights get no weight gradient; only the adapters train, reduce and step.
    lora = g["lora_rank"] > 0
    adapters = g["lora_rank"] * lora_width(m, g["lora_targets"])
    trainable = np.where(lora, adapters, float(m.num_parameters))
    weight_grad = np.where(lora, 0.0, 2.0)
    # Linear: 2 fwd + 2 input-gradient + 2 weight-gradient FLOPs per weight per token, +2
    # recomputed (not the head). Attention core per token and layer: QK^T 2sq + AV 2sq forward,
    # twice that backward, the forward again when recomputed (full or selective).
    per_token = (blocks + head) * (4.0 + weight_grad) + 2.0 * full * blocks + 6.0 * adapters
    linear_flops = tokens_per_gpu * per_token / (t * p)
    qo = m.q_dim + m.o_dim
    attention_flops = tokens_per_gpu * L * s * qo * (6.0 + 2.0 * rc_attention) / (t * p)
    gemm_eff = gemm_efficiency(tokens_per_micro * h / t, pr)
    gemm_s = linear_flops / (peak * gemm_eff)
    causal = 1.0 if m.family == "bert" else pr.causal_attention_fraction  # BERT: bidirectional
    flash_s = (attention_flops * causal) * (
        1.0 / (peak * pr.flash_attention_efficiency) + 1.0 / (hbm * pr.attention_flops_per_hbm_byte)
    )  # fmt: skip
    attention_s = np.where(eager, attention_flops / (peak * gemm_eff), flash_s)
    # Memory-bound kernels: forward 1, backward 2, recomputed forward 1.
    # Under autocast the residual stream and norms stay fp32 (the embedding is fp32); the MLP's
    # activations are matmul outputs, in 16 bits.
    amp = (prec == AMP_BF16) | (prec == AMP_FP16)
    residual_bytes = np.where(amp, 4.0, act_bytes)
    pointwise = pr.pointwise_bytes_per_width * (
        residual_bytes / 2.0 * L * h / np.where(sp, t, 1.0) + act_bytes / 2.0 * mlp_width(m) / t
    )  # fmt: skip
    scores = np.where(eager, pr.eager_attention_bytes_per_score * L * a * s / t, 0.0)
    token_bytes = pointwise * (3.0 + full) + act_bytes / 2.0 * scores * (3.0 + rc_attention)
    # Per micro-batch weight traffic: autocast casts every GEMM weight to 16 bits per forward and
    # its 16-bit gradient back to fp32; QLoRA dequantizes NF4 weights before every use.
    casts = np.where(amp, AUTOCAST_BYTES_PER_WEIGHT * (1.0 + full) + 8.0 * (lora == 0), 0.0)
    qlora = g["qlora"] & lora
    dequant = np.where(qlora, QLORA_DEQUANT_BYTES_PER_WEIGHT * (2.0 + full), 0.0)
    weight_bytes = num_micro * (blocks + head) * (casts + dequant) / (t * p)
    memory_s = (tokens_per_gpu / p * token_bytes + weight_bytes) / hbm
    shard = np.where(zero >= 1, d * c, 1.0)
    step_params = trainable / (t * p * shard)  # parameters this GPU's optimizer updates
    offload = g["offload"].astype(int)
    optimizer_bytes = np.where(
        g["optimizer_custom"],
        g["optimizer_step_bytes"],
        np.asarray(OPTIMIZER_STEP_BYTES_PER_PARAMETER)[g["optimizer"].astype(int)],
    )
    optimizer_s = np.where(offload >= OFFLOAD_OPTIMIZER, 0.0, step_params * optimizer_bytes / hbm)
    busy = gemm_s + attention_s + memory_s  # forward + backward, all micro-batches
    fwd_share = 1.0 / (3.0 + full)

    # ---- communication ----------------------------------------------------------------------
    # TP: per layer and micro-batch 2 all-reduces forward, 2 backward, +2 recomputed, of b s h
    # activations (SP: all-gather + reduce-scatter, the same bytes); across nodes the per-GPU
    # network share. Source: Narayanan et al. 2021 Sec. 3.2; Korthikanti et al. 2022 Sec. 4.2.
    tp_bw = np.where(t > gpn, inter, intra)
    tp_one = ring_time_s(tokens_per_micro * h * act_bytes, t, tp_bw, all_reduce=True, params=pr)
    tp_exposed = (4.0 + 2.0 * full) * L / p * num_micro * tp_one * (1.0 - pr.tp_overlap_fraction)
    # CP: ring exchange of K and V chunks, forward (c-1) of them, backward K, V and their
    # gradients, hidden behind the attention core. Source: Liu et al. 2023 (Ring Attention).
    cp_bw = group_bandwidth(c, t, gpn, intra, inter) * pr.collective_bandwidth_efficiency
    kv_chunk = tokens_per_micro * 2.0 * kv / t * act_bytes
    cp_s = (c - 1.0) * kv_chunk * (3.0 + full) * L / p * num_micro / cp_bw
    cp_exposed = exposed_s(cp_s, pr.cp_overlap_fraction * attention_s, pr)
    # PP: one activation per micro-batch and virtual stage each way, split over the TP ranks
    # (scatter/gather, Narayanan et al. 2021 Sec. 4.1).
    pp_bw = np.where(n / p >= gpn, inter, intra)
    p2p_s = np.where(p > 1, 2.0 * v * num_micro * tokens_per_micro * h * act_bytes / t / pp_bw, 0.0)
    # EP: per MoE layer and micro-batch an all-to-all dispatch and combine forward, both again
    # backward (+ recomputed), of the top-k token copies; exposed. The ep ranks are dp ranks.
    # Source: Lepikhin et al. 2021 (GShard) Sec. 2.2; Megatron-Core MoE token dispatcher.
    ep = np.maximum(g["ep"], 1).astype(np.float64)
    ep_bw = np.where(ep * t * c > gpn, inter, intra) * pr.collective_bandwidth_efficiency
    a2a_bytes = tokens_per_micro * m.num_experts_per_tok * h * act_bytes
    a2a_one = (ep - 1.0) / ep * a2a_bytes / ep_bw + (ep - 1.0) * pr.ring_step_latency_s
    moe_layers = m.num_moe_layers / p
    expert_s = np.where(ep > 1, (4.0 + 2.0 * full) * moe_layers * num_micro * a2a_one, 0.0)
    pipelined = busy + tp_exposed + cp_exposed + p2p_s + expert_s
    bubble = pipelined * (p - 1.0) / (num_micro * v)

    # DP over the dp x cp ranks holding the same weights (stride tp). Gradients travel in fp32
    # where the framework keeps them so (AMP, Megatron main grads, FSDP2 mixed precision).
    dp_group = d * c
    dp_bw = group_bandwidth(dp_group, t, gpn, intra, inter)
    mixed = (prec == MIXED_BF16) | (prec == MIXED_FP16) | (prec == FP8_MIXED)
    wide = (prec == FP32) | (prec == AMP_BF16) | (prec == AMP_FP16)
    fsdp2 = ((fw == HF) | (fw == TORCHTITAN)) & (zero == 3)
    grad_bytes = np.where(wide | (mixed & ((fw == MEGATRON) | fsdp2)), 4.0, 2.0)
    param_bytes = np.where(qlora, 0.5, np.where(wide, 4.0, 2.0))
    local = m.num_parameters / (t * p)
    local_trainable = trainable / (t * p)
    reduce_s = ring_time_s(
        local_trainable * grad_bytes, dp_group, dp_bw, all_reduce=zero == 0, params=pr
    )  # fmt: skip
    gather_s = ring_time_s(local * param_bytes, dp_group, dp_bw, all_reduce=False, params=pr)
    last_backward = busy / num_micro * (1.0 - fwd_share)
    dp_exposed = exposed_s(reduce_s, pr.dp_overlap_fraction * last_backward, pr) + np.where(
        zero >= 1, gather_s, 0.0
    )  # ZeRO-1/2 gather the updated weights after the step
    # ZeRO-3 / FSDP: each micro-batch gathers the weights forward and again backward and
    # reduce-scatters the gradients, prefetched behind compute; FSDP one collective per block,
    # DeepSpeed one per module and, fitted to Narayanan et al. 2021 Table 2, at the per-GPU
    # network share. Source: Rajbhandari et al. 2020 Sec. 7.2.2 (1.5x DDP's volume).
    deepspeed = fw == DEEPSPEED
    calls = L / p * np.where(deepspeed, float(modules_per_layer(m)), 1.0)
    bw3 = np.where(deepspeed, np.where(dp_group * t > gpn, inter, intra), dp_bw)
    gather3 = ring_time_s(local * param_bytes, dp_group, bw3, all_reduce=False, params=pr,
                          num_calls=calls)  # fmt: skip
    reduce3 = ring_time_s(local_trainable * grad_bytes, dp_group, bw3, all_reduce=False,
                          params=pr, num_calls=calls)  # fmt: skip
    per_micro = busy / num_micro
    fsdp_fwd = exposed_s(gather3, pr.fsdp_overlap_fraction * fwd_share * per_micro, pr)
    fsdp_bwd = exposed_s(
        gather3 + reduce3, pr.fsdp_overlap_fraction * (1.0 - fwd_share) * per_micro, pr
    )
    dp_exposed = np.where(zero <= 2, dp_exposed, 0.0)
    fsdp_exposed = np.where(zero == 3, (fsdp_fwd + fsdp_bwd) * num_micro, 0.0)

    # Offload: the optimizer steps on the host (gradients down, 16-bit weights up over PCIe, a
    # CPU update); with the parameters, every micro-batch also streams this GPU's weight shard
    # up for the forward and again for the backward, prefetched like the FSDP gathers.
    # Source: Ren et al. 2021 (ZeRO-Offload) Sec. 4; Rajbhandari et al. 2021 (ZeRO-Infinity).
    pcie = np.asarray(pcie_bytes_per_s, dtype=np.float64) * pr.pcie_efficiency
    host_step = (
        step_params * (grad_bytes + 2.0) / pcie + step_params / pr.cpu_optimizer_params_per_s
    )
    stream = local / shard * param_bytes / pcie
    streamed = exposed_s(stream, pr.fsdp_overlap_fraction * fwd_share * per_micro, pr) + exposed_s(
        stream, pr.fsdp_overlap_fraction * (1.0 - fwd_share) * per_micro, pr
    )  # fmt: skip
    offload_s = np.where(offload >= OFFLOAD_OPTIMIZER, host_step, 0.0) + np.where(
        offload == OFFLOAD_PARAMS, streamed * num_micro, 0.0
    )  # fmt: skip
    compute = busy + optimizer_s
    communication = tp_exposed + cp_exposed + p2p_s + expert_s + dp_exposed + fsdp_exposed
    communication = communication + offload_s
    step = compute + communication + bubble

    price = np.asarray(price_per_gpu_hour_usd, dtype=np.float64)
    tokens_per_second = tokens_per_step / step
    model_flops = tokens_per_step * (
        model_flops_per_token(m, s) - np.where(lora, 2.0 * (blocks + head), 0.0) + 6.0 * adapters
    )  # fmt: skip
    hardware_flops = (linear_flops + attention_flops) * n
    out = {
        "step_time_s": step,
        "compute_time_s": compute,
        "communication_exposed_s": communication,
        "bubble_time_s": bubble,
        "tokens_per_second": tokens_per_second,
        "tokens_per_second_per_gpu": tokens_per_second / n,
        "mfu": model_flops / (step * n * peak),
        "hfu": hardware_flops / (step * n * peak),
        "cost_per_million_tokens": n * price / 3600.0 / tokens_per_second * 1e6,
        "gemm_time_s": gemm_s,
        "attention_time_s": attention_s,
        "memory_bound_time_s": memory_s,
        "optimizer_time_s": optimizer_s,
        "tp_exposed_s": tp_exposed,
        "cp_exposed_s": cp_exposed,
        "pp_p2p_s": p2p_s,
        "dp_exposed_s": dp_exposed,
        "fsdp_exposed_s": fsdp_exposed,
        "offload_s": offload_s,
        "expert_s": expert_s,
        "model_flops_per_step": model_flops,
        "hardware_flops_per_step": hardware_flops,
        "achieved_flops_per_gpu": hardware_flops / (step * n),
    }
    if tokens is not None:
        time_to_train = np.asarray(tokens, dtype=np.float64) / tokens_per_second
        out["time_to_train_s"] = time_to_train
        out["cost_to_train_usd"] = n * price * time_to_train / 3600.0
    return {
        k: np.broadcast_to(np.asarray(x, dtype=np.float64), (num_rows,)) for k, x in out.items()
    }
