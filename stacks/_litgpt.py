"""LitGPT's YAML configs (`litgpt finetune_lora --config X.yaml`, `litgpt finetune --config
X.yaml`; config_hub/finetune/<model>/{lora,qlora,full}.yaml), read as litgpt 0.5.13 runs them.

The recipe is told from the keys: a LoRA switch (`lora_r`, `lora_query`, ...) or `quantize`
is finetune_lora (litgpt/finetune/lora.py), `model_name` without `checkpoint_dir` is pretrain
(not modelled), anything else is the full fine-tune (litgpt/finetune/full.py). What the file
leaves out is what those scripts' `setup` defaults give.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._reading import Doc, Reading, as_bool, as_float, as_int, bad, dig
from ._stacks import Stack

VERSION = "0.5.13"
LORA_PY = f"litgpt {VERSION} litgpt/finetune/lora.py"
FULL_PY = f"litgpt {VERSION} litgpt/finetune/full.py"
LORA_SWITCHES: dict[str, tuple[bool, tuple[str, ...]]] = {
    "lora_query": (True, ("q_proj",)),
    "lora_key": (False, ("k_proj",)),
    "lora_value": (True, ("v_proj",)),
    "lora_projection": (False, ("o_proj",)),
    "lora_mlp": (False, ("gate_proj", "up_proj", "down_proj")),
}
"""LitGPT's LoRA switch -> (its default in finetune/lora.py setup, trainmem's target names).
The qkv switches enable parts of one fused `attn` Linear (lora.py LoRAQKVLinear), which
trainmem's litgpt mode counts by these bits; lora_mlp adapts fc_1, fc_2 and proj (LLaMAMLP;
GptNeoxMLP has fc and proj)."""
PRECISIONS = {
    "bf16-true": "bf16",
    "16-true": "fp16",
    "32-true": "fp32",
    "bf16-mixed": "amp-bf16",
    "16-mixed": "amp-fp16",
    "bf16": "amp-bf16",
    "16": "amp-fp16",
    "32": "fp32",
}
"""Lightning Fabric precision -> trainmem's: `-true` builds the model in that dtype
(HalfPrecision), `-mixed` keeps fp32 weights under torch.autocast (MixedPrecision); the short
forms are Lightning's aliases (lightning 2.6.6 fabric/connector.py
_convert_precision_to_unified_args: 16 -> 16-mixed, bf16 -> bf16-mixed, 32 -> 32-true)."""
UNMODELLED_PRECISIONS = ("64-true", "64", "transformer-engine", "transformer-engine-float16")
QUANTIZE = ("bnb.nf4", "bnb.nf4-dq", "bnb.fp4", "bnb.fp4-dq", "bnb.int8-training")
OPTIMIZERS = {
    "adamw": "adamw",
    "adam": "adamw",
    "sgd": "sgd",
    "adamw8bit": "adamw-8bit",
    "pagedadamw8bit": "paged-adamw-8bit",
    "pagedadamw": "paged-adamw",
    "pagedadamw32bit": "paged-adamw",
    "adam8bit": "adamw-8bit",
    "lion": "lion",
    "adafactor": "adafactor",
}
"""An optimizer's class name (lower case) -> trainmem's optimizer."""


def detect(doc: Doc) -> int:
    """10 for a LitGPT config: a LoRA switch only LitGPT has (`lora_query`, ...), a
    `litgpt.` data or optimizer class, a top-level `checkpoint_dir` beside LitGPT's setup
    arguments (lora_r, quantize, precision, devices, ...), or `checkpoint_dir` / `model_name`
    beside a `train` section of micro / global batch sizes."""
    data = doc.data
    if not isinstance(data, Mapping):
        return 0
    if any(k in data for k in (*LORA_SWITCHES, "lora_head")):
        return 10
    for key in ("data.class_path", "optimizer.class_path"):
        value = dig(data, key)
        if isinstance(value, str) and value.startswith("litgpt."):
            return 10
    litgpt_keys = ("lora_r", "lora_alpha", "quantize", "precision", "devices", "optimizer")
    if "checkpoint_dir" in data and any(k in data for k in litgpt_keys):
        return 10
    train = data.get("train")
    named = "checkpoint_dir" in data or "model_name" in data
    batches = isinstance(train, Mapping) and (
        "micro_batch_size" in train or "global_batch_size" in train
    )
    return 10 if named and batches else 0


def recipe(doc: Doc) -> str:
    """lora | full | pretrain: which LitGPT script the file is for."""
    data = doc.data
    lora_keys = ("lora_r", "lora_alpha", "lora_dropout", "lora_head", *LORA_SWITCHES)
    if any(k in data for k in lora_keys) or data.get("quantize") is not None:
        return "lora"
    if "model_name" in data and "checkpoint_dir" not in data:
        return "pretrain"
    return "lora" if "lora" in doc.name.lower() else "full"


def read(doc: Doc, reading: Reading) -> None:
    """Every memory-relevant key of one LitGPT YAML config."""
    if not isinstance(doc.data, Mapping):
        raise ValueError(
            f"{doc.name}: a LitGPT job is read from its YAML config (litgpt finetune_lora "
            "--config X.yaml); give that file"
        )
    kind = recipe(doc)
    _model(doc, reading, kind)
    gpus = _devices(doc, reading)
    quantized = _quantize(doc, reading, kind, gpus)
    _precision(doc, reading, quantized)
    _train(doc, reading, kind)
    if kind == "lora":
        _lora(doc, reading)
    _optimizer(doc, reading, quantized)
    if gpus is not None and gpus > 1 and kind != "pretrain":
        _sharded(doc, reading, kind)
    if kind == "full":
        _full_head_warning(doc, reading)


def _model(doc: Doc, reading: Reading, kind: str) -> None:
    data = doc.data
    if kind == "pretrain":
        if data.get("model_name") is not None:
            reading.put("model", str(data["model_name"]), doc, "model_name")
        reading.unmodelled_key(
            doc,
            "model_name",
            "LitGPT's pretrain recipe (litgpt pretrain: FSDPStrategy, torch.compile, its own "
            "loss) is not modelled; trainmem's litgpt mode follows finetune_lora and finetune",
        )
        return
    if data.get("checkpoint_dir") is not None:
        reading.put("model", str(data["checkpoint_dir"]), doc, "checkpoint_dir")


def _devices(doc: Doc, reading: Reading) -> int | None:
    """num_gpus = devices x num_nodes; None when `devices` is auto (every visible GPU)."""
    data = doc.data
    devices = data.get("devices", 1)
    if devices is None or devices == -1 or str(devices).strip().lower() == "auto":
        reading.warn(
            f"{doc.name}:devices: {devices!r} is every visible GPU (litgpt utils.py "
            "parse_devices); give --num-gpus"
        )
        return None
    count = as_int(doc, "devices", devices, ge=1)
    nodes = as_int(doc, "num_nodes", data.get("num_nodes", 1) or 1, ge=1)
    total = count * nodes
    if "devices" in data or "num_nodes" in data:
        key = (
            "devices,num_nodes" if nodes > 1 else ("devices" if "devices" in data else "num_nodes")
        )
        reading.put("num_gpus", total, doc, key)
    return total


def _quantize(doc: Doc, reading: Reading, kind: str, gpus: int | None) -> bool:
    """`quantize` (finetune_lora only): bnb.nf4 is trainmem's litgpt `--qlora`."""
    value = doc.data.get("quantize")
    if value is None:
        return False
    text = str(value).strip()
    if text not in QUANTIZE:
        raise bad(doc, "quantize", "|".join(QUANTIZE), value)
    if gpus is not None and gpus > 1:
        raise ValueError(
            f"{doc.name}: quantize: LitGPT {VERSION} quantizes on one device only "
            f"(finetune/lora.py setup raises NotImplementedError), got {gpus} GPUs"
        )
    # bitsandbytes' PagedAdamW replacing the optimizer is modelled (finetune/lora.py
    # instantiate_bnb_optimizer: FrameworkSpec.qlora_paged_optimizer, recipe_optimizer).
    why: list[str] = []
    if text == "bnb.int8-training":
        why.insert(0, "8-bit base weights are not modelled (counted in the model's dtype)")
    else:
        reading.put("qlora", True, doc, "quantize")
        if text.startswith("bnb.fp4"):
            why.insert(0, "FP4 counted as NF4 (the same 4-bit storage)")
        if text.endswith("-dq"):
            why.insert(0, "double quantisation counted as bnb.nf4's fp32 absmax per 64 weights")
    if why:
        reading.unmodelled_key(doc, "quantize", "; ".join(why))
    return True


def _precision(doc: Doc, reading: Reading, quantized: bool) -> None:
    value = doc.data.get("precision")
    if value is None:
        if quantized:
            raise ValueError(
                f"{doc.name}: quantize: LitGPT {VERSION} needs a -true precision with "
                "quantization (its default precision is bf16-mixed)"
            )
        return  # get_default_supported_precision(training=True): bf16-mixed = trainmem's
    text = str(value).strip().lower()
    if text in UNMODELLED_PRECISIONS:
        reading.unmodelled_key(doc, "precision", f"{text} is not one of trainmem's precisions")
        return
    if text not in PRECISIONS:
        raise bad(doc, "precision", "bf16-true|bf16-mixed|16-true|16-mixed|32-true", value)
    if quantized and PRECISIONS[text].startswith("amp-"):
        raise ValueError(
            f"{doc.name}: precision: LitGPT {VERSION} refuses quantization with mixed "
            f"precision, got {value!r}"
        )
    reading.put("precision", PRECISIONS[text], doc, "precision")


def _train(doc: Doc, reading: Reading, kind: str) -> None:
    train = doc.data.get("train") or {}
    if not isinstance(train, Mapping):
        raise bad(doc, "train", "a mapping of training arguments", train)
    source = {"lora": LORA_PY, "full": FULL_PY}.get(kind)
    for key in ("micro_batch_size", "global_batch_size"):
        if train.get(key) is not None:
            reading.put(key, as_int(doc, f"train.{key}", train[key], ge=1), doc, f"train.{key}")
    if train.get("global_batch_size") is None and source is not None:
        reading.default(
            "global_batch_size", 16, f"{source} setup (TrainArgs(global_batch_size=16))"
        )
    length = train.get("max_seq_length")
    if length is not None:
        reading.put(
            "seq_len",
            as_int(doc, "train.max_seq_length", length, ge=1),
            doc,
            "train.max_seq_length",
        )
    elif kind != "pretrain":
        reading.warn(
            f"{doc.name}:train.max_seq_length: not given: LitGPT trains at the data's longest "
            "sample (finetune fit: model.max_seq_length); give --seq-len"
        )


def _lora(doc: Doc, reading: Reading) -> None:
    data = doc.data
    if data.get("lora_r") is not None:
        reading.put("lora_rank", as_int(doc, "lora_r", data["lora_r"], ge=1), doc, "lora_r")
    else:
        reading.default("lora_rank", 8, f"{LORA_PY} setup (lora_r=8)")
    targets: list[str] = []
    given = [k for k in LORA_SWITCHES if data.get(k) is not None]
    for key, (default, names) in LORA_SWITCHES.items():
        on = as_bool(doc, key, data[key]) if key in given else default
        targets += names if on else []
    if not targets:
        raise ValueError(
            f"{doc.name}: {','.join(given)}: LoRA on no block linear (lora_query, lora_key, "
            "lora_value, lora_projection and lora_mlp all false)"
        )
    text = "all-linear" if len(targets) == 7 else ",".join(targets)
    if given:
        reading.put("lora_targets", text, doc, ",".join(given))
    else:
        reading.default("lora_targets", text, f"{LORA_PY} setup (lora_query=True, lora_value=True)")
    if data.get("lora_head") is not None and as_bool(doc, "lora_head", data["lora_head"]):
        reading.unmodelled_key(doc, "lora_head", "LoRA on the LM head is not modelled")
    dropout = data.get("lora_dropout")
    if dropout is not None and as_float(doc, "lora_dropout", dropout) == 0.0:
        reading.unmodelled_key(
            doc,
            "lora_dropout",
            "0: no dropout masks or copies; trainmem's litgpt mode counts LitGPT's "
            "default dropout (0.05)",
        )


def _optimizer(doc: Doc, reading: Reading, quantized: bool) -> None:
    """`optimizer`: a class name (`AdamW`) or `{class_path, init_args}`."""
    value = doc.data.get("optimizer")
    if value is None:
        return  # "AdamW": torch.optim.AdamW (foreach) = trainmem's adamw
    key = "optimizer.class_path" if isinstance(value, Mapping) else "optimizer"
    path = value.get("class_path") if isinstance(value, Mapping) else value
    if not isinstance(path, str) or not path.strip():
        raise bad(doc, key, "an optimizer class (torch.optim.AdamW)", path)
    name = path.strip().rsplit(".", 1)[-1].lower()
    if quantized:
        if "adamw" not in name:
            raise ValueError(
                f"{doc.name}: {key}: LitGPT {VERSION} quantization supports AdamW only, got "
                f"{path!r}"
            )
        reading.put("optimizer", "adamw", doc, key)  # PagedAdamW: engine recipe_optimizer
        return
    args = (value.get("init_args") or {}) if isinstance(value, Mapping) else {}
    if not isinstance(args, Mapping):
        raise bad(doc, "optimizer.init_args", "a mapping", args)
    found = _optimizer_name(doc, name, args)
    if found is None:
        reading.unmodelled_key(doc, key, f"{path} is not one of trainmem's optimizers")
        return
    reading.put("optimizer", found, doc, key)


def _optimizer_name(doc: Doc, name: str, args: Mapping[str, Any]) -> str | None:
    found = OPTIMIZERS.get(name)
    fused, momentum = args.get("fused"), args.get("momentum")
    if found == "adamw" and fused is not None and as_bool(doc, "optimizer.init_args.fused", fused):
        return "adamw-fused"
    momentum_on = momentum is not None and as_float(doc, "optimizer.init_args.momentum", momentum)
    if found == "sgd" and momentum_on:
        return "sgd-momentum"
    return found


def _sharded(doc: Doc, reading: Reading, kind: str) -> None:
    """Several devices: every Block checkpointed and the model sharded (FSDP)."""
    if kind == "lora":
        reading.default(
            "zero",
            3,
            f"{LORA_PY} setup (ModelParallelStrategy(data_parallel_size=devices * num_nodes)) "
            "and parallelize_fn (fully_shard per trainable Linear and per Block)",
        )
        reading.default(
            "recompute", "full", f"{LORA_PY} parallelize_fn (checkpoint_wrapper on every Block)"
        )
        return
    reading.default("zero", 3, f"{FULL_PY} setup (FSDPStrategy(auto_wrap_policy={{Block}}))")
    reading.default(
        "recompute", "full", f"{FULL_PY} setup (activation_checkpointing_policy={{Block}})"
    )
    reading.warn(
        f"{doc.name}: LitGPT {VERSION} finetune/full.py shards with FSDP1 (FSDPStrategy, flat "
        "parameters); trainmem's litgpt mode counts FSDP2"
    )


def _full_head_warning(doc: Doc, reading: Reading) -> None:
    reading.warn(
        f"{doc.name}: LitGPT {VERSION} finetune/full.py runs the head over the whole sequence "
        "(fit: model(input_ids)); trainmem's litgpt mode counts finetune_lora's 128-token head "
        "chunks"
    )


STACK = Stack(name="litgpt", version=VERSION, framework="litgpt", detect=detect, read=read)
