"""torchtune recipe configs (recipes/configs/**.yaml), read as torchtune 0.6.1's recipes read them.

What a config says and where trainmem takes it from:

- the recipe and the GPUs: the header comment's launch line, `tune run [--nnodes N]
  [--nproc_per_node M] RECIPE --config ...` (else `# Config for ... in RECIPE.py`, without GPUs);
  a `*_single_device` recipe is one GPU, a `*_distributed` one N x M GPUs under FSDP2
  (`training.shard_model`: `--zero 3`, `fsdp_reshard_after_forward: False` `--zero 2`);
- the model: `model._component_` (a torchtune builder, e.g. `torchtune.models.llama3_1.
  lora_llama3_1_8b`) as a trainmem preset name; its LoRA arguments (`lora_rank`,
  `lora_attn_modules`, `apply_lora_to_mlp`; `qlora_*` builders and `quantize_base` are QLoRA);
- batch_size, gradient_accumulation_steps, tokenizer.max_seq_len, dtype, optimizer, loss,
  compile, enable_activation_checkpointing / ac_mode / ac_option, enable_activation_offloading,
  optimizer_in_bwd, fsdp_cpu_offload, tensor_parallel_dim.

Pinned: torchtune 0.6.1 (github.com/pytorch/torchtune tag v0.6.1, commit a6290a5b4075). Every
stack default below cites the 0.6.1 file that decides it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ._reading import Doc, Reading, as_bool, as_float, as_int, bad, dig
from ._stacks import Stack

VERSION = "0.6.1"
SRC = f"torchtune {VERSION}"

FULL_DISTRIBUTED = "full_finetune_distributed"
FULL_SINGLE = "full_finetune_single_device"
LORA_DISTRIBUTED = "lora_finetune_distributed"
LORA_SINGLE = "lora_finetune_single_device"
FINETUNE_RECIPES = (FULL_DISTRIBUTED, FULL_SINGLE, LORA_DISTRIBUTED, LORA_SINGLE)
"""The recipes trainmem's torchtune mode follows."""
FSDP_KEYS = ("fsdp_cpu_offload", "fsdp_reshard_after_forward", "custom_sharded_layers")
FULL_DISTRIBUTED_KEYS = ("tensor_parallel_dim", "ac_mode", "ac_option")
IGNORED_BY = {
    FULL_DISTRIBUTED: (),
    FULL_SINGLE: (*FSDP_KEYS, *FULL_DISTRIBUTED_KEYS),
    LORA_DISTRIBUTED: (*FULL_DISTRIBUTED_KEYS, "optimizer_in_bwd"),
    LORA_SINGLE: (*FSDP_KEYS, *FULL_DISTRIBUTED_KEYS, "optimizer_in_bwd"),
}
"""Memory keys a recipe never reads (recipes/RECIPE.py at 0.6.1: `cfg.get(KEY)` absent)."""
OTHER_RECIPES = (
    ("dpo", "DPO: chosen and rejected sequences per sample, and a reference model's forward"),
    ("knowledge_distillation", "knowledge distillation: a teacher model and its logits"),
    ("ppo", "PPO: policy, value, reference and reward models and generation"),
    ("qat", "quantization-aware training: fake-quantized weights and activations"),
    ("early_exit", "early-exit loss over several layers' outputs"),
    ("eval", "not a training recipe"),
    ("generate", "not a training recipe"),
    ("quantize", "not a training recipe"),
)
FAMILIES = (
    ("llama3_2_vision", "llama-3.2-vision"),
    ("llama3_3", "llama-3.3"),
    ("llama3_2", "llama-3.2"),
    ("llama3_1", "llama-3.1"),
    ("llama3", "llama-3"),
    ("code_llama2", "codellama"),
    ("llama2", "llama-2"),
    ("llama4", "llama-4"),
    ("qwen2_5", "qwen2.5"),
    ("qwen3", "qwen3"),
    ("qwen2", "qwen2"),
    ("gemma3", "gemma-3"),
    ("gemma2", "gemma-2"),
    ("gemma", "gemma"),
    ("mistral", "mistral"),
    ("mixtral", "mixtral"),
    ("phi3", "phi-3"),
    ("phi4", "phi-4"),
)
"""torchtune's model folder (torchtune/models/FOLDER) -> the preset family's spelling."""
SAME_ARCHITECTURE = {
    "llama-3.3-70b": "llama-3.1-70b",
    "phi-4-14b": "phi-4",
}
"""Builders whose preset has another name: Llama-3.3-70B's config.json is Llama-3.1-70B's
architecture; phi4_14b is the phi-4 preset."""
ATTN_MODULES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
"""torchtune LORA_ATTN_MODULES (modules/peft/_utils.py) -> PEFT names."""
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
"""apply_lora_to_mlp adapts w1, w3, w2 (FeedForward): gate, up, down."""
CHUNKED_OUTPUT_CHUNKS = 8
"""trainmem's `chunked-output` is CEWithChunkedOutputLoss(num_output_chunks=8), its default
(torchtune 0.6.1 torchtune/modules/loss/ce_chunked_output_loss.py)."""


def detect(doc: Doc) -> int:
    """10 for a config with a `_component_` in `torchtune.`; 3 for `_component_` keys alone (a
    torchtune config built of torch / bitsandbytes components only); else 0."""
    if not isinstance(doc.data, Mapping):
        return 0
    components = list(_components(doc.data))
    if any(isinstance(c, str) and c.startswith("torchtune.") for c in components):
        return 10
    return 3 if components else 0


def _components(data: Any) -> Any:
    if isinstance(data, Mapping):
        for key, value in data.items():
            if key == "_component_":
                yield value
            else:
                yield from _components(value)
    elif isinstance(data, list):
        for item in data:
            yield from _components(item)


def read(doc: Doc, reading: Reading) -> None:
    """Every memory key of one torchtune config (see the module docstring)."""
    data = doc.data
    if not isinstance(data, Mapping):
        raise ValueError(f"{doc.name}: not a torchtune config (expected a YAML mapping of keys)")
    recipe = _recipe(doc, reading)
    ignored = IGNORED_BY.get(recipe or "", ())
    for key in ignored:
        if data.get(key) not in (None, False, [], ""):
            reading.warn(f"{doc.name}:{key}: not read by {SRC} recipes/{recipe}.py; ignored")
    keys = {k: v for k, v in data.items() if k not in ignored}
    _model(doc, reading, data)
    _lora(doc, reading, data)
    _batch(doc, reading, keys)
    _seq_len(doc, reading, data)
    _precision(doc, reading, data)
    _optimizer(doc, reading, data)
    _recompute(doc, reading, keys)
    _loss(doc, reading, data)
    _in_backward(doc, reading, keys)
    _sharding(doc, reading, keys, recipe)


def _in_backward(doc: Doc, reading: Reading, keys: Mapping[str, Any]) -> None:
    """optimizer_in_bwd (the full recipes): each parameter steps in backward
    (training.register_optim_in_bwd_hooks); the recipes refuse it with gradient accumulation."""
    if "optimizer_in_bwd" not in keys:
        return
    value = as_bool(doc, "optimizer_in_bwd", keys["optimizer_in_bwd"])
    accum = keys.get("gradient_accumulation_steps") or 1
    if value and as_int(doc, "gradient_accumulation_steps", accum, ge=1) > 1:
        raise bad(
            doc,
            "optimizer_in_bwd",
            "false with gradient_accumulation_steps > 1 (the recipes refuse it)",
            keys["optimizer_in_bwd"],
        )
    reading.put("optimizer_in_backward", value, doc, "optimizer_in_bwd")


# ---- the recipe and its GPUs (the header comment) -----------------------------------------------

TUNE_RUN = re.compile(r"^\s*#.*?\btune run\s+(.*)$")
CONFIG_FOR = re.compile(r"^\s*#\s*Config for .*?\bin\s+([\w/]+)\.py\b")
NO_VALUE_FLAGS = ("--standalone", "--no-python", "--no_python", "--run-path", "--run_path")


def _recipe(doc: Doc, reading: Reading) -> str | None:
    """The recipe the header names (None: none named); num_gpus from its launch line."""
    for line in doc.text.splitlines():
        match = TUNE_RUN.match(line)
        if match:
            return _launch(doc, reading, match.group(1).split())
    for line in doc.text.splitlines():
        match = CONFIG_FOR.match(line)
        if match:
            recipe = match.group(1)
            _recipe_kind(doc, reading, recipe)
            if "distributed" in recipe:
                reading.warn(
                    f"{doc.name}: the header names {recipe} but no `tune run --nproc_per_node`"
                    " line: give --num-gpus"
                )
            return recipe
    return None


def _launch(doc: Doc, reading: Reading, words: list[str]) -> str | None:
    """`tune run [torchrun flags] RECIPE --config ...`: the recipe, and num_gpus = nnodes x
    nproc_per_node (torchrun's defaults 1 and 1) for a distributed one, 1 for a single-device
    one."""
    flags: dict[str, str] = {}
    recipe = None
    k = 0
    while k < len(words):
        word = words[k]
        if not word.startswith("-"):
            recipe = word.removesuffix(".py")
            break
        name, eq, value = word.partition("=")
        if not eq and name not in NO_VALUE_FLAGS and k + 1 < len(words):
            value, k = words[k + 1], k + 1
        flags[name.lstrip("-").replace("-", "_")] = value
        k += 1
    if recipe is None:
        return None
    _recipe_kind(doc, reading, recipe)
    if recipe.endswith("_single_device"):
        reading.put("num_gpus", 1, doc, "# tune run")
    elif "distributed" in recipe:
        key = "# tune run --nproc_per_node"
        nodes = as_int(doc, "# tune run --nnodes", flags.get("nnodes", 1), ge=1)
        per_node = as_int(doc, key, flags.get("nproc_per_node", 1), ge=1)
        reading.put("num_gpus", nodes * per_node, doc, key)
    return recipe


def _recipe_kind(doc: Doc, reading: Reading, recipe: str) -> None:
    """A recipe that is not one of the four fine-tuning recipes trainmem's torchtune mode
    follows is said (its own memory is not modelled)."""
    base = recipe.rsplit("/", 1)[-1]
    if base in FINETUNE_RECIPES:
        return
    why = next((w for word, w in OTHER_RECIPES if word in base), None)
    reading.unmodelled_key(
        doc, "# tune run", f"recipe {recipe}: {why or 'not one of ' + ', '.join(FINETUNE_RECIPES)}"
    )


# ---- the model and its adapters ---------------------------------------------------------------


def preset_name(component: str) -> str:
    """A torchtune model builder as trainmem's preset name: `torchtune.models.llama3_1.
    lora_llama3_1_8b` -> `llama-3.1-8b`, `qwen2_5_7b_instruct` -> `qwen2.5-7b`,
    `qwen2_5_0_5b` -> `qwen2.5-0.5b`, `gemma2_9b` -> `gemma-2-9b`, `phi3_mini` -> `phi-3-mini`.
    A builder of no known family is returned as it is (for the core's resolver)."""
    builder = component.rsplit(".", 1)[-1]
    builder = re.sub(r"^q?lora_", "", builder)
    for folder, family in FAMILIES:
        if builder.startswith(folder + "_"):
            size = builder[len(folder) + 1 :]
            size = re.sub(r"(\d)_(\d)", r"\1.\2", size)
            size = re.sub(r"_(instruct|base)$", "", size).replace("_", "-")
            name = f"{family}-{size}"
            return SAME_ARCHITECTURE.get(name, name)
    return builder


def _model(doc: Doc, reading: Reading, data: Mapping[str, Any]) -> None:
    component = dig(data, "model._component_")
    if isinstance(component, str) and component.startswith("torchtune.models."):
        name = preset_name(component)
        reading.put("model", name, doc, "model._component_")
        builder = component.rsplit(".", 1)[-1]
        if re.sub(r"^q?lora_", "", builder).startswith("llama3_3_"):
            reading.warn(f"{doc.name}:model._component_: {builder} read as {name} (same layers)")
        return
    folder = dig(data, "checkpointer.checkpoint_dir")
    if isinstance(folder, str) and folder.strip():
        reading.put("model", folder, doc, "checkpointer.checkpoint_dir")


def _lora(doc: Doc, reading: Reading, data: Mapping[str, Any]) -> None:
    """LoRA / QLoRA / DoRA from the builder's arguments (torchtune 0.6.1 torchtune/models/*/
    _model_builders.py lora_*: lora_rank 8, apply_lora_to_mlp False, lora_dropout 0.0)."""
    model = data.get("model")
    component = dig(data, "model._component_")
    builder = component.rsplit(".", 1)[-1] if isinstance(component, str) else ""
    if not isinstance(model, Mapping) or not (
        builder.startswith(("lora_", "qlora_")) or "lora_rank" in model
    ):
        return
    source = f"{SRC} torchtune/models/*/_model_builders.py (lora_*: lora_rank: int = 8)"
    if "lora_rank" in model:
        reading.put(
            "lora_rank",
            as_int(doc, "model.lora_rank", model["lora_rank"], ge=1),
            doc,
            "model.lora_rank",
        )
    else:
        reading.default("lora_rank", 8, source)
    _lora_targets(doc, reading, model)
    if builder.startswith("qlora_"):
        reading.put("qlora", True, doc, "model._component_")
    elif "quantize_base" in model:
        value = as_bool(doc, "model.quantize_base", model["quantize_base"])
        reading.put("qlora", value, doc, "model.quantize_base")
    if as_bool(doc, "model.apply_lora_to_output", model.get("apply_lora_to_output")):
        reading.unmodelled_key(
            doc,
            "model.apply_lora_to_output",
            "a LoRA adapter on the output head; trainmem adapts the blocks' linears only",
        )
    if as_float(doc, "model.lora_dropout", model.get("lora_dropout") or 0.0) > 0:
        reading.unmodelled_key(
            doc,
            "model.lora_dropout",
            "LoRA dropout keeps a dropped copy of each adapted "
            "input; trainmem's torchtune mode has it off, the builders' default",
        )
    if as_bool(doc, "model.use_dora", model.get("use_dora")):
        reading.unmodelled_key(
            doc, "model.use_dora", "DoRA's magnitude vectors and weight-norm activations"
        )


def _lora_targets(doc: Doc, reading: Reading, model: Mapping[str, Any]) -> None:
    modules = model.get("lora_attn_modules")
    if modules is None:
        reading.warn(f"{doc.name}:model.lora_attn_modules: missing; the builder requires it")
        return
    if isinstance(modules, str):
        modules = [modules]
    if not isinstance(modules, list):
        raise bad(
            doc, "model.lora_attn_modules", "a list of q_proj/k_proj/v_proj/output_proj", modules
        )
    names = []
    for module in modules:
        if module not in ATTN_MODULES:
            raise bad(
                doc, "model.lora_attn_modules", "q_proj, k_proj, v_proj or output_proj", module
            )
        names.append(ATTN_MODULES[module])
    key = "model.lora_attn_modules"
    if as_bool(doc, "model.apply_lora_to_mlp", model.get("apply_lora_to_mlp")):
        names.extend(MLP_MODULES)
        key += "+apply_lora_to_mlp"
    reading.put("lora_targets", ",".join(dict.fromkeys(names)), doc, key)


# ---- batch, sequence, precision ----------------------------------------------------------------


def _batch(doc: Doc, reading: Reading, keys: Mapping[str, Any]) -> None:
    """micro_batch_size = batch_size; gradient_accumulation_steps as the accumulation, from
    which the core derives the global batch once the GPUs are known (batch_size x accumulation
    x dp, dp = num_gpus / tensor_parallel_dim: recipes/full_finetune_distributed.py
    data_parallel_dim)."""
    if "batch_size" in keys:
        reading.put(
            "micro_batch_size",
            as_int(doc, "batch_size", keys["batch_size"], ge=1),
            doc,
            "batch_size",
        )
    accum_key = "gradient_accumulation_steps"
    if accum_key in keys:
        accum = as_int(doc, accum_key, keys[accum_key], ge=1)
        reading.put("grad_accum_steps", accum, doc, accum_key)


def _seq_len(doc: Doc, reading: Reading, data: Mapping[str, Any]) -> None:
    """seq_len = tokenizer.max_seq_len (else dataset.max_seq_len). torchtune has no fixed
    length: unpacked batches pad to their longest sample (data/_collate.py padded_collate_sft),
    truncated at max_seq_len; packed ones are max_seq_len tokens exactly (datasets/_packed.py)."""
    datasets = data.get("dataset")
    listed = datasets if isinstance(datasets, list) else [datasets]
    packed = any(
        isinstance(d, Mapping) and as_bool(doc, "dataset.packed", d.get("packed")) for d in listed
    )
    for key in ("tokenizer.max_seq_len", "dataset.max_seq_len"):
        value = dig(data, key)
        if value is not None:
            reading.put("seq_len", as_int(doc, key, value, ge=1), doc, key)
            if not packed:
                reading.warn(
                    f"{doc.name}:{key}: {value} is the truncation length; unpacked batches pad"
                    " to their longest sample, so the estimate is the worst case"
                )
            return
    reading.warn(
        f"{doc.name}:tokenizer.max_seq_len: not set; torchtune pads each batch to its longest "
        "sample (no fixed length): trainmem's default seq_len applies, give --seq-len"
    )
    if packed:
        reading.warn(f"{doc.name}:dataset.packed: packing needs tokenizer.max_seq_len")


def _precision(doc: Doc, reading: Reading, data: Mapping[str, Any]) -> None:
    """dtype: the model, gradients and optimizer states in that dtype (recipes build the model
    under training.set_default_dtype(dtype)); the recipes refuse fp16."""
    if "dtype" not in data:
        reading.warn(f"{doc.name}:dtype: missing; the recipes require it (cfg.dtype)")
        return
    value = str(data["dtype"]).strip().lower()
    if value in ("bf16", "fp32"):
        reading.put("precision", value, doc, "dtype")
    elif value == "fp64":
        reading.unmodelled_key(doc, "dtype", "fp64 parameters")
    else:
        raise bad(doc, "dtype", "bf16 or fp32 (torchtune 0.6.1 refuses fp16)", data["dtype"])


# ---- optimizer, recomputation, loss ------------------------------------------------------------

OPTIMIZERS = {
    "torch.optim.AdamW": "adamw",
    "torch.optim.Adam": "adamw",
    "bitsandbytes.optim.AdamW8bit": "adamw-8bit",
    "bitsandbytes.optim.Adam8bit": "adamw-8bit",
    "bitsandbytes.optim.PagedAdamW8bit": "adamw-8bit",
    "bitsandbytes.optim.PagedAdam8bit": "adamw-8bit",
    "bitsandbytes.optim.PagedAdamW": "adamw",
    "bitsandbytes.optim.PagedAdamW32bit": "adamw",
    "bitsandbytes.optim.PagedAdam": "adamw",
    "torch.optim.SGD": "sgd",
    "torch.optim.Adafactor": "adafactor",
}
"""optimizer._component_ -> trainmem's optimizer (Adam keeps AdamW's two states)."""


def _optimizer(doc: Doc, reading: Reading, data: Mapping[str, Any]) -> None:
    component = dig(data, "optimizer._component_")
    if component is None:
        return
    key = "optimizer._component_"
    name = OPTIMIZERS.get(str(component))
    if name is None:
        reading.unmodelled_key(doc, key, f"optimizer {component}")
        return
    if name == "adamw" and as_bool(doc, "optimizer.fused", dig(data, "optimizer.fused")):
        name, key = "adamw-fused", "optimizer.fused"
    if name == "sgd" and as_float(doc, "optimizer.momentum", dig(data, "optimizer.momentum") or 0):
        name, key = "sgd-momentum", "optimizer.momentum"
    reading.put("optimizer", name, doc, key)
    if ".Paged" in str(component):
        reading.unmodelled_key(
            doc,
            "optimizer._component_",
            f"{component} pages its states to host memory under "
            "pressure; counted as resident on the GPU",
        )


def _recompute(doc: Doc, reading: Reading, keys: Mapping[str, Any]) -> None:
    """enable_activation_checkpointing: every TransformerSelfAttentionLayer checkpointed
    (training.set_activation_checkpointing). full_finetune_distributed's ac_mode / ac_option
    apply only with enable_activation_checkpointing off (recipes/full_finetune_distributed.py
    _setup_model; training/activations.py: `selective` checkpoints every ac_option-th layer)."""
    full = as_bool(
        doc, "enable_activation_checkpointing", keys.get("enable_activation_checkpointing")
    )
    mode = keys.get("ac_mode")
    if mode is not None and full:
        reading.put("recompute", "none", doc, "ac_mode")
        reading.warn(
            f"{doc.name}:ac_mode: with enable_activation_checkpointing on, the recipe applies "
            "neither (no layer is checkpointed)"
        )
    elif mode is not None:
        _ac_mode(doc, reading, str(mode).strip().lower(), keys.get("ac_option"))
    elif "enable_activation_checkpointing" in keys:
        reading.put("recompute", "full" if full else "none", doc, "enable_activation_checkpointing")
    if "enable_activation_offloading" in keys:
        offload = as_bool(doc, "enable_activation_offloading", keys["enable_activation_offloading"])
        if offload and not full:
            raise bad(
                doc,
                "enable_activation_offloading",
                "false without enable_activation_checkpointing (the recipes refuse it)",
                keys["enable_activation_offloading"],
            )
        reading.put("activation_offload", offload, doc, "enable_activation_offloading")


def _ac_mode(doc: Doc, reading: Reading, mode: str, option: Any) -> None:
    if mode == "none":
        reading.put("recompute", "none", doc, "ac_mode")
    elif mode == "full":
        reading.put("recompute", "full", doc, "ac_mode")
    elif mode == "selective":
        every = as_int(doc, "ac_option", option, ge=0)
        if every <= 1:  # 0 and 1 checkpoint every layer (activations.py checkpoint_wrapper)
            reading.put("recompute", "full", doc, "ac_option")
            return
        reading.put("recompute", "selective-layer", doc, "ac_mode")
        reading.put("recompute_every", every, doc, "ac_option")
    else:
        raise bad(doc, "ac_mode", "none, full or selective", mode)


def _loss(doc: Doc, reading: Reading, data: Mapping[str, Any]) -> None:
    """loss._component_; compile: per-layer torch.compile of the model and of the loss
    (training/_compile.py compile_model, compile_loss; both in all four recipes)."""
    component = dig(data, "loss._component_")
    if component is not None:
        name = str(component).rsplit(".", 1)[-1]
        if name == "CEWithChunkedOutputLoss":
            chunks = dig(data, "loss.num_output_chunks")
            reading.put("loss", "chunked-output", doc, "loss._component_")
            if chunks is not None and as_int(doc, "loss.num_output_chunks", chunks, ge=1) != (
                CHUNKED_OUTPUT_CHUNKS
            ):
                reading.unmodelled_key(
                    doc, "loss.num_output_chunks", f"{chunks} chunks; trainmem counts 8"
                )
        elif str(component) in (
            "torch.nn.CrossEntropyLoss",
            "torch.nn.modules.loss.CrossEntropyLoss",
        ):
            reading.put("loss", "full", doc, "loss._component_")
        else:
            reading.unmodelled_key(
                doc,
                "loss._component_",
                f"loss {component} (not in {SRC}'s CEWithChunkedOutputLoss / CrossEntropyLoss)",
            )
    if "compile" in data:
        compiled = as_bool(doc, "compile", data["compile"])
        reading.put("compile", "blocks+loss" if compiled else "none", doc, "compile")


# ---- sharding and tensor parallelism -----------------------------------------------------------


def _sharding(doc: Doc, reading: Reading, keys: Mapping[str, Any], recipe: str | None) -> None:
    """A distributed recipe shards with FSDP2 over dp = num_gpus / tensor_parallel_dim
    (training.shard_model, reshard_after_forward default True: ZeRO-3; False: ZeRO-2);
    fsdp_cpu_offload: FSDP2 CPUOffloadPolicy (parameters, gradients, optimizer step on the
    host)."""
    tp = as_int(doc, "tensor_parallel_dim", keys.get("tensor_parallel_dim") or 1, ge=1)
    if "tensor_parallel_dim" in keys:
        reading.put("tp", tp, doc, "tensor_parallel_dim")
    fused = dig(keys, "optimizer.fused")
    if tp > 1 and as_bool(doc, "optimizer.fused", fused):
        raise bad(
            doc,
            "optimizer.fused",
            "false with tensor_parallel_dim > 1 (the recipe refuses it)",
            fused,
        )
    gpus = reading.fields.get("num_gpus")
    one_rank = gpus is not None and gpus.file == doc.name and int(gpus.value) // tp <= 1
    single = recipe is not None and "distributed" not in recipe
    if single or (one_rank and recipe == FULL_DISTRIBUTED):
        return  # full_finetune_distributed shards only when data_parallel_dim > 1
    if "fsdp_reshard_after_forward" in keys:
        reshard = as_bool(doc, "fsdp_reshard_after_forward", keys["fsdp_reshard_after_forward"])
        reading.put("zero", 3 if reshard else 2, doc, "fsdp_reshard_after_forward")
    if recipe is not None:
        reading.default(
            "zero",
            3,
            f"{SRC} recipes/{recipe}.py _setup_model (training.shard_model: FSDP2 "
            "fully_shard per layer and root, fsdp_reshard_after_forward default True)",
        )
    if as_bool(doc, "fsdp_cpu_offload", keys.get("fsdp_cpu_offload")):
        reading.put("offload", "optimizer+params", doc, "fsdp_cpu_offload")
    elif "fsdp_cpu_offload" in keys:
        reading.put("offload", "none", doc, "fsdp_cpu_offload")
    layers = keys.get("custom_sharded_layers")
    if layers:
        reading.unmodelled_key(
            doc,
            "custom_sharded_layers",
            f"{list(layers)} as FSDP units of their own; "
            "trainmem's torchtune mode keeps the embedding and head in the root unit (an "
            "overestimate)",
        )


STACK = Stack(
    name="torchtune",
    version=VERSION,
    framework="torchtune",
    detect=detect,
    read=read,
)
