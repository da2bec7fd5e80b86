"""Step time and cost of every row of a grid: FLOPs, achieved throughput, exposed communication,
pipeline bubble. Columns in, columns out, like `estimate`; no Python loop over rows.

A step on one GPU is

    step = compute + communication_exposed + bubble

compute: the GEMM FLOPs at the dense peak times a work-size efficiency, the attention core at its
own efficiency, the memory-bound kernels (norms, activations, residuals, eager softmax) at HBM
bandwidth, and the optimizer step. communication_exposed: what overlap does not hide of the
tensor-, context- and pipeline-parallel traffic on the critical path and of the data-parallel
gradient reduction and ZeRO-3 parameter gathers. bubble: the pipeline fill and drain.

Every constant is a field of `TimeParams` with its source; `bench/calibrate_time.py` refits the
fitted ones against published throughput tables.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Protocol

import numpy as np

from ._estimate import layout_reason
from ._grid import Grid
from ._model import ModelSpec

FP32, BF16, FP16, AMP_BF16, AMP_FP16, MIXED_BF16, MIXED_FP16 = range(7)
HF, MEGATRON, DEEPSPEED, TORCHTITAN = range(4)
NONE, SELECTIVE, FULL = range(3)
FLASH, EAGER = range(2)

OPTIMIZER_STEP_BYTES_PER_PARAMETER = (28.0, 28.0, 16.0, 12.0, 20.0, 24.0, 20.0)
"""HBM bytes the optimizer step moves per local parameter, in OPTIMIZERS order (adamw,
adamw-fused, adamw-8bit, sgd, sgd-momentum, adafactor, lion): fp32 parameter read+write 8,
gradient read 4, each fp32 state read+write 8 (8-bit AdamW: 2 per state; Adafactor: the
factored statistics are small, its update makes two gradient-sized temporaries).
Source: counting the tensors each torch.optim update reads and writes (foreach path).
Assumes: no fused multi-tensor savings, no 16-bit copy of the updated weights."""

TIME_COLUMNS = (
    "step_time_s",
    "compute_time_s",
    "communication_exposed_s",
    "bubble_time_s",
    "tokens_per_second",
    "mfu",
    "cost_per_million_tokens",
)
"""The headline outputs of `estimate_time` (with `tokens`: also time_to_train_s and
cost_to_train_usd)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeParams:
    """Constants of the step-time model. Fitted ones say so; refit with bench/calibrate_time.py
    or set one from a measured run (README, "Step time and cost")."""

    gemm_efficiency_max: float = 0.80
    """Fraction of the dense tensor-core peak that large bf16/fp16 GEMMs sustain.
    Source: fitted (bench/calibrate_time.py) to Narayanan et al. 2021 Table 1, torchtitan and
    MosaicML llm-foundry throughput tables; cuBLAS reaches 75-90% of peak on large GEMMs
    (NVIDIA A100/H100 GEMM performance guides)."""
    gemm_half_work: float = 1.0e6
    """Per-GPU work size (tokens per micro-batch x hidden size / tp) at which the GEMM
    efficiency is half its maximum: small micro-batches and thin TP shards run short kernels
    that launch overhead dominates. Source: the shape of Narayanan et al. 2021 Fig. 7
    (throughput vs micro-batch size, +30% from 1 to 16); the value fitted."""
    flash_attention_efficiency: float = 0.50
    """Fraction of the dense peak the fused (flash) attention kernels sustain on the FLOPs they
    execute, backward included (FlashAttention-2 reaches 50-73% of A100 peak forward, less
    backward: Dao 2023, Fig. 4-6). Fitted."""
    causal_attention_fraction: float = 0.5
    """Fraction of the s x s score FLOPs a fused causal kernel executes (it skips the masked
    blocks); eager attention computes them all. MFU still counts them all (PaLM Appendix B).
    Source: FlashAttention-2 (Dao 2023) Sec. 3.1.1, causal masking skips half the blocks."""
    pointwise_bytes_per_width: float = 160.0
    """HBM bytes moved by the memory-bound kernels of one layer's forward pass (norms,
    activation function, residual adds, dropout, rotary) per token per unit of width, where the
    width is hidden_size + the MLP's intermediate width (x2 when gated), for 16-bit activations
    (fp32: x2). Backward moves twice as much, recomputation repeats the forward.
    Source: fitted; an eager Llama layer counted kernel by kernel moves ~180 bytes per unit of
    width (RMSNorm in fp32 alone ~46 bytes x hidden per norm)."""
    eager_attention_bytes_per_score: float = 13.0
    """HBM bytes per attention-score element (one per head, query and key) in one forward pass
    of eager (unfused) attention in 16 bits: QK^T writes 2, scale-mask-softmax reads 2 and
    writes 2, dropout reads 2, writes 2 and a 1-byte mask, the AV product reads 2.
    Source: Megatron-LM's fused softmax path (Narayanan et al. 2021 Sec. 4.2); counted."""
    memory_bandwidth_efficiency: float = 0.80
    """Fraction of peak HBM bandwidth that elementwise kernels and the optimizer step reach.
    Source: STREAM-like copy kernels reach 80-90% of HBM peak on A100/H100 (NVIDIA CUDA best
    practices guide, "Effective bandwidth")."""
    collective_bandwidth_efficiency: float = 0.80
    """Fraction of a link's unidirectional bandwidth a NCCL ring collective reaches (bus
    bandwidth). Source: nccl-tests, all_reduce_perf busbw ~230-240 GB/s on A100 NVLink (300 GB/s)
    and ~20-23 GB/s over 200 Gb/s HDR InfiniBand (25 GB/s)."""
    collective_latency_s: float = 2.0e-5
    """Fixed cost of one collective call. Source: nccl-tests small-message all_reduce latency,
    10-30 us within a node, more across nodes."""
    dp_overlap_fraction: float = 0.8
    """Fraction of the last micro-batch's backward compute during which the data-parallel
    gradient reduction runs hidden (DDP / ZeRO-1/2 bucketed reduction overlaps backward; earlier
    micro-batches accumulate without communicating). Source: PyTorch DDP design (Li et al. 2020,
    VLDB, Sec. 3.2.3 bucketing and overlap); the value is a judgement, not fitted."""
    fsdp_overlap_fraction: float = 0.5
    """Fraction of each micro-batch's forward (backward) compute that hides the ZeRO-3/FSDP
    parameter all-gathers (and gradient reduce-scatters) through prefetching. Source: fitted to
    the ZeRO-3 rows of Narayanan et al. 2021 Table 2 (175B on 384-1536 A100s: 144, 88 and 44
    TFLOP/s per GPU), which no overlap (0) and full overlap (1) both miss by > 30%."""
    tp_overlap_fraction: float = 0.0
    """Fraction of tensor-parallel collectives hidden behind GEMMs. 0: Megatron-LM 2021 and
    torchtitan without async TP run them on the critical path (Narayanan et al. 2021 Sec. 3.2);
    async TP / userbuffers overlap most of it."""
    cp_overlap_fraction: float = 0.8
    """Fraction of the attention core's compute that hides the context-parallel ring exchange
    of K and V (ring attention overlaps the next block's transfer with the current block).
    Source: Liu et al. 2023, "Ring Attention", Sec. 3; a judgement, not fitted."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def with_overrides(self, overrides: dict[str, float]) -> TimeParams:
        """A copy with some fields replaced; unknown keys raise ValueError naming them."""
        unknown = sorted(set(overrides) - set(self.names()))
        if unknown:
            raise ValueError(
                f"time-param: unknown key '{unknown[0]}'; allowed: {', '.join(self.names())}"
            )
        return replace(self, **{k: float(v) for k, v in overrides.items()})


class GpuLike(Protocol):
    """What the time model reads from a GPU profile (hardware.GpuProfile has these fields)."""

    bf16_flops: float
    fp16_flops: float
    fp32_flops: float
    hbm_bandwidth_bytes_per_s: float
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float
    gpus_per_node: int
    pcie_bandwidth_bytes_per_s: float
    price_per_hour_usd: float


def time_inputs(gpu: GpuLike, *, price_per_hour_usd: float | None = None) -> dict[str, float]:
    """The GPU keyword arguments of `estimate_time` for one profile (price overridable).

    BF16 peak is the 16-bit peak (fp16 where a card has no bf16).
    """
    peak = gpu.bf16_flops if gpu.bf16_flops > 0 else gpu.fp16_flops
    return {
        "peak_flops": float(peak),
        "fp32_peak_flops": float(gpu.fp32_flops),
        "hbm_bytes_per_s": float(gpu.hbm_bandwidth_bytes_per_s),
        "intra_node_bytes_per_s": float(gpu.intra_node_bandwidth_bytes_per_s),
        "inter_node_bytes_per_s": float(gpu.inter_node_bandwidth_bytes_per_s),
        "gpus_per_node": float(gpu.gpus_per_node),
        "pcie_bytes_per_s": float(gpu.pcie_bandwidth_bytes_per_s),
        "price_per_gpu_hour_usd": float(
            gpu.price_per_hour_usd if price_per_hour_usd is None else price_per_hour_usd
        ),
    }


# ---- model FLOPs ---------------------------------------------------------------------------


def matmul_parameters(m: ModelSpec) -> tuple[int, int]:
    """(per layer, outside the layers) parameters that are GEMM weights.

    Per layer: every 2-D weight of a block (biases and norms are not GEMMs). Outside: the output
    projection (vocab x hidden, also when tied to the embedding: the lookup is not a GEMM, the
    logits are) and BERT's head transform. Source: PaLM (Chowdhery et al. 2022) Appendix B and
    torchtitan `get_nparams_and_flops` count parameters less the embedding lookup.
    """
    tensors = m.param_tensors()
    per_layer = sum(p.numel for p in tensors if p.group == "layer" and len(p.shape) == 2)
    head = m.vocab_size * m.hidden_size
    head += sum(p.numel for p in tensors if p.group == "head" and p.name.endswith("dense.weight"))
    return per_layer, head


def model_flops_per_token(m: ModelSpec, seq_len: np.ndarray) -> np.ndarray:
    """Training FLOPs per token by the MFU convention: 6 x GEMM parameters + 12 L s q.

    Source: PaLM (Chowdhery et al. 2022) Appendix B, 6N + 12 L H Q T; Narayanan et al. 2021
    Eq. 3 without its recomputation pass (72 B s l h^2 (1 + s/6h + V/12lh) for GPT).
    Assumes: attention scores counted in full (no causal halving), as both papers do.
    """
    s = np.asarray(seq_len, dtype=np.float64)
    L, q = m.num_hidden_layers, m.q_dim
    per_layer, head = matmul_parameters(m)
    return 6.0 * (L * per_layer + head) + 12.0 * L * s * q  # 2 fwd + 4 bwd per weight; QK, AV


# ---- compute -------------------------------------------------------------------------------


def gemm_efficiency(work: np.ndarray, params: TimeParams) -> np.ndarray:
    """Achieved fraction of the dense peak for GEMMs of a per-GPU work size (a saturating curve).

    work = tokens per micro-batch per GPU x hidden size / tp. Source: TimeParams.gemm_* (fitted;
    shape after Narayanan et al. 2021 Fig. 7). Assumes: GEMM shapes of a transformer layer.
    """
    w = np.asarray(work, dtype=np.float64)
    return params.gemm_efficiency_max * w / (w + params.gemm_half_work)


def _width(m: ModelSpec) -> tuple[float, float]:
    """(hidden part, intermediate part) of the pointwise width of one layer."""
    return float(m.hidden_size), float(m.intermediate_size * (2 if m.gated_mlp else 1))


# ---- communication -------------------------------------------------------------------------


def ring_time_s(
    num_bytes: np.ndarray,
    group_size: np.ndarray,
    bytes_per_s: np.ndarray,
    *,
    all_reduce: bool,
    params: TimeParams,
) -> np.ndarray:
    """One ring collective on `num_bytes` (the full, unsharded size) over `group_size` ranks.

    all-reduce: 2(n-1)/n x bytes / bandwidth; all-gather or reduce-scatter: (n-1)/n x bytes /
    bandwidth; plus a fixed latency; 0 for a group of one. Source: Patarasuk & Yuan 2009 (ring
    all-reduce is bandwidth optimal); NCCL's bus-bandwidth definition (nccl-tests PERFORMANCE.md).
    """
    n = np.asarray(group_size, dtype=np.float64)
    factor = (2.0 if all_reduce else 1.0) * (n - 1.0) / np.maximum(n, 1.0)
    bw = np.asarray(bytes_per_s, dtype=np.float64) * params.collective_bandwidth_efficiency
    return np.where(n > 1, factor * num_bytes / bw + params.collective_latency_s, 0.0)


def bubble_fraction(pp: np.ndarray, num_microbatches: np.ndarray, virtual_stages: np.ndarray):
    """Share of a step the pipeline sits idle: (p-1) / (m v + p - 1).

    Source: Narayanan et al. 2021 Sec. 2.2.1 (bubble / ideal = (p-1)/m) and Sec. 2.2.2
    (interleaving divides the bubble by v). Assumes: 1F1B, equal stages.
    """
    p = np.asarray(pp, dtype=np.float64)
    mv = np.asarray(num_microbatches, dtype=np.float64) * np.asarray(virtual_stages)
    return (p - 1.0) / (mv + p - 1.0)


def offload_time_s(num_rows: int) -> np.ndarray:
    """CPU-offload traffic over PCIe: 0 until the grid has an offload field (hook)."""
    return np.zeros(num_rows)


def expert_all_to_all_time_s(num_rows: int) -> np.ndarray:
    """MoE expert-parallel all-to-all: 0 until ModelSpec has experts (hook)."""
    return np.zeros(num_rows)


# ---- the step ------------------------------------------------------------------------------


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
) -> dict[str, np.ndarray]:
    """Step time, throughput, MFU and cost of every row of `g` for model `m`.

    GPU values are scalars or per-row arrays (`time_inputs(profile)` gives them for one
    profile). peak_flops: dense 16-bit peak; fp32 rows use fp32_peak_flops. Returns float64
    columns: step_time_s = compute_time_s + communication_exposed_s + bubble_time_s (exactly);
    tokens_per_second (whole job: global batch tokens / step time); mfu (model FLOPs / (step
    time x GPUs x peak)); hfu (with recomputation); cost_per_million_tokens (USD); the parts
    (gemm_time_s, attention_time_s, memory_bound_time_s, optimizer_time_s, tp_exposed_s,
    cp_exposed_s, pp_p2p_s, dp_exposed_s, fsdp_exposed_s, offload_s, expert_s);
    model_flops_per_step, hardware_flops_per_step, achieved_flops_per_gpu; with `tokens`:
    time_to_train_s and cost_to_train_usd. Rows with an invalid layout are NaN.

    Source: see each helper and TimeParams. Assumes: equal pipeline stages (the last stage's
    LM head is spread over all), no straggler or data-loader stalls, no fp8, a homogeneous GPU
    type per row.
    """
    tp_ = params or TimeParams()
    reason = layout_reason(m, g)
    valid = reason == 0
    num_rows = len(reason)

    # Paper symbols: s sequence, b micro-batch, t tp, p pp, c cp, d dp, L layers, h hidden.
    s = g["seq_len"].astype(np.float64)
    b = g["micro_batch_size"].astype(np.float64)
    t = np.maximum(g["tp"], 1).astype(np.float64)
    p = np.maximum(g["pp"], 1).astype(np.float64)
    c = np.maximum(g["cp"], 1).astype(np.float64)
    v = np.maximum(g["virtual_stages"], 1).astype(np.float64)
    n = g["num_gpus"].astype(np.float64)
    d = np.maximum(g["num_gpus"] // np.maximum(g["tp"] * g["pp"] * g["cp"], 1), 1)
    gbs = np.where(g["global_batch_size"] > 0, g["global_batch_size"], g["micro_batch_size"] * d)
    num_micro = np.maximum(gbs // np.maximum(g["micro_batch_size"] * d, 1), 1).astype(np.float64)
    d = d.astype(np.float64)
    L, h, q, kv = m.num_hidden_layers, m.hidden_size, m.q_dim, m.kv_dim
    a = m.num_attention_heads
    prec = g["precision"].astype(np.int64)
    rc = g["recompute"].astype(np.int64)
    fw = g["framework"].astype(np.int64)
    zero = g["zero"]
    eager = g["attention"].astype(np.int64) == EAGER
    sp = g["sequence_parallel"] & (g["tp"] > 1)
    full = (rc == FULL).astype(np.float64)
    recompute_attention = ((rc == FULL) | (rc == SELECTIVE)).astype(np.float64)

    peak = np.where(prec == FP32, fp32_peak_flops, peak_flops).astype(np.float64)
    hbm = np.asarray(hbm_bytes_per_s, dtype=np.float64) * tp_.memory_bandwidth_efficiency
    gpn = np.asarray(gpus_per_node, dtype=np.float64)
    intra = np.asarray(intra_node_bytes_per_s, dtype=np.float64)
    inter = np.asarray(inter_node_bytes_per_s, dtype=np.float64)
    act_bytes = np.where(prec == FP32, 4.0, 2.0)  # activations in the compute dtype

    tokens_per_step = gbs.astype(np.float64) * s  # whole job
    tokens_per_micro = b * s / c  # one GPU's tokens in one micro-batch
    per_layer, head = matmul_parameters(m)

    # FLOPs per GPU per step. Linear: 2 fwd + 4 bwd per weight per token, +2 under full
    # recomputation (not the head); attention core per token and layer: QK^T 2sq + AV 2sq
    # forward, twice that backward, the forward again when recomputed.
    tokens_per_gpu = tokens_per_step / (d * c)  # the tokens one TP x PP group processes
    linear_flops = tokens_per_gpu * (L * per_layer * (6.0 + 2.0 * full) + 6.0 * head) / (t * p)
    attention_flops = tokens_per_gpu * L * s * q * (12.0 + 4.0 * recompute_attention) / (t * p)
    model_flops = tokens_per_step * model_flops_per_token(m, s)
    hardware_flops = (linear_flops + attention_flops) * n

    gemm_s = linear_flops / (peak * gemm_efficiency(tokens_per_micro * h / t, tp_))
    attention_s = np.where(
        eager,
        attention_flops / (peak * gemm_efficiency(tokens_per_micro * h / t, tp_)),
        attention_flops * tp_.causal_attention_fraction / (peak * tp_.flash_attention_efficiency),
    )
    # Memory-bound kernels: forward 1, backward 2, recomputed forward 1 (full; the attention
    # core only under selective).
    wh, wf = _width(m)
    pointwise_bytes = tp_.pointwise_bytes_per_width * (act_bytes / 2.0) * (
        wh / np.where(sp, t, 1.0) + wf / t
    )  # fmt: skip
    score_bytes = np.where(
        eager, tp_.eager_attention_bytes_per_score * (act_bytes / 2.0) * a * s / t, 0.0
    )
    layer_bytes = pointwise_bytes * (3.0 + full) + score_bytes * (3.0 + recompute_attention)
    memory_s = tokens_per_gpu * L / p * layer_bytes / hbm
    opt = g["optimizer"].astype(np.int64)
    local_params = m.num_parameters / (t * p) / np.where(zero >= 1, d * c, 1.0)
    optimizer_s = local_params * np.asarray(OPTIMIZER_STEP_BYTES_PER_PARAMETER)[opt] / hbm
    forward_backward_s = gemm_s + attention_s + memory_s
    fwd_share = 1.0 / (3.0 + full)  # forward : backward (+ recompute) compute

    # Tensor parallel: per layer and micro-batch 2 all-reduces forward, 2 backward (+2 when
    # the forward is recomputed) of b s h activations; with SP all-gather + reduce-scatter, the
    # same bytes. Source: Narayanan et al. 2021 Sec. 3.2; Korthikanti et al. 2022 Sec. 4.2.1.
    tp_bw = np.where(t > gpn, inter, intra)
    tp_calls = (4.0 + 2.0 * full) * L / p * num_micro
    tp_one = ring_time_s(tokens_per_micro * h * act_bytes, t, tp_bw, all_reduce=True, params=tp_)
    tp_exposed = tp_calls * tp_one * (1.0 - tp_.tp_overlap_fraction)

    # Context parallel: ring exchange of K and V, forward (c-1) chunks, backward K, V and their
    # gradients; hidden behind the attention core. Source: Liu et al. 2023 (Ring Attention);
    # Megatron-LM context parallelism (all-gather K,V forward, reduce-scatter dK,dV backward).
    cp_bw = np.where(t * c > gpn, inter, intra)
    kv_chunk = tokens_per_micro * 2.0 * kv / t * act_bytes
    cp_bytes = (c - 1.0) * kv_chunk * (3.0 + full) * L / p * num_micro
    cp_s = np.where(c > 1, cp_bytes / (cp_bw * tp_.collective_bandwidth_efficiency), 0.0)
    cp_exposed = np.maximum(cp_s - tp_.cp_overlap_fraction * attention_s, 0.0)

    # Pipeline point-to-point: one activation per micro-batch per virtual stage each way
    # (scatter/gather splits it over the TP ranks: Narayanan et al. 2021 Sec. 4.1).
    pp_bw = np.where(n / p >= gpn, inter, intra)
    p2p_bytes = tokens_per_micro * h * act_bytes / t
    pp_p2p = np.where(p > 1, 2.0 * v * num_micro * p2p_bytes / pp_bw, 0.0)

    pipelined = forward_backward_s + tp_exposed + cp_exposed + pp_p2p
    bubble = pipelined * (p - 1.0) / (num_micro * v)

    # Data parallel over dp x cp ranks (they hold the same weights). Gradients reduce in fp32
    # where the framework keeps fp32 gradients (AMP, Megatron main-grad, FSDP2 mixed precision).
    dp_group = d * c
    dp_bw = np.where(n / p > gpn, inter, intra)
    mixed = (prec == MIXED_BF16) | (prec == MIXED_FP16)
    amp_or_fp32 = (prec == FP32) | (prec == AMP_BF16) | (prec == AMP_FP16)
    fsdp2 = ((fw == HF) | (fw == TORCHTITAN)) & (zero == 3)
    grad_bytes = np.where(amp_or_fp32 | (mixed & ((fw == MEGATRON) | fsdp2)), 4.0, 2.0)
    param_bytes = np.where(amp_or_fp32, 4.0, 2.0)
    local_full = m.num_parameters / (t * p)
    reduce_s = ring_time_s(
        local_full * grad_bytes, dp_group, dp_bw, all_reduce=(zero == 0), params=tp_
    )  # fmt: skip
    gather_s = ring_time_s(local_full * param_bytes, dp_group, dp_bw, all_reduce=False, params=tp_)
    last_backward = forward_backward_s / num_micro * (1.0 - fwd_share)
    dp_exposed = np.where(
        zero <= 2,
        np.maximum(reduce_s - tp_.dp_overlap_fraction * last_backward, 0.0)
        + np.where((zero >= 1) & (dp_group > 1), gather_s, 0.0),  # ZeRO-1/2: updated weights
        0.0,
    )
    # ZeRO-3 / FSDP: every micro-batch gathers the weights forward and again backward and
    # reduce-scatters the gradients, prefetched behind compute. Source: Rajbhandari et al. 2020
    # Sec. 7.2.2 (1.5x DDP's volume); torch FSDP2 (reshard_after_forward=True).
    per_micro = forward_backward_s / num_micro
    fsdp_fwd = np.maximum(gather_s - tp_.fsdp_overlap_fraction * fwd_share * per_micro, 0.0)
    fsdp_bwd = np.maximum(
        gather_s + reduce_s - tp_.fsdp_overlap_fraction * (1.0 - fwd_share) * per_micro, 0.0
    )
    fsdp_exposed = np.where(zero == 3, (fsdp_fwd + fsdp_bwd) * num_micro, 0.0)

    offload = offload_time_s(num_rows)
    expert = expert_all_to_all_time_s(num_rows)
    compute = forward_backward_s + optimizer_s
    communication = tp_exposed + cp_exposed + pp_p2p + dp_exposed + fsdp_exposed + offload + expert
    step = compute + communication + bubble

    price = np.asarray(price_per_gpu_hour_usd, dtype=np.float64)
    tokens_per_second = tokens_per_step / step
    out = {
        "step_time_s": step,
        "compute_time_s": compute,
        "communication_exposed_s": communication,
        "bubble_time_s": bubble,
        "tokens_per_second": tokens_per_second,
        "mfu": model_flops / (step * n * peak),
        "hfu": hardware_flops / (step * n * peak),
        "cost_per_million_tokens": n * price / 3600.0 / tokens_per_second * 1e6,
        "gemm_time_s": gemm_s,
        "attention_time_s": attention_s,
        "memory_bound_time_s": memory_s,
        "optimizer_time_s": optimizer_s,
        "tp_exposed_s": tp_exposed,
        "cp_exposed_s": cp_exposed,
        "pp_p2p_s": pp_p2p,
        "dp_exposed_s": dp_exposed,
        "fsdp_exposed_s": fsdp_exposed,
        "offload_s": offload,
        "expert_s": expert,
        "model_flops_per_step": model_flops,
        "hardware_flops_per_step": hardware_flops,
        "achieved_flops_per_gpu": hardware_flops / (step * n),
    }
    if tokens is not None:
        time_to_train = np.asarray(tokens, dtype=np.float64) / tokens_per_second
        out["time_to_train_s"] = time_to_train
        out["cost_to_train_usd"] = n * price * time_to_train / 3600.0
    return {
        k: np.where(valid, np.broadcast_to(np.asarray(x, dtype=np.float64), (num_rows,)), np.nan)
        for k, x in out.items()
    }
