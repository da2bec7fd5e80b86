"""HF Trainer / TRL configs (transformers 5.24.0 TrainingArguments, TRL 1.9.0 SFTConfig / DPOConfig
and ModelConfig: `trl sft --config x.yaml`, alignment-handbook recipes) as YAML or JSON: the model,
batch and sequence length, bf16/fp16 with the load dtype, gradient checkpointing, optimizer,
attention, PEFT LoRA / QLoRA, Liger, torch.compile, `deepspeed` (a path: the framework; inline: read
as a DeepSpeed config) and `fsdp`.

TRL's configs change TrainingArguments' defaults (gradient checkpointing on, bf16 on, max_length
1024, SFT's chunked loss); a file is TRL's when it has a key only TRL's dataclasses declare.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from . import _deepspeed
from ._reading import Doc, Reading, as_bool, as_float, as_int, bad, dig
from ._stacks import Stack

VERSION = "transformers 5.24.0 / trl 1.9.0"
TF = "transformers 5.24.0 src/transformers/training_args.py"
TRL_BASE = "trl 1.9.0 trl/trainer/base_config.py"
TRL_SFT = "trl 1.9.0 trl/trainer/sft_config.py"
TRL_DPO = "trl 1.9.0 trl/trainer/dpo_config.py"
TRL_MODEL = "trl 1.9.0 trl/trainer/model_config.py"
TRL_GRPO = "trl f2cd577 (1.10.0.dev0) trl/trainer/grpo_config.py"
TRL_GRPO_VLLM = "trl f2cd577 (1.10.0.dev0) trl/trainer/grpo_trainer.py (VLLMGeneration(...))"

HF_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "output_dir",
           "num_train_epochs", "logging_steps", "save_strategy", "lr_scheduler_type",
           "gradient_checkpointing", "optim", "warmup_ratio", "eval_strategy")  # fmt: skip
TRL_MODEL_KEYS = ("use_peft", "lora_r", "lora_target_modules", "load_in_4bit", "load_in_8bit",
                  "model_revision", "lora_alpha", "attn_implementation", "torch_dtype",
                  "dtype")  # fmt: skip
SFT_KEYS = ("max_seq_length", "packing", "dataset_text_field", "completion_only_loss",
            "assistant_only_loss", "packing_strategy", "padding_free", "dataset_mixture",
            "chat_template", "eos_token", "activation_offloading", "dataset_name")  # fmt: skip
PREFERENCE_KEYS = ("beta", "max_prompt_length", "max_completion_length", "precompute_ref_log_probs",
                   "rpo_alpha", "ref_model_init_kwargs", "sync_ref_model")  # fmt: skip
GRPO_KEYS = ("num_generations", "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization",
             "vllm_tensor_parallel_size", "generation_batch_size", "steps_per_generation",
             "num_iterations", "vllm_enable_sleep_mode", "vllm_max_model_length")  # fmt: skip
"""Keys only TRL's GRPOConfig has (it shares beta and the lengths with DPOConfig)."""
TRL_CLI = "trl f2cd577 (1.10.0.dev0) trl/cli/accelerate_config.py, trl/scripts/utils.py"
"""TRL's CLI passes a config key no dataclass declares to `accelerate launch` (`--key value`);
`accelerate_config` names one of trl/accelerate_configs/*.yaml."""
TRL_ACCELERATE_ZERO = {"zero1": 1, "zero2": 2, "zero3": 3}
"""TRL's shipped DeepSpeed accelerate configs (zero_stage; offload_*_device none)."""
FOREIGN = ("finetuning_type", "stage", "template", "cutoff_len", "base_model", "micro_batch_size",
           "sequence_len", "_component_", "tokenizer", "recipe")  # fmt: skip
"""Keys of LLaMA-Factory, axolotl, torchtune: not this stack's files."""

OPTIMIZERS = {"adamw_torch": "adamw", "adamw_hf": "adamw-hf", "adamw_torch_npu_fused": "adamw",
              "adamw_torch_fused": "adamw-fused", "adamw_apex_fused": "adamw-fused",
              "adamw_torch_xla": "adamw", "adamw_bnb_8bit": "adamw-8bit",
              "adamw_8bit": "adamw-8bit", "paged_adamw_8bit": "paged-adamw-8bit",
              "paged_adamw_32bit": "paged-adamw", "paged_adamw": "paged-adamw",
              "adafactor": "adafactor", "lion_32bit": "lion", "paged_lion_32bit": "lion",
              "paged_lion": "lion", "sgd": "sgd"}  # fmt: skip
"""transformers OptimizerNames (training_args.py) -> trainmem; paged AdamWs are bitsandbytes'
PagedAdamW / PagedAdamW8bit (trainer.py get_optimizer_cls_and_kwargs: `is_paged`), whose
states page to the host (engine/_optimizers.py paged_state_bytes); paged Lion is counted as a
resident Lion and said unmodelled (PAGED_UNMODELLED)."""
PAGED_UNMODELLED = ("paged_lion_32bit", "paged_lion", "paged_lion_8bit")
"""Paged optimizers trainmem has no paged built-in for."""
PRECISION_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16",
                    "half": "fp16", "float32": "fp32", "fp32": "fp32", "float": "fp32"}  # fmt: skip
FSDP_WORDS = ("full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2", "no_shard",
              "offload", "auto_wrap")  # fmt: skip


def detect(doc: Doc) -> int:
    data = doc.data
    if not isinstance(data, Mapping) or any(k in data for k in FOREIGN):
        return 0
    if any(k in data for k in _deepspeed.MARKERS) or "distributed_type" in data:
        return 0
    trl = sum(k in data for k in (*TRL_MODEL_KEYS, *SFT_KEYS, *PREFERENCE_KEYS, *GRPO_KEYS))
    hf = sum(k in data for k in HF_KEYS)
    if "model_name_or_path" in data and (trl or hf):
        return 9
    return 7 if hf >= 2 else 0


def trainer_kind(data: Mapping[str, Any]) -> str:
    """`grpo` (TRL's GRPO), `dpo` (a preference trainer), `sft` (TRL's SFT), `trl` (TRL's model
    config only) or `trainer` (plain TrainingArguments)."""
    if any(k in data for k in GRPO_KEYS):
        return "grpo"
    if any(k in data for k in PREFERENCE_KEYS):
        return "dpo"
    if any(k in data for k in SFT_KEYS) or "max_length" in data:
        return "sft"
    return "trl" if any(k in data for k in TRL_MODEL_KEYS) else "trainer"


def read(doc: Doc, reading: Reading) -> None:
    data: Mapping[str, Any] = doc.data
    kind = trainer_kind(data)
    if "model_name_or_path" in data and data["model_name_or_path"]:
        reading.put("model", str(data["model_name_or_path"]), doc, "model_name_or_path")
    _batch(data, kind, doc, reading)
    _wrappers(data, doc, reading)
    _precision(data, kind, doc, reading)
    _training(data, kind, doc, reading)
    _peft(data, doc, reading)
    _loss(data, kind, doc, reading)
    if kind == "dpo":
        _dpo(data, doc, reading)
    if kind == "grpo":
        _grpo(data, doc, reading)


def _dpo(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    """A preference trainer as `--rl dpo`: chosen and rejected in one forward, the reference
    model (the LoRA base under peft, ref_model auto); precompute_ref_log_probs scores the
    dataset with it before training, so the step runs without it."""
    key = next(k for k in PREFERENCE_KEYS if k in data)
    reading.put("rl", "dpo", doc, key)
    pre = "precompute_ref_log_probs"
    named = next((k for k in ("output_dir", "hub_model_id", "run_name")
                  if re.search(r"(^|[^a-z])(orpo|simpo|cpo)", str(data.get(k, "")).lower())),
                 None)  # fmt: skip
    if pre in data and as_bool(doc, pre, data[pre]):
        reading.put("ref_model", "none", doc, pre)
    elif named is not None:  # ORPO, SimPO, CPO: the same keys, no reference model
        reading.put("ref_model", "none", doc, named)
        reading.warn(f"{doc.name}:{named}: {data[named]!r} read as a reference-free "
                     "preference trainer (ORPO / SimPO / CPO): no reference model")  # fmt: skip
    else:
        reading.warn(f"{doc.name}:{key}: a preference trainer read as DPO (chosen and rejected "
                     "in one forward, a reference model); ORPO / SimPO / CPO load none: "
                     "--ref-model none")  # fmt: skip


def _grpo(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    """TRL's GRPOTrainer as `--rl grpo` (TRL_GRPO's defaults): num_generations completions per
    prompt; per_device_train_batch_size counts completions; the rollout (_grpo_rollout); the
    reference model only for beta > 0 (TRL's default beta 0.0 loads none)."""
    reading.put("rl", "grpo", doc, next(k for k in GRPO_KEYS if k in data))
    n, given = _given(data, "num_generations", 8)
    _put(reading, doc, "rl_group_size", as_int(doc, "num_generations", n, ge=1),
         "num_generations", given)  # fmt: skip
    response, given = _given(data, "max_completion_length", 512)
    response = as_int(doc, "max_completion_length", response, ge=1)
    _put(reading, doc, "response_len", response, "max_completion_length", given)
    if data.get("max_prompt_length") is not None:
        prompt = as_int(doc, "max_prompt_length", data["max_prompt_length"], ge=1)
        reading.put("seq_len", prompt + response, doc, "max_prompt_length")
    elif data.get("vllm_max_model_length") is not None:  # vLLM's context: prompt + completion
        length = as_int(doc, "vllm_max_model_length", data["vllm_max_model_length"], ge=response)
        reading.put("seq_len", length, doc, "vllm_max_model_length")
    else:
        reading.warn(
            f"{doc.name}: the prompts' length is the dataset's (no max_prompt_length): "
            "give --seq-len (prompt + completion)"
        )
    if data.get("generation_batch_size") is not None:
        prompts = as_int(doc, "generation_batch_size", data["generation_batch_size"], ge=1)
        reading.put("rollout_batch_size", max(prompts // int(reading.get("rl_group_size")), 1),
                    doc, "generation_batch_size")  # fmt: skip
    _grpo_rollout(data, doc, reading)
    beta, given = _given(data, "beta", 0.0)
    if as_float(doc, "beta", beta) == 0.0:
        _put(reading, doc, "ref_model", "none", "beta", given)


def _given(data: Mapping[str, Any], key: str, default: Any) -> tuple[Any, bool]:
    """(the file's value at `key`, True), or (`default`, False)."""
    given = key in data and data[key] is not None
    return (data[key] if given else default), given


def _put(reading: Reading, doc: Doc, name: str, value: Any, key: str, given: bool,
         source: str = TRL_GRPO) -> None:  # fmt: skip
    if given:
        reading.put(name, value, doc, key)
    else:
        reading.default(name, value, f"{source} ({key})")


def _grpo_rollout(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    """The rollout: vLLM colocated in the training processes (use_vllm, vllm_mode colocate: its
    tensor parallel size and gpu_memory_utilization, max_num_seqs per_device x tp x
    steps_per_generation (generation_batch_size / (per_device x processes) when the file gives
    those instead) and max_num_batched_tokens 4096 as TRL builds the LLM; awake through
    training unless vllm_enable_sleep_mode, which sleeps it at level 2), else the model's own
    generate."""
    vllm, _ = _given(data, "use_vllm", False)
    mode, mode_given = _given(data, "vllm_mode", "colocate")
    if not as_bool(doc, "use_vllm", vllm):
        if "use_vllm" in data:
            reading.put("rollout", "hf", doc, "use_vllm")
        else:
            reading.default("rollout", "hf", f"{TRL_GRPO} (use_vllm = False: model.generate)")
        return
    if str(mode).lower() != "colocate":
        reading.unmodelled_key(doc, "vllm_mode", f"vLLM {mode} mode: generation on other GPUs "
                               "(counted as the model's own generate)")  # fmt: skip
        reading.put("rollout", "hf", doc, "vllm_mode")
        return
    reading.put("rollout", "vllm", doc, "vllm_mode" if mode_given else "use_vllm")
    tp, given = _given(data, "vllm_tensor_parallel_size", 1)
    tp = as_int(doc, "vllm_tensor_parallel_size", tp, ge=1)
    _put(reading, doc, "rollout_tp", tp, "vllm_tensor_parallel_size", given)
    util, given = _given(data, "vllm_gpu_memory_utilization", 0.3)
    util = as_float(doc, "vllm_gpu_memory_utilization", util)
    _put(reading, doc, "rollout_gpu_memory_utilization", util, "vllm_gpu_memory_utilization",
         given)  # fmt: skip
    mb = int(reading.get("micro_batch_size"))
    steps = data.get("steps_per_generation") or data.get("gradient_accumulation_steps") or 1
    generation = data.get("generation_batch_size")
    if generation and not data.get("steps_per_generation") and reading.has("num_gpus"):
        # GRPOConfig.__post_init__: the generation batch over per_device x processes
        steps = max(int(generation) // (mb * int(reading.get("num_gpus"))), 1)
    seqs = mb * tp * as_int(doc, "steps_per_generation", steps, ge=1)
    reading.default("rollout_max_num_seqs", seqs, f"{TRL_GRPO_VLLM}: max_num_seqs")
    reading.default("rollout_max_num_batched_tokens", 4096,
                    f"{TRL_GRPO_VLLM}: max_num_batched_tokens=4096")  # fmt: skip
    sleep, given = _given(data, "vllm_enable_sleep_mode", False)
    level = 2 if as_bool(doc, "vllm_enable_sleep_mode", sleep) else 0
    _put(reading, doc, "rollout_sleep_level", level, "vllm_enable_sleep_mode", given,
         "trl f2cd577 trl/generation/vllm_generation.py (sleep(level=2) only under "
         "enable_sleep_mode)")  # fmt: skip


def _batch(data: Mapping[str, Any], kind: str, doc: Doc, reading: Reading) -> None:
    key = "per_device_train_batch_size"
    if key in data:
        reading.put("micro_batch_size", as_int(doc, key, data[key], ge=1), doc, key)
    else:
        reading.default("micro_batch_size", 8, f"{TF} (per_device_train_batch_size = 8)")
    key = "gradient_accumulation_steps"
    if key in data:
        steps = as_int(doc, key, data[key], ge=1)
        reading.put("grad_accum_steps", steps, doc, key)  # the core derives the global batch
    for key in ("max_length", "max_seq_length"):
        if data.get(key) is not None:
            reading.put("seq_len", as_int(doc, key, data[key], ge=1), doc, key)
            break
    else:
        if kind in ("sft", "dpo") and "max_length" not in data:
            source = TRL_SFT if kind == "sft" else TRL_DPO
            reading.default("seq_len", 1024, f"{source} (max_length = 1024)")
    for key in ("packing", "padding_free"):
        if key in data and as_bool(doc, key, data[key]):
            reading.unmodelled_key(
                doc,
                key,
                "padding-free packed rows (one flattened sequence, "
                "varlen attention): counted as full max_length rows",
            )
    if "auto_find_batch_size" in data and as_bool(
        doc, "auto_find_batch_size", data["auto_find_batch_size"]
    ):
        reading.unmodelled_key(doc, "auto_find_batch_size", "the batch halves after an OOM")


def _wrappers(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    """`deepspeed` (a JSON path, or the config inline) and `fsdp` (TrainingArguments)."""
    ds = data.get("deepspeed")
    if isinstance(ds, Mapping):
        _deepspeed.read(doc, reading, prefix="deepspeed.")
    elif ds:
        _deepspeed.to_framework(reading, "deepspeed", doc, "deepspeed")
        match = re.search(r"(?:zero|stage)[_-]?(\d)", str(ds).lower())
        if match and int(match.group(1)) <= 3:
            reading.put("zero", int(match.group(1)), doc, "deepspeed")
            reading.warn(
                f"{doc.name}:deepspeed: ZeRO stage {match.group(1)} guessed from the "
                f"file name {ds!r}; give the DeepSpeed JSON too"
            )
        else:
            reading.warn(f"{doc.name}:deepspeed: {ds!r}: give the DeepSpeed JSON too")
    fsdp = data.get("fsdp")
    if fsdp:
        _fsdp(fsdp, doc, reading)
    if data.get("accelerate_config") is not None:
        _trl_accelerate(data, doc, reading)


def _trl_accelerate(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    """TRL CLI's accelerate keys (TRL_CLI): `accelerate_config` zero1|zero2|zero3 is DeepSpeed
    at that stage (`zero_stage` over it, as accelerate launch's flag wins), num_processes the
    GPUs; another name or a path is said unread."""
    name = str(data["accelerate_config"])
    if name not in TRL_ACCELERATE_ZERO:
        reading.warn(f"{doc.name}:accelerate_config: {name!r} is not read: give the accelerate "
                     "config file too")  # fmt: skip
        return
    _deepspeed.to_framework(reading, "deepspeed", doc, "accelerate_config")
    if data.get("zero_stage") is not None:
        reading.put("zero", as_int(doc, "zero_stage", data["zero_stage"], ge=0), doc, "zero_stage")
    else:
        reading.put("zero", TRL_ACCELERATE_ZERO[name], doc, "accelerate_config")
    if data.get("num_processes") is not None:
        gpus = as_int(doc, "num_processes", data["num_processes"], ge=1)
        reading.put("num_gpus", gpus, doc, "num_processes")


def _fsdp(fsdp: Any, doc: Doc, reading: Reading) -> None:
    words = fsdp if isinstance(fsdp, list) else str(fsdp).replace(",", " ").split()
    words = [str(w).strip().lower() for w in words]
    for word in words:
        if word not in FSDP_WORDS:
            raise bad(doc, "fsdp", " ".join(FSDP_WORDS), fsdp)
    zero = 2 if ("shard_grad_op" in words or "hybrid_shard_zero2" in words) else 3
    zero = 0 if words == ["no_shard"] else zero
    reading.put("zero", zero, doc, "fsdp")
    if "offload" in words:
        reading.put("offload", "optimizer+params", doc, "fsdp")
    if any(w.startswith("hybrid") for w in words):
        reading.unmodelled_key(
            doc, "fsdp", "hybrid sharding over one node's GPUs: give --dp-shard GPUS_PER_NODE"
        )
    cfg = doc.data.get("fsdp_config")
    if isinstance(cfg, Mapping):
        for key in ("activation_checkpointing", "fsdp_activation_checkpointing"):
            if key in cfg and as_bool(doc, f"fsdp_config.{key}", cfg[key]):
                reading.put("recompute", "full", doc, f"fsdp_config.{key}")
        for key in ("cpu_ram_efficient_loading", "fsdp_cpu_ram_efficient_loading"):
            if key in cfg and as_bool(doc, f"fsdp_config.{key}", cfg[key]):
                reading.put("load", "meta-init", doc, f"fsdp_config.{key}")
    _deepspeed.wrapped_precision(reading, "fsdp", doc, "fsdp")


def _dtype(data: Mapping[str, Any], kind: str, doc: Doc) -> tuple[str | None, str | None]:
    """(the dtype the weights load in: bf16|fp16|fp32|None unknown, the key)."""
    for key in ("dtype", "torch_dtype", "model_init_kwargs.dtype", "model_init_kwargs.torch_dtype"):
        head, _, last = key.rpartition(".")
        parent = dig(data, head) if head else data
        if not isinstance(parent, Mapping) or last not in parent:
            continue
        value = parent[last]
        text = str(value).strip().lower().removeprefix("torch.")
        if value is None or text == "auto":  # transformers 5: from_pretrained's None is auto
            return None, key
        if text not in PRECISION_DTYPES:
            raise bad(doc, key, "bfloat16, float16, float32 or auto", value)
        return PRECISION_DTYPES[text], key
    return ("fp32", None) if kind != "trainer" else (None, None)


def _precision(data: Mapping[str, Any], kind: str, doc: Doc, reading: Reading) -> None:
    """The weights' dtype with the Trainer's autocast: 16-bit weights are pure 16-bit training
    (`bf16`; DeepSpeed keeps an fp32 master, so `mixed-bf16`), fp32 weights with bf16/fp16 are
    autocast (`amp-*`; under FSDP and DeepSpeed `mixed-*`), fp32 without is fp32."""
    amp, amp_key = None, None
    for name in ("bf16", "fp16"):
        if name in data and data[name] is not None and as_bool(doc, name, data[name]):
            amp, amp_key = name, name
            break
    if amp is None and kind != "trainer" and data.get("bf16") is None:
        amp = "bf16"  # TRL: bf16 = not fp16 (fp16 on is read above)
    dtype, dtype_key = _dtype(data, kind, doc)
    if dtype_key is not None and dtype is None:
        reading.unmodelled_key(doc, dtype_key, "auto: the checkpoint's dtype; counted as fp32")
        dtype = "fp32"
    if dtype is None:
        dtype = "fp32"  # the script loads the model: from_pretrained's dtype unknown here
    value = dtype if dtype != "fp32" else (f"amp-{amp}" if amp else "fp32")
    said = [k for k in ("bf16", "fp16") if data.get(k) is not None]
    key = dtype_key if dtype != "fp32" and dtype_key else amp_key or next(iter(said), None)
    if key is not None:
        reading.put("precision", value, doc, key)
    elif kind != "trainer":
        reading.default("precision", value, f"{TRL_BASE} (bf16 = not fp16) and {TRL_MODEL} "
                        "(dtype = float32)")  # fmt: skip
    else:
        reading.default("precision", value, f"{TF} (bf16 = fp16 = False; the script's model "
                        "dtype counted as fp32)")  # fmt: skip
    if reading.get("framework") == "deepspeed":
        _deepspeed.wrapped_precision(reading, "deepspeed", doc, key or "bf16")
    elif reading.get("zero", 0) > 0:
        _deepspeed.wrapped_precision(reading, "fsdp", doc, key or "bf16")


def _training(data: Mapping[str, Any], kind: str, doc: Doc, reading: Reading) -> None:
    key = "gradient_checkpointing"
    if key in data and data[key] is not None:
        if as_bool(doc, key, data[key]):
            reading.put("recompute", "full", doc, key)
    elif kind != "trainer":
        reading.default("recompute", "full", f"{TRL_BASE} (gradient_checkpointing = True)")
    _optimizer(data, doc, reading)
    key = "attn_implementation"
    value = data.get(key, dig(data, "model_init_kwargs.attn_implementation"))
    if value is not None:
        text = str(value).strip().lower()
        if text == "eager":
            reading.put("attention", "eager", doc, key)
        elif "flash" in text or text in ("sdpa", "kernels-community/vllm-flash-attn3"):
            reading.put("attention", "flash", doc, key)
        else:
            reading.unmodelled_key(doc, key, f"attention {value!r}: counted as flash")
    compiled = [
        k
        for k in ("torch_compile", "torch_compile_backend", "torch_compile_mode")
        if data.get(k) not in (None, False)
    ]
    if compiled and (
        compiled[0] != "torch_compile" or as_bool(doc, compiled[0], data[compiled[0]])
    ):
        liger = as_bool(doc, "use_liger_kernel", data.get("use_liger_kernel", False))
        mode = "blocks" if liger or kind == "sft" else "blocks+loss"
        reading.put("compile", mode, doc, compiled[0])
    key = "activation_offloading"
    if key in data and as_bool(doc, key, data[key]):
        reading.put("activation_offload", True, doc, key)


def _optimizer(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    key = "optim"
    if key not in data:
        reading.default("optimizer", "adamw-fused", f"{TF} (optim = adamw_torch_fused)")
        return
    name = str(data[key]).strip().lower()
    value = OPTIMIZERS.get(name)
    if value is None:
        reading.unmodelled_key(doc, key, f"optimizer {data[key]!r} is not a built-in one")
        return
    if name == "sgd" and "momentum" in str(data.get("optim_args", "")):
        value = "sgd-momentum"
    reading.put("optimizer", value, doc, key)
    if name in PAGED_UNMODELLED:
        reading.unmodelled_key(doc, key, "paged optimizer states: counted as resident")


def _peft(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    """TRL ModelConfig's PEFT keys (trl get_peft_config: LoRA only with use_peft)."""
    if not as_bool(doc, "use_peft", data.get("use_peft", False)):
        if as_bool(doc, "load_in_4bit", data.get("load_in_4bit", False)):
            reading.unmodelled_key(doc, "load_in_4bit", "4-bit base without adapters")
        return
    if "lora_r" in data:
        reading.put("lora_rank", as_int(doc, "lora_r", data["lora_r"], ge=1), doc, "lora_r")
    else:
        reading.default("lora_rank", 16, f"{TRL_MODEL} (lora_r = 16)")
    targets = data.get("lora_target_modules")
    if targets is not None:
        names = targets if isinstance(targets, list) else str(targets).split(",")
        text = ",".join(str(n).strip() for n in names if str(n).strip())
        reading.put("lora_targets", text, doc, "lora_target_modules")
    else:
        reading.default(
            "lora_targets",
            "q_proj,v_proj",
            "peft 0.21.2 utils/constants.py "
            "TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING (llama, mistral, qwen2, "
            "gemma: q_proj, v_proj; trl lora_target_modules = None)",
        )
    if as_bool(doc, "load_in_4bit", data.get("load_in_4bit", False)):
        reading.put("qlora", True, doc, "load_in_4bit")
        if not as_bool(doc, "use_bnb_nested_quant", data.get("use_bnb_nested_quant", False)):
            reading.warn(
                f"{doc.name}: use_bnb_nested_quant off ({TRL_MODEL} default): fp32 absmax "
                "per 64 weights, counted with double quantisation"
            )
    for key, why in (
        ("load_in_8bit", "LLM.int8 base weights"),
        ("use_dora", "DoRA magnitudes"),
        ("lora_modules_to_save", "fully trained extra modules"),
        ("lora_target_parameters", "LoRA on parameters (MoE experts)"),
    ):
        if data.get(key) and (key.startswith("lora_") or as_bool(doc, key, data[key])):
            reading.unmodelled_key(doc, key, why)


def _loss(data: Mapping[str, Any], kind: str, doc: Doc, reading: Reading) -> None:
    """Liger's fused linear cross entropy (`chunked`); TRL SFT's default `chunked_nll` (the head
    and an fp32 cross entropy per 256 valid tokens, each chunk checkpointed: trl 1.9.0
    trl/trainer/sft_trainer.py _chunked_cross_entropy_loss) is counted as `chunked` too."""
    if as_bool(doc, "use_liger_kernel", data.get("use_liger_kernel", False)):
        reading.put("loss", "chunked", doc, "use_liger_kernel")
        return
    if kind != "sft":
        return
    loss_type = data.get("loss_type")
    if loss_type is None:
        reading.default(
            "loss",
            "chunked",
            f"{TRL_SFT} (loss_type None -> chunked_nll; counted as "
            "chunked: no [tokens, vocab] logits)",
        )
    elif str(loss_type) == "chunked_nll":
        reading.put("loss", "chunked", doc, "loss_type")
    elif str(loss_type) not in ("nll", "dft"):
        raise bad(doc, "loss_type", "nll, dft or chunked_nll", loss_type)


STACK = Stack(
    name="hf",
    version=VERSION,
    framework="hf",
    detect=detect,
    read=read,
    mapping_only=True,
)
