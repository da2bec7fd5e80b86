"""axolotl configs (axolotl 0.18.0, commit 067b021c8b87a9e5e380b9173c704cf7340e30f5: the pydantic
schema of src/axolotl/utils/schemas/*.py, `axolotl train config.yml`): the base model, micro-batch,
accumulation and `sequence_len`, the adapter (LoRA / QLoRA, 4- and 8-bit loading), bf16/fp16 with
the dtype axolotl loads the model in, gradient checkpointing, activation offloading, attention,
the optimizer, `deepspeed` (a JSON path: its stage and offload inferred from axolotl's shipped
deepspeed_configs/*.json by name; inline: read as a DeepSpeed config), FSDP (`fsdp`,
`fsdp_config`), the N-D parallel sizes, torch.compile, the Liger and Cut Cross Entropy plugins and
the kernels trainmem does not model.

axolotl runs the HF Trainer (transformers 5.14.1, peft 0.19.1, accelerate 1.13.0 are its pins):
the job is trainmem's `hf` framework, `deepspeed` with a DeepSpeed config. The helpers shared
with the LLaMA-Factory reader (stacks/_llamafactory.py), also an HF Trainer stack, are here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from . import _deepspeed, _hf
from ._reading import Doc, Reading, as_bool, as_int, bad, dig
from ._stacks import Stack

VERSION = "0.18.0"
AX = f"axolotl {VERSION}"
SCHEMA = f"{AX} src/axolotl/utils/schemas"
RESOLVE_DTYPE = f"{AX} src/axolotl/utils/config/__init__.py resolve_dtype"

MARKERS = ("base_model", "sequence_len", "micro_batch_size", "sample_packing", "lora_target_linear",
           "base_model_config", "eval_sample_packing", "pad_to_sequence_len")  # fmt: skip
"""Top-level keys only axolotl's schema has (the HF Trainer's names differ)."""
FOREIGN = ("model_name_or_path", "_component_", "checkpoint_dir", "finetuning_type", "cutoff_len")

OPTIMIZERS = {**_hf.OPTIMIZERS, "adamw_torch_8bit": "adamw-8bit", "ao_adamw_8bit": "adamw-8bit"}
"""transformers OptimizerNames (training_args.py) and axolotl's CustomSupportedOptimizers
(schemas/enums.py) -> trainmem; paged AdamWs as the HF reader's (bitsandbytes' paged states
to the host), paged Lion counted as resident and said unmodelled; the torchao 8-bit AdamWs are
counted as bitsandbytes' (8-bit states in blocks)."""

PRE_QUANTISED = re.compile(r"(^|[-_./])(gptq|awq|aqlm|bnb-4bit|4bit|int4|nf4|exl2)([-_./]|$)", re.I)
"""A checkpoint name that says it is already quantised (TheBloke's -GPTQ, -AWQ, unsloth's
-bnb-4bit)."""


class Shipped(NamedTuple):
    """What a DeepSpeed JSON the stack ships sets (read from the file at the pinned commit)."""

    stage: int
    offload: str
    notes: str = ""
    """Keys of that file trainmem does not model (empty: none)."""
    buckets: tuple[float, str] = (0.0, "auto")
    """Its reduce bucket and overlap_comm as `zero_bucket_elems` / `overlap_comm` (what
    stacks/_deepspeed.py reads from the JSON itself: no reduce_bucket_size key is DeepSpeed's
    5e8, no overlap_comm key off under ZeRO 1-2)."""


_Z3 = ("sub_group_size 0, max_live_parameters 0 and max_reuse_distance 0 (not DeepSpeed's 1e9 "
       "defaults)")  # fmt: skip
DEEPSPEED_FILES = {
    "zero1.json": Shipped(1, "none", buckets=(5e8, "on")),
    "zero1_torch_compile.json": Shipped(1, "none", "compile (DeepSpeed compile)", (5e8, "on")),
    "zero2.json": Shipped(2, "optimizer", buckets=(5e8, "on")),
    "zero2_torch_compile.json": Shipped(2, "optimizer", "compile (DeepSpeed compile)", (5e8, "on")),
    "zero3.json": Shipped(3, "none", _Z3),
    "zero3_bf16.json": Shipped(3, "none", _Z3),
    "zero3_bf16_cpuoffload_all.json": Shipped(3, "optimizer+params", _Z3),
    "zero3_bf16_cpuoffload_params.json": Shipped(
        3,
        "none",
        f"offload_param cpu without offload_optimizer (parameters offloaded alone); {_Z3}",
    ),
}
"""axolotl 0.18.0 deepspeed_configs/*.json: stage, offload and what trainmem does not model. All
leave bf16/fp16 "auto" (the Trainer's flag) except zero3_bf16*.json (bf16 enabled: true)."""


def detect(doc: Doc) -> int:
    data = doc.data
    if not isinstance(data, Mapping) or any(k in data for k in FOREIGN):
        return 0
    found = sum(k in data for k in MARKERS)
    if "base_model" in data and found >= 2:
        return 10
    return 8 if found >= 2 else 0


def read(doc: Doc, reading: Reading) -> None:
    data: Mapping[str, Any] = doc.data
    model = data.get("base_model")
    if model:
        reading.put("model", str(model), doc, "base_model")
        pre_quantised(doc, reading, "base_model", str(model))
    _batch(data, doc, reading)
    _wrappers(data, doc, reading)
    _parallel(data, doc, reading)
    _adapter(data, doc, reading)
    _precision(data, doc, reading)
    _training(data, doc, reading)
    attention(data, doc, reading)
    _optimizer(data, doc, reading)
    _plugins(data, doc, reading)
    _kernels(data, doc, reading)
    _trainer(data, doc, reading)
    host_adam(reading)


# ---- helpers shared with the LLaMA-Factory reader --------------------------------------------


def pre_quantised(doc: Doc, reading: Reading, key: str, name: str) -> None:
    if PRE_QUANTISED.search(name.rstrip("/").split("/")[-1]):
        reading.unmodelled_key(doc, key, "a pre-quantised checkpoint (GPTQ/AWQ/bnb): counted as "
                               "the 16-bit model it was made from")  # fmt: skip


def optimizer(doc: Doc, reading: Reading, key: str, value: Any) -> None:
    """An HF Trainer optimizer name: trainmem's, or unmodelled."""
    name = str(value).strip().lower()
    mapped = OPTIMIZERS.get(name)
    if mapped is None:
        reading.unmodelled_key(doc, key, f"optimizer {value!r} is not a built-in one")
        return
    reading.put("optimizer", mapped, doc, key)
    if name in _hf.PAGED_UNMODELLED:
        reading.unmodelled_key(doc, key, "paged optimizer states: counted as resident")


def deepspeed(
    data: Mapping[str, Any], doc: Doc, reading: Reading, shipped: Mapping[str, Shipped], where: str
) -> None:
    """`deepspeed`: inline, read as a DeepSpeed config; a path, the stage and offload of the
    stack's shipped JSON of that name (`where`: the folder it ships them in), else a stage
    guessed from the name. Said in a warning: the JSON itself, given too, is what counts."""
    value = data.get("deepspeed")
    if isinstance(value, Mapping):
        _deepspeed.read(doc, reading, prefix="deepspeed.")
        return
    if not value:
        return
    _deepspeed.to_framework(reading, "deepspeed", doc, "deepspeed")
    base = str(value).replace("\\", "/").rstrip("/").split("/")[-1]
    known = shipped.get(base)
    if known is not None:
        reading.put("zero", known.stage, doc, "deepspeed")
        if known.offload != "none":
            reading.put("offload", known.offload, doc, "deepspeed")
        buckets = _shipped_buckets(known)
        for field, setting in buckets.items():
            reading.put(field, setting, doc, "deepspeed")
        reading.warn(
            f"{doc.name}:deepspeed: ZeRO stage {known.stage}, offload {known.offload}"
            f"{_bucket_words(buckets)}: inferred "
            f"from the name {value!r} ({where}{base} sets them); give the DeepSpeed JSON too"
        )
        if known.notes:
            reading.unmodelled_key(doc, "deepspeed", f"{where}{base} sets {known.notes}")
        return
    match = re.search(r"(?:zero|stage|_z)[_-]?(\d)", base.lower())
    if match and int(match.group(1)) <= 3:
        reading.put("zero", int(match.group(1)), doc, "deepspeed")
        reading.warn(f"{doc.name}:deepspeed: ZeRO stage {match.group(1)} guessed from the file "
                     f"name {value!r}; give the DeepSpeed JSON too")  # fmt: skip
    else:
        reading.warn(f"{doc.name}:deepspeed: {value!r}: give the DeepSpeed JSON too")


def _shipped_buckets(known: Shipped) -> dict[str, Any]:
    """The bucket fields a shipped JSON sets (none at stage 0, which has no buckets)."""
    elems, overlap = known.buckets
    if known.stage < 1:
        return {}
    return {
        **({"zero_bucket_elems": elems} if elems > 0 else {}),
        **({"overlap_comm": overlap} if overlap != "auto" else {}),
    }


def _bucket_words(buckets: dict[str, Any]) -> str:
    names = {"zero_bucket_elems": "reduce bucket", "overlap_comm": "overlap_comm"}
    return "".join(
        f", {names[k]} {v:g}" if isinstance(v, float) else f", {names[k]} {v}"
        for k, v in buckets.items()
    )


FSDP_WORDS = ("full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2", "no_shard",
              "offload", "auto_wrap")  # fmt: skip
"""transformers TrainingArguments `fsdp` words (FSDPOption)."""


def fsdp_words(value: Any, doc: Doc, reading: Reading, key: str) -> None:
    """TrainingArguments-style `fsdp` (a list or a space-separated string): the sharding (3 =
    full shard, FSDP2 under trainmem's hf framework) and CPU offload."""
    words = value if isinstance(value, list) else str(value).replace(",", " ").split()
    words = [str(w).strip().lower() for w in words]
    for word in words:
        if word not in FSDP_WORDS:
            raise bad(doc, key, " ".join(FSDP_WORDS), value)
    zero = 2 if ("shard_grad_op" in words or "hybrid_shard_zero2" in words) else 3
    reading.put("zero", 0 if words == ["no_shard"] else zero, doc, key)
    if "offload" in words:
        reading.put("offload", "optimizer+params", doc, key)
    if any(w.startswith("hybrid") for w in words):
        reading.unmodelled_key(doc, key, "hybrid sharding: give --dp-shard GPUS_PER_NODE")


def attention(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    """attn_implementation (and axolotl's deprecated booleans): flash-like kernels (FA2/3, SDPA,
    flex, xformers, sage: no [s, s] scores kept) are `flash`, eager is `eager`."""
    key = "attn_implementation"
    value = data.get(key)
    if value is None:
        for flag, impl in (("flash_attention", "flash"), ("sdp_attention", "flash"),
                           ("xformers_attention", "flash"), ("flex_attention", "flash"),
                           ("sage_attention", "flash"), ("eager_attention", "eager")):  # fmt: skip
            if data.get(flag) is not None and as_bool(doc, flag, data[flag]):
                reading.put("attention", impl, doc, flag)
                return
        return
    text = str(value).strip().lower()
    if text == "eager":
        reading.put("attention", "eager", doc, key)
    elif text in ("sdpa", "flash_attention_2", "flash_attention_3", "flex_attention", "xformers",
                  "sage") or "flash" in text:  # fmt: skip
        reading.put("attention", "flash", doc, key)
    else:
        reading.unmodelled_key(doc, key, f"attention {value!r}: counted as flash")


def host_adam(reading: Reading) -> None:
    """DeepSpeed with the optimizer offloaded steps on the host (DeepSpeedCPUAdam): no fused
    step temporaries on the GPU; trainmem's ZeRO-Offload rows take `adamw` (as
    stacks/_deepspeed.py _host_adam reads a DeepSpeed JSON)."""
    read = reading.fields.get("optimizer")
    if (
        reading.get("framework") == "deepspeed"
        and reading.get("offload", "none") != "none"
        and read is not None
        and read.value == "adamw-fused"
    ):
        reading.override("optimizer", "adamw", read.origin, read.file)


def half_precision(value: str, lora: bool, reading: Reading) -> str:
    """The 16-bit working dtype `value` (bf16|fp16) as trainmem's precision: DeepSpeed keeps an
    fp32 master (mixed-*); FSDP with accelerate's mixed precision upcasts the trainable
    parameters to fp32 (accelerate utils/fsdp_utils.py fsdp2_prepare_model), so full
    fine-tuning is mixed-*; a LoRA base stays 16-bit (its fp32 adapters are trainmem's)."""
    if reading.get("framework") == "deepspeed":
        return f"mixed-{value}"
    if reading.get("zero", 0) > 0 and not lora:
        return f"mixed-{value}"
    return value


def compile_mode(reading: Reading) -> str:
    """The HF Trainer's torch_compile compiles the whole model: the loss too, unless a chunked
    (fused linear) loss runs outside it."""
    return "blocks" if reading.get("loss") == "chunked" else "blocks+loss"


# ---- axolotl's keys ------------------------------------------------------------------------


def _batch(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    for key in ("micro_batch_size", "gradient_accumulation_steps"):
        if data.get(key) is None:
            continue
        value = as_int(doc, key, data[key], ge=1)
        field = "micro_batch_size" if key == "micro_batch_size" else "grad_accum_steps"
        reading.put(field, value, doc, key)
    if data.get("batch_size") is not None and data.get("gradient_accumulation_steps") is None:
        total = as_int(doc, "batch_size", data["batch_size"], ge=1)
        micro = int(reading.get("micro_batch_size", 1))
        # normalize_config: gradient_accumulation_steps = batch_size // micro_batch_size
        reading.put("grad_accum_steps", max(total // micro, 1), doc, "batch_size")
    if data.get("sequence_len") is not None:
        reading.put("seq_len", as_int(doc, "sequence_len", data["sequence_len"], ge=1), doc,
                    "sequence_len")  # fmt: skip
    else:
        reading.default("seq_len", 512, f"{SCHEMA}/config.py (sequence_len = 512)")
    if data.get("sample_packing") is not None and as_bool(
        doc, "sample_packing", data["sample_packing"]
    ):
        reading.warn(
            f"{doc.name}:sample_packing: several samples packed into each row of sequence_len "
            "tokens (varlen attention): counted as full rows of sequence_len tokens"
        )


def _wrappers(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    deepspeed(data, doc, reading, DEEPSPEED_FILES, f"{AX} deepspeed_configs/")
    cfg = data.get("fsdp_config")
    if data.get("fsdp"):
        fsdp_words(data["fsdp"], doc, reading, "fsdp")
    if cfg is None:
        return
    if not isinstance(cfg, Mapping):
        raise bad(doc, "fsdp_config", "a mapping", cfg)
    _fsdp_config(data, cfg, doc, reading)


def _fsdp_config(
    data: Mapping[str, Any], cfg: Mapping[str, Any], doc: Doc, reading: Reading
) -> None:
    """fsdp_config (schemas/fsdp.py FSDPConfig; `fsdp_`-prefixed keys are its deprecated
    spelling, validation.py check_fsdp_config_kwargs_prefix)."""
    keys = {str(k).removeprefix("fsdp_"): f"fsdp_config.{k}" for k in cfg}
    values = {str(k).removeprefix("fsdp_"): v for k, v in cfg.items()}

    def on(name: str) -> bool:
        return name in values and as_bool(doc, keys[name], values[name])

    version = data.get("fsdp_version", values.get("version", 1))
    version_key = "fsdp_version" if "fsdp_version" in data else keys.get("version", "fsdp_config")
    if as_int(doc, version_key, version, ge=1) == 1:
        reading.warn(f"{doc.name}: FSDP1 (fsdp_version 1, axolotl's default: "
                     f"{SCHEMA}/validation.py) modelled as FSDP2")  # fmt: skip
    strategy = str(values.get("sharding_strategy", "FULL_SHARD")).strip().upper()
    if "reshard_after_forward" in values:
        zero = 3 if on("reshard_after_forward") else 2
        reading.put("zero", zero, doc, keys["reshard_after_forward"])
    elif strategy in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "1", "2", "3"):
        zero = {"FULL_SHARD": 3, "1": 3, "SHARD_GRAD_OP": 2, "2": 2}.get(strategy, 0)
        reading.put("zero", zero, doc, keys.get("sharding_strategy", "fsdp_config"))
    elif strategy.startswith("HYBRID"):
        reading.put("zero", 3 if strategy == "HYBRID_SHARD" else 2, doc, keys["sharding_strategy"])
        reading.unmodelled_key(doc, keys["sharding_strategy"], "hybrid sharding: give --dp-shard")
    else:
        raise bad(doc, keys["sharding_strategy"], "FULL_SHARD|SHARD_GRAD_OP|NO_SHARD|HYBRID_SHARD",
                  values["sharding_strategy"])  # fmt: skip
    if on("offload_params"):
        reading.put("offload", "optimizer+params", doc, keys["offload_params"])
    if on("activation_checkpointing"):
        reading.put("recompute", "full", doc, keys["activation_checkpointing"])
    if "cpu_ram_efficient_loading" in values:
        efficient = on("cpu_ram_efficient_loading")
        load = "meta-init" if efficient else "cpu-full-state-dict"
        reading.put("load", load, doc, keys["cpu_ram_efficient_loading"])
    wrap = str(values.get("auto_wrap_policy", "TRANSFORMER_BASED_WRAP")).upper()
    if wrap != "TRANSFORMER_BASED_WRAP":
        reading.unmodelled_key(doc, keys["auto_wrap_policy"], f"{wrap}: units not per block")


def _parallel(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    """The N-D parallel sizes (schemas/config.py): tp (transformers tp_plan), cp (ring
    attention), the FSDP shard group."""
    sizes = (("tensor_parallel_size", "tp"), ("context_parallel_size", "cp"),
             ("sequence_parallel_degree", "cp"), ("dp_shard_size", "dp_shard"))  # fmt: skip
    for key, field in sizes:
        if data.get(key) is not None:
            value = as_int(doc, key, data[key], ge=1)
            if value > 1:
                reading.put(field, value, doc, key)
    if reading.has("dp_shard") and not reading.has("zero"):
        reading.put("zero", 3, doc, "dp_shard_size")


def _adapter(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    """adapter lora|qlora (schemas/peft.py; loaders/adapter.py load_lora)."""
    adapter = data.get("adapter")
    four = data.get("load_in_4bit") is not None and as_bool(doc, "load_in_4bit",
                                                             data["load_in_4bit"])  # fmt: skip
    eight = data.get("load_in_8bit") is not None and as_bool(doc, "load_in_8bit",
                                                              data["load_in_8bit"])  # fmt: skip
    if eight:
        reading.unmodelled_key(doc, "load_in_8bit", "LLM.int8 base weights: counted as 16-bit")
    if not adapter:
        if four:
            reading.unmodelled_key(doc, "load_in_4bit", "a 4-bit base without adapters")
        return
    kind = str(adapter).strip().lower()
    if kind not in ("lora", "qlora"):
        reading.unmodelled_key(doc, "adapter", f"adapter {adapter!r}: counted as full fine-tuning")
        return
    if data.get("lora_r") is None:
        raise bad(doc, "lora_r", "an integer >= 1 (the LoRA rank)", data.get("lora_r"))
    reading.put("lora_rank", as_int(doc, "lora_r", data["lora_r"], ge=1), doc, "lora_r")
    _targets(data, doc, reading)
    if kind == "qlora":
        reading.put("qlora", True, doc, "adapter")
    elif four:
        reading.put("qlora", True, doc, "load_in_4bit")
    if reading.get("qlora") and (reading.get("zero", 0) > 0):
        reading.warn(f"{doc.name}: QLoRA sharded: axolotl skips prepare_model_for_kbit_training "
                     "(loaders/model.py), unquantised layers stay 16-bit; trainmem's hf QLoRA "
                     "counts them in fp32 (an over-estimate)")  # fmt: skip
    for key, why in (("peft_use_dora", "DoRA magnitudes"),
                     ("lora_modules_to_save", "fully trained extra modules"),
                     ("lora_target_parameters", "LoRA on parameters (MoE experts)"),
                     ("peft_layers_to_transform", "adapters on some layers only")):  # fmt: skip
        if data.get(key) and (key.startswith("lora_") or key.startswith("peft_layers")
                                      or as_bool(doc, key, data[key])):  # fmt: skip
            reading.unmodelled_key(doc, key, why)
    if data.get("peft_autocast_adapter_dtype") is False:
        reading.unmodelled_key(doc, "peft_autocast_adapter_dtype", "16-bit adapters")


def _targets(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    linear = data.get("lora_target_linear")
    if linear is not None and as_bool(doc, "lora_target_linear", linear):
        reading.put("lora_targets", "all-linear", doc, "lora_target_linear")
        return
    targets = data.get("lora_target_modules")
    if targets:
        names = targets if isinstance(targets, list) else str(targets).split(",")
        text = ",".join(str(n).strip() for n in names if str(n).strip())
        reading.put("lora_targets", text, doc, "lora_target_modules")
        return
    reading.default("lora_targets", "q_proj,v_proj",
                    f"{AX} src/axolotl/loaders/adapter.py _build_peft_lora_config (target_modules "
                    "[]: peft 0.19.1's per-model default, q_proj and v_proj for llama, mistral, "
                    "qwen2, gemma)")  # fmt: skip


def _precision(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    """resolve_dtype: bf16 (default "auto": on where the GPU has it), fp16, or the no-AMP
    bfloat16/float16; the model loads in that dtype (cfg.torch_dtype, loaders/model.py), so
    the weights are 16-bit: trainmem's `bf16`/`fp16` (its LoRA adapters stay fp32, peft's
    autocast_adapter_dtype), `mixed-*` under DeepSpeed and FSDP full fine-tuning."""
    lora = reading.get("lora_rank", 0) > 0
    fp8 = data.get("fp8") is not None and as_bool(doc, "fp8", data["fp8"])
    if fp8:
        reading.put("precision", "fp8-mixed", doc, "fp8")
        return
    bf16 = data.get("bf16", "auto")
    auto = isinstance(bf16, str) and bf16.strip().lower() == "auto"
    bf16_on = not auto and as_bool(doc, "bf16", bf16)
    fp16_on = data.get("fp16") is not None and as_bool(doc, "fp16", data["fp16"])
    for key, half, flag in (("bf16", "bf16", bf16_on), ("fp16", "fp16", fp16_on and not bf16_on),
                            ("bfloat16", "bf16", None), ("float16", "fp16", None)):  # fmt: skip
        if flag is None:
            flag = data.get(key) is not None and as_bool(doc, key, data[key])
        if flag:
            reading.put("precision", half_precision(half, lora, reading), doc, key)
            return
    if auto and not fp16_on:
        value = half_precision("bf16", lora, reading)
        if "bf16" in data:
            reading.put("precision", value, doc, "bf16")
            reading.warn(f"{doc.name}:bf16: auto read as bf16 (a GPU with bf16: Ampere or newer)")
        else:
            reading.default("precision", value, f"{RESOLVE_DTYPE} (bf16 = auto: bf16 where the GPU "
                            "has it; the model loads in torch_dtype bfloat16)")  # fmt: skip
        return
    if data.get("load_in_8bit"):  # resolve_dtype: float16 for an 8-bit load without bf16
        reading.put("precision", half_precision("fp16", lora, reading), doc, "load_in_8bit")
        return
    reading.put("precision", "fp32", doc, "bf16")


def _training(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    key = "gradient_checkpointing"
    value = data.get(key)
    if value is not None:
        text = str(value).strip().lower()
        if text in ("offload", "offload_disk"):
            reading.put("recompute", "full", doc, key)
            reading.unmodelled_key(doc, key, f"{value}: checkpointed inputs offloaded to the host")
        elif as_bool(doc, key, value):
            reading.put("recompute", "full", doc, key)
    key = "activation_offloading"
    value = data.get(key)
    if value is not None and value is not False:
        text = str(value).strip().lower()
        if text in ("disk", "hidden_states"):
            reading.unmodelled_key(doc, key, f"activation offloading {value!r}")
        elif text == "legacy" or as_bool(doc, key, value):
            reading.put("activation_offload", True, doc, key)
    for key, why in (("layer_offloading", "layer parameters offloaded to the host"),
                     ("tiled_mlp", "ALST tiled MLP"),
                     ("unfrozen_parameters", "only some parameters trained"),
                     ("relora", "ReLoRA restarts"), ("qat", "quantisation-aware training"),
                     ("lisa_n_layers", "LISA layer sampling")):  # fmt: skip
        if data.get(key):
            reading.unmodelled_key(doc, key, why)
    quant = data.get("model_quantization_config")
    if quant and not dig(data, "model_quantization_config_kwargs.dequantize"):
        reading.unmodelled_key(doc, "model_quantization_config", f"{quant} quantised weights")
    if data.get("gptq"):
        reading.unmodelled_key(doc, "gptq", "GPTQ base weights: counted as 16-bit")


def _optimizer(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    if data.get("optimizer") is None:
        reading.default("optimizer", "adamw-fused",
                        f"{SCHEMA}/training.py (optimizer = adamw_torch_fused)")  # fmt: skip
        return
    optimizer(doc, reading, "optimizer", data["optimizer"])


LIGER_KERNELS = ("liger_rope", "liger_rms_norm", "liger_layer_norm", "liger_glu_activation",
                 "liger_swiglu", "liger_cross_entropy")  # fmt: skip


def _plugins(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    """The Liger plugin (integrations/liger/args.py) and Cut Cross Entropy
    (integrations/cut_cross_entropy/args.py: cut_cross_entropy = True once listed)."""
    plugins = data.get("plugins") or []
    names = [str(p) for p in (plugins if isinstance(plugins, list) else [plugins])]
    liger = any(".liger" in p.lower() for p in names)
    cce = any("cut_cross_entropy" in p.lower() for p in names)
    liger_keys = [k for k in ("liger_fused_linear_cross_entropy", *LIGER_KERNELS) if data.get(k)]
    if liger_keys and not liger:
        reading.warn(f"{doc.name}: {', '.join(liger_keys)} without the Liger plugin: ignored")
    if liger:
        for key in liger_keys:
            if not as_bool(doc, key, data[key]):
                continue
            if key == "liger_fused_linear_cross_entropy":
                reading.put("loss", "chunked", doc, key)
            else:
                reading.unmodelled_key(doc, key, "a Liger kernel: counted as transformers' ops")
    if cce:
        key = "cut_cross_entropy" if "cut_cross_entropy" in data else "plugins"
        if key == "plugins" or as_bool(doc, key, data[key]):
            reading.put("loss", "chunked", doc, key)
    elif data.get("cut_cross_entropy"):
        reading.warn(f"{doc.name}: cut_cross_entropy without its plugin: ignored")


def _kernels(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    for key, why in (("lora_mlp_kernel", "axolotl's LoRA MLP autograd kernel"),
                     ("lora_qkv_kernel", "axolotl's LoRA QKV autograd kernel"),
                     ("lora_o_kernel", "axolotl's LoRA O autograd kernel"),
                     ("lora_embedding_kernel", "axolotl's LoRA embedding kernel"),
                     ("chunked_cross_entropy", "cross entropy in chunks over the whole logits: "
                      "counted as the one-piece loss"),
                     ("flash_attn_cross_entropy", "flash-attn's cross entropy"),
                     ("flash_attn_fuse_mlp", "flash-attn's fused MLP"),
                     ("fused_attn_kernel", "a fused attention kernel")):  # fmt: skip
        if data.get(key) is not None and as_bool(doc, key, data[key]):
            reading.unmodelled_key(doc, key, why)
    for key in data:
        if str(key).startswith("unsloth_") and data[key]:
            reading.unmodelled_key(doc, str(key), "an unsloth kernel")
    compiled = data.get("torch_compile")
    if compiled is not None and (
        str(compiled).strip().lower() == "auto" or as_bool(doc, "torch_compile", compiled)
    ):
        reading.put("compile", compile_mode(reading), doc, "torch_compile")


def _trainer(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    if data.get("rl"):
        reading.unmodelled_key(doc, "rl", f"the {data['rl']} trainer: preference pairs or "
                               "generations, a reference model (TRL)")  # fmt: skip
    for key in ("reward_model", "process_reward_model"):
        if data.get(key) is not None and as_bool(doc, key, data[key]):
            reading.unmodelled_key(doc, key, "a reward model: pairs and a value head")


STACK = Stack(
    name="axolotl",
    version=VERSION,
    framework="hf",
    detect=detect,
    read=read,
    mapping_only=True,
)
