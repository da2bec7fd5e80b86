"""accelerate config YAMLs (`accelerate launch --config_file`, accelerate 1.15.0: ClusterConfig of
accelerate/commands/config/config_args.py): the GPU count, mixed precision, FSDP (sharding, offload,
activation checkpointing, CPU-RAM-efficient loading, FSDP2), DeepSpeed (`deepspeed_config`: stage,
offload), `parallelism_config` (tp, cp, dp_shard) and `dynamo_config`.

Read after an HF Trainer config (its auxiliary file), or alone. The keys known to accelerate are in
tests/data/accelerate_fsdp_keys.json.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._deepspeed import DEEPSPEED_DEFAULT_REDUCE_BUCKET_ELEMS, to_framework, wrapped_precision
from ._reading import Doc, Reading, as_bool, as_int, bad, is_auto
from ._stacks import Stack

VERSION = "1.15.0"
SOURCE = f"accelerate {VERSION}"
MARKERS = ("distributed_type", "compute_environment", "fsdp_config", "deepspeed_config",
           "num_machines", "main_training_function", "mixed_precision")  # fmt: skip
DISTRIBUTED = ("NO", "MULTI_GPU", "FSDP", "DEEPSPEED", "MULTI_CPU", "MULTI_NPU", "MULTI_MLU",
               "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "XLA", "MEGATRON_LM", "MULTI_HPU",
               "MULTI_NEURON")  # fmt: skip
SHARDING = {"FULL_SHARD": (3, False), "SHARD_GRAD_OP": (2, False), "NO_SHARD": (0, False),
            "HYBRID_SHARD": (3, True), "HYBRID_SHARD_ZERO2": (2, True)}  # fmt: skip
"""fsdp_sharding_strategy -> (trainmem zero, hybrid: shard within a machine)."""
SHARDING_BY_NUMBER = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                      "HYBRID_SHARD_ZERO2")  # fmt: skip
"""accelerate also takes the strategy's number, 1-5 (utils/constants.py FSDP_SHARDING_STRATEGY)."""
PLUGIN = "src/accelerate/utils/dataclasses.py FullyShardedDataParallelPlugin"
PRECISIONS = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "no": None}


def detect(doc: Doc) -> int:
    data = doc.data
    if not isinstance(data, Mapping):
        return 0
    if "distributed_type" in data or "compute_environment" in data:
        return 10
    return 6 if sum(k in data for k in MARKERS) >= 2 else 0


def read(doc: Doc, reading: Reading) -> None:
    data: Mapping[str, Any] = doc.data
    kind = str(data.get("distributed_type", "NO")).strip().upper()
    if kind not in DISTRIBUTED:
        raise bad(doc, "distributed_type", "|".join(DISTRIBUTED), data.get("distributed_type"))
    _gpus(data, doc, reading)
    if kind == "FSDP":
        _fsdp(data.get("fsdp_config") or {}, doc, reading)
    elif kind == "DEEPSPEED":
        _deepspeed(data.get("deepspeed_config") or {}, doc, reading)
    elif kind == "MEGATRON_LM":
        reading.unmodelled_key(doc, "distributed_type", "accelerate's Megatron-LM plugin")
    _precision(data, kind, doc, reading)
    _parallelism(data.get("parallelism_config") or {}, doc, reading)
    _dynamo(data.get("dynamo_config") or {}, doc, reading)


def _gpus(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    """num_processes is every machine's processes together (accelerate/commands/launch.py)."""
    if "num_processes" in data and not is_auto(data["num_processes"]):
        reading.put(
            "num_gpus",
            as_int(doc, "num_processes", data["num_processes"], ge=1),
            doc,
            "num_processes",
        )
    if "num_machines" in data:
        as_int(doc, "num_machines", data["num_machines"], ge=1)


def _precision(data: Mapping[str, Any], kind: str, doc: Doc, reading: Reading) -> None:
    """mixed_precision: autocast under DDP (amp-*), a 16-bit working copy of fp32 weights under
    FSDP and DeepSpeed (mixed-*); fp8 is Transformer Engine / torchao (fp8-mixed)."""
    if "mixed_precision" not in data:
        return
    text = str(data["mixed_precision"]).strip().lower()
    if text not in PRECISIONS:
        raise bad(doc, "mixed_precision", "no, fp16, bf16 or fp8", data["mixed_precision"])
    half = PRECISIONS[text]
    if half == "fp8":
        reading.put("precision", "fp8-mixed", doc, "mixed_precision")
    elif half is not None:
        sharded = kind in ("FSDP", "DEEPSPEED")
        reading.put(
            "precision", f"mixed-{half}" if sharded else f"amp-{half}", doc, "mixed_precision"
        )
    if kind == "FSDP":
        wrapped_precision(reading, "fsdp", doc, "distributed_type")


def _fsdp(cfg: Any, doc: Doc, reading: Reading) -> None:
    if not isinstance(cfg, Mapping):
        raise bad(doc, "fsdp_config", "a mapping", cfg)
    p = "fsdp_config."
    version = as_int(doc, p + "fsdp_version", cfg.get("fsdp_version", 1), ge=1)
    if version == 1:
        reading.warn(f"{doc.name}: FSDP1 (fsdp_version 1, accelerate's default) modelled as FSDP2")
    _sharding(cfg, version, doc, reading)
    if as_bool(doc, p + "fsdp_offload_params", cfg.get("fsdp_offload_params", False)):
        reading.put("offload", "optimizer+params", doc, p + "fsdp_offload_params")
    if as_bool(
        doc, p + "fsdp_activation_checkpointing", cfg.get("fsdp_activation_checkpointing", False)
    ):
        reading.put("recompute", "full", doc, p + "fsdp_activation_checkpointing")
    key = p + "fsdp_cpu_ram_efficient_loading"
    if key.removeprefix(p) in cfg:
        # true: rank 0 reads, the others build on meta and receive each tensor; false: every
        # rank's whole CPU model moved to the GPUs by fully_shard (accelerate 1.15.0
        # utils/fsdp_utils.py fsdp2_prepare_model / fsdp2_load_full_state_dict).
        efficient = as_bool(doc, key, cfg["fsdp_cpu_ram_efficient_loading"])
        reading.put("load", "meta-init" if efficient else "cpu-full-state-dict", doc, key)
    if as_bool(
        doc,
        p + "fsdp_activation_checkpointing_offload",
        cfg.get("fsdp_activation_checkpointing_offload", False),
    ):
        reading.unmodelled_key(
            doc,
            p + "fsdp_activation_checkpointing_offload",
            "checkpointed inputs offloaded to the CPU",
        )
    wrap = str(cfg.get("fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP")).upper()
    if wrap != "TRANSFORMER_BASED_WRAP":
        reading.unmodelled_key(doc, p + "fsdp_auto_wrap_policy", f"{wrap}: units not per block")
    if version == 1 and as_bool(
        doc, p + "fsdp_forward_prefetch", cfg.get("fsdp_forward_prefetch", False)
    ):
        reading.unmodelled_key(doc, p + "fsdp_forward_prefetch", "one more block gathered")
    prefetch = str(cfg.get("fsdp_backward_prefetch", "BACKWARD_PRE")).upper()
    if version == 1 and prefetch != "BACKWARD_PRE":
        reading.unmodelled_key(doc, p + "fsdp_backward_prefetch", f"{prefetch}: fewer gathered")


def _sharding(cfg: Mapping[str, Any], version: int, doc: Doc, reading: Reading) -> None:
    """FSDP2 shards by fsdp_reshard_after_forward (True: ZeRO-3, False: ZeRO-2) and ignores the
    strategy; FSDP1 by the strategy, which accelerate 1.x takes as fsdp_reshard_after_forward
    (or the older fsdp_sharding_strategy); default FULL_SHARD / True."""
    p = "fsdp_config."
    reshard = cfg.get("fsdp_reshard_after_forward")
    if version >= 2 or isinstance(reshard, bool):
        if reshard is None:
            reading.default("zero", 3, f"{SOURCE} {PLUGIN} (reshard_after_forward True)")
            return
        key = p + "fsdp_reshard_after_forward"
        reading.put("zero", 3 if as_bool(doc, key, reshard) else 2, doc, key)
        return
    key = p + ("fsdp_reshard_after_forward" if reshard is not None else "fsdp_sharding_strategy")
    strategy = reshard if reshard is not None else cfg.get("fsdp_sharding_strategy")
    if strategy is None:
        reading.default("zero", 3, f"{SOURCE} {PLUGIN} (sharding_strategy FULL_SHARD)")
        return
    if isinstance(strategy, int) and not isinstance(strategy, bool):
        if not 1 <= strategy <= 5:
            raise bad(doc, key, "a strategy 1-5", strategy)
        strategy = SHARDING_BY_NUMBER[strategy - 1]
    name = str(strategy).strip().upper()
    if name not in SHARDING:
        raise bad(doc, key, "|".join(SHARDING), strategy)
    zero, hybrid = SHARDING[name]
    reading.put("zero", zero, doc, key)
    if hybrid:
        machines = max(as_int(doc, "num_machines", doc.data.get("num_machines", 1), ge=1), 1)
        gpus = reading.get("num_gpus")
        if gpus is not None:
            reading.put("dp_shard", max(int(gpus) // machines, 1), doc, key)


def _deepspeed(cfg: Any, doc: Doc, reading: Reading) -> None:
    """The deepspeed_config block of an accelerate config (accelerate/utils/dataclasses.py
    DeepSpeedPlugin): stage and offload devices, or a DeepSpeed JSON file to read with it."""
    if not isinstance(cfg, Mapping):
        raise bad(doc, "deepspeed_config", "a mapping", cfg)
    p = "deepspeed_config."
    to_framework(reading, "deepspeed", doc, "distributed_type")
    if cfg.get("deepspeed_config_file"):
        reading.warn(
            f"{doc.name}: {p}deepspeed_config_file {cfg['deepspeed_config_file']!r}: "
            "give that JSON too (its keys are read from it)"
        )
    if "zero_stage" in cfg:
        stage = as_int(doc, p + "zero_stage", cfg["zero_stage"])
        if stage > 3:
            raise bad(doc, p + "zero_stage", "a ZeRO stage 0-3", cfg["zero_stage"])
        reading.put("zero", stage, doc, p + "zero_stage")
        if not cfg.get("deepspeed_config_file") and stage >= 1:
            _deepspeed_plugin_buckets(stage, reading)
    devices = {}
    for name in ("offload_optimizer_device", "offload_param_device"):
        device = str(cfg.get(name, "none")).strip().lower()
        if device not in ("none", "cpu", "nvme"):
            raise bad(doc, p + name, "none, cpu or nvme", cfg[name])
        if device == "nvme":
            reading.unmodelled_key(doc, p + name, "NVMe offload: the GPU side is counted as cpu's")
        if device != "none":
            devices[name] = p + name
    if "offload_param_device" in devices and "offload_optimizer_device" in devices:
        reading.put("offload", "optimizer+params", doc, devices["offload_param_device"])
    elif "offload_param_device" in devices:
        reading.unmodelled_key(doc, devices["offload_param_device"], "parameters offloaded alone")
    elif "offload_optimizer_device" in devices:
        reading.put("offload", "optimizer", doc, devices["offload_optimizer_device"])
    if "gradient_accumulation_steps" in cfg and not is_auto(cfg["gradient_accumulation_steps"]):
        steps = as_int(
            doc, p + "gradient_accumulation_steps", cfg["gradient_accumulation_steps"], ge=1
        )
        reading.put("grad_accum_steps", steps, doc, p + "gradient_accumulation_steps")


def _deepspeed_plugin_buckets(stage: int, reading: Reading) -> None:
    """Without a DeepSpeed JSON, accelerate's DeepSpeedPlugin writes a zero_optimization block
    of the stage, the offload devices and stage3_gather_16bit_weights_on_model_save only, so
    DeepSpeed's own defaults apply: reduce_bucket_size 5e8 elements, overlap_comm off under
    ZeRO 1-2 (on under ZeRO-3), not the Trainer's "auto" sizes.
    Source: accelerate 1.x utils/dataclasses.py DeepSpeedPlugin.__post_init__ (the config dict
    built from the plugin's fields); deepspeed 0.19.8 runtime/zero/config.py."""
    source = (
        f"{SOURCE} src/accelerate/utils/dataclasses.py DeepSpeedPlugin (no DeepSpeed JSON: "
        "DeepSpeed's own zero_optimization defaults)"
    )
    reading.default("zero_bucket_elems", DEEPSPEED_DEFAULT_REDUCE_BUCKET_ELEMS, source)
    if stage < 3:
        reading.default("overlap_comm", "off", source)


def _parallelism(cfg: Any, doc: Doc, reading: Reading) -> None:
    """parallelism_config (accelerate ParallelismConfig): tp, cp, dp_shard under dp_replicate."""
    if not isinstance(cfg, Mapping):
        raise bad(doc, "parallelism_config", "a mapping", cfg)
    p = "parallelism_config.parallelism_config_"
    sizes = {k: as_int(doc, p + k, cfg[f"parallelism_config_{k}"], ge=1)
             for k in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")
             if f"parallelism_config_{k}" in cfg}  # fmt: skip
    for name, field in (("tp_size", "tp"), ("cp_size", "cp")):
        if sizes.get(name, 1) > 1:
            reading.put(field, sizes[name], doc, p + name)
    if sizes.get("dp_replicate_size", 1) > 1 and "dp_shard_size" in sizes:
        reading.put("dp_shard", sizes["dp_shard_size"], doc, p + "dp_shard_size")
    if sizes.get("sp_size", 1) > 1:
        reading.unmodelled_key(doc, p + "sp_size", "Ulysses sequence parallelism (all-to-all)")


def _dynamo(cfg: Any, doc: Doc, reading: Reading) -> None:
    """dynamo_config: torch.compile of the whole model (the loss inside the HF model's forward),
    or of each block with dynamo_use_regional_compilation (accelerate/accelerator.py prepare)."""
    if not isinstance(cfg, Mapping):
        raise bad(doc, "dynamo_config", "a mapping", cfg)
    backend = str(cfg.get("dynamo_backend", "NO")).strip().upper()
    if backend in ("NO", "NONE", ""):
        return
    regional = as_bool(
        doc,
        "dynamo_config.dynamo_use_regional_compilation",
        cfg.get("dynamo_use_regional_compilation", False),
    )
    reading.put(
        "compile", "blocks" if regional else "blocks+loss", doc, "dynamo_config.dynamo_backend"
    )


STACK = Stack(
    name="accelerate",
    version=VERSION,
    framework="hf",
    detect=detect,
    read=read,
    auxiliary=True,
    mapping_only=True,
)
