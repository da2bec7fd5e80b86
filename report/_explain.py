"""`trainmem explain SNAPSHOT`: a measured PyTorch memory snapshot (report/_snapshot.py,
attributed by report/_attribute.py) side by side with trainmem's prediction of the same job
(estimate's flags, or the job's own config files read as `trainmem check` reads them), the
component that differs most, and the overhead values that make the prediction match
(`--calibrate OUT.toml`, read back by `--overhead-file`).

What a snapshot cannot see is said, not guessed: the CUDA context and NCCL's own buffers live
outside PyTorch's allocator, so the measured framework_overhead is only what the allocator
served to them (cuBLAS workspaces, communicator buffers allocated through torch), compared
with the predicted cuBLAS workspace; the context is calibrated only from a device figure (the
OOM entry's free device memory, or `--device-used-gib` read from nvidia-smi / NVML at the
peak).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainmem.engine import COMPONENTS, GIB, Overheads, overheads_for
from trainmem.engine._overhead import num_communicators
from trainmem.hardware import get_gpu

from ._attribute import attribute
from ._options import Option, gib_to_bytes
from ._overhead_file import (
    check_output_path,
    overhead_items,
    overhead_toml,
    write_text_atomically,
)
from ._snapshot import load_snapshot, replay

CONFIG = Option(
    name="config",
    type=list[str] | None,
    default=None,
    http=False,
    help=(
        "The job's own config file (repeatable; read as `trainmem check` reads it): the "
        "prediction's job, estimate flags given too override it."
    ),
)
CALIBRATE = Option(
    name="calibrate",
    type=str | None,
    default=None,
    http=False,
    help="Write the overhead values that make the prediction match here (TOML, --overhead-file).",
)
DEVICE_USED_GIB = Option(
    name="device_used_gib",
    type=float | None,
    default=None,
    gt=0,
    le=1 << 20,
    http=False,
    help=(
        "Device memory used at the peak, GiB (nvidia-smi / NVML): calibrates the CUDA context "
        "and NCCL, which a snapshot cannot see (an OOM dump's free memory tells it otherwise)."
    ),
)
EXPLAIN_OWN_OPTIONS = (CONFIG, CALIBRATE, DEVICE_USED_GIB)
ALLOCATOR_VISIBLE_OVERHEAD = "cublas_workspace_bytes"
"""The part of the predicted framework_overhead that the allocator serves (and a snapshot
shows): the cuBLAS workspaces; the CUDA context and NCCL buffers are outside it."""


def explain_report(
    snapshot: str,
    *,
    predicted: Mapping[str, Any],
    overheads: Overheads,
    calibrate: str | None = None,
    device_used_gib: float | None = None,
    gpu_memory_bytes: int,
) -> dict[str, Any]:
    """`trainmem explain --json`: `measured` and `predicted` (component -> bytes, the names of
    estimate's `bytes`), their `_at_peak` breakdowns, `difference` (measured - predicted, the
    framework overhead against its allocator-visible part), `differs_most`, the measured and
    predicted peaks, and `calibration` (the overheads that make the prediction match; written
    to `calibrate` when given, after every check passed)."""
    if calibrate is not None:
        check_output_path(calibrate, what="calibrate")
    replayed = replay(load_snapshot(snapshot))
    measured = attribute(replayed)
    visible = {**predicted["bytes"], "framework_overhead": overheads.cublas_workspace_bytes}
    difference = {c: measured["measured"][c] - int(round(visible[c])) for c in COMPONENTS}
    most = max(COMPONENTS, key=lambda c: abs(difference[c]))
    outside = _outside_allocator_bytes(
        replayed.oom, measured, device_used_gib=device_used_gib, gpu_memory_bytes=gpu_memory_bytes
    )
    calibration = calibrated_overheads(
        measured, predicted, overheads, outside_allocator_bytes=outside
    )
    warnings = [*predicted.get("warnings", []), *replayed.warnings]
    warnings += _allocator_warnings(replayed.allocator_settings, predicted.get("config", {}))
    report = {
        "snapshot": snapshot,
        "measured": measured["measured"],
        "predicted": dict(predicted["bytes"]),
        "measured_at_peak": measured["measured_at_peak"],
        "predicted_at_peak": dict(predicted["breakdown_at_peak"]),
        "difference": difference,
        "differs_most": most,
        "measured_peaks": {
            "peak_allocated_bytes": measured["peak_allocated_bytes"],
            "peak_reserved_bytes": measured["peak_reserved_bytes"],
            "allocated_at_end_bytes": measured["allocated_at_end_bytes"],
            "reserved_at_end_bytes": measured["reserved_at_end_bytes"],
            "outside_allocator_bytes": outside,
        },
        "predicted_peaks": {
            k: predicted[k]
            for k in ("peak_allocated_bytes", "peak_reserved_bytes", "peak_device_bytes")
        },
        "not_in_snapshot": {
            "cuda_context_bytes": overheads.cuda_context_bytes,
            "nccl_bytes": predicted["bytes"]["framework_overhead"]
            - overheads.cuda_context_bytes
            - overheads.cublas_workspace_bytes,
        },
        "oom": replayed.oom,
        "trace": {
            "device": measured["device"],
            "num_trace_entries": measured["num_trace_entries"],
            "num_allocations": measured["num_allocations"],
            "phases_seen": measured["phases_seen"],
        },
        "calibration": calibration,
        "config": predicted.get("config", {}),
        "model": predicted.get("model"),
        "gpu": predicted.get("gpu", {}).get("name"),
        "warnings": warnings,
    }
    if calibrate is not None:
        comment = (
            f"trainmem explain {snapshot}: overheads that make the prediction match it\n"
            "(the --overhead keys; read back with --overhead-file)"
        )
        text = overhead_toml(calibration, comment=comment)
        write_text_atomically(calibrate, text, what="calibrate")
        report["calibrated_file"] = calibrate
    return report


def _allocator_warnings(settings: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """A warning when the snapshot's allocator (its allocator_settings) is not the one the
    prediction assumes (--allocator): their fragmentation differs."""
    if "expandable_segments" not in settings:
        return []
    ran = "expandable-segments" if settings["expandable_segments"] else "native"
    assumed = config.get("allocator", ran)
    if ran == assumed:
        return []
    return [
        f"the snapshot's allocator ran as {ran} (its allocator_settings), the prediction "
        f"assumes --allocator {assumed}: give --allocator {ran} to compare the fragmentation"
    ]


def _outside_allocator_bytes(
    oom: Mapping[str, int] | None,
    measured: Mapping[str, Any],
    *,
    device_used_gib: float | None,
    gpu_memory_bytes: int,
) -> int | None:
    """Device bytes outside PyTorch's allocator (CUDA context, NCCL, other processes): the
    device's used memory less the allocator's reserved bytes, from `--device-used-gib` (at the
    peak) or an OOM entry (the GPU's memory less its free bytes then, at the reserved bytes at
    the end: the dump's moment); None when neither says."""
    if device_used_gib is not None:
        used = gib_to_bytes(device_used_gib) or 0
        return max(used - int(measured["peak_reserved_bytes"]), 0)
    if oom is not None and oom.get("device_free_bytes"):
        used = gpu_memory_bytes - int(oom["device_free_bytes"])
        return max(used - int(measured["reserved_at_end_bytes"]), 0)
    return None


def calibrated_overheads(
    measured: Mapping[str, Any],
    predicted: Mapping[str, Any],
    overheads: Overheads,
    *,
    outside_allocator_bytes: int | None,
) -> dict[str, float]:
    """The overhead values (Overheads' names) that make this prediction match the snapshot:
    - fragmentation: engine/_peaks.py fragmentation_bytes is max(fraction x non-persistent,
      factor x largest block) (native allocator; expandable segments: its fraction alone), so
      scaling the fraction and the factor by measured / predicted scales it exactly;
    - cublas_workspace_bytes: the allocator-visible overhead the frames show (when any);
    - cuda_context_bytes (and nccl_bytes_per_communicator where the context alone cannot take
      it): the bytes outside the allocator, when known (_outside_allocator_bytes).
    Fractions stay below 1 (Overheads' rule)."""
    out: dict[str, float] = {}
    measured_frag = float(measured["measured"]["fragmentation"])
    predicted_frag = float(predicted["bytes"]["fragmentation"])
    expandable = predicted.get("config", {}).get("allocator") == "expandable-segments"
    if predicted_frag > 0 and measured["peak_allocated_bytes"] > 0:
        scale = measured_frag / predicted_frag
        if expandable:
            key = "expandable_segments_fragmentation_fraction"
            out[key] = min(getattr(overheads, key) * scale, 0.999)
        else:
            out["fragmentation_fraction"] = min(overheads.fragmentation_fraction * scale, 0.999)
            out["fragmentation_largest_block_factor"] = (
                overheads.fragmentation_largest_block_factor * scale
            )
    visible = measured["measured"]["framework_overhead"]
    if visible > 0:
        out["cublas_workspace_bytes"] = float(visible)
    if outside_allocator_bytes is not None:
        config = predicted.get("config", {})
        comms = float(
            num_communicators(
                dp=predicted.get("details", {}).get("dp", 1),
                tp=config.get("tp", 1),
                pp=config.get("pp", 1),
                cp=config.get("cp", 1),
            )
        )
        nccl = overheads.nccl_bytes_per_communicator * comms
        if outside_allocator_bytes >= nccl:
            out["cuda_context_bytes"] = float(outside_allocator_bytes - nccl)
        else:  # less than the NCCL default alone: the context's default kept, NCCL shrunk
            context = min(overheads.cuda_context_bytes, float(outside_allocator_bytes))
            out["cuda_context_bytes"] = context
            out["nccl_bytes_per_communicator"] = (outside_allocator_bytes - context) / comms
    return out


def job_overheads(
    gpu: str, hardware_dir: str | None, overhead: list[str] | None, overhead_file: str | None
) -> tuple[Overheads, int]:
    """The overheads the prediction used (the GPU's defaults, the file's, the flags') and the
    GPU's memory in bytes."""
    from ._estimate import key_numbers

    profile = get_gpu(gpu, hardware_dir)
    base = overheads_for(profile.arch, cuda_context_bytes=profile.cuda_context_bytes)
    items = overhead_items(overhead_file, overhead)
    return base.with_overrides(key_numbers("--overhead", items, Overheads.names())), int(
        profile.memory_bytes
    )


def _unit(report: Mapping[str, Any]) -> tuple[str, float]:
    """GiB, or MiB where every figure is under 1 GiB (a small job's table stays readable)."""
    figures = [*report["measured"].values(), *report["predicted"].values()]
    return ("GiB", GIB) if max(abs(v) for v in figures) >= GIB else ("MiB", 2.0**20)


def explain_table(report: Mapping[str, Any]) -> str:
    """The human output: measured vs predicted per component, the peaks, the component that
    differs most, what the snapshot cannot see, and the calibration."""
    unit, size = _unit(report)
    rows = [f"{'component':<20} {'measured':>10} {'predicted':>10} {'difference':>11}  ({unit})"]
    for c in COMPONENTS:
        m, p, d = report["measured"][c], report["predicted"][c], report["difference"][c]
        rows.append(f"{c:<20} {m / size:>10.3f} {p / size:>10.3f} {d / size:>+11.3f}")
    mp, pp = report["measured_peaks"], report["predicted_peaks"]
    most = report["differs_most"]
    context = report["not_in_snapshot"]["cuda_context_bytes"]
    rows += [
        "",
        f"peak allocated: measured {mp['peak_allocated_bytes'] / size:.3f} {unit}, "
        f"predicted {pp['peak_allocated_bytes'] / size:.3f} {unit}",
        f"peak reserved:  measured {mp['peak_reserved_bytes'] / size:.3f} {unit}, "
        f"predicted {pp['peak_reserved_bytes'] / size:.3f} {unit}",
        f"differs most: {most} ({report['difference'][most] / size:+.3f} {unit})",
        "framework_overhead: measured is what the allocator served (cuBLAS workspace, NCCL via "
        "torch), compared with the predicted cuBLAS workspace; the CUDA context "
        f"({context / GIB:.2f} GiB predicted) and NCCL's own buffers are not in a snapshot",
    ]
    if report["oom"]:
        rows.append(
            f"oom: a request of {report['oom']['requested_bytes'] / GIB:.3f} GiB failed with "
            f"{report['oom']['device_free_bytes'] / GIB:.3f} GiB free on the device"
        )
    if report["calibration"]:
        shown = ", ".join(f"{k}={v:.6g}" for k, v in report["calibration"].items())
        rows.append(f"calibration: {shown}")
    if report.get("calibrated_file"):
        rows.append(f"wrote {report['calibrated_file']} (use it with --overhead-file)")
    rows += [f"warning: {w}" for w in report["warnings"]]
    return "\n".join(rows)
