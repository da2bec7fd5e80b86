"""Turn one estimated row into the `estimate --json` object and the human table."""

from __future__ import annotations

from typing import Any

import numpy as np

from trainmem.engine import (
    COMPONENTS,
    FRAMEWORK_SPECS,
    GIB,
    PHASES,
    ModelSpec,
    lora_mask,
    lora_num_parameters,
)
from trainmem.hardware import GpuProfile

from ._advice import advice_lines
from ._error_bars import error_bar_lines, error_bar_report
from ._rl import rl_lines

BYTES_KEYS = COMPONENTS


def _int(x: Any) -> int:
    return int(round(float(np.asarray(x).reshape(-1)[0])))


def row_report(
    model: ModelSpec,
    out: dict[str, np.ndarray],
    *,
    gpu: GpuProfile,
    config: dict[str, Any],
    headroom: float,
    row: int = 0,
) -> dict[str, Any]:
    """The JSON contract of `trainmem estimate --json` for one row (see README, "JSON")."""

    breakdown = {k: _int(_at(out, k, row)) for k in COMPONENTS}
    peak_device = _int(_at(out, "peak_device_bytes", row))
    # Rounding each component to an int may leave a byte or two; give it to `transient`.
    breakdown["transient"] += peak_device - sum(breakdown.values())
    phase = PHASES[int(_at(out, "peak_phase", row))]
    persistent_bytes = {
        "parameters": breakdown["parameters"],
        "master_weights": breakdown["master_weights"],
        "gradients": _int(_at(out, "gradients_total", row)),
        "optimizer_states": breakdown["optimizer_states"],
        "activations": _int(_at(out, "activations_total", row)),
        "transient": breakdown["transient"],
        "framework_overhead": breakdown["framework_overhead"],
        "fragmentation": breakdown["fragmentation"],
    }
    biggest = max(breakdown, key=lambda k: breakdown[k])
    report = {
        "model": model.name,
        "num_parameters": model.num_parameters,
        "config": config,
        "bytes": persistent_bytes,
        "breakdown_at_peak": breakdown,
        "peak_allocated_bytes": _int(_at(out, "peak_allocated_bytes", row)),
        "peak_reserved_bytes": _int(_at(out, "peak_reserved_bytes", row)),
        "peak_device_bytes": peak_device,
        "peak_phase": phase,
        "phases": {
            "forward": _int(_at(out, "peak_forward_bytes", row)),
            "backward": _int(_at(out, "peak_backward_bytes", row)),
            "optimizer_step": _int(_at(out, "peak_optimizer_step_bytes", row)),
        },
        "biggest_consumer": biggest,
        "details": {k: _int(_at(out, k, row)) for k in DETAIL_KEYS},
        "num_trainable_parameters": _trainable(model, config),
        "host_bytes": _int(_at(out, "host_bytes", row)),
        "paged_optimizer_bytes": _int(_at(out, "paged_optimizer_bytes", row)),
        "gpu": {
            "name": gpu.name,
            "memory_bytes": gpu.memory_bytes,
            "usable_bytes": gpu.usable_bytes,
        },
        "headroom": headroom,
        "fits": bool(_at(out, "fits", row)),
        "headroom_bytes": _int(_at(out, "headroom_bytes", row)),
        "peak_load_bytes": _int(_at(out, "peak_load_bytes", row)),
        "load": load_report(out, config, gpu=gpu, headroom=headroom, row=row),
        "units": "bytes per device (worst rank); GiB = 2**30 in the human output",
    }
    limit_bytes = gpu.usable_bytes * (1.0 - headroom)  # what `fits` compares the peak with
    report.update(error_bar_report(peak_device, limit_bytes, config))
    return report


def load_report(
    out: dict[str, np.ndarray], config: dict[str, Any], *, gpu: GpuProfile, headroom: float, row
) -> dict[str, Any]:
    """The load phase of one row (`load` of estimate --json): the mode it runs (`--load`, or
    the framework's own where auto, with the file that decides it), its device peak, the host
    RAM a rank holds then, and whether the load alone fits the GPU."""
    spec = FRAMEWORK_SPECS[config["framework"]]
    asked = config.get("load", "auto")
    peak = _int(_at(out, "peak_load_bytes", row))
    sharded_qlora = bool(config.get("qlora")) and int(config.get("lora_rank", 0)) > 0
    mode, source = spec.auto_load(sharded_qlora=sharded_qlora and int(config["zero"]) >= 3)
    return {
        "mode": mode if asked == "auto" else asked,
        "from": f"framework-default:{source}" if asked == "auto" else "flag",
        "peak_device_bytes": peak,
        "host_bytes_per_rank": _int(_at(out, "load_host_bytes", row)),
        "fits": bool(peak <= gpu.usable_bytes * (1.0 - headroom)),
    }


def stage_summary(out: dict[str, np.ndarray], *, row: int) -> dict[str, Any]:
    """One pipeline stage's rank: its peaks and main components (for --per-stage)."""

    return {
        "pp_stage": int(_at(out, "pp_stage", row)),
        "parameters": _int(_at(out, "parameters", row)),
        "gradients": _int(_at(out, "gradients_total", row)),
        "optimizer_states": _int(_at(out, "optimizer_states", row)),
        "activations": _int(_at(out, "activations_total", row)),
        "peak_allocated_bytes": _int(_at(out, "peak_allocated_bytes", row)),
        "peak_device_bytes": _int(_at(out, "peak_device_bytes", row)),
        "peak_phase": PHASES[int(_at(out, "peak_phase", row))],
        "fits": bool(_at(out, "fits", row)),
    }


RL_TIME_PARTS = ("rl_rollout_s", "rl_score_s", "rl_critic_s", "rl_sync_s", "rl_offload_s")
"""An RL step's time beside its trainer's, per optimizer step (engine/_rl_time.py); 0 without
--rl."""
TIME_PARTS = (
    "gemm_time_s",
    "attention_time_s",
    "memory_bound_time_s",
    "optimizer_time_s",
    "tp_exposed_s",
    "cp_exposed_s",
    "pp_p2p_s",
    "dp_exposed_s",
    "fsdp_exposed_s",
    "offload_s",
    "expert_s",
    *RL_TIME_PARTS,
)


def time_report(
    timing: dict[str, np.ndarray], *, price_per_gpu_hour_usd: float, row: int = 0
) -> dict[str, Any]:
    """The `time` object of `estimate --json` for one row (see README, "Step time and cost")."""

    def at(key: str) -> float:
        return float(np.asarray(timing[key]).reshape(-1)[row])

    keys = [
        "step_time_s",
        "compute_time_s",
        "communication_exposed_s",
        "bubble_time_s",
        "tokens_per_second",
        "tokens_per_second_per_gpu",
        "mfu",
        "hfu",
        "cost_per_million_tokens",
        "model_flops_per_step",
        "achieved_flops_per_gpu",
    ]
    report: dict[str, Any] = {k: at(k) for k in keys}
    report["price_per_gpu_hour_usd"] = price_per_gpu_hour_usd
    report["parts"] = {k: at(k) for k in TIME_PARTS}
    for key in ("time_to_train_s", "cost_to_train_usd"):
        if key in timing:
            report[key] = at(key)
    return report


def _rl_time_text(parts: dict[str, float]) -> str:
    """`, RL 30.1 (rollout 27.4, score 2.1, ...)` where the step has RL time, else ``."""
    rl = {k: parts.get(k, 0.0) for k in RL_TIME_PARTS}
    if not sum(rl.values()) > 0.0:
        return ""
    named = ", ".join(f"{k[3:-2]} {v:.3g}" for k, v in rl.items() if v > 0.0)
    return f", RL {sum(rl.values()):.3g} ({named})"


def time_line(t: dict[str, Any]) -> str:
    """One line of the human output: step time, throughput, MFU, cost."""
    line = (
        f"  step {t['step_time_s']:.3g} s (compute {t['compute_time_s']:.3g}, exposed "
        f"communication {t['communication_exposed_s']:.3g}, bubble {t['bubble_time_s']:.3g}"
        f"{_rl_time_text(t.get('parts', {}))}): "
        f"{t['tokens_per_second']:,.0f} tokens/s, MFU {t['mfu']:.0%}, "
        f"${t['cost_per_million_tokens']:.3g} per million tokens"
    )
    if "time_to_train_s" in t:
        line += (
            f"; budget: {t['time_to_train_s'] / 86400:,.3g} days, ${t['cost_to_train_usd']:,.0f}"
        )
    return line


def _trainable(model: ModelSpec, config: dict[str, Any]) -> int:
    """Parameters the optimizer updates: all, or the LoRA adapters as PEFT counts them."""
    rank = int(config.get("lora_rank", 0))
    if rank <= 0:
        return model.num_parameters
    return lora_num_parameters(
        model,
        rank,
        lora_mask(str(config.get("lora_targets", ""))),
        lora_scope=str(config.get("lora_scope", "auto")),
        freeze_vision=bool(config.get("freeze_vision", False)),
    )


DETAIL_KEYS = (
    "activations_per_layer",
    "activations_outside_layers",
    "activations_autocast_weight_copies",
    "optimizer_step_temporaries",
    "dp",
    "num_microbatches",
)


def _at(out: dict[str, np.ndarray], key: str, row: int) -> Any:
    """Row `row` of output column `key`."""
    return np.asarray(out[key]).reshape(-1)[row]


def _gib(n: float) -> str:
    return f"{n / GIB:9.2f}"


def _knobs(c: dict[str, Any]) -> str:
    """The framework knobs set away from their defaults, for the summary line."""
    words = []
    if c.get("compile", "none") != "none":
        words.append(f"compile {c['compile']}")
    if c.get("recompute") == "selective-layer":
        words.append(f"every {c['recompute_every']} blocks")
    if c.get("loss", "full") != "full":
        words.append(f"loss {c['loss']}")
    if c.get("optimizer_in_backward"):
        words.append("optimizer in backward")
    if c.get("allocator", "native") != "native":
        words.append(f"allocator {c['allocator']}")
    if c.get("qlora") and c.get("bitsandbytes_version", "current") != "current":
        words.append(f"bitsandbytes {c['bitsandbytes_version']}")
    return "".join(f", {w}" for w in words)


def load_lines(report: dict[str, Any]) -> list[str]:
    """The load phase's line: its mode, device peak and host RAM per rank, and a warning when
    the job would run out of memory before step 1."""
    load = report.get("load")
    if not load:
        return []
    whose = "the framework's default" if load["from"] != "flag" else "--load"
    host = load["host_bytes_per_rank"]
    host_words = f", {host / GIB:.2f} GiB host RAM per rank" if host else ""
    warn = "" if load["fits"] else ": DOES NOT FIT, out of memory before step 1"
    return [
        f"  load ({load['mode']}, {whose}): {load['peak_device_bytes'] / GIB:.2f} GiB on the "
        f"device{host_words}{warn}"
    ]


def paged_lines(report: dict[str, Any]) -> list[str]:
    """The paged optimizer's line: state bytes in CUDA unified memory, which torch's allocator
    does not see and which page out to host RAM rather than run the GPU out of memory."""
    paged = report.get("paged_optimizer_bytes", 0)
    if not paged:
        return []
    return [
        f"  paged optimizer states: {paged / GIB:.2f} GiB in unified memory, outside torch's "
        "allocator (paged to host RAM under pressure: counted on the host)"
    ]


def fp8_lines(report: dict[str, Any]) -> list[str]:
    """Under `fp8-mixed`, `mxfp8` or `nvfp4`, what the recipe of the row's stack changes: the
    block GEMMs' rate (both), and in memory Transformer Engine's cached quantized weights or,
    for torchao's Float8Linear / mx_mm (FrameworkSpec.fp8_weight_cache False), nothing saved
    quantized."""
    c = report["config"]
    precision = c["precision"]
    if precision not in ("fp8-mixed", "mxfp8", "nvfp4"):
        return []
    from trainmem.engine import FRAMEWORK_SPECS

    cached = FRAMEWORK_SPECS[c["framework"]].fp8_weight_cache
    if precision != "fp8-mixed":
        rate = "fp4" if precision == "nvfp4" else "fp8"
        if cached:
            copies = (
                "MXFP8 (1 B + an E8M0 scale per 32)"
                if rate == "fp8"
                else ("NVFP4 (0.5 B + an E4M3 scale per 16)")
            )
            memory = f"row- and column-wise {copies} weight copies kept from forward to backward"
            memory += " (Transformer Engine), activations saved in bf16"
        else:
            memory = "nothing kept quantized (torchao mx_mm saves the bf16 input and weight)"
        return [
            f"  {precision}: the block GEMMs at the GPU's {rate} rate, the head in bf16; {memory}"
        ]
    if cached:
        memory = "fp8 weight copies kept from forward to backward (Transformer Engine), "
        memory += "activations saved in bf16"
    else:
        memory = (
            "saved activations and FSDP all-gathers stay 16-bit (torchao Float8Linear saves "
            "the high-precision input; fp8 all-gather is off by default)"
        )
    return [f"  fp8: the block GEMMs at the GPU's fp8 rate, the head in bf16; {memory}"]


def host_lines(report: dict[str, Any]) -> list[str]:
    """The node's host RAM line, when the job keeps anything in host memory (CPU offload) or
    the node's RAM does not hold it (the step's or the load's, whichever needs more)."""
    need = report.get("node_host_bytes", 0)
    if not need or (not report.get("host_bytes") and report.get("host_fits", True)):
        return []
    load_host = report.get("load", {}).get("host_bytes_per_rank", 0)
    per_rank = max(report["host_bytes"], load_host)
    what = "CPU offload" if report["host_bytes"] >= load_host else "model load"
    if what == "CPU offload" and report["host_bytes"] == report.get("paged_optimizer_bytes"):
        what = "paged optimizer states"
    limit = report.get("host_memory_per_node_bytes")
    of = "no host RAM known" if limit is None else f"of {limit / GIB:,.0f} GiB"
    verdict = "fits" if report.get("host_fits", True) else "DOES NOT FIT the node"
    return [
        f"  host RAM per node ({what}): {report['ranks_per_node']} "
        f"rank{'s' if report['ranks_per_node'] != 1 else ''} x "
        f"{per_rank / GIB:.2f} GiB = {need / GIB:.2f} GiB {of}: {verdict}"
    ]


def _images(c: dict[str, Any]) -> str:
    """The header's images of a vision-language job (images_per_sample > 0), else nothing."""
    n = int(c.get("images_per_sample") or 0)
    if n <= 0:
        return ""
    frozen = ", vision tower frozen" if c.get("freeze_vision") else ""
    if not frozen and int(c.get("lora_rank") or 0) > 0 and c.get("lora_scope") == "language":
        frozen = ", LoRA on the language model only"
    return f" + {n} image{'s' if n != 1 else ''} of {c['image_size']} px a sequence{frozen}"


def human_table(report: dict[str, Any]) -> str:
    """Plain-text table: per-component GiB at the peak, phases, verdict."""
    c = report["config"]
    dp = report["details"]["dp"]
    step_phase = report["rl"]["step_peak_phase"] if "rl" in report else report["peak_phase"]
    hsdp = f" ({c['dp_shard']}-way shards x {dp // c['dp_shard']})" if c.get("dp_shard") else ""
    lines = [
        f"{report['model']}  ({report['num_parameters']:,} parameters)",
        f"  {c['precision']}, {c['optimizer']}, recompute {c['recompute']}, attention "
        f"{c['attention']}, framework {c['framework']}{_knobs(c)}",
        f"  {c['num_gpus']} x {report['gpu']['name']}: tp {c['tp']} pp {c['pp']} cp {c['cp']} "
        f"dp {dp}{hsdp}, zero {c['zero']}, micro-batch {c['micro_batch_size']} "
        f"x seq {c['seq_len']}{_images(c)}",
        "",
        "  component (per device, at the peak)      GiB",
    ]
    for key, val in report["breakdown_at_peak"].items():
        lines.append(f"  {key:<36}{_gib(val)}")
    lines += [
        f"  {'peak device (nvidia-smi)':<36}{_gib(report['peak_device_bytes'])}",
        f"  {'peak reserved (torch)':<36}{_gib(report['peak_reserved_bytes'])}",
        f"  {'peak allocated (torch)':<36}{_gib(report['peak_allocated_bytes'])}",
        "",
        "  phase peaks (allocated, GiB): "
        + ", ".join(f"{k} {report['phases'][k] / GIB:.2f}" for k in PHASES)
        + f"  -> peak in {step_phase}",
        f"  activations saved at end of forward: {report['bytes']['activations'] / GIB:.2f} GiB;"
        f" biggest consumer at the peak: {report['biggest_consumer']}",
    ]
    for s in report.get("stages", []):
        lines.append(
            f"  stage {s['pp_stage']}: allocated {s['peak_allocated_bytes'] / GIB:.2f} GiB, "
            f"device {s['peak_device_bytes'] / GIB:.2f} GiB, activations "
            f"{s['activations'] / GIB:.2f} GiB, peak in {s['peak_phase']}"
        )
    lines += rl_lines(report)
    lines += load_lines(report) + paged_lines(report) + fp8_lines(report)
    usable = report["gpu"]["usable_bytes"]
    gpu_fits = report["headroom_bytes"] >= 0
    verdict = "FITS" if gpu_fits else "DOES NOT FIT"
    lines.append(
        f"  {verdict} on {report['gpu']['name']} ({usable / GIB:.2f} GiB usable, "
        f"{report['headroom']:.0%} headroom): margin {report['headroom_bytes'] / GIB:+.2f} GiB"
    )
    lines += error_bar_lines(report)
    lines += host_lines(report)
    if "time" in report:
        lines.append(time_line(report["time"]))
    lines += advice_lines(report)
    return "\n".join(lines)
