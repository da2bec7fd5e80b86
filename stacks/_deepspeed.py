"""DeepSpeed JSON configs (deepspeed 0.19.8, https://www.deepspeed.ai/docs/config-json/), alone or
beside an HF Trainer config (`--deepspeed ds.json`): ZeRO stage, offload, batch sizes, bf16/fp16,
the optimizer block, and the keys trainmem does not model (non-"auto" bucket sizes that are not
the HF Trainer's, ZeRO++, NVMe, activation partitioning or CPU checkpointing).

"auto" values are the HF Trainer's to fill: they are left to the HF config (alone, unknown).
The helpers `to_framework` and `wrapped_precision` are shared with the HF and accelerate
readers (stacks/_hf.py, stacks/_accelerate.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ._reading import Doc, Reading, as_bool, as_float, as_int, bad, dig, is_auto
from ._stacks import Stack

VERSION = "0.19.8"
SOURCE = f"deepspeed {VERSION}"

MARKERS = ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size",
           "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "steps_per_print",
           "wall_clock_breakdown")  # fmt: skip
"""Top-level keys only DeepSpeed configs use."""

OPTIMIZERS = {"adam": "adamw-fused", "adamw": "adamw-fused", "lion": "lion",
              "adafactor": "adafactor", "fusedadam": "adamw-fused",
              "cpuadam": "adamw-fused"}  # fmt: skip
"""DeepSpeed `optimizer.type` (lower case) -> trainmem: Adam/AdamW are FusedAdam (DeepSpeedCPUAdam
under offload), Lion FusedLion (deepspeed 0.19.8 runtime/engine.py _configure_basic_optimizer);
others come from torch.optim."""

DEEPSPEED_DEFAULT_REDUCE_BUCKET_ELEMS = 5e8
"""reduce_bucket_size where the config has no such key (the HF Trainer fills "auto" only):
deepspeed 0.19.8 runtime/zero/config.py."""
ZERO_DEFAULTS = f"{SOURCE} runtime/zero/config.py"
"""Where DeepSpeed's own ZeRO defaults are (a key the config does not have)."""
DS_DEFAULTS = {"stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
               "max_live_parameters": 1e9, "max_reuse_distance": 1e9,
               "allgather_bucket_size": 5e8, "sub_group_size": 1e9}  # fmt: skip
"""Buffer-size keys whose DeepSpeed default (deepspeed 0.19.8 runtime/zero/config.py) is what
trainmem assumes; another value is not modelled."""
AUTO_SIZES = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "prefetch_bucket_size",
              "stage3_param_persistence_threshold", "param_persistence_threshold")  # fmt: skip
"""Sizes the HF Trainer fills from "auto" (h*h, 0.9*h*h, 10*h: transformers
integrations/deepspeed.py trainer_config_finalize), which trainmem models."""
ASSUMED_ON = ("contiguous_gradients",)
"""Switches trainmem's DeepSpeed model assumes on (plan/_launch.py deepspeed_config writes them)."""
ZERO_PP = (
    "zero_quantized_weights",
    "zero_quantized_gradients",
    "zero_quantized_nontrainable_weights",
)


def detect(doc: Doc) -> int:
    data = doc.data
    if not isinstance(data, Mapping):
        return 0
    if any(k in data for k in MARKERS):
        return 10
    if isinstance(data.get("fp16"), Mapping) and "initial_scale_power" in data["fp16"]:
        return 8
    return 0


# ---- helpers shared with the HF and accelerate readers -------------------------------------------


def to_framework(reading: Reading, framework: str, doc: Doc, key: str) -> None:
    """The job runs under `framework` (deepspeed): set unless a file already said so, and the
    precision read so far becomes the wrapper's (`wrapped_precision`)."""
    reading.put("framework", framework, doc, key)
    if reading.get("framework") == framework:
        wrapped_precision(reading, framework, doc, key)


def wrapped_precision(reading: Reading, wrapper: str, doc: Doc, key: str) -> None:
    """Under DeepSpeed (any 16-bit run) or FSDP (autocast over fp32 weights) the working copy is
    16-bit with an fp32 master: `mixed-*` (docs/concepts.md precision table)."""
    read = reading.fields.get("precision")
    if read is None:
        return
    value = str(read.value)
    half = value.removeprefix("amp-")
    if half not in ("bf16", "fp16"):
        return
    if value.startswith("amp-") or wrapper == "deepspeed":
        reading.override("precision", f"mixed-{half}", read.origin, read.file)
        reading.warn(f"precision: {value} under {wrapper} ({doc.name}:{key}) is mixed-{half}")


# ---- the reader ---------------------------------------------------------------------------------


def read(doc: Doc, reading: Reading, prefix: str = "") -> None:
    """One DeepSpeed config (`prefix`: its dotted place when it is inline in another file)."""
    data = doc.data if not prefix else dig(doc.data, prefix.rstrip("."))
    if not isinstance(data, Mapping):
        return
    if prefix or reading.stack != "deepspeed":
        key = "zero_optimization" if "zero_optimization" in data else next(iter(data), "")
        to_framework(reading, "deepspeed", doc, prefix.rstrip(".") or key)
    _batches(data, doc, reading, prefix)
    _precision(data, doc, reading, prefix)
    _optimizer(data, doc, reading, prefix)
    zero = data.get("zero_optimization")
    if isinstance(zero, Mapping):
        _zero(zero, doc, reading, prefix + "zero_optimization.")
    _host_adam(reading, doc)
    _extras(data, doc, reading, prefix)


def _host_adam(reading: Reading, doc: Doc) -> None:
    """Adam/AdamW with the optimizer offloaded is DeepSpeedCPUAdam on the host (runtime/engine.py
    get_optimizer_configuration; zero_force_ds_cpu_optimizer refuses any other): on the GPU
    neither FusedAdam's step counters nor foreach temporaries. trainmem's ZeRO-Offload rows
    follow deepspeed 0.19.8 with `adamw` (docs/concepts.md), so that is what is read."""
    optimizer = reading.fields.get("optimizer")
    offloaded = reading.get("offload", "none") != "none"
    if offloaded and optimizer is not None and optimizer.file == doc.name:  # noqa: SIM102
        if optimizer.value == "adamw-fused":
            reading.override("optimizer", "adamw", optimizer.origin, optimizer.file)


def _batches(data: Mapping[str, Any], doc: Doc, reading: Reading, prefix: str) -> None:
    given = {}
    for key, field in (("train_micro_batch_size_per_gpu", "micro_batch_size"),
                       ("gradient_accumulation_steps", "grad_accum_steps"),
                       ("train_batch_size", "global_batch_size")):  # fmt: skip
        value = data.get(key)
        if value is None or is_auto(value):
            continue
        given[field] = as_int(doc, prefix + key, value, ge=1)
        reading.put(field, given[field], doc, prefix + key)
    if "global_batch_size" in given and not reading.has("micro_batch_size"):
        _micro_from_total(given, doc, reading, prefix)


def _micro_from_total(given: dict[str, int], doc: Doc, reading: Reading, prefix: str) -> None:
    """train_batch_size without a micro-batch: DeepSpeed's micro-batch is the total over the
    accumulation (default 1) and the GPUs."""
    total, accum = given["global_batch_size"], given.get("grad_accum_steps", 1)
    gpus = int(reading.get("num_gpus", 1))
    micro = max(total // (accum * gpus), 1)
    source = (f"{SOURCE} runtime/config.py _set_batch_related_parameters (micro-batch = "
              "train_batch_size / (gradient_accumulation_steps x GPUs))")  # fmt: skip
    reading.default("micro_batch_size", micro, source)
    if accum == 1:
        del reading.fields["global_batch_size"]
    reading.warn(f"{doc.name}:{prefix}train_batch_size {total}: micro-batch {micro} on {gpus} "
                 "GPU(s); with --num-gpus give --micro-batch-size")  # fmt: skip


def _precision(data: Mapping[str, Any], doc: Doc, reading: Reading, prefix: str) -> None:
    """bf16 / fp16 `enabled`: DeepSpeed's 16-bit training keeps an fp32 master (mixed-*)."""
    found: list[str | None] = []
    for name in ("bf16", "fp16"):
        section = data.get(name)
        if not isinstance(section, Mapping) or "enabled" not in section:
            continue
        key = f"{prefix}{name}.enabled"
        if is_auto(section["enabled"]):
            found.append(None)
            continue
        if as_bool(doc, key, section["enabled"]):
            reading.put("precision", f"mixed-{name}", doc, key)
            found.append(name)
        for flag in (f"{name}_master_weights_and_grads", "bf16_optimizer_states", "auto_cast"):
            if flag in section and as_bool(doc, f"{prefix}{name}.{flag}", section[flag]):
                why = "autocast inputs" if flag == "auto_cast" else "16-bit master or states"
                reading.unmodelled_key(doc, f"{prefix}{name}.{flag}", why)
    if not found and reading.stack == "deepspeed":
        reading.default(
            "precision",
            "fp32",
            f"{SOURCE} runtime/precision_config.py (bf16 and fp16 disabled by default)",
        )


def _optimizer(data: Mapping[str, Any], doc: Doc, reading: Reading, prefix: str) -> None:
    """DeepSpeed's `optimizer` block replaces the Trainer's `optim` (transformers
    integrations/deepspeed.py deepspeed_optim_sched)."""
    block = data.get("optimizer")
    if not isinstance(block, Mapping) or "type" not in block:
        return
    key = prefix + "optimizer.type"
    kind = str(block["type"]).strip().lower()
    value = OPTIMIZERS.get(kind)
    torch_adam = dig(block, "params.torch_adam")
    if kind in ("adam", "adamw") and as_bool(
        doc, prefix + "optimizer.params.torch_adam", torch_adam
    ):
        value = "adamw"  # torch.optim.AdamW (runtime/engine.py get_optimizer_configuration)
    if kind == "sgd":
        momentum = dig(block, "params.momentum") or 0
        value = (
            "sgd-momentum"
            if as_float(doc, prefix + "optimizer.params.momentum", momentum)
            else "sgd"
        )
    if value is None:
        reading.unmodelled_key(doc, key, f"optimizer {block['type']!r} is not a built-in one")
        return
    reading.override("optimizer", value, f"file:{key}", doc.name)


def _zero(zero: Mapping[str, Any], doc: Doc, reading: Reading, prefix: str) -> None:
    stage = zero.get("stage")
    if stage is not None and not is_auto(stage):
        value = as_int(doc, prefix + "stage", stage)
        if value > 3:
            raise bad(doc, prefix + "stage", "a ZeRO stage 0-3", stage)
        guess = reading.fields.get("zero")
        if guess is not None and guess.origin == "file:deepspeed":  # the HF file's name guess
            reading.override("zero", value, f"file:{prefix}stage", doc.name)
        reading.put("zero", value, doc, prefix + "stage")
    _offload(zero, doc, reading, prefix)
    for key in ZERO_PP:
        if key in zero and as_bool(doc, prefix + key, zero[key]):
            reading.unmodelled_key(doc, prefix + key, "ZeRO++ quantised weights or gradients")
    if isinstance(zero.get("zenflow"), Mapping):
        reading.unmodelled_key(doc, prefix + "zenflow", "ZenFlow's stalled gradient buffers")
    hpz = zero.get("zero_hpz_partition_size")
    if hpz is not None and as_int(doc, prefix + "zero_hpz_partition_size", hpz) > 1:
        reading.unmodelled_key(
            doc, prefix + "zero_hpz_partition_size", "ZeRO++ hpZ secondary shard"
        )
    _sizes(zero, doc, reading, prefix)


def _offload(zero: Mapping[str, Any], doc: Doc, reading: Reading, prefix: str) -> None:
    devices = {}
    for name, legacy in (
        ("offload_optimizer", "cpu_offload"),
        ("offload_param", "cpu_offload_param"),
    ):
        section, key = zero.get(name), f"{prefix}{name}.device"
        device = dig(section, "device") if isinstance(section, Mapping) else None
        if device is None and legacy in zero and as_bool(doc, prefix + legacy, zero[legacy]):
            device, key = "cpu", prefix + legacy
        if device is None or is_auto(device):
            continue
        device = str(device).strip().lower()
        if device not in ("none", "cpu", "nvme"):
            raise bad(doc, key, "none, cpu or nvme", device)
        if device == "nvme":
            reading.unmodelled_key(doc, key, "NVMe offload: the GPU side is counted as cpu's")
        ratio = section.get("ratio", 1.0) if isinstance(section, Mapping) else 1.0
        if as_float(doc, f"{prefix}{name}.ratio", ratio) != 1.0:
            reading.unmodelled_key(doc, f"{prefix}{name}.ratio", "partial optimizer offload")
        if device != "none":
            devices[name] = key
    if "offload_param" in devices:
        if "offload_optimizer" not in devices:
            reading.unmodelled_key(doc, devices["offload_param"], "parameters offloaded alone")
            return
        reading.put("offload", "optimizer+params", doc, devices["offload_param"])
    elif "offload_optimizer" in devices:
        reading.put("offload", "optimizer", doc, devices["offload_optimizer"])


def _sizes(zero: Mapping[str, Any], doc: Doc, reading: Reading, prefix: str) -> None:
    """Bucket sizes: reduce_bucket_size and overlap_comm are modelled (zero_bucket_elems,
    overlap_comm; "auto" is the HF Trainer's h*h, an absent key DeepSpeed's own default, which
    the Trainer does not fill: 5e8 elements, overlap_comm off under ZeRO 1-2); the prefetch
    bucket and persistence threshold are modelled at the Trainer's auto sizes (also given as
    its numbers for one hidden size, what trainmem's `--format deepspeed` writes); any other
    value of theirs is not modelled."""
    stage = int(reading.get("zero", 0))
    reduce = _reduce_bucket(zero, doc, reading, prefix, stage=stage)
    given = {k: zero[k] for k in AUTO_SIZES[1:] if k in zero and not is_auto(zero[k])}
    numbers = {k: as_float(doc, prefix + k, v) for k, v in given.items()}
    if numbers and not _trainer_sizes(numbers, reduce=reduce):
        for key in numbers:
            reading.unmodelled_key(
                doc,
                prefix + key,
                "a bucket size other than the HF Trainer's auto (0.9*h*h, 10*h)",
            )
    for key, default in DS_DEFAULTS.items():
        value = zero.get(key)
        if (
            value is not None
            and not is_auto(value)
            and as_float(doc, prefix + key, value) != default
        ):
            reading.unmodelled_key(doc, prefix + key, f"not DeepSpeed's default {default:g}")
    for key in ASSUMED_ON:
        if key in zero and not is_auto(zero[key]) and not as_bool(doc, prefix + key, zero[key]):
            reading.unmodelled_key(doc, prefix + key, "trainmem assumes it on")


def _reduce_bucket(
    zero: Mapping[str, Any], doc: Doc, reading: Reading, prefix: str, *, stage: int
) -> float | None:
    """zero_bucket_elems and overlap_comm from reduce_bucket_size and overlap_comm (under ZeRO
    1-3; stage 0 has no buckets); the numeric reduce_bucket_size (None: absent or "auto")."""
    key = prefix + "reduce_bucket_size"
    value = zero.get("reduce_bucket_size")
    elems = None if value is None or is_auto(value) else as_float(doc, key, value)
    if elems is not None and elems <= 0:
        raise bad(doc, key, "a positive number of elements", value)
    if stage < 1:
        return elems
    if value is None:
        reading.default("zero_bucket_elems", DEEPSPEED_DEFAULT_REDUCE_BUCKET_ELEMS, ZERO_DEFAULTS)
    elif elems is not None:
        reading.put("zero_bucket_elems", elems, doc, key)
    key = prefix + "overlap_comm"
    overlap = zero.get("overlap_comm")
    if overlap is None:
        if stage < 3:  # DeepSpeed's own default: on under ZeRO-3 only
            reading.default("overlap_comm", "off", ZERO_DEFAULTS + " (overlap_comm_valid)")
    elif not is_auto(overlap):
        reading.put("overlap_comm", "on" if as_bool(doc, key, overlap) else "off", doc, key)
    return elems


def _trainer_sizes(numbers: Mapping[str, float], *, reduce: float | None = None) -> bool:
    """The prefetch and persistence numbers are the Trainer's auto sizes (0.9*h*h, 10*h) of one
    hidden size h, that of a numeric `reduce` bucket too (h*h) where the config has one."""
    sizes = set()
    if reduce is not None:
        root = math.isqrt(int(reduce))
        if root * root != int(reduce):
            return False
        sizes.add(root)
    for key in ("stage3_param_persistence_threshold", "param_persistence_threshold"):
        if key in numbers:
            if numbers[key] % 10:
                return False
            sizes.add(int(numbers[key]) // 10)
    for key in ("stage3_prefetch_bucket_size", "prefetch_bucket_size"):
        if key in numbers:
            h = math.isqrt(int(numbers[key] / 0.9)) + 1
            while h > 0 and int(0.9 * h * h) > numbers[key]:
                h -= 1
            if int(0.9 * h * h) != numbers[key]:
                return False
            sizes.add(h)
    return len(sizes) == 1


def _extras(data: Mapping[str, Any], doc: Doc, reading: Reading, prefix: str) -> None:
    """Sections that change memory in ways trainmem does not count."""
    ac = data.get("activation_checkpointing")
    if isinstance(ac, Mapping):
        for key in ("partition_activations", "cpu_checkpointing", "contiguous_memory_optimization"):
            if key in ac and as_bool(doc, f"{prefix}activation_checkpointing.{key}", ac[key]):
                reading.unmodelled_key(
                    doc,
                    f"{prefix}activation_checkpointing.{key}",
                    "DeepSpeed activation partitioning / CPU checkpointing",
                )
    for section, why in (("torch_autocast", "DeepSpeed's torch autocast"), ("amp", "apex AMP"),
                         ("compile", "DeepSpeed compile"), ("sparse_attention", "sparse attention"),
                         ("data_types", "a gradient accumulation dtype")):  # fmt: skip
        value = data.get(section)
        if not isinstance(value, Mapping) or not value:
            continue
        key = f"{prefix}{section}.enabled"
        if section == "data_types" or as_bool(doc, key, value.get("enabled", False)):
            reading.unmodelled_key(doc, prefix + section, why)
    tp = dig(data, "tensor_parallel.autotp_size")
    if tp is not None and as_int(doc, prefix + "tensor_parallel.autotp_size", tp) > 1:
        reading.unmodelled_key(doc, prefix + "tensor_parallel.autotp_size", "DeepSpeed AutoTP")


STACK = Stack(
    name="deepspeed",
    version=VERSION,
    framework="deepspeed",
    detect=detect,
    read=read,
    auxiliary=True,
)
