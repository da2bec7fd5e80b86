"""`trainmem trace`: the command's work as a function of its fields (one JSON-able dict).

The report carries the keys of `estimate --json` that a measurement can fill (num_parameters,
config, bytes, peak_allocated_bytes, peak_phase, phases, details) from the trace, and next to
them `measured` (the raw trace), `estimate` (the formulas' figures for the same flags, for a model
the formulas know or a profile just saved), `relative_error` (estimate / measured - 1),
`estimate_report` (the whole `estimate --json`), and with --save-profile `profile`, with
--real-gpu `real_gpu` and `real_gpu_vs_estimate`.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmem.catalog import model_config_dict
from trainmem.engine import ATTENTION
from trainmem.hardware import GIB
from trainmem.report import choice

MIB = 2**20

COMPARED = (
    # (measured key, estimate key)
    ("parameters_bytes", "parameters_bytes"),
    ("gradients_bytes", "gradients_bytes"),
    ("optimizer_states_bytes", "optimizer_states_bytes"),
    ("activations_bytes", "activations_bytes"),
    ("peak_allocated_bytes", "peak_allocated_bytes"),
)


def _estimate_figures(report: dict[str, Any]) -> dict[str, Any]:
    """The comparable figures of an `estimate --json` report."""
    b = report["bytes"]
    return {
        # the trace cannot tell fp32 working weights from master weights: compare their sum
        "parameters_bytes": b["parameters"] + b["master_weights"],
        "gradients_bytes": b["gradients"],
        "optimizer_states_bytes": b["optimizer_states"],
        "activations_bytes": b["activations"],
        "peak_allocated_bytes": report["peak_allocated_bytes"],
        "peak_reserved_bytes": report["peak_reserved_bytes"],
        "peak_device_bytes": report["peak_device_bytes"],
    }


def _contract(measured: dict[str, Any]) -> dict[str, Any]:
    """The estimate --json keys, filled from a measurement."""
    return {
        "num_parameters": measured["num_parameters"],
        "num_trainable_parameters": measured["trainable_parameters"],
        "bytes": {
            "parameters": measured["parameters_bytes"],
            "master_weights": 0,
            "gradients": measured["gradients_bytes"],
            "optimizer_states": measured["optimizer_states_bytes"],
            "activations": measured["activations_bytes"],
            "transient": measured["transient_bytes"],
        },
        "peak_allocated_bytes": measured["peak_allocated_bytes"],
        "peak_phase": measured["peak_phase"],
        "phases": measured["phases"],
        "details": {
            "activations_per_layer": measured["activations_per_layer_bytes"],
            "activations_outside_layers": measured["activations_outside_layers_bytes"],
            "activations_autocast_weight_copies": measured[
                "activations_autocast_weight_copies_bytes"
            ],
            "num_layers": measured["num_layers"],
            "layer_class": measured["layer_class"],
        },
    }


def trace_report(
    *,
    model: str,
    module: str | None,
    seq_len: int,
    micro_batch_size: int,
    precision: str,
    optimizer: str,
    recompute: str,
    attention: str,
    sdpa_kernel: str,
    device: str,
    num_gpus: int,
    zero: int,
    gpu: str,
    tp: int = 1,
    sequence_parallel: bool = False,
    save_profile: str | None,
    profile_seq_lens: str | None,
    profile_name: str | None,
    real_gpu: bool,
    estimate_defaults: dict[str, Any],
    lora_rank: int = 0,
    lora_targets: str = "all-linear",
    qlora: bool = False,
    snapshot: str | None = None,
    images_per_sample: int = 0,
    image_size: int = 448,
    freeze_vision: bool = False,
    lora_scope: str = "auto",
    timeout_s: float | str | None = None,
    max_memory_gb: float | str | None = None,
    in_process: bool = False,
) -> dict[str, Any]:
    """Trace the step (and optionally a second length, a real GPU) and compare with the
    estimate; `snapshot`: also write the traced step there as a PyTorch memory snapshot.

    By default the whole report is made in one bounded child process (trace/_child.py): it
    is stopped, with every process the model started, after `timeout_s` seconds or over
    `max_memory_gb` (else $TRAINMEM_TRACE_TIMEOUT / $TRAINMEM_TRACE_MAX_MEMORY_GB, else 1800 s
    and no cap), and any end but an answer (a signal, os._exit) is one ValueError line.
    `in_process=True` traces in this process instead, unbounded (a trace still moves to one
    child where this process's autograd engine cannot see the fake device); a model's
    RuntimeError, AssertionError, NotImplementedError or TypeError is then one ValueError
    line too."""
    fields = {k: v for k, v in locals().items() if k not in _BOUND_PARAMETERS}
    if not in_process:
        from ._bounds import resolve_bounds

        bounds = resolve_bounds(
            timeout_s, max_memory_gb, timeout_name="timeout_s", memory_name="max_memory_gb"
        )
        return bounded_trace_report(fields, bounds)
    try:
        return _trace_report(_TraceJob(**fields))
    except (RuntimeError, AssertionError, NotImplementedError, TypeError) as exc:
        # A model code path the fake device cannot run: one line, not torch's traceback.
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ValueError(
            f"trace: the step failed on fake tensors: {type(exc).__name__}: {first}"
        ) from None


_BOUND_PARAMETERS = ("timeout_s", "max_memory_gb", "in_process")
"""trace_report's parameters that say where it runs, not what it traces."""


def bounded_trace_report(fields: dict[str, Any], bounds: Any) -> dict[str, Any]:
    """trace_report(**fields) in one child process under `bounds` (a _child.Bounds: the CLI
    names them by its flags). The flags are checked here first (_check; the --save-profile file
    included, the real GPU in the child), so that bad input is refused before a child starts."""
    from ._child import run_in_child

    _check(_TraceJob(**fields), gpu=False)
    return run_in_child("trace_report", {**fields, "in_process": True}, bounds=bounds)


def _trace_report(job: _TraceJob) -> dict[str, Any]:
    """trace_report in this process."""
    _check(job)
    # The formulas' estimate first: bad flags fail before a long trace.
    estimate_full = None if job.module else _estimate(job, None)
    if estimate_full is not None and _is_vlm(job):
        check_host_memory(int(estimate_full["peak_allocated_bytes"]))
    profile_info: dict[str, Any] | None = None
    if job.save_profile:
        measured, profile_info = _trace_and_save_profile(job)
        if job.module:
            estimate_full = _estimate(job, job.save_profile)
    else:
        measured = _trace(job, job.seq_len)
    report = _report(job, measured, estimate_full)
    if profile_info is not None:
        report["profile"] = profile_info
    if job.real_gpu:
        report.update(_real_gpu(functools.partial(_trace, job), job.seq_len, report["estimate"]))
    return report


@dataclass(frozen=True, slots=True, kw_only=True)
class _TraceJob:
    """The fields of one `trainmem trace` call (`trace_report`'s parameters), and the groups of
    them that the trace, the estimate and the report's `config` share."""

    model: str
    module: str | None
    seq_len: int
    micro_batch_size: int
    precision: str
    optimizer: str
    recompute: str
    attention: str
    sdpa_kernel: str
    device: str
    num_gpus: int
    zero: int
    gpu: str
    tp: int
    sequence_parallel: bool
    save_profile: str | None
    profile_seq_lens: str | None
    profile_name: str | None
    real_gpu: bool
    estimate_defaults: dict[str, Any]
    lora_rank: int
    lora_targets: str
    qlora: bool
    snapshot: str | None
    images_per_sample: int = 0
    image_size: int = 448
    freeze_vision: bool = False
    lora_scope: str = "auto"

    @property
    def images(self) -> dict[str, Any]:
        """A vision-language model's image fields; none for a text model's job (its calls
        stay as they were)."""
        if not (self.images_per_sample or self.freeze_vision):
            return {}
        return {
            "images_per_sample": self.images_per_sample,
            "image_size": self.image_size,
            "freeze_vision": self.freeze_vision,
        }

    @property
    def parallel(self) -> dict[str, Any]:
        return {
            "num_gpus": self.num_gpus,
            "zero": self.zero,
            "tp": self.tp,
            "sequence_parallel": self.sequence_parallel,
        }

    @property
    def common(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "recompute": self.recompute,
            "optimizer": self.optimizer,
        }

    @property
    def lora(self) -> dict[str, Any]:
        """The LoRA flags (trace/_lora.py); none without LoRA: the plain trace's calls stay as
        they were."""
        if not (self.lora_rank or self.qlora):
            return {}
        return {"lora_rank": self.lora_rank, "lora_targets": self.lora_targets}

    @property
    def vision_lora(self) -> dict[str, Any]:
        """Which of a vision-language model's modules LoRA may adapt (engine lora_scope), where
        not the default: none without LoRA (a text model's job is refused another scope)."""
        if not self.lora or self.lora_scope == "auto":
            return {}
        return {"lora_scope": self.lora_scope}


def _check(job: _TraceJob, *, gpu: bool = True) -> None:
    """Refuse the flags a trace cannot run with (one ValueError) before anything is traced;
    a real GPU is looked for (with `gpu`: it imports torch) before the fake trace, not after
    it, and the --save-profile file's folder before the two traces."""
    from ._core import DEVICES
    from ._save_profile import check_save_profile
    from ._sdpa import SDPA_KERNELS

    check_save_profile(job.save_profile)
    if job.real_gpu:
        from ._gpu import check_cuda

        if job.num_gpus > 1:
            raise ValueError("real-gpu: one GPU only (a multi-GPU job is traced on fake devices)")
        if gpu:
            check_cuda()
    choice("recompute", job.recompute, ("none", "full"))
    choice("attention", job.attention, ATTENTION)
    choice("sdpa-kernel", job.sdpa_kernel, SDPA_KERNELS)
    choice("device", job.device, DEVICES)
    if job.seq_len < 1 or job.micro_batch_size < 1:
        raise ValueError("seq-len and micro-batch-size: must be >= 1")
    if job.snapshot is not None:
        from trainmem.report._overhead_file import check_output_path

        if job.module or job.num_gpus > 1 or job.zero or job.tp > 1 or job.save_profile:
            raise ValueError(
                "snapshot: one --model on one fake device only (no --module, --num-gpus, "
                "--zero, --tp or --save-profile)"
            )
        check_output_path(job.snapshot, what="snapshot")
    if job.num_gpus > 1 or job.zero or job.tp > 1:
        from ._dist import check_parallel

        check_parallel(**job.parallel, module=job.module)
    _check_vision(job)
    if job.lora_rank or job.qlora:
        from ._lora import check_lora

        check_lora(
            lora_rank=job.lora_rank, lora_targets=job.lora_targets, qlora=job.qlora, tp=job.tp
        )
        if job.module or job.save_profile or job.real_gpu:
            raise ValueError(
                "lora-rank: traces --model on fake devices only (no --module, "
                "--save-profile or --real-gpu)"
            )


HOST_MEMORY_SHARE = 0.8
"""The share of this machine's available memory a real-tensor CPU trace may take (the step's
estimated peak; the allocator's slack and Python's own come on top)."""


def check_host_memory(peak_bytes: int) -> None:
    """Refuse (one ValueError) a real-tensor CPU step whose estimated peak exceeds
    HOST_MEMORY_SHARE of the memory this machine has available (os.sysconf)."""
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # not on this platform: the child's bounds still apply
        return
    if peak_bytes > HOST_MEMORY_SHARE * available:
        raise ValueError(
            f"model: a vision-language model's step runs on real CPU tensors and needs about "
            f"{peak_bytes / 2**30:.1f} GiB (the estimate's peak); this machine has "
            f"{available / 2**30:.1f} GiB available: trace a smaller config (fewer layers, "
            "a narrower width) or estimate it"
        )


def _is_vlm(job: _TraceJob) -> bool:
    """Whether --model is a vision-language model (a config the VLM step traces)."""
    if job.module:
        return False
    from trainmem.engine._vision import is_vlm_config

    return is_vlm_config(model_config_dict(job.model))


def _check_vision(job: _TraceJob) -> None:
    """A vision-language model's step (trace/_vlm.py) runs on one process's real CPU tensors,
    full fine-tuning or peft LoRA; its image flags need one. One ValueError naming the flag."""
    from trainmem.engine._vocab import LORA_SCOPES

    choice("lora-scope", job.lora_scope, LORA_SCOPES)
    vlm = _is_vlm(job)
    if not vlm:
        if job.images_per_sample or job.freeze_vision:
            flag = "images-per-sample" if job.images_per_sample else "freeze-vision"
            raise ValueError(f"{flag}: --model is not a vision-language model")
        if job.lora_scope != "auto":
            raise ValueError("lora-scope: --model is not a vision-language model")
        return
    if job.images_per_sample < 0 or job.image_size < 1:
        raise ValueError("images-per-sample and image-size: must be >= 0 and >= 1")
    others = {
        "--num-gpus": job.num_gpus > 1,
        "--zero": bool(job.zero),
        "--tp": job.tp > 1,
        "--save-profile": bool(job.save_profile),
        "--snapshot": job.snapshot is not None,
        "--real-gpu": job.real_gpu,
    }
    named = [flag for flag, given in others.items() if given]
    if named:
        raise ValueError(
            f"model: a vision-language model's step is traced on one process's CPU tensors "
            f"(no {', '.join(named)})"
        )
    if job.precision not in ("fp32", "bf16", "amp-bf16"):
        raise ValueError(
            f"precision: a vision-language model's trace takes fp32, bf16 or amp-bf16, "
            f"got {job.precision!r}"
        )


def _trace(job: _TraceJob, length: int, real_hook: Any = None) -> dict[str, Any]:
    """The step at `length` tokens: on the fake device, or (real_hook) on the real GPU."""
    flags: dict[str, Any] = {
        **job.common,
        "micro_batch_size": job.micro_batch_size,
        "seq_len": length,
        "sdpa_kernel": job.sdpa_kernel,
    }
    if real_hook is None:
        flags["device"] = job.device
    else:
        flags.update(device="cuda", fake=False, on_phase_end=real_hook)
    if job.module:
        from ._module import trace_module

        return trace_module(job.module, **flags)
    config = model_config_dict(job.model)
    if _is_vlm(job):
        from ._vlm import trace_vlm_step

        return trace_vlm_step(
            config,
            micro_batch_size=job.micro_batch_size,
            seq_len=length,
            images_per_sample=job.images_per_sample,
            image_size=job.image_size,
            precision=job.precision,
            recompute=job.recompute,
            optimizer=job.optimizer,
            attention=job.attention,
            freeze_vision=job.freeze_vision,
            **job.lora,
            lora_scope=job.lora_scope,
        )
    if job.num_gpus > 1:
        from ._dist import trace_parallel

        return trace_parallel(config, attention=job.attention, **job.parallel, **flags, **job.lora)
    from ._core import trace_step

    if job.snapshot is not None and real_hook is None:
        flags["snapshot"] = job.snapshot
    return trace_step(config, attention=job.attention, **flags, **job.lora)


def _estimate(job: _TraceJob, profile_file: str | None) -> dict[str, Any]:
    """`estimate --json` for the traced flags: of the model, or of a saved profile."""
    from trainmem.report import estimate_report

    fields = {
        **job.estimate_defaults,
        **job.parallel,
        "gpu": job.gpu,
        "seq_len": job.seq_len,
        "micro_batch_size": job.micro_batch_size,
        "precision": job.precision,
        "optimizer": job.optimizer,
        "recompute": job.recompute,
        "attention": job.attention,
        "framework": "hf",
        **job.lora,
        **job.images,
        **job.vision_lora,
    }
    if profile_file:
        fields.update(profile_file=profile_file, model=job.estimate_defaults["model"])
    else:
        fields["model"] = job.model
    return estimate_report(**fields)


def _trace_and_save_profile(job: _TraceJob) -> tuple[dict[str, Any], dict[str, Any]]:
    """Trace the two profile lengths (and the asked one), write the profile to
    `job.save_profile`; returns the trace at the asked length and the report's `profile`."""
    from ._save_profile import parse_seq_lens, profile_from_traces, write_atomic

    if job.num_gpus > 1:
        raise ValueError("save-profile: trace one GPU (num-gpus 1); a profile is per layer")
    lens = parse_seq_lens(job.profile_seq_lens, job.seq_len)
    if job.module:
        from ._module import factory_takes_seq_len, load_factory

        if not factory_takes_seq_len(load_factory(job.module)):
            raise ValueError("save-profile: the module's factory must take seq_len")
    traces = {length: _trace(job, length) for length in sorted({*lens, job.seq_len})}
    profile = profile_from_traces(
        traces[lens[0]],
        traces[lens[1]],
        name=job.profile_name or _default_profile_name(job),
        command=_command(
            model=job.model,
            module=job.module,
            micro_batch_size=job.micro_batch_size,
            profile_seq_lens=f"{lens[0]},{lens[1]}",
            sdpa_kernel=job.sdpa_kernel,
            device=job.device,
            **job.common,
            attention=job.attention,
        ),
        valid_for={
            "precision": job.precision,
            "recompute": job.recompute,
            "attention": job.attention,
        },
    )
    assert job.save_profile is not None  # called with --save-profile only
    write_atomic(job.save_profile, json.dumps(profile, indent=2) + "\n")
    return traces[job.seq_len], {"path": job.save_profile, **profile}


def _default_profile_name(job: _TraceJob) -> str:
    """A profile's name without --profile-name: the module's file, the config's folder (or
    file), or the preset."""
    if job.module:
        return Path(job.module.rpartition(":")[0]).name.removesuffix(".py")
    if Path(job.model).exists():  # a config.json (or its folder): name it after the folder
        path = Path(job.model)
        return path.parent.name if path.name == "config.json" else path.stem
    return job.model


def _report(
    job: _TraceJob, measured: dict[str, Any], estimate_full: dict[str, Any] | None
) -> dict[str, Any]:
    """The estimate --json keys filled from the trace, the trace itself, the estimate's figures
    and their relative errors (module docstring)."""
    predicted = _estimate_figures(estimate_full) if estimate_full else None
    return {
        "model": job.module or (estimate_full or {}).get("model", job.model),
        **_contract(measured),
        "config": {
            **job.common,
            "micro_batch_size": job.micro_batch_size,
            "seq_len": job.seq_len,
            "attention": job.attention,
            "sdpa_kernel": job.sdpa_kernel,
            **job.parallel,
            **job.lora,
            **job.images,
            **job.vision_lora,
        },
        "device": measured.get("device"),
        "note": measured.get("note", ""),
        "measured": measured,
        "estimate": predicted,
        "relative_error": {
            k: predicted[e] / measured[k] - 1.0
            for k, e in COMPARED
            if predicted and measured.get(k)
        },
        "estimate_report": estimate_full,
    }


def _command(*, model: str, module: str | None, **flags: Any) -> str:
    """The `trainmem trace` command line that traced what a profile holds."""
    words = ["trainmem", "trace", *(["--module", module] if module else ["--model", model])]
    for key, value in flags.items():
        words += [f"--{key.replace('_', '-')}", str(value)]
    return " ".join(shlex.quote(w) for w in words)


def _real_gpu(run: Any, seq_len: int, predicted: dict[str, Any] | None) -> dict[str, Any]:
    from ._gpu import differences, real_gpu_step

    measured_gpu = real_gpu_step(lambda hook: run(seq_len, real_hook=hook))
    return {"real_gpu": measured_gpu, "real_gpu_vs_estimate": differences(measured_gpu, predicted)}


def trace_text(report: dict[str, Any]) -> str:
    """The human output of `trainmem trace` (GiB, or MiB for a step under 1 GiB)."""
    m = report["measured"]
    est = report["estimate"] or {}
    unit, name = (GIB, "GiB") if m["peak_allocated_bytes"] >= GIB else (MIB, "MiB")
    lines = [
        f"{report['model']}: one step traced on {m.get('device')} in {m['elapsed_s']:.1f} s"
        + (f" ({report['note']})" if report.get("note") else "")
    ]
    lines.append(f"  {'':<28}{'traced ' + name:>12}{'estimate ' + name:>14}{'error':>9}")
    for key, _ in COMPARED:
        want = est.get(key)
        err = report["relative_error"].get(key)
        lines.append(
            f"  {key.removesuffix('_bytes'):<28}{m[key] / unit:>12.3f}"
            + (f"{want / unit:>14.3f}" if want is not None else f"{'-':>14}")
            + (f"{err:>+9.2%}" if err is not None else "")
        )
    for phase, value in m["phases"].items():
        lines.append(f"  peak {phase:<23}{value / unit:>12.3f}")
    if m.get("num_layers"):
        lines.append(
            f"  per layer ({m['num_layers']} x {m['layer_class']}): "
            f"{m['activations_per_layer_bytes'] / unit:.3f} {name} activations; outside the "
            f"layers {m['activations_outside_layers_bytes'] / unit:.3f} {name}"
        )
    if report.get("profile"):
        lines.append(f"  profile written to {report['profile']['path']}")
    if report.get("real_gpu"):
        r = report["real_gpu"]
        lines.append(f"  real GPU ({r['device']}, torch {r['torch']}):")
        for key in ("peak_allocated_bytes", "peak_reserved_bytes", "peak_device_bytes"):
            diff = report["real_gpu_vs_estimate"].get(key)
            text = f"  estimate {diff['relative_error']:+.2%}" if diff else ""
            lines.append(f"    {key.removesuffix('_bytes'):<26}{r[key] / unit:>12.3f}{text}")
    return "\n".join(lines)
