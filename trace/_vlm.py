"""A vision-language model's training step with images (Qwen2-VL / Qwen2.5-VL, Llama 3.2
Vision), measured as trace_step measures a causal LM's.

The step runs on real CPU tensors (run_step's `fake=False` path, as bench/cpu_trace.py), not on
the fake CUDA device: the models read their image inputs' values in forward (Qwen's
image_grid_thw .tolist() / cu_seqlens, Mllama's aspect-ratio ids), which fake tensors cannot
give (DataDependentOutputException on aten._local_scalar_dense). The tracker counts the same
storages on either device; the CPU's SDPA kernels are the ones measured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

VISION_MODULES = frozenset({"visual", "vision_tower", "vision_model", "multi_modal_projector"})
"""The modules of the tower and projector in transformers 5.24's VLMs (Qwen2-VL / 2.5-VL
`visual`, LLaVA / Gemma 3 `vision_tower` and `multi_modal_projector`, Mllama `vision_model` and
`multi_modal_projector`): what --freeze-vision freezes."""


def lora_target_modules(model: Any, lora_targets: str, *, language_only: bool) -> Any:
    """peft's target_modules for the VLM: the flag's names as peft matches them (all-linear:
    every nn.Linear but the output head, the tower's and projector's included), or with
    `language_only` (--lora-scope language, or the tower frozen) the full names of the
    language model's linears those names match (LLaMA-Factory's patch_target_modules: nothing
    under VISION_MODULES). Source: peft 0.21.2 tuners/tuners_utils.py
    _maybe_include_all_linear_layers, check_target_module_exists (a name matches a module whose
    name ends with "." + name)."""
    import torch

    from ._lora import target_modules

    names = target_modules(lora_targets)
    if not language_only:
        return names
    head = model.get_output_embeddings()
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
        and module is not head
        and not any(part in VISION_MODULES for part in name.split("."))
        and (names == "all-linear" or name.rpartition(".")[2] in names)
    ]


def vlm_job(
    config: dict[str, Any],
    *,
    micro_batch_size: int,
    seq_len: int,
    images_per_sample: int,
    image_size: int,
    precision: str,
    attention: str = "flash",
    freeze_vision: bool = False,
    lora_rank: int = 0,
    lora_targets: str = "all-linear",
    lora_scope: str = "auto",
) -> Callable[[], Any]:
    """A builder of the step: the model from `config` (AutoModelForImageTextToText, no
    weights), seq_len text tokens plus each image's placeholder tokens (Qwen: (side/28)^2 after
    smart_resize; Mllama: one <|image|> token among the text; LLaVA / Gemma 3: the processor's
    fixed image tokens), square images of `image_size` pixels as the processors would hand them
    (Qwen: flattened patches [patches, 3 x 2 x 14 x 14] and image_grid_thw; Mllama: 4 tiles per
    image, padded as MllamaImageProcessor pads; LLaVA / Gemma 3: [images, 3, side, side] at the
    tower's side, to which their processors resize any image). Gemma 3 gets the token_type_ids
    its processor returns (return_mm_token_type_ids): each image's tokens attend to each other
    both ways, so every layer takes a mask. Full recompute is HF's checkpointing as the Trainer
    turns it on (_core.enable_hf_checkpointing): every GradientCheckpointingLayer, the tower's
    blocks with the language model's. `lora_rank` > 0: peft LoRA on the frozen model
    (lora_target_modules; trace/_lora.py's LoraConfig, fp32 adapters), the tower's adapters
    left out where `lora_scope` is language or the tower frozen."""
    import numpy as np
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from trainmem.engine import model_from_hf_config
    from trainmem.engine._vision import (
        QWEN_MAX_PIXELS,
        QWEN_MIN_PIXELS,
        image_tokens_per_image,
        mllama_tiles,
        qwen_resized_side,
    )

    from ._core import enable_hf_checkpointing
    from ._step import StepJob

    spec = model_from_hf_config(config, name="traced")
    v = spec.vision
    if v is None:
        raise ValueError(
            "model: not a vision-language model (qwen2_vl, qwen2_5_vl, mllama, llava, gemma3)"
        )
    fields = {k: val for k, val in config.items() if not k.startswith("_")}
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    for sub in (cfg, getattr(cfg, "text_config", None), getattr(cfg, "vision_config", None)):
        if sub is not None:
            sub._attn_implementation = "sdpa" if attention == "flash" else "eager"
    cfg.use_cache = False
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    b, n = micro_batch_size, images_per_sample
    vocab = spec.vocab_size

    def build() -> Any:
        model = AutoModelForImageTextToText.from_config(cfg, dtype=dtype)
        if freeze_vision:  # the tower and projector: no gradients, no optimizer states
            for name, p in model.named_parameters():
                if any(part in VISION_MODULES for part in name.split(".")):
                    p.requires_grad_(False)
        if lora_rank:
            model = _with_peft(
                model,
                lora_rank=lora_rank,
                lora_targets=lora_targets,
                language_only=freeze_vision or lora_scope == "language",
            )
        if v.kind == "mllama":
            ids = torch.randint(0, vocab, (b, seq_len))
            ids[:, 1 : 1 + n] = cfg.image_token_index
            tiles = int(mllama_tiles(v, np.array([float(image_size)]))[0])
            side = v.image_size
            pix = torch.zeros(b, n, v.max_num_tiles, v.in_channels, side, side, dtype=dtype)
            ratio_id = 1 if tiles == 1 else 6  # supported_aspect_ratios (1, 1) / (2, 2), 1-based
            inputs = {
                "pixel_values": pix,
                "aspect_ratio_ids": torch.full((b, n), ratio_id),
                "aspect_ratio_mask": torch.ones(b, n, v.max_num_tiles, dtype=torch.long),
                "cross_attention_mask": torch.ones(b, seq_len, n, v.max_num_tiles,
                                                   dtype=torch.long),
            }  # fmt: skip
        elif v.kind in ("llava", "gemma3"):
            tokens = v.image_tokens
            image_id = cfg.image_token_id if v.kind == "llava" else cfg.image_token_index
            ids = torch.randint(0, min(vocab, 1000), (b, seq_len + n * tokens))
            for i in range(n):
                ids[:, 1 + i * tokens : 1 + (i + 1) * tokens] = image_id
            side = v.image_size
            inputs = {"pixel_values": torch.zeros(b * n, v.in_channels, side, side, dtype=dtype)}
            if v.kind == "gemma3":  # Gemma3Processor's mm token types: 1 on an image's tokens
                inputs["token_type_ids"] = (ids == image_id).long()
        else:
            tokens = int(image_tokens_per_image(v, np.array([float(image_size)]))[0])
            resized = qwen_resized_side(
                np.array([float(image_size)]),
                factor=v.patch_size * v.spatial_merge_size,
                min_pixels=QWEN_MIN_PIXELS,
                max_pixels=QWEN_MAX_PIXELS,
            )
            side = int(resized[0])
            grid = torch.tensor([[1, side // v.patch_size, side // v.patch_size]] * (b * n))
            width = v.in_channels * v.temporal_patch_size * v.patch_size**2
            ids = torch.randint(0, min(vocab, 1000), (b, seq_len + n * tokens))
            for i in range(n):
                ids[:, 1 + i * tokens : 1 + (i + 1) * tokens] = cfg.image_token_id
            inputs = {
                "pixel_values": torch.zeros(int(grid.prod(-1).sum()), width, dtype=dtype),
                "image_grid_thw": grid,
            }
        labels = ids.masked_fill(ids >= vocab, -100)

        def loss(model: Any, batch: Any) -> Any:
            ids, labels, inputs = batch
            return model(input_ids=ids, labels=labels, **inputs).loss

        return StepJob(
            model=model,
            batch=(ids, labels, inputs),
            loss=loss,
            enable_recompute=enable_hf_checkpointing,
            # A whole warm-up step: the optimizer keeps state only for the parameters a
            # gradient reaches (not LLaVA's tower blocks after its feature layer), which an
            # optimizer step on zero gradients would give to every parameter.
            full_warm_up=True,
            dtypes_set=bool(lora_rank),  # built in its dtype; the adapters fp32
        )

    return build


def _with_peft(model: Any, *, lora_rank: int, lora_targets: str, language_only: bool) -> Any:
    """`model` wrapped by peft's get_peft_model (trace/_lora.py's LoraConfig) on the targets of
    lora_target_modules."""
    from ._lora import LORA_ALPHA_PER_RANK, LORA_DROPOUT, import_peft

    peft = import_peft()
    config = peft.LoraConfig(
        r=lora_rank,
        lora_alpha=LORA_ALPHA_PER_RANK * lora_rank,
        lora_dropout=LORA_DROPOUT,
        target_modules=lora_target_modules(model, lora_targets, language_only=language_only),
        task_type="CAUSAL_LM",
    )
    return peft.get_peft_model(model, config)


def trace_vlm_step(
    config: dict[str, Any],
    *,
    micro_batch_size: int,
    seq_len: int,
    images_per_sample: int,
    image_size: int,
    precision: str,
    recompute: str,
    optimizer: str = "adamw",
    attention: str = "flash",
    freeze_vision: bool = False,
    lora_rank: int = 0,
    lora_targets: str = "all-linear",
    lora_scope: str = "auto",
) -> dict[str, Any]:
    """One measured step of the VLM with images on real CPU tensors (run_step's keys, and the
    device and note trace_step's have)."""
    from ._core import import_torch, step_contexts
    from ._step import run_step

    import_torch()
    device_type, contexts, _ = step_contexts(device="cpu", fake=False, sdpa_kernel="flash")
    build = vlm_job(
        config,
        micro_batch_size=micro_batch_size,
        seq_len=seq_len,
        images_per_sample=images_per_sample,
        image_size=image_size,
        precision=precision,
        attention=attention,
        freeze_vision=freeze_vision,
        lora_rank=lora_rank,
        lora_targets=lora_targets,
        lora_scope=lora_scope,
    )
    out = run_step(
        build,
        precision=precision,
        recompute=recompute,
        optimizer=optimizer,
        device_type=device_type,
        contexts=contexts,
    )
    out.update(
        device="cpu (real tensors)",
        note="a vision-language model's step runs on real CPU tensors: its model reads the "
        "image inputs' values, which fake tensors cannot give",
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
    )
    return out
