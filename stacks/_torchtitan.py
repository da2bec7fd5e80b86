"""torchtitan jobs: a TOML train config (`--job.config_file X.toml`, torchtitan <= 0.2.2's
format: torchtitan/models/*/train_configs/*.toml) or a launch line of `torchtitan.train`
(torchrun / run_train.sh): torchtitan 0.3.0's `--module M --config FN` (a config_registry
function) with `--section.field value` overrides and the `activation-checkpoint:MODE`
subcommand, or a 0.2 line with `--job.config_file` and overrides.

What a TOML leaves out is torchtitan 0.2.2's JobConfig default (torchtitan/config/job_config.py);
what a 0.3.0 line leaves out is its config function's value (torchtitan 0.3.0
torchtitan/models/<module>/config_registry.py), else 0.3.0's config/configs.py default. The
stack version is 0.3.0 (the launch line's); TOML defaults cite 0.2.2, the last release that read
TOML.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from typing import Any

from ._reading import Doc, Reading, as_bool, as_int, bad
from ._stacks import Stack

VERSION = "0.3.0"
V02 = "torchtitan 0.2.2 torchtitan/config/job_config.py"
V03 = "torchtitan 0.3.0 torchtitan/config/configs.py"
FLAVORS = {
    ("llama3", "8b"): "llama-3.1-8b",
    ("llama3", "70b"): "llama-3.1-70b",
    ("llama3", "405b"): "llama-3.1-405b",
    ("llama2", "7b"): "llama-2-7b",
    ("llama2", "13b"): "llama-2-13b",
    ("llama2", "70b"): "llama-2-70b",
    ("qwen3", "8b"): "qwen3-8b",
    ("qwen3", "30b-a3b"): "qwen3-30b-a3b",
    ("deepseek_v3", "16b"): "deepseek-v2-lite",
    ("deepseek_v3", "671b"): "deepseek-v3",
}
"""torchtitan (model.name, model.flavor) -> trainmem preset (torchtitan/models/<name>/__init__.py
flavors: llama3 8B/70B/405B are Llama-3.1's shapes; deepseek_v3 16B is DeepSeek-V2-Lite's)."""
REGISTRY: dict[str, dict[str, Any]] = {
    "llama3_debugmodel": {
        "model.name": "llama3", "model.flavor": "debugmodel", "training.local_batch_size": 8,
        "training.seq_len": 2048, "activation_checkpoint.mode": "selective",
        "parallelism.pipeline_parallel_schedule": "Interleaved1F1B",
    },
    "llama3_8b": {
        "model.name": "llama3", "model.flavor": "8B", "training.local_batch_size": 1,
        "training.seq_len": 8192, "activation_checkpoint.mode": "selective",
    },
    "llama3_70b": {
        "model.name": "llama3", "model.flavor": "70B", "training.local_batch_size": 8,
        "training.seq_len": 8192, "parallelism.tensor_parallel_degree": 8,
        "activation_checkpoint.mode": "full",
    },
    "llama3_405b": {
        "model.name": "llama3", "model.flavor": "405B", "training.local_batch_size": 2,
        "training.seq_len": 8192, "parallelism.tensor_parallel_degree": 8,
        "activation_checkpoint.mode": "full", "compile.enable": True,
        "model.converters": ["float8"],
    },
    "qwen3_30b_a3b": {
        "model.name": "qwen3", "model.flavor": "30B-A3B", "training.local_batch_size": 2,
        "training.seq_len": 4096, "activation_checkpoint.mode": "full",
    },
    "deepseek_v3_16b": {
        "model.name": "deepseek_v3", "model.flavor": "16B", "training.local_batch_size": 4,
        "training.seq_len": 4096, "parallelism.expert_parallel_degree": 8,
        "parallelism.pipeline_parallel_schedule": "Interleaved1F1B",
        "activation_checkpoint.mode": "selective", "compile.enable": True,
        "compile.components": ["loss"],
    },
    "deepseek_v3_671b": {
        "model.name": "deepseek_v3", "model.flavor": "671B", "training.local_batch_size": 4,
        "training.seq_len": 4096, "parallelism.expert_parallel_degree": 2,
        "parallelism.pipeline_parallel_schedule": "Interleaved1F1B",
        "activation_checkpoint.mode": "selective", "compile.enable": True,
        "compile.components": ["loss"],
    },
}  # fmt: skip
"""torchtitan 0.3.0 config_registry functions (models/llama3, qwen3, deepseek_v3
config_registry.py): their memory-relevant values, in the TOML's dotted names. SelectiveAC is
per-op SAC in 0.3.0 (`selective` here means `op`)."""
DEFAULTS_02: dict[str, Any] = {
    "training.local_batch_size": 8,
    "training.global_batch_size": -1,
    "training.seq_len": 2048,
    "training.mixed_precision_param": "bfloat16",
    "parallelism.data_parallel_replicate_degree": 1,
    "parallelism.data_parallel_shard_degree": -1,
    "parallelism.pipeline_parallel_schedule": "1F1B",
    "parallelism.pipeline_parallel_microbatch_size": 1,
    "activation_checkpoint.mode": "selective",
    "activation_checkpoint.selective_ac_option": "2",
    "compile.components": ["model", "loss"],
    "optimizer.name": "AdamW",
    "optimizer.implementation": "fused",
}
"""torchtitan 0.2.2 JobConfig defaults (torchtitan/config/job_config.py) that change memory."""
DEFAULTS_03 = {
    **DEFAULTS_02,
    "activation_checkpoint.selective_ac_option": "op",
    "parallelism.enable_sequence_parallel": True,
}
"""torchtitan 0.3.0 (config/configs.py TrainingConfig, ParallelismConfig, CompileConfig;
trainer.py Trainer.Config activation_checkpoint=SelectiveAC.Config: per-op SAC;
components/optimizer/optimizer.py implementation "fused")."""
BOOL_FLAGS = {
    "compile.enable",
    "training.compile",
    "training.enable_cpu_offload",
    "training.disable_cuda_graphs",
    "parallelism.enable_sequence_parallel",
    "parallelism.enable_async_tensor_parallel",
    "compile.enable_async_tensor_parallel",
    "checkpoint.enable",
    "checkpoint.enable_checkpoint",
    "memory_estimation.enabled",
    "profiling.enable_profiling",
    "profiling.enable_memory_snapshot",
    "metrics.enable_tensorboard",
    "metrics.enable_wandb",
    "validation.enable",
}
"""Switches of the command line that take no value (`--compile.enable`, `--compile.no-enable`)."""
SINGLE_STAGE = ("1f1b", "gpipe")
"""Pipeline schedules with one stage per rank (torch.distributed.pipelining
PipelineScheduleSingle); every other runs two unless layers_per_stage says otherwise."""
LAUNCHERS = ("torchtitan.train", "torchtitan/train.py", "run_train.sh")


def detect(doc: Doc) -> int:
    """10 for a torchtitan TOML (a [model] flavor beside [training] / [parallelism] /
    [activation_checkpoint]); 12 for a launch line of torchtitan.train (above a plain torchrun
    line's launch reading)."""
    if doc.syntax == "shell":
        return 12 if any(k in doc.text for k in (*LAUNCHERS, "--job.config_file")) else 0
    data = doc.data
    if doc.syntax != "toml" or not isinstance(data, Mapping):
        return 0
    model = data.get("model")
    sections = ("training", "parallelism", "activation_checkpoint")
    if isinstance(model, Mapping) and "flavor" in model and any(s in data for s in sections):
        return 10
    return 0


def read(doc: Doc, reading: Reading) -> None:
    """One torchtitan TOML or launch line."""
    if doc.syntax == "shell":
        _read_line(doc, reading)
        return
    if not isinstance(doc.data, Mapping):
        raise bad(doc, "(file)", "a torchtitan TOML config", doc.data)
    given = {k: (v, k) for k, v in _flatten(doc.data).items()}
    Job(doc, reading, given, dict(DEFAULTS_02), V02, era="0.2").apply()


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and not name.startswith("quantize"):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


class Job:
    """The effective torchtitan config of one file: what it gives (with the key it is under)
    over the stack's defaults, turned into trainmem's fields."""

    def __init__(
        self,
        doc: Doc,
        reading: Reading,
        given: dict[str, tuple[Any, str]],
        defaults: dict[str, Any],
        source: str,
        *,
        era: str,
        launch: dict[str, tuple[int, str]] | None = None,
    ) -> None:
        self.doc, self.reading, self.given = doc, reading, given
        self.defaults, self.source, self.era = defaults, source, era
        self.launch = launch or {}
        self.cli = doc.syntax == "shell"

    # ---- values ----------------------------------------------------------------------------

    def value(self, key: str) -> Any:
        if key in self.given:
            return self.given[key][0]
        return self.defaults.get(key)

    def keyname(self, key: str) -> str:
        return self.given[key][1] if key in self.given else key

    def integer(self, key: str, default: int, ge: int = 1) -> int:
        value = self.value(key)
        return default if value is None else as_int(self.doc, self.keyname(key), value, ge=ge)

    def set(self, name: str, value: Any, keys: tuple[str, ...], why: str = "") -> None:
        """A field from `keys`: the file's when it gives any of them, else the default's."""
        mine = list(dict.fromkeys(self.given[k][1] for k in keys if k in self.given))
        if mine and self.cli:
            self.reading.override(name, value, f"file:{','.join(mine)}", self.doc.name)
        elif mine:
            self.reading.put(name, value, self.doc, ",".join(mine))
        else:
            self.reading.default(name, value, f"{self.source} {why or ', '.join(keys)}".strip())

    # ---- fields ----------------------------------------------------------------------------

    def apply(self) -> None:
        self.model()
        layout = self.layout()
        self.precision(layout)
        self.batch(layout)
        if layout["pp"] > 1:
            self.stages(layout["pp"])
        self.recompute()
        self.compile()
        self.optimizer()
        self.rest()

    def model(self) -> None:
        name, flavor = self.value("model.name") or "llama3", self.value("model.flavor")
        if flavor is None:
            return
        key = (str(name).lower(), str(flavor).lower())
        self.set("model", FLAVORS.get(key, f"{name}-{flavor}"), ("model.name", "model.flavor"))

    def layout(self) -> dict[str, int]:
        """The parallel degrees, num_gpus, zero and dp_shard."""
        p = "parallelism."
        deg = {
            "tp": self.integer(f"{p}tensor_parallel_degree", 1),
            "pp": self.integer(f"{p}pipeline_parallel_degree", 1),
            "cp": self.integer(f"{p}context_parallel_degree", 1),
            "ep": self.integer(f"{p}expert_parallel_degree", 1),
            "etp": self.integer(f"{p}expert_tensor_parallel_degree", 1),
        }
        keys = {
            "tp": "tensor_parallel_degree", "pp": "pipeline_parallel_degree",
            "cp": "context_parallel_degree", "ep": "expert_parallel_degree",
            "etp": "expert_tensor_parallel_degree",
        }  # fmt: skip
        for name, key in keys.items():
            if f"{p}{key}" in self.given or deg[name] != 1:
                self.set(name, deg[name], (f"{p}{key}",))
        replicate = self.integer(f"{p}data_parallel_replicate_degree", 1)
        shard = self.value(f"{p}data_parallel_shard_degree")
        shard = (
            -1
            if shard is None
            else as_int(self.doc, self.keyname(f"{p}data_parallel_shard_degree"), shard, ge=-1)
        )
        if shard == 0:
            raise bad(self.doc, self.keyname(f"{p}data_parallel_shard_degree"), "-1 or >= 1", 0)
        return self.gpus(deg, replicate, shard)

    def gpus(self, deg: dict[str, int], replicate: int, shard: int) -> dict[str, int]:
        p = "parallelism."
        degree_keys = tuple(
            f"{p}{k}"
            for k in (
                "data_parallel_replicate_degree", "data_parallel_shard_degree",
                "tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree",
            )
        )  # fmt: skip
        model = deg["tp"] * deg["pp"] * deg["cp"]
        total: int | None = None
        if shard != -1:
            total = replicate * shard * model
            self.set("num_gpus", total, degree_keys)
        elif "num_gpus" in self.launch:
            total, key = self.launch["num_gpus"]
            self.reading.override("num_gpus", total, f"file:{key}", self.doc.name)
            if total % (replicate * model):
                raise ValueError(
                    f"{self.doc.name}: {key}: {total} GPUs do not divide into replicate "
                    f"{replicate} x tp x pp x cp {model}"
                )
            shard = total // (replicate * model)
        else:
            self.reading.warn(
                f"{self.doc.name}: parallelism.data_parallel_shard_degree -1 takes the GPUs "
                "left over; the file does not say how many: give --num-gpus"
            )
        sharded = shard == -1 or shard > 1 or deg["cp"] > 1
        zero_keys = (f"{p}data_parallel_shard_degree", f"{p}context_parallel_degree")
        self.set("zero", 3 if sharded else 0, zero_keys, "FSDP2 over dp_shard x cp")
        if replicate > 1 and sharded and shard != -1:
            self.set("dp_shard", shard, (f"{p}data_parallel_shard_degree",))
        return {**deg, "replicate": replicate, "shard": shard, "sharded": int(sharded),
                "gpus": total or 0}  # fmt: skip

    def precision(self, layout: dict[str, int]) -> None:
        keys = ("training.mixed_precision_param", "training.dtype")
        param = str(self.value(keys[0]) or "bfloat16").lower()
        dtype = str(self.value(keys[1]) or "float32").lower()
        if param not in ("bfloat16", "float32") or dtype not in ("bfloat16", "float32"):
            key = keys[0] if param not in ("bfloat16", "float32") else keys[1]
            raise bad(self.doc, self.keyname(key), "bfloat16 or float32", self.value(key))
        if dtype == "bfloat16":
            precision = "bf16"
        elif param == "float32":
            precision = "fp32"
        elif self.era == "0.3" or layout["sharded"]:
            precision = "mixed-bf16"  # FSDP2 MixedPrecisionPolicy(param_dtype=bfloat16)
        elif layout["tp"] > 1 or layout["pp"] > 1:
            precision = "fp32"  # 0.2.2 distributed/utils.py maybe_enable_amp: disabled
        else:
            precision = "amp-bf16"  # 0.2.2 maybe_enable_amp: torch.autocast (DDP, one GPU)
        converters = self.converters()
        if converters and precision != "fp32":
            precision = "fp8-mixed"
        why = "training.mixed_precision_param (bfloat16: FSDP2 MixedPrecisionPolicy)"
        self.set("precision", precision, (*keys, *converters), why)

    def converters(self) -> tuple[str, ...]:
        """The Float8 converter's key, when the model is converted to Float8Linear."""
        value = self.value("model.converters")
        if value is None:
            return ()
        items = value.split(",") if isinstance(value, str) else list(value)
        found: tuple[str, ...] = ()
        for item in (str(i).strip() for i in items if str(i).strip()):
            if item in ("float8", "quantize.linear.float8"):
                found = ("model.converters",)
            else:
                self.reading.unmodelled_key(self.doc, self.keyname("model.converters"),
                                            f"converter {item} is not modelled")  # fmt: skip
        return found

    def batch(self, layout: dict[str, int]) -> None:
        local_key = "training.batch_size" if "training.batch_size" in self.given else (
            "training.local_batch_size")  # fmt: skip
        local = self.integer(local_key, 8)
        glob = self.integer("training.global_batch_size", -1, ge=-1)
        seq = self.integer("training.seq_len", 2048)
        if "training.seq_len" in self.given or seq != 2048:
            self.set("seq_len", seq, ("training.seq_len",))
        dp = layout["replicate"] * layout["shard"] if layout["shard"] != -1 else 0
        if layout["pp"] > 1:
            micro_key = "parallelism.pipeline_parallel_microbatch_size"
            micro = self.integer(micro_key, 1)
            if local % micro:
                raise bad(self.doc, self.keyname(local_key), f"a multiple of {micro}", local)
            self.set("micro_batch_size", micro, (micro_key,))
            total = glob if glob > 0 else local * dp
            if total > 0:
                self.set("global_batch_size", total, ("training.global_batch_size", local_key))
            return
        self.set("micro_batch_size", local, (local_key,))
        if glob > 0:
            self.set("global_batch_size", glob, ("training.global_batch_size",))

    def stages(self, pp: int) -> None:
        """Virtual stages per rank: two for a looped schedule, or ceil((layers + first + last
        stage's less layers) / layers_per_stage) / pp (distributed/pipeline_parallel.py)."""
        keys = (
            "parallelism.pipeline_parallel_schedule",
            "parallelism.pipeline_parallel_layers_per_stage",
        )
        schedule = str(self.value(keys[0]) or "1F1B").strip()
        per_stage = self.value(keys[1])
        if per_stage is None:
            stages = 1 if schedule.lower() in SINGLE_STAGE else 2
            self.set("virtual_stages", stages, keys[:1])
            return
        size = as_int(self.doc, self.keyname(keys[1]), per_stage, ge=1)
        layers = self.layers()
        if layers is None:
            self.reading.warn(f"{self.doc.name}: {self.keyname(keys[1])}: the model's layer "
                              "count is unknown here; give --virtual-stages")  # fmt: skip
            return
        first = self.integer("parallelism.pipeline_parallel_first_stage_less_layers", 1, ge=0)
        last = self.integer("parallelism.pipeline_parallel_last_stage_less_layers", 1, ge=0)
        total = math.ceil((layers + first + last) / size)
        if total % pp:
            raise ValueError(
                f"{self.doc.name}: {self.keyname(keys[1])}: torchtitan makes ceil(({layers} + "
                f"{first} + {last}) / {size}) = {total} stages, not a multiple of pp {pp}"
            )
        self.set("virtual_stages", total // pp, keys)

    def layers(self) -> int | None:
        """The model's block count (its preset, resolved offline), None when unknown."""
        from trainmem.catalog import load_model

        from ._models import resolve_model

        model = self.reading.get("model")
        try:
            return int(load_model(resolve_model(str(model))).num_hidden_layers)
        except (ValueError, TypeError, AttributeError, OSError):
            return None

    def recompute(self) -> None:
        mode = self.value("activation_checkpoint.mode")
        mode = "none" if mode is None else str(mode).strip().lower()
        keys = ("activation_checkpoint.mode", "activation_checkpoint.selective_ac_option")
        if mode in ("none", "full"):
            self.set("recompute", mode, keys[:1])
        elif mode == "selective":
            option = str(self.value(keys[1])).strip().lower()
            if option == "op":
                self.set("recompute", "selective-op", keys)
            else:
                every = as_int(self.doc, self.keyname(keys[1]), option, ge=1)
                self.set("recompute", "selective-layer", keys)
                self.set("recompute_every", every, keys[1:])
        elif mode in ("memory_budget", "memory-budget"):
            self.reading.unmodelled_key(self.doc, self.keyname(keys[0]),
                                        "torch.compile's memory-budget partitioner")  # fmt: skip
        else:
            raise bad(self.doc, self.keyname(keys[0]), "none|selective|full|memory_budget", mode)

    def compile(self) -> None:
        key = "training.compile" if "training.compile" in self.given else "compile.enable"
        on = self.value(key)
        if on is None or not as_bool(self.doc, self.keyname(key), on):
            if key in self.given:
                self.set("compile", "none", (key,))
            return
        if key == "training.compile":  # torchtitan 0.1: per-block torch.compile
            self.set("compile", "blocks", (key,))
            return
        parts = self.value("compile.components") or []
        parts = parts.split(",") if isinstance(parts, str) else parts
        parts = {str(p).strip() for p in parts}
        if "model" in parts:
            mode = "blocks+loss" if "loss" in parts else "blocks"
            self.set("compile", mode, (key, "compile.components"))
            return
        self.reading.unmodelled_key(self.doc, self.keyname("compile.components"),
                                    f"torch.compile of {sorted(parts)} only (trainmem compiles "
                                    "blocks or blocks+loss)")  # fmt: skip

    def optimizer(self) -> None:
        keys = ("optimizer.name", "optimizer.implementation")
        name = str(self.value(keys[0]) or "AdamW").strip()
        impl = str(self.value(keys[1]) or "fused").strip().lower()
        if name.lower() not in ("adamw", "adam"):
            self.reading.unmodelled_key(self.doc, self.keyname(keys[0]),
                                        f"{name} is not one of trainmem's optimizers")  # fmt: skip
            return
        found = "adamw-fused" if impl in ("fused", "fused_opt_states_bf16") else "adamw"
        if impl == "fused_opt_states_bf16":
            self.reading.unmodelled_key(self.doc, self.keyname(keys[1]),
                                        "bf16 optimizer states")  # fmt: skip
        why = "optimizer.implementation (fused)"
        if self.era == "0.3":
            why = "(components/optimizer/optimizer.py: implementation fused)"
        self.set("optimizer", found, keys, why)

    def rest(self) -> None:
        tp = self.integer("parallelism.tensor_parallel_degree", 1)
        sp_key = "parallelism.enable_sequence_parallel"
        if tp > 1:
            sp = self.value(sp_key)
            on = True if sp is None else as_bool(self.doc, self.keyname(sp_key), sp)
            self.set("sequence_parallel", on, (sp_key,), "(TP plans shard norms: SequenceParallel)")
            if not on:  # engine/_tensor_parallel.py sequence_parallel_on: torchtitan's TP is SP
                self.reading.unmodelled_key(
                    self.doc,
                    self.keyname(sp_key),
                    "TP without sequence parallelism: trainmem counts torchtitan's default (SP on)",
                )
        offload = self.value("training.enable_cpu_offload")
        if offload is not None and as_bool(
            self.doc, self.keyname("training.enable_cpu_offload"), offload
        ):
            self.set("offload", "optimizer+params", ("training.enable_cpu_offload",))
        if self.era == "0.2":
            self.reading.default("loss", "full", "torchtitan 0.2.2 torchtitan/components/loss.py "
                                 "build_cross_entropy_loss (one cross entropy)")  # fmt: skip


# ---- launch lines -----------------------------------------------------------------------------


def _read_line(doc: Doc, reading: Reading) -> None:
    """A torchrun / run_train.sh line of torchtitan.train."""
    env, words = _command(doc)
    head, args = _split(words)
    given, extra = _flags(doc, args)
    launch = _launcher(doc, env, head)
    if "job.config_file" in given:
        era, defaults, source = "0.2", dict(DEFAULTS_02), V02
        reading.warn(f"{doc.name}: --job.config_file {given['job.config_file'][0]}: give that "
                     "TOML file too for its values")  # fmt: skip
    else:
        era, defaults, source = "0.3", dict(DEFAULTS_03), V03
        config = str(given.get("config", ("", ""))[0])
        if config in REGISTRY:
            defaults.update(REGISTRY[config])
            source = f"torchtitan {VERSION} config_registry.py {config}:"
        elif config:
            reading.warn(f"{doc.name}: --config {config}: not a torchtitan {VERSION} config "
                         "function trainmem knows; its values are not read")  # fmt: skip
        if config in REGISTRY:
            for key in ("model.name", "model.flavor"):
                given.setdefault(key, (REGISTRY[config][key], "--config"))
    if extra.get("activation_checkpoint.mode"):
        given["activation_checkpoint.mode"] = extra["activation_checkpoint.mode"]
    if env.get("allocator"):
        reading.override("allocator", "expandable-segments", f"file:{env['allocator']}", doc.name)
    Job(doc, reading, given, defaults, source, era=era, launch=launch).apply()


def _command(doc: Doc) -> tuple[dict[str, str], list[str]]:
    """The environment the script sets and the words of its torchtitan command."""
    text = re.sub(r"\\\r?\n", " ", doc.text)
    env: dict[str, str] = {}
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise ValueError(f"{doc.name}: cannot split the line ({exc})") from None
        while words and words[0] == "export":
            words = words[1:]
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        if any(w.endswith(LAUNCHERS) or w in LAUNCHERS for w in words):
            return _environment(env), words
    raise ValueError(f"{doc.name}: no torchtitan.train command in the script")


def _environment(env: dict[str, str]) -> dict[str, str]:
    out = dict(env)
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        if "expandable_segments:true" in env.get(name, "").lower():
            out["allocator"] = name
    return out


def _split(words: list[str]) -> tuple[list[str], list[str]]:
    """The launcher's words and torchtitan's arguments."""
    for k, word in enumerate(words):
        if word in LAUNCHERS or word.endswith(LAUNCHERS):
            return words[: k + 1], words[k + 1 :]
    return words, []


def _flags(doc: Doc, args: list[str]) -> tuple[dict[str, tuple[Any, str]], dict[str, Any]]:
    """`--section.field value` (or `=value`), `--x.flag` / `--x.no-flag` switches and the
    `activation-checkpoint:MODE` subcommand, as dotted keys with the flag they came from."""
    given: dict[str, tuple[Any, str]] = {}
    extra: dict[str, Any] = {}
    k = 0
    while k < len(args):
        word = args[k]
        k += 1
        if word.startswith("activation-checkpoint:") or word.startswith("activation_checkpoint:"):
            mode = word.split(":", 1)[1]
            extra["activation_checkpoint.mode"] = (mode, word)
            continue
        if not word.startswith("--"):
            continue
        flag, eq, value = word.partition("=")
        name = flag[2:].replace("-", "_")
        section, _, field = name.rpartition(".")
        negated = field.startswith("no_") and f"{section}.{field[3:]}" in BOOL_FLAGS
        key = f"{section}.{field[3:]}" if negated else name
        if key in BOOL_FLAGS and not eq:
            given[key] = (not negated, flag)
            continue
        if not eq:
            if k >= len(args) or args[k].startswith("--") or args[k].startswith("$"):
                raise bad(doc, flag, "a value", None)
            value, k = args[k], k + 1
        given[key] = (value, flag)
    return given, extra


def _launcher(doc: Doc, env: dict[str, str], head: list[str]) -> dict[str, tuple[int, str]]:
    """num_gpus from torchrun's --nnodes x --nproc-per-node (run_train.sh: NGPU, default 8)."""
    flags: dict[str, str] = {}
    for k, word in enumerate(head):
        flag, eq, value = word.partition("=")
        flag = flag.replace("_", "-")
        if flag in ("--nproc-per-node", "--nnodes"):
            flags[flag] = value if eq else (head[k + 1] if k + 1 < len(head) else "")
    if head and head[-1].endswith("run_train.sh"):
        flags.setdefault("--nproc-per-node", env.get("NGPU", "8"))
    procs = _resolve(flags.get("--nproc-per-node", "1"), env)
    nodes = _resolve(flags.get("--nnodes", "1"), env)
    if procs is None or nodes is None:
        return {}
    per = as_int(doc, "--nproc-per-node", procs, ge=1)
    count = as_int(doc, "--nnodes", nodes, ge=1)
    if "--nproc-per-node" not in flags and "--nnodes" not in flags:
        return {}
    key = "--nnodes,--nproc-per-node" if count > 1 else "--nproc-per-node"
    return {"num_gpus": (per * count, key)}


def _resolve(value: str, env: dict[str, str]) -> str | None:
    """A torchrun count: a number, `${VAR}` / `$VAR` the script set, else None (unknown)."""
    match = re.fullmatch(r"\$\{?(\w+)(?::-\"?(\d+)\"?)?\}?", value.strip())
    if match:
        value = env.get(match.group(1), match.group(2) or "")
        value = re.sub(r"^\$\{\w+:-\"?(\d+)\"?\}$", r"\1", value)
    if ":" in value or not value.strip().isdigit():
        return None
    return value


STACK = Stack(name="torchtitan", version=VERSION, framework="torchtitan", detect=detect, read=read)
