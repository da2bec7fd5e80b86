"""The engine's closed vocabularies: the names a categorical training field takes.

A grid stores a categorical field as its code, the index of the name in its tuple here.
"""

from __future__ import annotations

PRECISIONS = (
    "fp32",
    "bf16",
    "fp16",
    "amp-bf16",
    "amp-fp16",
    "mixed-bf16",
    "mixed-fp16",
    "fp8-mixed",
    "mxfp8",
    "nvfp4",
)
from ._optimizers import OPTIMIZERS as OPTIMIZERS  # noqa: E402, I001 (the registry's names)

RECOMPUTE = ("none", "selective", "full", "selective-op", "selective-layer")
"""Appended names keep the codes of the older ones (points tables stay readable)."""
ATTENTION = ("flash", "eager", "eager-unfused")
"""flash: no s x s tensor kept; eager: the scores materialised, through the framework's default
softmax; eager-unfused: the scores materialised and the softmax run as plain torch ops (for
Megatron: masked_softmax_fusion off, the fp32 softmax path; every other framework's eager
softmax is unfused already, so there it means eager)."""
FRAMEWORKS = ("hf", "megatron", "deepspeed", "torchtitan", "torchtune", "litgpt", "verl")
"""Appended names keep the codes of the older ones (points tables stay readable)."""
OFFLOADS = ("none", "optimizer", "optimizer+params")
LOSSES = ("full", "chunked", "chunked-output", "chunked-head", "auto", "vocab-parallel")
"""chunked-head: torchtitan 0.3's ChunkedLossWrapper (the head and cross entropy run forward and
backward per sequence chunk inside the loss call); auto: the framework's own loss
(FrameworkSpec.loss); vocab-parallel: Megatron's vocab-parallel cross entropy under any stack
(one fp32 copy of the logits, its softmax and gradient written in place, split over tp), as
Megatron-LM runs it under DeepSpeed. Appended names keep the codes of the older ones."""
COMPILES = ("none", "blocks", "blocks+loss")
"""torch.compile of nothing, of each transformer block, or of the blocks and the loss."""
ALLOCATORS = ("native", "expandable-segments")
"""PYTORCH_CUDA_ALLOC_CONF: the default caching allocator, or expandable_segments:True."""
BITSANDBYTES_VERSIONS = ("current", "legacy")
"""The bitsandbytes a `--qlora` job runs: current (0.43.2 and later, July 2024 on: MatMul4Bit
keeps only the quantised weight for backward) or legacy (0.43.1 and earlier: it keeps its input
too; the QLoRA paper's runs, LitGPT 0.4 to 0.5.3, which pin 0.42.0). Source: bitsandbytes
autograd/_functions.py MatMul4Bit.forward, `ctx.tensors = (A, B)` in the 0.42.0, 0.43.0 and
0.43.1 wheels, `(None, B)` in 0.43.2, 0.43.3, 0.44.x and 0.50.2."""
LORA_SCOPES = ("auto", "language")
"""Which of a vision-language model's modules LoRA's target names may adapt: auto, PEFT's own
matching (HF Trainer / TRL + PEFT: `all-linear` takes the vision tower's and projector's linears
too, a listed name every module whose name ends with it); language, the language model's only
(LLaMA-Factory's patch_target_modules keeps LoRA off a frozen tower and projector). Source: peft
0.21.2 tuners/tuners_utils.py _maybe_include_all_linear_layers, check_target_module_exists;
LLaMA-Factory src/llamafactory/model/model_utils/visual.py patch_target_modules."""
OVERLAP_COMMS = ("auto", "on", "off")
"""DeepSpeed ZeRO's `overlap_comm`: auto (on, as the HF Trainer's example configs set it and as
DeepSpeed defaults it under ZeRO-3), on, off (DeepSpeed's default under ZeRO 1-2: one reduce
buffer instead of two). Source: deepspeed 0.19.8 runtime/zero/config.py overlap_comm_valid,
zero/stage_1_and_2.py setup_buckets (buf_1 only with overlap_comm)."""
LOADS = ("auto", "full-state-dict", "cpu-full-state-dict", "meta-init", "sharded")
"""How the job builds its model and loads the checkpoint before step 1 (engine/_load.py); auto:
the stack's own default (FrameworkSpec.load)."""
RL_ALGORITHMS = ("none", "grpo", "ppo", "dpo")
"""RL post-training (engine/_rl.py): none (a plain training job), GRPO (group of responses per
prompt, no critic), PPO (a critic model trained beside the actor), DPO (no rollout: chosen and
rejected responses scored by a frozen reference)."""
ROLLOUTS = ("auto", "vllm", "sglang", "hf")
"""The rollout engine of an RL job: auto (vllm for grpo and ppo, none for dpo), vLLM or SGLang
colocated on the training GPUs, or the trainer's own Hugging Face `generate`."""
REF_MODELS = ("auto", "separate", "shared-lora", "none", "offloaded")
"""The reference model of an RL job: auto (shared-lora with --lora-rank, else separate; dpo's
and ppo's and grpo's alike), a separate frozen 16-bit copy sharded like the trainer, the base
model with the LoRA adapters disabled (no extra weights), none (no KL term), or a separate copy
offloaded to CPU (verl ref.fsdp_config.param_offload)."""
RL_TRAINER_OFFLOADS = ("none", "optimizer", "params", "params+optimizer")
"""What of the trainer's states is moved to CPU while the rollout engine generates (verl
actor.fsdp_config.optimizer_offload / param_offload)."""
