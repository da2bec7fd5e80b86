"""`trainmem check --fix`: when the job does not fit, the smallest change of estimate's advice
that fits, written as edits of the user's own files (their keys, their values).

The change is the fitting advice entry with the fewest changed fields, then the least step-time
cost (a GPU swap is not a file edit, unless the GPU came from a file). A changed field read from a
file is edited at the key it was read from; a number keeps the file's key; for the rest each
stack's key for the field (KEYS) says where it goes; a field no file of the stack can say is an
edit of the command line (`flag`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._check import data_parallel
from ._reading import Reading

Edit = Callable[[Any], tuple[str, Any] | None]


def _key(key: str, convert: Callable[[Any], Any] = lambda v: v) -> Edit:
    return lambda value: (key, convert(value))


def _when(key: str, value: Any, written: Any) -> Edit:
    """The key, set to `written` when the field takes `value` (else not expressible)."""
    return lambda v: (key, written) if v == value else None


KEYS: dict[str, dict[str, Edit]] = {
    "torchtune": {
        "micro_batch_size": _key("batch_size"),
        "recompute": _when("enable_activation_checkpointing", "full", True),
        "activation_offload": _key("enable_activation_offloading"),
        "lora_rank": _key("model.lora_rank"),
        "optimizer_in_backward": _key("optimizer_in_bwd"),
        "seq_len": _key("tokenizer.max_seq_len"),
        "loss": _when(
            "loss._component_", "chunked-output", "torchtune.modules.loss.CEWithChunkedOutputLoss"
        ),
        "offload": _when("fsdp_cpu_offload", "optimizer+params", True),
    },
    "axolotl": {
        "micro_batch_size": _key("micro_batch_size"),
        "recompute": _when("gradient_checkpointing", "full", True),
        "lora_rank": _key("lora_r"),
        "qlora": _when("adapter", True, "qlora"),
        "seq_len": _key("sequence_len"),
        "loss": _when("liger_fused_linear_cross_entropy", "chunked", True),
    },
    "llamafactory": {
        "micro_batch_size": _key("per_device_train_batch_size"),
        "lora_rank": _key("lora_rank"),
        "qlora": _when("quantization_bit", True, 4),
        "seq_len": _key("cutoff_len"),
        "recompute": _when("disable_gradient_checkpointing", "full", False),
        "loss": _when("enable_liger_kernel", "chunked", True),
    },
    "litgpt": {
        "micro_batch_size": _key("train.micro_batch_size"),
        "lora_rank": _key("lora_r"),
        "qlora": _when("quantize", True, "bnb.nf4"),
        "seq_len": _key("train.max_seq_length"),
    },
    "hf": {
        "micro_batch_size": _key("per_device_train_batch_size"),
        "recompute": _when("gradient_checkpointing", "full", True),
        "lora_rank": _key("lora_r"),
        "qlora": _when("load_in_4bit", True, True),
        "seq_len": _key("max_length"),
        "loss": _when("use_liger_kernel", "chunked", True),
    },
    "deepspeed": {
        "micro_batch_size": _key("train_micro_batch_size_per_gpu"),
        "zero": _key("zero_optimization.stage"),
        "offload": _when("zero_optimization.offload_optimizer.device", "optimizer", "cpu"),
    },
    "accelerate": {
        "recompute": _when("fsdp_config.fsdp_activation_checkpointing", "full", True),
        "offload": _when("fsdp_config.fsdp_offload_params", "optimizer+params", True),
    },
    "torchtitan": {
        "micro_batch_size": _key("training.local_batch_size"),
        "seq_len": _key("training.seq_len"),
        "recompute": _when("activation_checkpoint.mode", "full", "full"),
        "tp": _key("parallelism.tensor_parallel_degree"),
    },
    "megatron": {
        "micro_batch_size": _key("--micro-batch-size"),
        "recompute": _when("--recompute-granularity", "full", "full"),
        "tp": _key("--tensor-model-parallel-size"),
        "pp": _key("--pipeline-model-parallel-size"),
        # ZeRO 1: the distributed optimizer; 2 and 3: Megatron-FSDP's sharding levels
        # (megatron/training/arguments.py --data-parallel-sharding-strategy, with
        # --use-megatron-fsdp), as plan/_launch.py megatron_args writes them.
        "zero": lambda z: {
            1: ("--use-distributed-optimizer", True),
            2: ("--data-parallel-sharding-strategy", "optim_grads"),
            3: ("--data-parallel-sharding-strategy", "optim_grads_params"),
        }.get(z),
        "sequence_parallel": _when("--sequence-parallel", True, True),
    },
}
"""Per stack, the key a trainmem field is written at and its value in the file's vocabulary
(None: this value cannot be said there)."""


def ranked(advice: list[dict[str, Any]], reading: Reading) -> list[dict[str, Any]]:
    """The fitting advice entries, least change first: every edit in the files before any that
    needs a flag, then the fewest edits, then the least step time."""
    gpu = reading.fields.get("gpu")
    gpu_in_file = gpu is not None and gpu.origin.startswith("file:")
    fitting = [a for a in advice if a.get("fits") and (a.get("knob") != "gpu" or gpu_in_file)]

    def cost(entry: dict[str, Any]) -> tuple[int, int, float]:
        found = edits(_changes(entry), reading)
        flags = sum(e["file"] is None for e in found)
        # A smaller micro-batch's accumulation edit is part of the same change.
        changed = sum(e["field"] != "grad_accum_steps" for e in found)
        return flags, changed or 1, entry.get("step_time_ratio") or 1.0

    return sorted(fitting, key=cost)


def _changes(entry: dict[str, Any]) -> dict[str, Any]:
    if entry.get("knob") == "gpu":
        return {"gpu": entry["gpu"]}
    return dict(entry.get("changes") or {})


def edits(changes: dict[str, Any], reading: Reading) -> list[dict[str, Any]]:
    """Each changed field as {"field", "file", "key", "from", "to", "value"}: the file and key
    it is read from or goes to (file None, key the flag: the command line), the old and new
    values in the file's vocabulary, and the new value in trainmem's."""
    out = []
    for name, value in changes.items():
        read = reading.fields.get(name)
        old = None if read is None else read.value
        if old == value:
            continue  # the advice's full configuration repeats fields it keeps
        file = read.file if read is not None else None
        key = read.origin.removeprefix("file:") if read is not None and file else None
        if key is not None and (key.startswith("# ") or name == "global_batch_size"):
            written = None  # a usage comment, or a product of several keys: a flag
        else:
            written = _written(reading, name, value, key if isinstance(old, int) else None)
        if written is None:
            out.append(_flag_edit(name, old, value))
            continue
        key, to = written
        shown = read.raw if read is not None and read.raw is not None else old
        out.append(
            {
                "field": name,
                "file": file or _stack_file(reading),
                "key": key,
                "from": shown if file else None,
                "to": to,
                "value": value,
            }
        )
    if "micro_batch_size" in changes:
        out += _accumulation_edit(reading, int(changes["micro_batch_size"]))
    return out


def _accumulation_edit(reading: Reading, micro: int) -> list[dict[str, Any]]:
    """A smaller micro-batch keeps the global batch: the file's gradient accumulation key (the
    one the global batch was read from) is edited too."""
    gbs = reading.fields.get("global_batch_size")
    if gbs is None or gbs.file is None or not gbs.value or "accum" not in gbs.origin:
        return []
    dp = data_parallel({name: read.value for name, read in reading.fields.items()})
    if gbs.value % (micro * dp):
        return []
    return [
        {
            "field": "grad_accum_steps",
            "file": gbs.file,
            "key": gbs.origin.removeprefix("file:"),
            "from": gbs.raw,
            "to": gbs.value // (micro * dp),
            "value": gbs.value // (micro * dp),
        }
    ]


NEW_RECIPE = {"torchtune": ("lora_rank", "qlora"), "litgpt": ("lora_rank",)}
"""Fields whose change from full fine-tuning is another recipe of the stack (torchtune's LoRA
model builder and recipe, `litgpt finetune_lora`), not an edit of a key."""


def _written(reading: Reading, name: str, value: Any, same_key: str | None) -> Any:
    if name in NEW_RECIPE.get(reading.stack, ()) and not reading.get("lora_rank"):
        return None
    if same_key is not None and isinstance(value, int) and not isinstance(value, bool):
        return same_key, value
    edit = KEYS.get(reading.stack, {}).get(name)
    return None if edit is None else edit(value)


def _flag_edit(name: str, old: Any, value: Any) -> dict[str, Any]:
    return {
        "field": name,
        "file": None,
        "key": "--" + name.replace("_", "-"),
        "from": old,
        "to": value,
        "value": value,
    }


def _stack_file(reading: Reading) -> str | None:
    """The job's main file (where a key the files leave out is added)."""
    files = [r.file for r in reading.fields.values() if r.file is not None]
    return files[0] if files else None


def smaller_micro_batch(
    report: dict[str, Any], estimate: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any] | None:
    """The largest smaller micro-batch that fits (the global batch kept where the file fixes
    it: micro x dp divides it), as an advice entry; None when even 1 does not fit.
    `estimate(changes)` is estimate's report of the job with `changes`. Peaks grow with the
    micro-batch, so a bisection over the valid values finds it."""
    config = report["config"]
    dp = data_parallel(config)
    gbs = config["global_batch_size"]
    valid = [m for m in range(1, config["micro_batch_size"]) if not gbs or gbs % (m * dp) == 0]
    best, lo, hi = None, 0, len(valid) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        trial = estimate({"micro_batch_size": valid[mid]})
        if trial["fits"]:
            best, lo = trial, mid + 1
        else:
            hi = mid - 1
    if best is None:
        return None
    m = best["config"]["micro_batch_size"]
    ratio = best["time"].get("step_time_s"), report["time"].get("step_time_s")
    return {
        "change": f"micro-batch {config['micro_batch_size']} -> {m}",
        "knob": "micro_batch_size",
        "fits": True,
        "peak_device_bytes": best["peak_device_bytes"],
        "step_time_ratio": ratio[0] / ratio[1] if all(ratio) else None,
        "changes": {"micro_batch_size": m},
    }


def fix_report(
    report: dict[str, Any],
    reading: Reading,
    estimate: Callable[[dict[str, Any]], dict[str, Any]],
    recheck: Callable[[list[dict[str, Any]]], bool],
) -> dict[str, Any] | None:
    """`fix` of check's JSON: None when the job fits or no change fits; else the change, its
    peak and step-time ratio, and the edits. The candidates: estimate's advice and the largest
    smaller micro-batch that fits, least change first; the first whose edited files the stack's
    reader accepts and reads back to the change (`recheck`: a torchtune recipe refuses activation
    offload without checkpointing, say) is the fix."""
    if report["fits"]:
        return None
    candidates = list(report.get("advice") or [])
    smaller = smaller_micro_batch(report, estimate)
    if smaller is not None:
        candidates.insert(0, smaller)
    for entry in ranked(candidates, reading):
        changes = _changes(entry)
        found = edits(changes, reading)
        if recheck(found):
            return {
                "change": entry["change"],
                "peak_device_bytes": entry["peak_device_bytes"],
                "step_time_ratio": entry.get("step_time_ratio"),
                "edits": found,
            }
    return None


def edited_texts(files: dict[str, str], found: list[dict[str, Any]]) -> dict[str, str] | None:
    """The files with the edits applied (YAML and JSON files: the dotted key set; comments are
    not kept, this is for reading back only; flag edits leave them be); None when an edit is in
    a file this cannot rewrite (a TOML file, a script)."""
    import json

    import yaml

    from ._files import parse

    out = dict(files)
    for edit in found:
        if edit["file"] is None:
            continue
        doc = parse(edit["file"], out[edit["file"]])
        if doc.syntax not in ("yaml", "json"):
            return None
        data = doc.data
        *parents, last = edit["key"].split(".")
        for part in parents:
            data = data.setdefault(part, {})
            if not isinstance(data, dict):
                return None
        data[last] = edit["to"]
        dump = json.dumps if doc.syntax == "json" else yaml.safe_dump
        out[edit["file"]] = dump(doc.data)
    return out
