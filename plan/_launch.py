"""Launch configs of a recommended plan: a DeepSpeed JSON config, a torchrun line, an sbatch
script, an accelerate FSDP config, a torchtitan launch line, and for an RL job a verl recipe or
a TRL config (plan/_trl.py), each rendered from the `recommend --json` report alone.

Each format launches some frameworks only (FORMAT_FRAMEWORKS); `recommend` restricts its search
to what the framework can launch (`_recommend.LAUNCHABLE`), so a rendered plan is the plan that
was estimated. Numbers are concrete (never DeepSpeed's "auto"); learning rates and data paths
are the user's, so they are placeholders or left to `$EXTRA_ARGS`.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from typing import Any

from trainmem.engine import FRAMEWORKS

FORMATS = ("json", "deepspeed", "torchrun", "slurm", "accelerate", "torchtitan", "verl", "trl")
FORMAT_FRAMEWORKS: dict[str, tuple[str, ...]] = {
    "json": FRAMEWORKS,
    "deepspeed": ("deepspeed",),
    "torchrun": ("megatron", "deepspeed"),
    "slurm": ("megatron", "deepspeed"),
    "accelerate": ("hf",),
    "torchtitan": ("torchtitan",),
    "verl": ("verl",),
    "trl": ("deepspeed",),
}
"""Frameworks each format launches: DeepSpeed configs DeepSpeed; accelerate's FSDP config is the
`hf` framework (FSDP2 for ZeRO-3, README "Concepts"); torchrun and sbatch start Megatron-LM's
pretrain_gpt.py or a Hugging Face Trainer script with `--deepspeed`; torchtitan is a torchrun
line of `torchtitan.train` with its config overrides; verl is its PPO trainer's Hydra overrides
for an RL job; trl is TRL's GRPO or DPO config YAML of an RL job, its Trainer under DeepSpeed
through TRL's shipped accelerate configs (plan/_trl.py)."""
DEFAULT_FRAMEWORK = {
    "json": "megatron",
    "deepspeed": "deepspeed",
    "torchrun": "megatron",
    "slurm": "megatron",
    "accelerate": "hf",
    "torchtitan": "torchtitan",
    "verl": "verl",
    "trl": "deepspeed",
}
MASTER_PORT = 29500
"""torchrun's default rendezvous port (torch/distributed/run.py `--master-port`)."""
CPUS_PER_GPU = 8
"""sbatch --cpus-per-task per GPU (data-loader workers and the launcher); set it to your nodes."""
DEEPSPEED_CONFIG_FILE = "ds_config.json"
EXPANDABLE_SEGMENTS_ENV = "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
"""The allocator setting of `--allocator expandable-segments` (torch/csrc/c10/cuda/
CUDAAllocatorConfig.cpp reads PYTORCH_CUDA_ALLOC_CONF at the first CUDA allocation)."""


def _environment(plan: dict[str, Any]) -> list[str]:
    """Shell lines the plan's job needs before its launcher: the allocator setting."""
    return [EXPANDABLE_SEGMENTS_ENV] if plan.get("allocator") == "expandable-segments" else []


def render(report: dict[str, Any], fmt: str) -> str:
    """The `recommend` report as `fmt` (one of FORMATS); ValueError (one line) when the plan's
    framework cannot be launched that way or nothing fits. An alternative renders as
    `render({**report, **report["alternatives"][k]}, fmt)`."""
    if fmt not in FORMATS:
        raise ValueError(f"format: unknown value '{fmt}'; allowed: {', '.join(FORMATS)}")
    if fmt == "json":
        return json.dumps(report, indent=2)
    check_format(fmt, report["framework"])
    if not report["fits"]:
        raise ValueError(f"format {fmt}: nothing fits, no launch config ({report['reason']})")
    if fmt == "deepspeed":
        return json.dumps(deepspeed_config(report), indent=2)
    if fmt == "accelerate":
        return accelerate_config(report)
    if fmt == "torchtitan":
        return torchtitan_script(report)
    if fmt == "verl":
        return verl_script(report)
    if fmt == "trl":
        from ._trl import trl_config

        return trl_config(report)
    return slurm_script(report) if fmt == "slurm" else torchrun_script(report)


VERL_NEEDS_RL = "format verl: an RL job (--rl grpo|ppo) renders as a verl recipe"


def format_framework(fmt: str | None, framework: str | None, rl: str | None = None) -> str | None:
    """The framework a plan printed as `fmt` is searched for: the one given, else the format's
    default (DEFAULT_FRAMEWORK); ValueError when `fmt` is unknown or cannot launch it (verl:
    a job whose `rl` is not grpo or ppo; trl: not grpo or dpo), before any search. `fmt` None
    (a summary, or a JSON answer over HTTP) leaves `framework` as given (None: the search's
    default), so that a format never plans what it cannot launch."""
    if fmt is None:
        return framework
    if fmt not in FORMATS:
        raise ValueError(f"format: unknown value '{fmt}'; allowed: {', '.join(FORMATS)}")
    if fmt == "verl" and rl not in ("grpo", "ppo"):
        raise ValueError(VERL_NEEDS_RL)
    if fmt == "trl" and rl not in ("grpo", "dpo"):
        from ._trl import TRL_NEEDS_RL

        raise ValueError(TRL_NEEDS_RL)
    chosen = framework or DEFAULT_FRAMEWORK[fmt]
    check_format(fmt, chosen)
    return chosen


def replans(fmt: str | None, framework: str | None) -> bool:
    """Whether printing a plan as `fmt` searches another framework than the summary would (the
    format's default, DEFAULT_FRAMEWORK, where none was given): then the plan may change."""
    if fmt in (None, "json") or framework is not None:
        return False
    return DEFAULT_FRAMEWORK[fmt] != DEFAULT_FRAMEWORK["json"]


REPLAN_FIELDS = (
    "framework",
    "gpu",
    "num_gpus",
    "tp",
    "pp",
    "cp",
    "dp",
    "ep",
    "zero",
    "recompute",
    "offload",
    "micro_batch_size",
    "grad_accum_steps",
)
"""A plan's fields a re-plan for a launch format may change (said when they do)."""
REPLAN_WORDS = {"grad_accum_steps": "accumulation", "micro_batch_size": "micro-batch"}


def replan_note(before: dict[str, Any], after: dict[str, Any], fmt: str) -> dict[str, Any]:
    """The JSON key `replanned_for_format`: the format, and each REPLAN_FIELDS field whose
    value differs between the summary's plan (`before`) and the format's (`after`), as
    [before, after]."""
    changed = {
        k: [before.get(k), after.get(k)] for k in REPLAN_FIELDS if before.get(k) != after.get(k)
    }
    return {"format": fmt, "changed": changed}


def replan_line(note: dict[str, Any]) -> str:
    """The stderr line of a re-plan: ``note: --format deepspeed plans for deepspeed, not the
    summary's megatron: zero 2 -> 3, accumulation 16 -> 8``."""
    changed = dict(note["changed"])
    before, after = changed.pop("framework", [None, None])
    head = f"note: --format {note['format']} plans for {after}, not the summary's {before}"
    parts = [f"{REPLAN_WORDS.get(k, k)} {a} -> {b}" for k, (a, b) in changed.items()]
    return f"{head}: {', '.join(parts)}" if parts else f"{head} (the same layout)"


def check_format(fmt: str, framework: str) -> None:
    """ValueError unless `fmt` launches `framework`."""
    allowed = FORMAT_FRAMEWORKS[fmt]
    if framework not in allowed:
        raise ValueError(
            f"framework: format {fmt} launches {'|'.join(allowed)}, not {framework}; "
            f"omit --framework or pass one of those"
        )


def _summary(plan: dict[str, Any]) -> str:
    """One comment line: the plan and its prediction."""
    return (
        f"{plan['model']} on {plan['num_nodes']} node(s) x {plan['gpus_per_node']} "
        f"{plan['gpu']}: tp {plan['tp']} pp {plan['pp']} cp {plan['cp']} dp {plan['dp']} "
        f"ep {plan['ep']}, zero {plan['zero']}, recompute {plan['recompute']}, offload "
        f"{plan['offload']}, micro-batch {plan['micro_batch_size']} x accumulation "
        f"{plan['grad_accum_steps']}; peak {plan['peak_device_bytes'] / 2**30:.2f} GiB per GPU"
    )


# ---- DeepSpeed ---------------------------------------------------------------------------------

DEEPSPEED_OPTIMIZERS: dict[str, dict[str, Any]] = {
    "adamw": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                          "weight_decay": 0.1, "torch_adam": True}},
    "adamw-fused": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                "weight_decay": 0.1}},
    "sgd": {"type": "SGD", "params": {"lr": 1e-2, "momentum": 0.0, "weight_decay": 0.0}},
    "sgd-momentum": {"type": "SGD", "params": {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.0}},
    "lion": {"type": "Lion", "params": {"lr": 1e-4, "betas": [0.9, 0.99], "weight_decay": 0.1}},
    "adafactor": {"type": "Adafactor", "params": {"lr": 1e-2}},
}  # fmt: skip
"""`optimizer` blocks by trainmem optimizer (learning rates are placeholders). `adamw` is torch's
AdamW (foreach; `torch_adam`, which deepspeed 0.19.8 runtime/engine.py get_optimizer_configuration
reads first), `adamw-fused` DeepSpeed's FusedAdam (no foreach temporaries). DeepSpeed builds
Adam/AdamW/Lion itself (CPU variants under offload, where `torch_adam` is not written: the
states are on the host either way) and any other type as
getattr(torch.optim, type) (deepspeed/runtime/engine.py _configure_basic_optimizer; Adafactor
needs torch >= 2.5). Others (adamw-8bit, user optimizers) are passed to deepspeed.initialize by
the script: no block, and `zero_allow_untested_optimizer`."""
DEEPSPEED_CPU_OPTIMIZERS = ("AdamW", "Lion")
"""Types DeepSpeed replaces by its CPU optimizer under offload_optimizer."""


def deepspeed_config(plan: dict[str, Any]) -> dict[str, Any]:
    """A DeepSpeed config (https://www.deepspeed.ai/docs/config-json/) of a deepspeed plan.

    Buckets at the sizes the estimate assumes (the plan's zero_bucket_elems and overlap_comm;
    by default HF Trainer's "auto": reduce_bucket_size = h^2,
    stage3_prefetch_bucket_size = 0.9 h^2, stage3_param_persistence_threshold = 10 h; source:
    transformers/integrations/deepspeed.py trainer_config_finalize).
    """
    cfg = _deepspeed_batch_and_precision(plan)
    block = DEEPSPEED_OPTIMIZERS.get(plan["optimizer"])
    if block is None:
        cfg["zero_allow_untested_optimizer"] = True
    else:
        cfg["optimizer"] = json.loads(json.dumps(block))  # a copy
        if plan["offload"] != "none":
            cfg["optimizer"]["params"].pop("torch_adam", None)
    zero_optimization = _deepspeed_zero(plan)
    if "offload_optimizer" in zero_optimization and (
        block is None or block["type"] not in DEEPSPEED_CPU_OPTIMIZERS
    ):
        cfg["zero_force_ds_cpu_optimizer"] = False
    cfg["zero_optimization"] = zero_optimization
    # Full recompute: the model checkpoints each layer (HF: --gradient_checkpointing).
    if plan["recompute"] == "full":
        cfg["activation_checkpointing"] = {
            "partition_activations": False,  # needs tensor parallelism (an mpu)
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
    return cfg


def _deepspeed_batch_and_precision(plan: dict[str, Any]) -> dict[str, Any]:
    """The batch sizes, clipping, logging and the bf16 / fp16 blocks (fp16: dynamic loss
    scaling at DeepSpeed's documented defaults)."""
    precision = plan["precision"]
    cfg: dict[str, Any] = {
        "train_batch_size": plan["micro_batch_size"] * plan["grad_accum_steps"] * plan["dp"],
        "train_micro_batch_size_per_gpu": plan["micro_batch_size"],
        "gradient_accumulation_steps": plan["grad_accum_steps"],
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
        "bf16": {"enabled": precision == "mixed-bf16"},
        "fp16": {"enabled": precision == "mixed-fp16"},
    }
    if precision == "mixed-fp16":  # dynamic loss scaling, DeepSpeed's documented defaults
        cfg["fp16"].update(
            loss_scale=0,
            initial_scale_power=16,
            loss_scale_window=1000,
            hysteresis=2,
            min_loss_scale=1,
        )
    return cfg


def _deepspeed_zero(plan: dict[str, Any]) -> dict[str, Any]:
    """The zero_optimization block: the stage, its buckets at the estimate's sizes, offload."""
    h = int(plan["architecture"]["hidden_size"])
    zero, offload = int(plan["zero"]), plan["offload"]
    z: dict[str, Any] = {"stage": zero}
    if zero >= 1:
        bucket = float(plan.get("zero_bucket_elems") or 0.0)
        z.update(
            overlap_comm=plan.get("overlap_comm", "auto") != "off",
            reduce_bucket_size=int(bucket) if bucket > 0 else h * h,
        )
    if zero >= 2:
        z["contiguous_gradients"] = True
    if zero == 3:
        z.update(
            stage3_prefetch_bucket_size=int(0.9 * h * h),
            stage3_param_persistence_threshold=10 * h,
            stage3_max_live_parameters=1_000_000_000,
            stage3_max_reuse_distance=1_000_000_000,
            stage3_gather_16bit_weights_on_model_save=True,
        )
    if offload in ("optimizer", "optimizer+params"):
        z["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if offload == "optimizer+params":
        z["offload_param"] = {"device": "cpu", "pin_memory": True}
    return z


# ---- torchrun and sbatch -----------------------------------------------------------------------


def megatron_args(plan: dict[str, Any]) -> list[list[str]]:
    """Megatron-LM pretrain_gpt.py arguments (megatron/training/arguments.py), grouped by line:
    parallelism, batch, model shape, memory knobs, precision and optimizer."""
    groups = (
        _megatron_parallel(plan),
        _megatron_batch(plan),
        _megatron_shape(plan),
        _megatron_memory(plan),
        _megatron_numerics(plan),
    )
    return [[str(a) for a in group] for group in groups if group]


def _megatron_parallel(plan: dict[str, Any]) -> list[Any]:
    """The parallel degrees (TP, PP with its virtual stages, CP, EP) and sequence parallelism."""
    parallel = [
        "--tensor-model-parallel-size",
        plan["tp"],
        "--pipeline-model-parallel-size",
        plan["pp"],
        "--context-parallel-size",
        plan["cp"],
    ]
    if plan["virtual_stages"] > 1:
        parallel += [
            "--num-layers-per-virtual-pipeline-stage",
            plan["architecture"]["num_hidden_layers"] // (plan["pp"] * plan["virtual_stages"]),
        ]
    if plan["ep"] > 1:
        parallel += ["--expert-model-parallel-size", plan["ep"]]
    if plan["tp"] > 1 and plan["sequence_parallel"]:
        parallel.append("--sequence-parallel")
    return parallel


def _megatron_batch(plan: dict[str, Any]) -> list[Any]:
    return [
        "--micro-batch-size",
        plan["micro_batch_size"],
        "--global-batch-size",
        plan["global_batch_size"],
        "--seq-length",
        plan["seq_len"],
    ]


def _megatron_shape(plan: dict[str, Any]) -> list[Any]:
    """The model's shape: sizes and attention heads, positions, norm, vocabulary, MLP, biases
    and dropout, then the MoE and MLA blocks where the model has them."""
    m = plan["architecture"]
    hidden, heads = m["hidden_size"], m["num_attention_heads"]
    shape = [
        "--num-layers",
        m["num_hidden_layers"],
        "--hidden-size",
        hidden,
        "--ffn-hidden-size",
        m["intermediate_size"],
        "--num-attention-heads",
        heads,
    ]
    if m["num_key_value_heads"] != heads:
        shape += ["--group-query-attention", "--num-query-groups", m["num_key_value_heads"]]
    if m["head_dim"] * heads != hidden:
        shape += ["--kv-channels", m["head_dim"]]
    shape += [
        "--max-position-embeddings",
        max(plan["seq_len"], m["max_position_embeddings"]),
        "--position-embedding-type",
        "rope" if m["rotary"] else "learned_absolute",
        *(megatron_rope_args(m) if m["rotary"] else []),
        "--normalization",
        "RMSNorm" if m["norm"] == "rms" else "LayerNorm",
    ]
    if m.get("norm_epsilon") is not None:
        shape += ["--norm-epsilon", m["norm_epsilon"]]
    if m.get("qk_norm"):
        shape.append("--qk-layernorm")
    shape += [
        "--vocab-size",
        m["vocab_size"],
        "--make-vocab-size-divisible-by",
        vocab_divisor(m["vocab_size"], plan["tp"]),
    ]
    if m["gated_mlp"]:
        shape.append("--swiglu")
    if not m["tie_word_embeddings"]:
        shape.append("--untie-embeddings-and-output-weights")
    if not m["mlp_bias"]:
        shape.append("--disable-bias-linear")
        if m["attention_bias"]:
            shape.append("--add-qkv-bias")
    if m["dropout"] == 0:
        shape += ["--attention-dropout", 0, "--hidden-dropout", 0]
    return shape + _megatron_moe(m) + _megatron_mla(m)


def _megatron_moe(m: dict[str, Any]) -> list[Any]:
    """The MoE flags (none for a dense model): experts, routing, shared experts, dense layers."""
    if not m["num_experts"]:
        return []
    moe = [
        "--num-experts",
        m["num_experts"],
        "--moe-router-topk",
        m["num_experts_per_tok"],
        "--moe-ffn-hidden-size",
        m["moe_intermediate_size"],
        "--moe-grouped-gemm",
    ]
    if m["shared_expert_intermediate_size"]:
        moe += ["--moe-shared-expert-intermediate-size", m["shared_expert_intermediate_size"]]
    if m["num_dense_layers"]:
        dense, layers = m["num_dense_layers"], m["num_hidden_layers"]
        moe += ["--moe-layer-freq", f"([0]*{dense}+[1]*{layers - dense})"]
    return moe


def _megatron_mla(m: dict[str, Any]) -> list[Any]:
    """The multi-latent attention flags (DeepSeek-V2/V3; none without a KV LoRA rank)."""
    if not m["kv_lora_rank"]:
        return []
    mla = [
        "--multi-latent-attention",
        "--kv-lora-rank",
        m["kv_lora_rank"],
        "--qk-head-dim",
        m["qk_nope_head_dim"],
        "--qk-pos-emb-head-dim",
        m["qk_rope_head_dim"],
        "--v-head-dim",
        m["v_head_dim"],
    ]
    if m["q_lora_rank"]:
        mla += ["--q-lora-rank", m["q_lora_rank"]]
    return mla


def _megatron_memory(plan: dict[str, Any]) -> list[Any]:
    """The memory knobs: recompute, the distributed optimizer / Megatron-FSDP, CPU offload."""
    memory = _megatron_recompute(plan)
    if plan["zero"] >= 1:
        memory.append("--use-distributed-optimizer")
    if plan["zero"] >= 2:  # Megatron-FSDP (its README's required flags)
        strategy = "optim_grads" if plan["zero"] == 2 else "optim_grads_params"
        memory += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy]
        memory += ["--no-gradient-accumulation-fusion", "--ckpt-format", "fsdp_dtensor"]
    if plan["offload"] == "optimizer":  # the hybrid device optimizer needs the precision-aware one
        memory += [
            "--optimizer-cpu-offload",
            "--use-precision-aware-optimizer",
            "--overlap-cpu-optimizer-d2h-h2d",
        ]
    return memory


def _megatron_recompute(plan: dict[str, Any]) -> list[Any]:
    if plan["recompute"] == "full":
        return [
            "--recompute-granularity",
            "full",
            "--recompute-method",
            "uniform",
            "--recompute-num-layers",
            1,
        ]
    if plan["recompute"] == "selective":
        return ["--recompute-granularity", "selective"]
    if plan["recompute"] == "selective-layer":  # as many blocks per stage, whole
        layers = plan["architecture"]["num_hidden_layers"]
        per_stage = layers // (plan["pp"] * plan["virtual_stages"])
        return [
            "--recompute-granularity",
            "full",
            "--recompute-method",
            "block",
            "--recompute-num-layers",
            per_stage // plan.get("recompute_every", 2),
        ]
    return []


def _megatron_numerics(plan: dict[str, Any]) -> list[Any]:
    """Precision, optimizer (adam or sgd: ValueError for one Megatron-LM does not take) and the
    gradient clip."""
    optimizer = MEGATRON_OPTIMIZERS.get(plan["optimizer"])
    if optimizer is None:
        raise ValueError(
            f"optimizer: Megatron-LM's --optimizer takes adam or sgd (trainmem "
            f"{'|'.join(MEGATRON_OPTIMIZERS)}), not {plan['optimizer']}"
        )
    return [*MEGATRON_PRECISIONS[plan["precision"]], *optimizer, "--clip-grad", 1.0]


MEGATRON_LLAMA3_ROPE = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
"""The Llama 3.x rope scaling constants Megatron-core applies under --use-rope-scaling (only the
factor is an argument): megatron/core/models/common/embeddings/rotary_pos_embedding.py
RotaryEmbedding._apply_scaling."""
MEGATRON_YARN_DEFAULTS = {"original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}
"""YaRN values of megatron-core's MLATransformerConfig that Megatron-LM sets no flag for
(megatron/core/transformer/transformer_config.py)."""
MEGATRON_VOCAB_DIVISOR = 128
"""Megatron-LM's --make-vocab-size-divisible-by default (megatron/training/arguments.py)."""


def megatron_rope_args(m: dict[str, Any]) -> list[Any]:
    """The rotary arguments of a model (Megatron-LM megatron/training/arguments.py: --rotary-base,
    an int, default 10000; --rotary-percent; --use-rope-scaling with --rope-scaling-factor for
    Llama 3.x; YaRN under multi-latent attention: --rotary-scaling-factor, --mscale,
    --mscale-all-dim, read into MLATransformerConfig by core_transformer_config_from_args).
    ValueError (one line) for a scaling Megatron-LM cannot express."""
    theta = m.get("rope_theta") or 10000
    out: list[Any] = ["--rotary-base", int(theta)]
    if m.get("partial_rotary_factor", 1.0) != 1.0:
        out += ["--rotary-percent", m["partial_rotary_factor"]]
    scaling = m.get("rope_scaling") or {}
    kind = scaling.get("rope_type")
    if kind is None:
        return out
    if kind == "llama3" and all(scaling.get(k, v) == v for k, v in MEGATRON_LLAMA3_ROPE.items()):
        return [*out, "--use-rope-scaling", "--rope-scaling-factor", scaling["factor"]]
    if (
        kind == "yarn"
        and m["kv_lora_rank"]
        and all(scaling.get(k, v) == v for k, v in MEGATRON_YARN_DEFAULTS.items())
    ):
        return [
            *out,
            "--rotary-scaling-factor",
            scaling["factor"],
            "--mscale",
            scaling.get("mscale", 1.0),
            "--mscale-all-dim",
            scaling.get("mscale_all_dim", 0.0),
        ]
    raise ValueError(
        f"rope_scaling: Megatron-LM's flags express Llama 3.x scaling ({MEGATRON_LLAMA3_ROPE}) "
        f"and YaRN under multi-latent attention, not {scaling}"
    )


def vocab_divisor(vocab_size: int, tp: int) -> int:
    """--make-vocab-size-divisible-by that keeps the vocabulary unpadded: Megatron-LM pads it to
    a multiple of divisor x tp (megatron/training/tokenizer _vocab_size_with_padding); the
    largest divisor <= 128 with vocab_size % (divisor x tp) == 0, else the default (padding is
    unavoidable when tp does not divide the vocabulary)."""
    if vocab_size % tp:
        return MEGATRON_VOCAB_DIVISOR
    return math.gcd(vocab_size // tp, MEGATRON_VOCAB_DIVISOR)


MEGATRON_PRECISIONS: dict[str, list[Any]] = {
    "mixed-bf16": ["--bf16"],
    "mixed-fp16": ["--fp16"],
    "fp8-mixed": ["--bf16", "--fp8-format", "hybrid", "--fp8-amax-history-len", 1024,
                  "--fp8-amax-compute-algo", "max"],
    "mxfp8": ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"],
    "nvfp4": ["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"],
    "fp32": [],
}  # fmt: skip
"""Megatron-LM's precision arguments of each trainmem precision (Transformer Engine's hybrid FP8:
E4M3 forward, E5M2 backward, max over a 1024-step amax history; MXFP8BlockScaling through
fp8_recipe 'mxfp8' (E4M3 only), NVFP4BlockScaling through fp4 'e2m1' and fp4_recipe 'nvfp4').
Source: megatron-core 0.16.1 transformer/transformer_config.py (fp8 `--fp8-format`, fp8_recipe,
fp4 `--fp4-format`, fp4_recipe)."""
MEGATRON_OPTIMIZERS: dict[str, list[Any]] = {
    "adamw": ["--optimizer", "adam"],  # Megatron's adam decouples weight decay (AdamW)
    "adamw-fused": ["--optimizer", "adam"],
    "sgd": ["--optimizer", "sgd", "--sgd-momentum", 0.0],
    "sgd-momentum": ["--optimizer", "sgd", "--sgd-momentum", 0.9],
}


def trainer_args(plan: dict[str, Any]) -> list[list[str]]:
    """Hugging Face Trainer arguments (transformers TrainingArguments) of a deepspeed plan; the
    DeepSpeed config (`--format deepspeed`) is read from DEEPSPEED_CONFIG_FILE."""
    batch = [
        "--per_device_train_batch_size",
        plan["micro_batch_size"],
        "--gradient_accumulation_steps",
        plan["grad_accum_steps"],
    ]
    knobs = ["--deepspeed", DEEPSPEED_CONFIG_FILE]
    knobs += {"mixed-bf16": ["--bf16"], "mixed-fp16": ["--fp16"]}.get(plan["precision"], [])
    if plan["recompute"] == "full":
        knobs.append("--gradient_checkpointing")
    return [[str(a) for a in batch], [str(a) for a in knobs]]


def default_script(plan: dict[str, Any]) -> str:
    if plan["framework"] == "megatron":
        return (
            "pretrain_bert.py"
            if plan["architecture"]["model_type"] == "bert"
            else "pretrain_gpt.py"
        )
    return "train.py"


def _lines(head: str, groups: list[list[str]], tail: str, width: int = 96) -> str:
    """A command over several lines (backslash continuations): each argument group on lines of
    its own, a flag and its value never split."""
    body = [head]
    for group in groups:
        line = ""
        for arg in group:
            if arg.startswith("--") and line and len(line) + len(arg) > width - 20:
                body.append("    " + line)  # a new line starts at a flag, before 76 characters
                line = ""
            line = f"{line} {shlex.quote(arg)}" if line else shlex.quote(arg)
        body.append("    " + line)
    return " \\\n".join([*body, "    " + tail])


def _extra_comment(plan: dict[str, Any]) -> str:
    if plan["framework"] == "megatron":
        return (
            "# $EXTRA_ARGS: data, tokenizer and schedule, e.g. --data-path ... "
            "--tokenizer-type HuggingFaceTokenizer --tokenizer-model ... --lr ..."
        )
    return (
        f"# {DEEPSPEED_CONFIG_FILE}: the same recommend with --format deepspeed; "
        "$EXTRA_ARGS: your script's model, data and --output_dir arguments"
    )


def torchrun_script(plan: dict[str, Any]) -> str:
    """The torchrun launch line (run it on every node; torch/distributed/run.py flags)."""
    script = plan["launch"]["script"] or default_script(plan)
    # The endpoint stays a shell expansion: MASTER_ADDR on multi-node jobs, else this host.
    job = shlex.quote(plan["launch"]["job_name"])
    head = (
        f"torchrun --nnodes={plan['num_nodes']} --nproc-per-node={plan['gpus_per_node']} "
        f"--rdzv-backend=c10d --rdzv-endpoint=${{MASTER_ADDR:-localhost}}:{MASTER_PORT} "
        f"--rdzv-id={job} {shlex.quote(script)}"
    )
    args = megatron_args(plan) if plan["framework"] == "megatron" else trainer_args(plan)
    comments = [f"# trainmem recommend: {_summary(plan)}", _extra_comment(plan)]
    if plan["num_nodes"] > 1:
        comments.append(
            f"# run on each of the {plan['num_nodes']} nodes with MASTER_ADDR set to "
            "the first node's address"
        )
    return "\n".join([*comments, *_environment(plan), _lines(head, args, "$EXTRA_ARGS")]) + "\n"


TIME_RE = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}\Z|^\d+-\d+\Z")  # \Z: no trailing newline
"""sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (sbatch man page)."""


def slurm_script(plan: dict[str, Any]) -> str:
    """An sbatch script: one task per node running torchrun (master: the first node)."""
    launch = plan["launch"]
    script = launch["script"] or default_script(plan)
    per_node = plan["gpus_per_node"]
    header = [
        "#!/bin/bash",
        f"#SBATCH --job-name={launch['job_name']}",
        f"#SBATCH --nodes={plan['num_nodes']}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={per_node}",
        f"#SBATCH --cpus-per-task={CPUS_PER_GPU * per_node}",
        f"#SBATCH --time={launch['time_limit']}",
        "#SBATCH --output=%x-%j.out",
        "##SBATCH --partition=YOUR_PARTITION  (remove one # and name your GPU partition)",
        f"# trainmem recommend: {_summary(plan)}",
        f"# --cpus-per-task: {CPUS_PER_GPU} cores per GPU; set it to what your nodes have",
        _extra_comment(plan),
        "set -euo pipefail",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"MASTER_PORT={MASTER_PORT}",
        "export MASTER_ADDR MASTER_PORT",
        'EXTRA_ARGS="${EXTRA_ARGS:-}"',
        *_environment(plan),
    ]
    head = (
        f'srun torchrun --nnodes="$SLURM_NNODES" --nproc-per-node={per_node} '
        '--rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" '
        f'--rdzv-id="$SLURM_JOB_ID" {shlex.quote(script)}'
    )
    args = megatron_args(plan) if plan["framework"] == "megatron" else trainer_args(plan)
    return "\n".join([*header, _lines(head, args, "$EXTRA_ARGS")]) + "\n"


# ---- accelerate --------------------------------------------------------------------------------

WRAP_CLASSES = {
    "llama": "LlamaDecoderLayer",
    "mistral": "MistralDecoderLayer",
    "mixtral": "MixtralDecoderLayer",
    "qwen2": "Qwen2DecoderLayer",
    "qwen2_moe": "Qwen2MoeDecoderLayer",
    "qwen3": "Qwen3DecoderLayer",
    "qwen3_moe": "Qwen3MoeDecoderLayer",
    "gemma": "GemmaDecoderLayer",
    "gemma2": "Gemma2DecoderLayer",
    "gemma3": "Gemma3DecoderLayer",
    "gemma3_text": "Gemma3DecoderLayer",
    "phi": "PhiDecoderLayer",
    "phi3": "Phi3DecoderLayer",
    "gpt2": "GPT2Block",
    "bert": "BertLayer",
    "deepseek_v2": "DeepseekV2DecoderLayer",
    "deepseek_v3": "DeepseekV3DecoderLayer",
    "gpt_neox": "GPTNeoXLayer",
    "falcon": "FalconDecoderLayer",
    "opt": "OPTDecoderLayer",
    "starcoder2": "Starcoder2DecoderLayer",
    "olmo": "OlmoDecoderLayer",
    "olmo2": "Olmo2DecoderLayer",
}
"""FSDP wrap unit by model_type: the block in the model's `_no_split_modules` (transformers
models/<type>/modeling_<type>.py). Other types: accelerate falls back to `_no_split_modules`."""
SHARDING = {3: "FULL_SHARD", 2: "SHARD_GRAD_OP", 0: "NO_SHARD"}
MIXED_PRECISION = {"mixed-bf16": "bf16", "mixed-fp16": "fp16", "fp32": "no"}


def accelerate_config(plan: dict[str, Any]) -> str:
    """An `accelerate launch --config_file` YAML (accelerate's ClusterConfig keys) for FSDP.

    ZeRO 3 and 2 are FSDP2 (the `hf` framework's model of ZeRO-3) with reshard_after_forward
    True / False; ZeRO 0 is FSDP1 NO_SHARD (FSDP2 has no such strategy). fsdp_sharding_strategy is
    written too: FSDP1 reads it (accelerate launch always exports it), FSDP2 ignores it. The
    FSDP1-only keys (backward/forward prefetch, use_orig_params, sync_module_states) are written
    for FSDP1 only, as `accelerate config` does (accelerate/commands/config/cluster.py).
    """
    top: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": "FSDP",
        "downcast_bf16": False,
        "enable_cpu_affinity": False,
        "fsdp_config": _fsdp_config(plan),
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": MIXED_PRECISION[plan["precision"]],
        "num_machines": plan["num_nodes"],
        "num_processes": plan["num_gpus"],
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }
    if plan["num_nodes"] > 1:
        top["main_process_port"] = MASTER_PORT
    if plan.get("compile", "none") != "none":  # accelerate/utils/dataclasses.py DynamoBackend
        top["dynamo_config"] = {"dynamo_backend": "INDUCTOR"}
    comments = _accelerate_comments(plan)
    return "\n".join([*("# " + c for c in comments), *_yaml(dict(sorted(top.items())))]) + "\n"


def _fsdp_config(plan: dict[str, Any]) -> dict[str, Any]:
    """accelerate's fsdp_config block, its keys sorted (accelerate_config says which FSDP)."""
    zero = int(plan["zero"])
    version = 1 if zero == 0 else 2
    fsdp: dict[str, Any] = {
        "fsdp_activation_checkpointing": plan["recompute"] == "full",
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        # The load the plan was estimated with: meta-init is accelerate's cpu_ram_efficient
        # loading (rank 0 reads, broadcasts per tensor); the hf stack's own default (`--load
        # auto`) is a whole CPU model that fully_shard moves to the GPUs (engine/_load.py).
        "fsdp_cpu_ram_efficient_loading": plan.get("load") == "meta-init",
        "fsdp_offload_params": plan["offload"] == "optimizer+params",
        "fsdp_reshard_after_forward": SHARDING[zero] if version == 1 else zero == 3,
        "fsdp_sharding_strategy": SHARDING[zero],
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_version": version,
    }
    wrap = WRAP_CLASSES.get(plan["architecture"]["model_type"])
    if wrap:
        fsdp["fsdp_transformer_layer_cls_to_wrap"] = wrap
    if version == 1:
        fsdp.update(
            fsdp_backward_prefetch="BACKWARD_PRE",
            fsdp_forward_prefetch=False,
            fsdp_sync_module_states=True,
            fsdp_use_orig_params=True,
        )
    return dict(sorted(fsdp.items()))


def _accelerate_comments(plan: dict[str, Any]) -> list[str]:
    """The config's header comments: the plan, the Trainer's batch flags, a multi-node launch."""
    m, a = plan["micro_batch_size"], plan["grad_accum_steps"]
    comments = [
        f"trainmem recommend: {_summary(plan)}",
        f"Trainer: --per_device_train_batch_size {m} --gradient_accumulation_steps {a} (global "
        f"batch {m * a * plan['dp']} = {m} x {a} x {plan['dp']} processes)"
        + (
            "; checkpointing is fsdp_activation_checkpointing, so no --gradient_checkpointing"
            if plan["recompute"] == "full"
            else ""
        ),
    ]
    if plan["num_nodes"] > 1:
        comments.append(
            "each node: accelerate launch --config_file THIS --machine_rank RANK "
            "--main_process_ip FIRST_NODE script.py"
        )
    return comments


_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_YAML_WORDS = {"yes", "no", "on", "off", "true", "false", "null", "y", "n"}


def _yaml(mapping: dict[str, Any], indent: str = "") -> list[str]:
    """Block YAML of a mapping of scalars and mappings (strings quoted when YAML would read them
    as something else)."""
    out = []
    for key, value in mapping.items():
        if isinstance(value, dict):
            out += [f"{indent}{key}:", *_yaml(value, indent + "  ")]
        elif isinstance(value, bool):
            out.append(f"{indent}{key}: {'true' if value else 'false'}")
        elif isinstance(value, str) and (not _PLAIN.match(value) or value.lower() in _YAML_WORDS):
            out.append(f"{indent}{key}: {json.dumps(value)}")
        else:
            out.append(f"{indent}{key}: {value}")
    return out


# ---- torchtitan --------------------------------------------------------------------------------

TORCHTITAN_CONFIGS: dict[str, tuple[str, str]] = {
    "llama-3.1-8b": ("llama3", "llama3_8b"),
    "llama-3.1-70b": ("llama3", "llama3_70b"),
    "llama-3.1-405b": ("llama3", "llama3_405b"),
    "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b"),
    "deepseek-v2-lite": ("deepseek_v3", "deepseek_v3_16b"),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b"),
}
"""trainmem model -> torchtitan 0.3.0 (--module, --config): the config_registry functions of
torchtitan/models/<module>/config_registry.py whose model has the preset's parameter count
(flavors 8B, 70B, 405B, 30B-A3B, 16B (DeepSeek-V2-Lite's shape), 671B)."""
TORCHTITAN_NOTES = {
    "llama3_405b": "llama3_405b converts the Linear layers to Float8 in its config function "
    "(not a command-line setting): for a bf16 run write your own config function",
}
TORCHTITAN_AC = {
    "none": "none",
    "full": "full",
    "selective": "selective",
    "selective-op": "selective",
}
"""trainmem recompute -> torchtitan's activation_checkpoint subcommand (SelectiveAC is per-op
SAC in 0.3.0: torchtitan/distributed/activation_checkpoint.py)."""
TORCHTITAN_PRECISIONS = {"mixed-bf16": "bfloat16", "fp32": "float32"}
"""training.mixed_precision_param of each precision (FSDP2 MixedPrecisionPolicy; the sharded
master parameters stay training.dtype float32)."""
TORCHTITAN_COMPILE = {"blocks": "model", "blocks+loss": "model,loss"}


TORCHTITAN_ADAMW = {"adamw": "foreach", "adamw-fused": "fused"}
"""torchtitan 0.3.0 components/optimizer/optimizer.py Config.implementation (foreach,
fused: torch.optim.AdamW(foreach=True | fused=True)) of a plan's optimizer."""


def torchtitan_args(plan: dict[str, Any]) -> list[list[str]]:
    """torchtitan 0.3.0 `torchtitan.train` overrides (torchtitan/config/manager.py ConfigManager:
    --section.field flags over the --module/--config function's Trainer.Config), grouped by
    line: parallelism, batch, precision and compile. Batch: without pipelining the local batch is
    the micro-batch and torchtitan accumulates global / (local x dp) steps; with pipelining the
    local batch is micro-batch x accumulation, split into pipeline micro-batches."""
    zero, dp = int(plan["zero"]), plan["dp"]
    if zero not in (0, 3):
        raise ValueError(f"zero: torchtitan runs FSDP2 (zero 3) or DDP (zero 0), not {zero}")
    precision = TORCHTITAN_PRECISIONS.get(plan["precision"])
    if precision is None:
        raise ValueError(
            f"precision: torchtitan's command line sets {'|'.join(TORCHTITAN_PRECISIONS)} "
            f"(Float8 is a converter in the config function), not {plan['precision']}"
        )
    mb = plan["micro_batch_size"]
    batch: list[Any] = [
        "--training.local_batch_size",
        mb * plan["grad_accum_steps"] if plan["pp"] > 1 else mb,
        "--training.global_batch_size",
        mb * plan["grad_accum_steps"] * dp,
        "--training.seq_len",
        plan["seq_len"],
    ]
    groups = (_torchtitan_parallel(plan), batch, _torchtitan_numerics(plan, precision))
    return [[str(a) for a in group] for group in groups]


def _torchtitan_parallel(plan: dict[str, Any]) -> list[Any]:
    """The parallel degrees (DDP replicas or FSDP2 shards), sequence parallelism and the
    pipeline's micro-batch and schedule."""
    zero, dp, pp = int(plan["zero"]), plan["dp"], plan["pp"]
    parallel: list[Any] = [
        "--parallelism.data_parallel_replicate_degree",
        dp if zero == 0 else 1,
        "--parallelism.data_parallel_shard_degree",
        dp if zero == 3 else 1,
        "--parallelism.tensor_parallel_degree",
        plan["tp"],
        "--parallelism.pipeline_parallel_degree",
        pp,
        "--parallelism.context_parallel_degree",
        plan["cp"],
        "--parallelism.expert_parallel_degree",
        plan["ep"],
    ]
    if plan["tp"] > 1:
        parallel.append(
            "--parallelism.enable_sequence_parallel"
            if plan["sequence_parallel"]
            else "--parallelism.no-enable-sequence-parallel"
        )
    if pp > 1:
        parallel += ["--parallelism.pipeline_parallel_microbatch_size", plan["micro_batch_size"]]
        if plan["virtual_stages"] > 1:
            layers = plan["architecture"]["num_hidden_layers"]
            parallel += [
                "--parallelism.pipeline_parallel_schedule",
                "Interleaved1F1B",
                "--parallelism.pipeline_parallel_layers_per_stage",
                layers // (pp * plan["virtual_stages"]),
                # Even stages, as estimated: torchtitan 0.3.0 otherwise counts the embedding
                # and the head as one layer each (distributed/pipeline_parallel.py,
                # config/configs.py pipeline_parallel_{first,last}_stage_less_layers = 1) and
                # refuses a stage count that pp does not divide.
                "--parallelism.pipeline_parallel_first_stage_less_layers",
                0,
                "--parallelism.pipeline_parallel_last_stage_less_layers",
                0,
            ]
        else:
            parallel += ["--parallelism.pipeline_parallel_schedule", "1F1B"]
    return parallel


def _torchtitan_numerics(plan: dict[str, Any], precision: str) -> list[Any]:
    """Precision, the AdamW implementation, CUDA graphs (off with pipelining) and compile."""
    pp = plan["pp"]
    numerics: list[Any] = ["--training.mixed_precision_param", precision]
    implementation = TORCHTITAN_ADAMW.get(plan["optimizer"])
    if implementation:  # the AdamW the plan was estimated with (0.3.0's own default: fused)
        numerics += ["--optimizer.implementation", implementation]
    if pp > 1:  # CUDA graphs do not run pipelines (Trainer.Config._validate_cuda_graphs)
        numerics.append("--training.disable_cuda_graphs")
    components = TORCHTITAN_COMPILE.get(plan.get("compile", "none"))
    numerics += (
        ["--compile.enable", "--compile.components", components]
        if components
        else ["--compile.no-enable"]
    )
    return numerics


def torchtitan_script(plan: dict[str, Any]) -> str:
    """A torchrun line of torchtitan 0.3.0's trainer (run it on every node). torchtitan 0.3.0
    reads no TOML: `torchtitan.train` takes --module/--config (a Python config function) and
    --section.field overrides, then the activation-checkpoint subcommand. A model without a
    torchtitan config function gets shell variables to set and a note."""
    recompute = TORCHTITAN_AC.get(plan["recompute"])
    if recompute is None:
        raise ValueError(
            f"recompute: torchtitan checkpoints {'|'.join(TORCHTITAN_AC)}, not {plan['recompute']}"
        )
    known = TORCHTITAN_CONFIGS.get(plan["model"])
    if known:
        module, config = known
        model = f"--module {module} --config {config}"
        notes = [f"# model: torchtitan {module} config {config}"]
        if config in TORCHTITAN_NOTES:
            notes.append(f"# note: {TORCHTITAN_NOTES[config]}")
    else:
        model = (
            '--module "${TORCHTITAN_MODULE:?your config_registry module}" '
            '--config "${TORCHTITAN_CONFIG:?its function}"'
        )
        notes = [
            f"# note: {plan['model']} is not a torchtitan 0.3.0 model: write a config function "
            "returning Trainer.Config with its model_spec (as torchtitan/models/llama3/"
            "config_registry.py does) and set TORCHTITAN_MODULE and TORCHTITAN_CONFIG"
        ]
    loss = plan.get("loss", "auto")
    if loss not in ("auto", "chunked-head"):  # the registry's functions wrap the loss
        notes.append(
            "# note: torchtitan 0.3.0's llama3 config functions run ChunkedLossWrapper (trainmem "
            f"--loss chunked-head); --loss {loss} needs a config function that sets it "
            "(llama3_debugmodel_ce_loss sets CrossEntropyLoss)"
        )
    head = (
        f"torchrun --nnodes={plan['num_nodes']} --nproc-per-node={plan['gpus_per_node']} "
        f"--rdzv-backend=c10d --rdzv-endpoint=${{MASTER_ADDR:-localhost}}:{MASTER_PORT} "
        f"--rdzv-id={shlex.quote(plan['launch']['job_name'])} -m torchtitan.train {model}"
    )
    comments = [
        f"# trainmem recommend: {_summary(plan)}",
        *notes,
        "# $EXTRA_ARGS: --hf_assets_path (tokenizer), --dataloader.dataset, --training.steps, "
        "--optimizer.lr ...; the activation-checkpoint subcommand comes last",
    ]
    if plan["num_nodes"] > 1:
        comments.append(
            f"# run on each of the {plan['num_nodes']} nodes with MASTER_ADDR set to "
            "the first node's address"
        )
    tail = f"$EXTRA_ARGS activation-checkpoint:{recompute}"
    return (
        "\n".join([*comments, *_environment(plan), _lines(head, torchtitan_args(plan), tail)])
        + "\n"
    )


# ---- verl --------------------------------------------------------------------------------------

VERL_VERSION = "verl b178a3c (0.8.0.dev) verl/trainer/config/_generated_ppo_trainer.yaml"


def verl_overrides(plan: dict[str, Any]) -> list[list[str]]:
    """The `key=value` groups of verl's PPO trainer for the plan's RL job (plan["rl_job"]):
    every key trainmem's estimate depends on, so that `trainmem check` reads the script back
    to the same fields (stacks/_verl.py). Learning rates, data and logging are $EXTRA_ARGS."""
    rl = plan["rl_job"]
    n = rl["rl_group_size"]
    if plan["global_batch_size"] % n:
        raise ValueError(
            f"format verl: global_batch_size {plan['global_batch_size']} is not a whole number "
            f"of prompts of rl_group_size {n} (verl's ppo_mini_batch_size is in prompts)"
        )
    from trainmem.catalog._presets import preset_hub_ids

    path = preset_hub_ids().get(plan["model"])
    model_path = path if path else "${MODEL_PATH:?your model's path or Hugging Face id}"
    a, r, m = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.model."
    offload = rl["rl_trainer_offload"]
    params, optimizer = "params" in offload, "optimizer" in offload
    checkpointing = plan["recompute"] == "full"
    ref = rl["ref_model"]
    model = [f"{m}path={model_path}", f"{m}enable_gradient_checkpointing={checkpointing}"]
    if rl["lora_rank"]:
        model += [f"{m}lora_rank={rl['lora_rank']}", f"{m}target_modules={rl['lora_targets']}"]
    actor = [
        f"{a}ppo_mini_batch_size={plan['global_batch_size'] // n}",
        f"{a}ppo_micro_batch_size_per_gpu={plan['micro_batch_size']}",
        f"{a}use_kl_loss={ref != 'none'}",
        f"{a}fsdp_config.param_offload={params}",
        f"{a}fsdp_config.optimizer_offload={optimizer}",
    ]
    packed = rl["rl_max_token_len_per_gpu"]
    if packed:  # the train and score micro-batches packed by tokens (trainmem packs both)
        actor += [f"{a}use_dynamic_bsz=True", f"{a}ppo_max_token_len_per_gpu={packed}"]
    log_prob = rl["log_prob_micro_batch_size"] or plan["micro_batch_size"]
    rollout = [
        f"{r}name={rl['rollout']}",
        f"{r}tensor_model_parallel_size={rl['rollout_tp']}",
        f"{r}gpu_memory_utilization={rl['rollout_gpu_memory_utilization']}",
        f"{r}n={n}",
        f"{r}max_num_seqs={rl['rollout_max_num_seqs']}",
        f"{r}max_num_batched_tokens={rl['rollout_max_num_batched_tokens']}",
        f"{r}log_prob_micro_batch_size_per_gpu={log_prob}",
    ]
    refs = [f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={log_prob}"]
    if packed:  # the old policy's and the reference's log-probs packed as the train step
        for group, prefix in ((rollout, r), (refs, "actor_rollout_ref.ref.")):
            group += [f"{prefix}log_prob_use_dynamic_bsz=True",
                      f"{prefix}log_prob_max_token_len_per_gpu={packed}"]  # fmt: skip
    if ref == "offloaded":
        refs.append("actor_rollout_ref.ref.fsdp_config.param_offload=True")
    critic: list[str] = []
    if rl["rl"] == "ppo":  # the critic: same model and configuration (trainmem's PPO critic)
        critic = [
            f"critic.model.path={model_path}",
            f"critic.model.enable_gradient_checkpointing={checkpointing}",
            f"critic.ppo_micro_batch_size_per_gpu={plan['micro_batch_size']}",
            f"critic.model.fsdp_config.param_offload={params}",
            f"critic.model.fsdp_config.optimizer_offload={optimizer}",
        ]
        if packed:
            critic += ["critic.use_dynamic_bsz=True", f"critic.ppo_max_token_len_per_gpu={packed}"]
    return [
        [
            f"algorithm.adv_estimator={'gae' if rl['rl'] == 'ppo' else 'grpo'}",
            "algorithm.use_kl_in_reward=False",
        ],
        [
            f"data.train_batch_size={rl['rollout_batch_size']}",
            f"data.max_prompt_length={plan['seq_len'] - rl['response_len']}",
            f"data.max_response_length={rl['response_len']}",
        ],
        model,
        actor,
        rollout,
        refs,
        critic,
        [f"trainer.n_gpus_per_node={plan['gpus_per_node']}", f"trainer.nnodes={plan['num_nodes']}"],
    ]


def verl_script(plan: dict[str, Any]) -> str:
    """A script running verl's PPO trainer (`python3 -m verl.trainer.main_ppo`) with the plan's
    Hydra overrides, verl b178a3c's key names (VERL_VERSION). verl's FSDP actor shards over
    every GPU: a plan with tp, pp or cp above 1, or without ZeRO-3, is not one verl runs."""
    rl = plan.get("rl_job")
    if not rl or rl.get("rl") not in ("grpo", "ppo"):
        raise ValueError(VERL_NEEDS_RL)
    if (plan["tp"], plan["pp"], plan["cp"], plan["zero"]) != (1, 1, 1, 3):
        raise ValueError(
            "format verl: verl's FSDP actor runs tp 1, pp 1, cp 1, ZeRO-3; the plan has "
            f"tp {plan['tp']} pp {plan['pp']} cp {plan['cp']} zero {plan['zero']}"
        )
    groups = [g for g in verl_overrides(plan) if g]
    comments = [
        f"# trainmem recommend: {_summary(plan)}",
        f"# keys: {VERL_VERSION}; $EXTRA_ARGS: data.train_files, data.val_files, "
        "actor_rollout_ref.actor.optim.lr, trainer.logger ...",
    ]
    if rl.get("rl_mean_seq_len"):
        comments.append(
            f"# estimated with {rl['rl_mean_seq_len']} real tokens per sequence "
            "(use_remove_padding); verl's config does not state them"
        )
    if plan["num_nodes"] > 1:
        comments.append(f"# a Ray cluster of {plan['num_nodes']} nodes: start it before this")
    head = "python3 -m verl.trainer.main_ppo"
    return "\n".join([*comments, *_environment(plan), _verl_lines(head, groups)]) + "\n"


def _verl_lines(head: str, groups: list[list[str]]) -> str:
    """One override per line (backslash continuations), then $EXTRA_ARGS."""
    words = [shlex.quote(w) if "$" not in w else f'"{w}"' for g in groups for w in g]
    return " \\\n".join([head, *("    " + w for w in words), "    $EXTRA_ARGS"])
