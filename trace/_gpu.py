"""`trainmem trace --real-gpu`: the same step on a real CUDA device, with the allocator's figures.

The step (warm-up, then the measured one) runs on real tensors on `cuda`; before the measured
step and after each of its phases the device is synchronised and
torch.cuda.max_memory_allocated / max_memory_reserved are read, then the peaks reset, so each
phase reports its own maxima; `device_used_bytes` is what the whole device has in use at the
phase's end (torch.cuda.mem_get_info: total - free; it includes the CUDA context, cuBLAS
workspaces and any other process on the GPU, as nvidia-smi does). The byte tracker runs too, so
the report also has the traced figures on the real device.

These are the figures the overhead model is calibrated against (README, "trace"): reserved -
allocated is the allocator's fragmentation, device used - reserved the CUDA context.

Source: torch/cuda/memory.py (max_memory_allocated, max_memory_reserved,
reset_peak_memory_stats, mem_get_info).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PHASES = ("forward", "backward", "optimizer_step")


class CudaPhaseStats:
    """on_phase_end callback for run_step: per-phase CUDA allocator maxima."""

    def __init__(self) -> None:
        self.phases: dict[str, dict[str, int]] = {}

    def __call__(self, name: str) -> None:
        import torch

        torch.cuda.synchronize()
        if name in PHASES:
            free, total = torch.cuda.mem_get_info()
            self.phases[name] = {
                "max_allocated_bytes": int(torch.cuda.max_memory_allocated()),
                "max_reserved_bytes": int(torch.cuda.max_memory_reserved()),
                "device_used_bytes": int(total - free),
            }
        torch.cuda.reset_peak_memory_stats()


def check_cuda() -> None:
    """One-line ValueError when there is no CUDA device to run on."""
    try:
        import torch
    except ImportError:  # pragma: no cover - depends on the environment
        raise ValueError("real-gpu: needs torch with CUDA: pip install 'trainmem[trace]'") from None
    if not torch.cuda.is_available():
        build = "a CPU-only build" if not torch.backends.cuda.is_built() else "no device visible"
        raise ValueError(
            f"real-gpu: no CUDA device (torch {torch.__version__}: {build}); "
            "run it on a machine with a GPU"
        )


def real_gpu_step(run: Callable[[Callable[[str], None]], dict[str, Any]]) -> dict[str, Any]:
    """run(on_phase_end) runs the step on the real device; returns the CUDA figures and the
    traced ones: {"device", "torch", "phases": {phase: {max_allocated_bytes,
    max_reserved_bytes, device_used_bytes}}, "peak_allocated_bytes", "peak_reserved_bytes",
    "peak_device_bytes", "traced": run's result}."""
    check_cuda()
    import torch

    stats = CudaPhaseStats()
    traced = run(stats)
    phases = stats.phases
    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "phases": phases,
        "peak_allocated_bytes": max(p["max_allocated_bytes"] for p in phases.values()),
        "peak_reserved_bytes": max(p["max_reserved_bytes"] for p in phases.values()),
        "peak_device_bytes": max(p["device_used_bytes"] for p in phases.values()),
        "traced": traced,
    }


def differences(real: dict[str, Any], estimate: dict[str, Any] | None) -> dict[str, Any]:
    """estimate - measured (bytes) and estimate / measured - 1 for allocated, reserved, device."""
    if not estimate:
        return {}
    out: dict[str, Any] = {}
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "peak_device_bytes"):
        got, want = real.get(key), estimate.get(key)
        if got and want is not None:
            out[key] = {"estimate_minus_measured": want - got, "relative_error": want / got - 1.0}
    return out
