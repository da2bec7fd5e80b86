"""The constants of the step-time model (`TimeParams`) and the GPU values it reads.

Each constant is a named, overridable field with its source; the fitted ones are refitted by
`python -m bench.calibrate_time --fit` against published throughput tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Protocol

MIN_EFFICIENCY = 0.01
"""The least fraction of a peak an efficiency may say (a kernel at 1e-320 of its peak is a typo:
it made the step time infinite)."""
TIME_PARAM_CEILINGS: dict[str, float] = {
    "gemm_half_work": 1e12,
    "attention_flops_per_hbm_byte": 1e6,
    "pointwise_bytes_per_width": 1e4,
    "eager_attention_bytes_per_score": 1e3,
    "ring_step_latency_s": 1.0,
    "cpu_optimizer_params_per_s": 1e15,
    "fp8_cast_bytes_per_element": 100.0,
    "rollout_step_overhead_s": 1.0,
}
"""The largest value of each unbounded time constant that still describes hardware: about a
million times its default or more (a ring step of a second, 10^15 parameters a second); beyond
it the step time overflows to infinity or means nothing."""


def _ceiling(name: str) -> float:
    """TIME_PARAM_CEILINGS' value of `name`; 10^15 for a constant it does not list."""
    return TIME_PARAM_CEILINGS.get(name, 1e15)


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeParams:
    """Constants of the step-time model; fitted ones say so (bench/calibrate_time.py refits
    them). Override one from a measured run: README, "Step time and cost"."""

    gemm_efficiency_max: float = 0.76
    """Fraction of the dense tensor-core peak that large GEMMs sustain in training.
    Source: fitted to Narayanan et al. 2021 Table 1, torchtitan's H100 table and MosaicML
    llm-foundry's A100/H100 tables (bench/calibrate_time.py); cuBLAS reaches 70-90% of peak on
    large GEMMs."""
    gemm_half_work: float = 8.0e5
    """Per-GPU work (tokens per micro-batch x hidden_size / tp) at which GEMM efficiency is half
    its maximum: thin micro-batches and TP shards run short, launch-bound kernels.
    Source: the saturating shape of Narayanan et al. 2021 Fig. 7 (+30% throughput from
    micro-batch 1 to 16); the value fitted as above."""
    flash_attention_efficiency: float = 0.75
    """Tensor-core ceiling of fused (flash) attention, as a fraction of the dense peak.
    Source: Shah et al. 2024 (FlashAttention-3), up to 75% of H100 peak."""
    attention_flops_per_hbm_byte: float = 78.0
    """Fused attention throughput that scales with the memory system rather than the tensor
    cores: FLOP/s per byte/s of effective HBM bandwidth, added as a second, serial term.
    FlashAttention-2 reaches 50-73% of A100 peak but only ~35% of H100's (Shah et al. 2024,
    Sec. 1): from A100 to H100 its throughput grows like HBM bandwidth (1.6x), not like the
    tensor-core peak (3.2x). The value fitted as above (MosaicML rows at 16k-64k tokens)."""
    causal_attention_fraction: float = 0.5
    """Share of the s x s score FLOPs a fused causal kernel executes (it skips masked blocks);
    eager attention computes all of them, and MFU counts all of them (PaLM Appendix B).
    Source: Dao 2023 (FlashAttention-2) Sec. 3.1.1."""
    pointwise_bytes_per_width: float = 27.0
    """HBM bytes the memory-bound kernels of one layer's forward pass move per token per unit of
    width (hidden_size + the MLP width, x2 when gated) in 16-bit activations (fp32: x2); the
    backward moves twice that, recomputation repeats the forward. Source: fitted as above;
    counting kernels gives 20-50 for fused implementations (Megatron, MPT), more for eager
    HF code (RMSNorm upcasts to fp32)."""
    eager_attention_bytes_per_score: float = 7.8
    """HBM bytes per attention-score element (head x query x key) in one forward pass of eager
    attention: scores written, masked softmax read and written, dropout, the AV read (13 bytes
    unfused in 16 bits, fewer with Megatron's fused scale-mask-softmax). Source: fitted to
    Narayanan et al. 2021 Table 1 (whose small models spend most on it)."""
    memory_bandwidth_efficiency: float = 0.80
    """Fraction of peak HBM bandwidth that elementwise kernels and the optimizer reach.
    Source: NVIDIA CUDA C++ Best Practices Guide, "Effective bandwidth" (copy kernels reach
    80-90% of the theoretical figure)."""
    collective_bandwidth_efficiency: float = 0.80
    """Fraction of a link's unidirectional bandwidth a NCCL collective reaches (bus bandwidth).
    Source: nccl-tests all_reduce_perf, ~230-240 GB/s busbw on A100 NVLink (300 GB/s)."""
    ring_step_latency_s: float = 5.0e-6
    """Latency of one step of a ring collective (n-1 steps per pass over n ranks): it makes
    many small collectives over many ranks slow. Source: nccl-tests small-message latency, a
    few microseconds per hop; a judgement."""
    dp_overlap_fraction: float = 0.8
    """Fraction of the last micro-batch's backward that hides the data-parallel gradient
    reduction (DDP / ZeRO-1/2 reduce buckets as gradients become ready; earlier micro-batches
    accumulate locally). Source: Li et al. 2020 (PyTorch Distributed, VLDB) Sec. 3.2.3; a
    judgement."""
    fsdp_overlap_fraction: float = 0.75
    """Fraction of each micro-batch's forward (backward) compute that hides the ZeRO-3/FSDP
    parameter all-gathers (and gradient reduce-scatters). Source: solved from the ZeRO-3 rows
    of Narayanan et al. 2021 Table 2 (175B GPT on 384 and 1536 A100s: 144 and 44 TFLOP/s per
    GPU, same traffic per GPU, 4x the compute on 384)."""
    tp_overlap_fraction: float = 0.0
    """Fraction of tensor-parallel collectives hidden behind GEMMs: 0 for Megatron-LM (2021) and
    torchtitan without async TP (Narayanan et al. 2021 Sec. 3.2); async TP hides most."""
    overlap_slowdown_fraction: float = 0.2
    """Share of overlapped communication time that still lengthens the step: NCCL kernels take
    SMs and HBM bandwidth from the compute they overlap. Source: Jangda et al. 2022 (CoCoNet,
    ASPLOS) and Wang et al. 2023 (ASPLOS, "Overlap communication with dependent computation")
    report 10-30% slowdowns of overlapped GEMMs; set so that torchtitan's 128-GPU run is slower
    per GPU than its 8-GPU run (Tables 3 vs 1)."""
    pcie_efficiency: float = 0.80
    """Fraction of the host link's peak that pinned host-device copies reach. Source: CUDA
    samples bandwidthTest, ~25 GB/s of PCIe 4.0 x16's 31.5 and ~50 of Gen5's 63."""
    cpu_optimizer_params_per_s: float = 2.0e9
    """Parameters per second one GPU's share of the host updates with an offloaded optimizer.
    Source: Ren et al. 2021 (ZeRO-Offload) Sec. 5: the vectorized CPU-Adam updates a
    billion-parameter model in well under a second on a dual-socket server, 5-7x torch's CPU
    AdamW; a judgement, not fitted."""
    fp8_gemm_efficiency_ratio: float = 0.83
    """Fraction of the 16-bit GEMMs' efficiency (gemm_efficiency, of their peak) that fp8
    GEMMs reach of the fp8 peak, under `fp8-mixed`. Source: a judgement from cuBLASLt's
    large-GEMM throughput on H100 SXM (about 1.3 of 1.98 PFLOP/s dense fp8 against 0.75 of
    0.99 in bf16); not fitted (no step time of an fp8 run in the evidence)."""
    fp8_cast_bytes_per_element: float = 5.0
    """HBM bytes per element an fp8 recipe moves to cast a tensor to fp8 with a dynamic
    (tensorwise) scale: the amax pass reads the 16-bit tensor (2), the cast reads it again (2)
    and writes fp8 (1). Source: torchao float8 float8_scaling_utils.py hp_tensor_to_float8_dynamic
    (tensor_to_scale, then the scaled cast); torch.compile fuses the two reads (3 bytes), which
    this ignores."""
    rollout_step_overhead_s: float = 0.015
    """Time a rollout engine's decode step takes beyond reading its weights and KV cache:
    the scheduler, the sampler over the vocabulary and the kernel launches of one step (the
    logs' vLLM runs eager: no CUDA graphs). Source: fitted to verl's timing_s/gen of five runs
    on 8 H100s (dingxianzhong/play-verl 7716a61: Qwen2.5-0.5B GRPO and PPO, Qwen2-7B PPO at
    rollout tp 1 and 2; eric-haibin-lin/verl-data cc49946: Qwen2.5-7B LoRA GRPO at tp 2), the
    geometric mean of estimate / measured at 1; the runs' own per-step overheads range from
    about 7 ms (7B, tp 1) to 33 ms (0.5B, 2048 responses): bench/rl_time.py prints each."""
    cp_overlap_fraction: float = 0.8
    """Fraction of the attention core that hides the context-parallel K/V ring exchange.
    Source: Liu et al. 2023 (Ring Attention) Sec. 3, blockwise overlap; a judgement."""

    def __post_init__(self) -> None:
        errors = []
        for name in self.names():
            value = getattr(self, name)
            if "efficiency" in name:  # below 1% of a peak no kernel runs: a typo, not a GPU
                if not MIN_EFFICIENCY <= value <= 1.0:  # NaN fails too
                    errors.append(f"{name} must be in [{MIN_EFFICIENCY}, 1], got {value}")
            elif name == "causal_attention_fraction":
                if not 0.0 < value <= 1.0:
                    errors.append(f"{name} must be in (0, 1], got {value}")
            elif name.endswith("_fraction"):
                if not 0.0 <= value <= 1.0:
                    errors.append(f"{name} must be in [0, 1], got {value}")
            elif not (math.isfinite(value) and 0.0 <= value <= _ceiling(name)):
                errors.append(f"{name} must be finite, >= 0 and <= {_ceiling(name):g}, got {value}")
        for name in ("attention_flops_per_hbm_byte", "cpu_optimizer_params_per_s"):
            if not getattr(self, name) > 0.0:  # divisors: 0 made the step time infinite
                errors.append(f"{name} must be > 0")
        if errors:
            raise ValueError("time-param: " + "; ".join(errors))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def with_overrides(self, overrides: dict[str, float]) -> TimeParams:
        """A copy with some fields replaced; an unknown key raises ValueError naming it."""
        if not overrides:
            return self  # immutable: the copy would equal it
        unknown = sorted(set(overrides) - set(self.names()))
        if unknown:
            raise ValueError(
                f"time-param: unknown key '{unknown[0]}'; allowed: {', '.join(self.names())}"
            )
        return replace(self, **{k: float(v) for k, v in overrides.items()})


class GpuLike(Protocol):
    """What the time model reads from a GPU profile (hardware.GpuProfile has these fields)."""

    @property
    def bf16_flops(self) -> float: ...
    @property
    def fp16_flops(self) -> float: ...
    @property
    def fp32_flops(self) -> float: ...
    @property
    def hbm_bandwidth_bytes_per_s(self) -> float: ...
    @property
    def intra_node_bandwidth_bytes_per_s(self) -> float: ...
    @property
    def inter_node_bandwidth_bytes_per_s(self) -> float: ...
    @property
    def gpus_per_node(self) -> int: ...
    @property
    def pcie_bandwidth_bytes_per_s(self) -> float: ...
    @property
    def price_per_hour_usd(self) -> float: ...


def time_inputs(gpu: GpuLike, *, price_per_hour_usd: float | None = None) -> dict[str, float]:
    """The GPU keyword arguments of `estimate_time` for one profile (price overridable).

    peak_flops is the dense 16-bit peak (bf16, or fp16 where a card has no bf16);
    fp8_peak_flops the dense fp8 peak (0 where the card has none), fp4_peak_flops the dense fp4
    one (0 where the card has none, or a profile made before the field: getattr's default).
    """
    price = gpu.price_per_hour_usd if price_per_hour_usd is None else price_per_hour_usd
    return {
        "peak_flops": float(gpu.bf16_flops if gpu.bf16_flops > 0 else gpu.fp16_flops),
        "fp8_peak_flops": float(getattr(gpu, "fp8_flops", 0.0)),
        "fp4_peak_flops": float(getattr(gpu, "fp4_flops", 0.0)),
        "fp32_peak_flops": float(gpu.fp32_flops),
        "hbm_bytes_per_s": float(gpu.hbm_bandwidth_bytes_per_s),
        "intra_node_bytes_per_s": float(gpu.intra_node_bandwidth_bytes_per_s),
        "inter_node_bytes_per_s": float(gpu.inter_node_bandwidth_bytes_per_s),
        "gpus_per_node": float(gpu.gpus_per_node),
        "pcie_bytes_per_s": float(gpu.pcie_bandwidth_bytes_per_s),
        "price_per_gpu_hour_usd": float(price),
    }
