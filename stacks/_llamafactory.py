"""LLaMA-Factory training configs (`llamafactory-cli train x.yaml`; llamafactory 0.9.6.dev0, commit
ff6d4d12eeb035d6ce06805a5733dd7b29f2ac30, after v0.9.5: src/llamafactory/hparams/*.py): the
model, `stage`, `finetuning_type` (LoRA by default, rank 8 over every linear layer),
`quantization_bit`, batch, accumulation and `cutoff_len`, bf16/fp16/pure_bf16 with the dtype
LLaMA-Factory trains in, gradient checkpointing (on unless disable_gradient_checkpointing),
`flash_attn`, `enable_liger_kernel`, `optim` and the optimizers it swaps in, `deepspeed` (a path:
the stage and offload of its shipped examples/deepspeed/*.json inferred from the name; inline:
read as a DeepSpeed config) and `fsdp`.

LLaMA-Factory runs the HF Trainer (its pins: transformers <= 5.8.0, peft <= 0.18.1, accelerate
<= 1.11.0): trainmem's `hf` framework, `deepspeed` with a DeepSpeed config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ._axolotl import (
    Shipped,
    attention,
    compile_mode,
    deepspeed,
    fsdp_words,
    half_precision,
    host_adam,
    optimizer,
    pre_quantised,
)
from ._reading import Doc, Reading, as_bool, as_int, bad
from ._stacks import Stack

VERSION = "0.9.6.dev0"
LF = f"llamafactory {VERSION} src/llamafactory"
SHIPPED_DIR = f"llamafactory {VERSION} examples/deepspeed/"
FINETUNING = f"{LF}/hparams/finetuning_args.py"
TF = "transformers 5.8.0 src/transformers/training_args.py"
"""LLaMA-Factory's newest allowed transformers (pyproject.toml: transformers<=5.8.0)."""

MARKERS = ("finetuning_type", "cutoff_len", "lora_target", "template", "quantization_bit",
           "pure_bf16", "flash_attn", "enable_liger_kernel", "disable_gradient_checkpointing",
           "neat_packing", "lora_rank", "pref_beta", "freeze_trainable_layers")  # fmt: skip
"""Top-level keys only LLaMA-Factory's argument dataclasses have."""
STAGES = ("pt", "sft", "rm", "ppo", "dpo", "kto")
FINETUNING_TYPES = ("lora", "oft", "freeze", "full")

_Z2 = (5e8, "off")
"""reduce_bucket_size 5e8 and overlap_comm false (modelled: zero_bucket_elems, overlap_comm)."""
DEEPSPEED_FILES = {
    "ds_z0_config.json": Shipped(0, "none"),
    "ds_z2_config.json": Shipped(2, "none", buckets=_Z2),
    "ds_z2_offload_config.json": Shipped(2, "optimizer", buckets=_Z2),
    "ds_z2_autotp_config.json": Shipped(2, "none", "DeepSpeed AutoTP size 2", _Z2),
    "ds_z3_config.json": Shipped(3, "none", buckets=(0.0, "off")),
    "ds_z3_offload_config.json": Shipped(3, "optimizer+params", buckets=(0.0, "off")),
    "ds_z3_fp8_config.json": Shipped(
        3,
        "optimizer",
        "the prefetch bucket and persistence threshold of hidden size 3584",
        (3584.0 * 3584.0, "off"),
    ),
}
"""llamafactory examples/deepspeed/*.json at the pinned commit: stage, offload and what trainmem
does not model; every one leaves bf16 "auto" (the Trainer's flag)."""

SWAPPED_OPTIMIZERS = {"use_galore": "GaLore projected optimizer states",
                      "use_apollo": "APOLLO low-rank optimizer states",
                      "use_badam": "BAdam block-wise updates",
                      "use_adam_mini": "Adam-mini (one second moment per block)",
                      "use_muon": "Muon"}  # fmt: skip
"""finetuning_args.py switches that replace the Trainer's optimizer (train/trainer_utils.py
create_custom_optimizer)."""
UNMODELLED = {"use_dora": "DoRA magnitudes", "additional_target": "fully trained extra modules",
              "use_llama_pro": "LLaMA Pro expanded blocks",
              "shift_attn": "LongLoRA shifted sparse attention",
              "mixture_of_depths": "mixture of depths", "use_unsloth": "unsloth's kernels",
              "use_unsloth_gc": "unsloth's offloaded checkpoints",
              "upcast_layernorm": "fp32 norms", "upcast_lmhead_output": "fp32 logits from the head",
              "use_dft_loss": "DFT's probability-weighted loss",
              "use_asft_loss": "ASFT's loss (a reference distribution)",
              "use_eaft_loss": "EAFT's entropy-weighted loss", "use_kt": "KTransformers",
              "use_v1_kernels": "LLaMA-Factory's v1 kernels"}  # fmt: skip


MM_TEMPLATES = frozenset({
    "dots_ocr", "ernie_vl", "gemma3", "gemma3n", "gemma4", "gemma4n", "glm4v", "glm4_5v",
    "glm_ocr", "granite3_vision", "intern_vl", "intern_s1", "keye_vl", "kimi_vl", "lfm2_vl",
    "llama4", "mllama", "moss_vl", "llava", "llava_next", "llava_next_llama3",
    "llava_next_mistral", "llava_next_qwen", "llava_next_yi", "llava_next_video",
    "llava_next_video_mistral", "llava_next_video_yi", "mimo_vl", "minicpm_v", "minicpm_v_4_6",
    "minicpm_o", "mistral_small", "ministral3", "paligemma", "paligemma_chat", "pixtral",
    "qwen2_audio", "qwen2_omni", "qwen3_omni", "qwen3_omni_nothink", "qwen2_vl", "qwen3_vl",
    "qwen3_vl_nothink", "qwen3_5", "qwen3_5_nothink", "qwen3_6", "video_llava", "yi_vl",
    "youtu_vl",
})  # fmt: skip
"""The templates registered with a multimodal plugin (src/llamafactory/data/template.py
register_template(..., mm_plugin=get_mm_plugin(...)) at the pinned commit): a job of one of them
is a multimodal model's, whose tower LLaMA-Factory freezes by default."""
VISION_KEYS = ("freeze_vision_tower", "freeze_multi_modal_projector", "freeze_language_model",
               "image_max_pixels", "image_min_pixels")  # fmt: skip
"""Keys only a multimodal job sets (finetuning_args.py, model_args.py ProcessorArguments)."""
IMAGE_MAX_PIXELS = 768 * 768
"""ProcessorArguments.image_max_pixels' default (src/llamafactory/hparams/model_args.py)."""


def detect(doc: Doc) -> int:
    data = doc.data
    if not isinstance(data, Mapping) or "base_model" in data or "_component_" in data:
        return 0
    found = sum(k in data for k in MARKERS)
    stage = str(data.get("stage", "")).strip().lower() in STAGES
    if "model_name_or_path" in data and (found or stage):
        return 10
    return 8 if found >= 2 else 0


def read(doc: Doc, reading: Reading) -> None:
    data: Mapping[str, Any] = doc.data
    model = data.get("model_name_or_path")
    if model:
        reading.put("model", str(model), doc, "model_name_or_path")
        pre_quantised(doc, reading, "model_name_or_path", str(model))
    stage = _stage(data, doc, reading)
    _batch(data, stage, doc, reading)
    deepspeed(data, doc, reading, DEEPSPEED_FILES, SHIPPED_DIR)
    if data.get("fsdp"):
        fsdp_words(data["fsdp"], doc, reading, "fsdp")
    kind = _finetuning(data, doc, reading)
    _precision(data, kind, doc, reading)
    _training(data, stage, doc, reading)
    _vision(data, kind, doc, reading)
    host_adam(reading)


def _vision(data: Mapping[str, Any], kind: str, doc: Doc, reading: Reading) -> None:
    """A multimodal job's tower (a multimodal `template`, or a key only such a job sets):
    freeze_vision_tower and freeze_multi_modal_projector (default true, both: trainmem's
    `freeze_vision` freezes the two together; model/model_utils/visual.py get_forbidden_modules
    freezes them under full and freeze tuning, patch_target_modules keeps LoRA off them: a
    LoRA job's lora_scope is language, where PEFT's own matching would adapt them), and
    image_max_pixels as the largest square image LLaMA-Factory hands the processor
    (data/mm_plugin.py _preprocess_image scales a larger one down to it). The images per sample
    are the dataset's (check's warning asks for --images-per-sample: _check.resolved_fields)."""
    template = str(data.get("template", "")).strip().lower()
    if template not in MM_TEMPLATES and not any(k in data for k in VISION_KEYS):
        return
    tower = _flag(data, "freeze_vision_tower", doc)
    projector = _flag(data, "freeze_multi_modal_projector", doc)
    if "freeze_vision_tower" in data:
        reading.put("freeze_vision", tower, doc, "freeze_vision_tower")
    else:
        reading.default("freeze_vision", True, f"{FINETUNING} (freeze_vision_tower = True)")
    if tower != projector:
        what = "trained with the tower frozen" if tower else "frozen with the tower trained"
        counted = "frozen" if tower else "trained"
        reading.unmodelled_key(
            doc, "freeze_multi_modal_projector", f"the projector {what}; counted {counted}"
        )
    if kind == "lora" and tower:
        visual = f"{LF}/model/model_utils/visual.py"
        reading.default("lora_scope", "language", f"{visual} patch_target_modules")
    elif kind == "lora":
        reading.unmodelled_key(
            doc,
            "freeze_vision_tower",
            "LoRA on the tower's linears whose names contain a target, the projector's never "
            "(find_all_linear_modules forbids it); counted as peft's matching, which adapts the "
            "projector's too under all-linear",
        )
    if _flag(data, "freeze_language_model", doc, default=False):
        reading.unmodelled_key(
            doc, "freeze_language_model", "the language model frozen; counted trained"
        )
    key = "image_max_pixels"
    if key in data:
        pixels = as_int(doc, key, data[key], ge=1)
        reading.put("image_size", max(math.isqrt(pixels), 1), doc, key)
    else:
        source = f"{LF}/hparams/model_args.py (image_max_pixels = 768 * 768)"
        reading.default("image_size", math.isqrt(IMAGE_MAX_PIXELS), source)


def _flag(data: Mapping[str, Any], key: str, doc: Doc, *, default: bool = True) -> bool:
    """A boolean key of the config, `default` when absent."""
    return as_bool(doc, key, data[key]) if key in data else default


def _stage(data: Mapping[str, Any], doc: Doc, reading: Reading) -> str:
    stage = str(data.get("stage", "sft")).strip().lower()
    if stage not in STAGES:
        raise bad(doc, "stage", "|".join(STAGES), data.get("stage"))
    if stage in ("dpo", "kto", "ppo"):
        why = (f"{stage}: a reference model (and, ppo, a value and a reward model; dpo/kto: "
               "chosen and rejected sequences)")  # fmt: skip
        reading.unmodelled_key(doc, "stage", why)
    elif stage == "rm":
        reading.unmodelled_key(doc, "stage", "rm: chosen and rejected pairs and a value head")
    return stage


def _batch(data: Mapping[str, Any], stage: str, doc: Doc, reading: Reading) -> None:
    key = "per_device_train_batch_size"
    if data.get(key) is not None:
        reading.put("micro_batch_size", as_int(doc, key, data[key], ge=1), doc, key)
    else:
        reading.default("micro_batch_size", 8, f"{TF} (per_device_train_batch_size = 8)")
    key = "gradient_accumulation_steps"
    if data.get(key) is not None:
        reading.put("grad_accum_steps", as_int(doc, key, data[key], ge=1), doc, key)
    key = "cutoff_len"
    if data.get(key) is not None:
        reading.put("seq_len", as_int(doc, key, data[key], ge=1), doc, key)
    neat = data.get("neat_packing") is not None and as_bool(
        doc, "neat_packing", data["neat_packing"]
    )
    packing = data.get("packing")
    packed = neat or (as_bool(doc, "packing", packing) if packing is not None else stage == "pt")
    if not packed:
        return
    if neat:
        why = "neat_packing: packed without cross-attention (block-diagonal)"
    elif packing is not None:
        why = "packing"
    else:
        why = f"stage pt: packing on by default ({LF}/hparams/parser.py)"
    reading.warn(f"{doc.name}: {why}: rows of cutoff_len tokens, counted as full rows")


def _finetuning(data: Mapping[str, Any], doc: Doc, reading: Reading) -> str:
    """finetuning_type (default lora: finetuning_args.py), its LoRA rank and targets
    (model/adapter.py _setup_lora_tuning: lora_target all -> every linear layer), and the
    on-the-fly quantization_bit (model/model_utils/quantization.py: 4 -> bitsandbytes NF4)."""
    kind = str(data.get("finetuning_type", "lora")).strip().lower()
    if kind not in FINETUNING_TYPES:
        raise bad(doc, "finetuning_type", "|".join(FINETUNING_TYPES), data.get("finetuning_type"))
    if kind in ("freeze", "oft"):
        why = "freeze: only the last blocks trained" if kind == "freeze" else "OFT adapters"
        reading.unmodelled_key(doc, "finetuning_type", f"{why}; counted as full fine-tuning")
    if kind == "lora":
        if data.get("lora_rank") is not None:
            rank = as_int(doc, "lora_rank", data["lora_rank"], ge=1)
            reading.put("lora_rank", rank, doc, "lora_rank")
        else:
            source = f"{FINETUNING} (finetuning_type = lora, lora_rank = 8)"
            reading.default("lora_rank", 8, source)
        target = data.get("lora_target")
        if target is not None:
            names = target if isinstance(target, list) else str(target).split(",")
            text = ",".join(str(n).strip() for n in names if str(n).strip())
            targets = "all-linear" if text == "all" else text
            reading.put("lora_targets", targets, doc, "lora_target")
    _quantization(data, kind, doc, reading)
    for key, why in UNMODELLED.items():
        value = data.get(key)
        if value is None or value is False:
            continue
        if not isinstance(value, bool) or as_bool(doc, key, value):
            reading.unmodelled_key(doc, key, why)
    return kind


def _quantization(data: Mapping[str, Any], kind: str, doc: Doc, reading: Reading) -> None:
    bits = data.get("quantization_bit")
    if bits is None:
        return
    value = as_int(doc, "quantization_bit", bits, ge=1)
    method = str(data.get("quantization_method", "bnb")).strip().lower()
    if value != 4 or method != "bnb" or kind != "lora":
        why = f"{value}-bit {method} base weights" + ("" if kind == "lora" else " without LoRA")
        reading.unmodelled_key(doc, "quantization_bit", f"{why}: counted as 16-bit")
        return
    reading.put("qlora", True, doc, "quantization_bit")
    reading.warn(f"{doc.name}:quantization_bit: LLaMA-Factory keeps the unquantised layers in "
                 "the compute dtype (no prepare_model_for_kbit_training); trainmem's hf QLoRA "
                 "counts them in fp32 (an over-estimate)")  # fmt: skip
    if data.get("double_quantization") is not None and not as_bool(
        doc, "double_quantization", data["double_quantization"]
    ):
        reading.warn(f"{doc.name}: double_quantization off: fp32 absmax per 64 weights, counted "
                     "with double quantisation")  # fmt: skip


def _precision(data: Mapping[str, Any], kind: str, doc: Doc, reading: Reading) -> None:
    """The model loads in the checkpoint's dtype (model/loader.py torch_dtype "auto"); the
    trainable parameters are cast to fp32 unless pure_bf16 (model/adapter.py init_adapter,
    cast_trainable_params_to_fp32): full fine-tuning with bf16/fp16 is autocast over fp32
    (`amp-*`; `mixed-*` under DeepSpeed and FSDP), without either fp32; pure_bf16 is `bf16`;
    a LoRA base stays 16-bit with fp32 adapters (`bf16`); fp8 is torchao's (`fp8-mixed`)."""
    keys = [k for k in ("fp8", "pure_bf16", "bf16", "fp16")
            if data.get(k) is not None and as_bool(doc, k, data[k])]  # fmt: skip
    key = keys[0] if keys else None
    if key == "fp8":
        reading.put("precision", "fp8-mixed", doc, key)
        return
    half = "fp16" if key == "fp16" else "bf16"
    if kind == "lora":
        value = half_precision(half, True, reading)
        if key is None:
            reading.default("precision", value, f"{LF}/model/loader.py (torch_dtype auto: the "
                            "checkpoint's dtype, counted as bf16; adapters fp32)")  # fmt: skip
        else:
            reading.put("precision", value, doc, key)
        reading.warn(f"{doc.name}: the base loads in the checkpoint's dtype (torch_dtype auto): "
                     f"counted as {half}")  # fmt: skip
        return
    if key is None:
        reading.default("precision", "fp32", f"{LF}/model/adapter.py init_adapter (trainable "
                        "parameters cast to fp32; bf16 = fp16 = False)")  # fmt: skip
        return
    if key == "pure_bf16":
        value = "mixed-bf16" if reading.get("framework") == "deepspeed" else "bf16"
    elif reading.get("framework") == "deepspeed" or reading.get("zero", 0) > 0:
        value = f"mixed-{half}"
    else:
        value = f"amp-{half}"
    reading.put("precision", value, doc, key)


def _training(data: Mapping[str, Any], stage: str, doc: Doc, reading: Reading) -> None:
    key = "disable_gradient_checkpointing"
    if data.get(key) is not None and as_bool(doc, key, data[key]):
        reading.put("recompute", "none", doc, key)
    else:
        source = (f"{LF}/model/model_utils/checkpointing.py prepare_model_for_training "
                  "(disable_gradient_checkpointing = False)")  # fmt: skip
        reading.default("recompute", "full", source)
    flash = data.get("flash_attn")
    if flash is not None:
        text = str(flash).strip().lower()
        if text not in ("auto", "disabled", "sdpa", "fa2", "fa3"):
            raise bad(doc, "flash_attn", "auto|disabled|sdpa|fa2|fa3", flash)
        reading.put("attention", "eager" if text == "disabled" else "flash", doc, "flash_attn")
    else:
        attention(data, doc, reading)
    key = "enable_liger_kernel"
    if data.get(key) is not None and as_bool(doc, key, data[key]):
        if stage in ("pt", "sft"):  # model/loader.py: require_logits for the other stages
            reading.put("loss", "chunked", doc, key)
        reading.unmodelled_key(doc, key, "Liger's RoPE, RMSNorm and SwiGLU kernels")
    _optim(data, doc, reading)
    compiled = data.get("torch_compile")
    if compiled is not None and as_bool(doc, "torch_compile", compiled):
        reading.put("compile", compile_mode(reading), doc, "torch_compile")


def _optim(data: Mapping[str, Any], doc: Doc, reading: Reading) -> None:
    swapped = [k for k in SWAPPED_OPTIMIZERS if data.get(k) and as_bool(doc, k, data[k])]
    for k in swapped:
        reading.unmodelled_key(doc, k, f"{SWAPPED_OPTIMIZERS[k]}: the optimizer is replaced")
    if swapped:
        return
    if data.get("optim") is not None:
        optimizer(doc, reading, "optim", data["optim"])
    else:
        source = f"{TF} (optim = adamw_torch_fused, torch >= 2.8)"
        reading.default("optimizer", "adamw-fused", source)


STACK = Stack(
    name="llamafactory",
    version=VERSION,
    framework="hf",
    detect=detect,
    read=read,
    mapping_only=True,
)
