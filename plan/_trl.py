"""`recommend --format trl`: an RL plan (`--rl grpo` or `--rl dpo`) as the YAML that TRL's own
CLI runs (`trl grpo --config plan.yaml`, `trl dpo --config plan.yaml`), TRL_VERSION's fields.

TRL's CLI launches its script through `accelerate launch`: a key of the file that no dataclass
of the script declares is passed to `accelerate launch` as `--key value` (trl/scripts/utils.py
TrlParser.set_defaults_with_config returns them; trl/cli/commands/training.py TrainingCommand
hands them to trl/cli/accelerate_launcher.py), and `accelerate_config: zero3` names one of
trl/accelerate_configs/*.yaml (trl/cli/accelerate_config.py; docs/source/clis.md "Using
--accelerate_config"). So the file states the DeepSpeed stage and the process count itself, and
`trainmem check` reads the layout back from it (stacks/_hf.py).

Source: trl f2cd577 (1.10.0.dev0) trl/trainer/grpo_config.py, trl/trainer/dpo_config.py,
trl/trainer/model_config.py, trl/scripts/grpo.py, trl/scripts/dpo.py,
trl/generation/vllm_generation.py; accelerate 1.16.0 accelerate/commands/launch.py
(_validate_launch_command keeps a flag given on the command line over its config file's value).
"""

from __future__ import annotations

from typing import Any

TRL_VERSION = "trl f2cd577 (1.10.0.dev0) trl/trainer/grpo_config.py, dpo_config.py, model_config.py"
TRL_NEEDS_RL = (
    "format trl: an RL job (--rl grpo|dpo) renders as a TRL config (TRL's PPO trainer is not "
    "what this format writes)"
)
TRL_ACCELERATE_CONFIGS = {1: "zero1", 2: "zero2", 3: "zero3"}
"""ZeRO stage -> the accelerate config TRL ships (trl/accelerate_configs/zero{1,2,3}.yaml:
DeepSpeed, offload none); ZeRO 0 is zero1 with `zero_stage: 0` over it (accelerate launch's
--zero_stage; a flag wins over the file)."""
TRL_OPTIMIZERS = {
    "adamw": "adamw_torch",
    "adamw-fused": "adamw_torch_fused",
    "adamw-8bit": "adamw_bnb_8bit",
    "paged-adamw-8bit": "paged_adamw_8bit",
    "paged-adamw": "paged_adamw_32bit",
    "adafactor": "adafactor",
    "lion": "lion_32bit",
    "sgd": "sgd",
}
"""trainmem optimizer -> TrainingArguments `optim` (transformers OptimizerNames; the inverse of
stacks/_hf.py OPTIMIZERS). The Trainer builds it and hands it to DeepSpeed (no optimizer block
in TRL's zero configs)."""
TRL_VLLM_MAX_NUM_BATCHED_TOKENS = 4096
"""trl/generation/vllm_generation.py builds the colocated LLM(max_num_batched_tokens=4096)."""
GRPO_KL_BETA = 0.04
"""A GRPO beta > 0 loads the reference model (grpo_config.py: 0.0, its default, loads none);
0.04 was GRPOConfig's default until trl #3516 (7359ddc) made it 0.0 (the KL weight is yours)."""
DPO_BETA = 0.1
"""DPOConfig's default beta (dpo_config.py)."""


def _refuse_unrunnable(plan: dict[str, Any], rl: dict[str, Any]) -> None:
    """ValueError (one line) for a plan TRL's trainers do not run: they are data parallel only
    (the Trainer under DeepSpeed), keep no trainer offload across the rollout, pack nothing by
    tokens, score at the train micro-batch and roll out with vLLM or generate."""
    if (plan["tp"], plan["pp"], plan["cp"], plan["ep"]) != (1, 1, 1, 1):
        raise ValueError(
            "format trl: TRL's trainers are data parallel (tp 1, pp 1, cp 1, ep 1); the plan has "
            f"tp {plan['tp']} pp {plan['pp']} cp {plan['cp']} ep {plan['ep']}"
        )
    if plan["offload"] != "none":
        raise ValueError(
            f"offload: format trl's accelerate configs (zero1|zero2|zero3) offload none, not "
            f"{plan['offload']}"
        )
    if plan["optimizer"] not in TRL_OPTIMIZERS:
        raise ValueError(
            f"optimizer: format trl sets optim for {'|'.join(TRL_OPTIMIZERS)}, not "
            f"{plan['optimizer']}"
        )
    checks = (
        ("rl_trainer_offload", rl["rl_trainer_offload"], "none"),
        ("rl_max_token_len_per_gpu", rl["rl_max_token_len_per_gpu"], 0),
        ("log_prob_micro_batch_size", rl["log_prob_micro_batch_size"], plan["micro_batch_size"]),
    )
    for name, value, allowed in checks:
        if value != allowed:
            raise ValueError(f"{name}: format trl runs {allowed} (TRL's trainers), not {value}")
    if rl["ref_model"] == "offloaded":
        raise ValueError("ref_model: format trl loads none|shared-lora|separate, not offloaded")


def trl_config(plan: dict[str, Any]) -> str:
    """The YAML of `trl grpo|dpo --config THIS` for the plan's RL job (plan["rl_job"]): the
    model, batch, lengths, precision, checkpointing, optimizer, LoRA, the GRPO rollout and the
    reference (beta), then the accelerate launch keys (accelerate_config, num_processes).
    Learning rate, data and logging are the user's: a commented placeholder. ValueError (one
    line) for a job without --rl grpo|dpo or a plan TRL does not run (_refuse_unrunnable)."""
    rl = plan.get("rl_job")
    if not rl or rl.get("rl") not in ("grpo", "dpo"):
        raise ValueError(TRL_NEEDS_RL)
    _refuse_unrunnable(plan, rl)
    from trainmem.catalog._presets import preset_hub_ids

    from ._launch import _summary, _yaml

    path = preset_hub_ids().get(plan["model"])
    fields: dict[str, Any] = {
        "model_name_or_path": path or "YOUR_MODEL_PATH_OR_HUB_ID",
        "per_device_train_batch_size": plan["micro_batch_size"],
        "gradient_accumulation_steps": plan["grad_accum_steps"],
    }
    fields.update(_grpo_fields(plan, rl) if rl["rl"] == "grpo" else _dpo_fields(plan, rl))
    fields.update(
        bf16=plan["precision"] == "mixed-bf16",
        fp16=plan["precision"] == "mixed-fp16",
        gradient_checkpointing=plan["recompute"] == "full",
        optim=TRL_OPTIMIZERS[plan["optimizer"]],
    )
    if plan.get("attention") == "eager":
        fields["attn_implementation"] = "eager"
    if rl["lora_rank"]:
        targets = str(rl["lora_targets"])
        fields.update(
            use_peft=True,
            lora_r=rl["lora_rank"],
            lora_alpha=2 * rl["lora_rank"],  # not a memory decision: TRL's default ratio
            lora_target_modules=targets if "," not in targets else targets.split(","),
        )
    fields.update(_accelerate_keys(plan))
    return "\n".join([*_comments(plan, rl, _summary(plan)), *_yaml_lists(fields, _yaml)]) + "\n"


def _grpo_fields(plan: dict[str, Any], rl: dict[str, Any]) -> dict[str, Any]:
    """GRPOConfig's group, completion length, generation batch, rollout and beta. GRPOConfig has
    no max_prompt_length (removed in trl 0.28: the dataset's prompts are filtered instead); with
    vLLM the context window vllm_max_model_length is the plan's seq_len (prompt + completion)."""
    n, mb, gpus = rl["rl_group_size"], plan["micro_batch_size"], plan["num_gpus"]
    if plan["global_batch_size"] % n:
        raise ValueError(
            f"format trl: global_batch_size {plan['global_batch_size']} is not a whole number of "
            f"groups of num_generations {n} (GRPOConfig's effective batch must be)"
        )
    out: dict[str, Any] = {"num_generations": n, "max_completion_length": rl["response_len"]}
    completions = rl["rollout_batch_size"] * n
    if completions != mb * gpus * plan["grad_accum_steps"]:  # TRL's default: one step's batch
        if completions % (mb * gpus):
            raise ValueError(
                f"format trl: rollout_batch_size {rl['rollout_batch_size']} x num_generations {n}"
                f" is not a multiple of per_device_train_batch_size {mb} x {gpus} processes "
                "(GRPOConfig's generation_batch_size must be)"
            )
        out["generation_batch_size"] = completions
    if rl["rollout"] == "vllm":
        level = rl["rollout_sleep_level"]
        if level == 1:
            raise ValueError("rollout_sleep_level: format trl sleeps vLLM at 2 or not (0), not 1")
        if gpus % rl["rollout_tp"]:
            raise ValueError(
                f"rollout_tp: vllm_tensor_parallel_size {rl['rollout_tp']} must divide the "
                f"{gpus} processes (TRL's colocated vLLM groups)"
            )
        out.update(
            use_vllm=True,
            vllm_mode="colocate",
            vllm_tensor_parallel_size=rl["rollout_tp"],
            vllm_gpu_memory_utilization=rl["rollout_gpu_memory_utilization"],
            vllm_enable_sleep_mode=level == 2,
            vllm_max_model_length=plan["seq_len"],
        )
    elif rl["rollout"] == "hf":
        out["use_vllm"] = False
    else:
        raise ValueError(f"rollout: format trl rolls out with vllm|hf, not {rl['rollout']}")
    out["beta"] = 0.0 if rl["ref_model"] == "none" else GRPO_KL_BETA
    return out


def _dpo_fields(plan: dict[str, Any], rl: dict[str, Any]) -> dict[str, Any]:
    """DPOConfig's max_length (chosen and rejected each up to it; DPOConfig has no prompt or
    completion length) and the reference: none is the reference log-probs precomputed before
    training (precompute_ref_log_probs), else beta."""
    precompute = rl["ref_model"] == "none"
    return {"max_length": plan["seq_len"], "beta": DPO_BETA, "precompute_ref_log_probs": precompute}


def _accelerate_keys(plan: dict[str, Any]) -> dict[str, Any]:
    """accelerate launch's keys in the file: the DeepSpeed config, the processes, machines and
    the mixed precision (so that zero3.yaml's bf16 does not override an fp16 or fp32 plan)."""
    zero = int(plan["zero"])
    keys: dict[str, Any] = {"accelerate_config": TRL_ACCELERATE_CONFIGS.get(zero, "zero1")}
    if zero == 0:
        keys["zero_stage"] = 0
    keys["num_processes"] = plan["num_gpus"]
    if plan["num_nodes"] > 1:
        keys["num_machines"] = plan["num_nodes"]
    keys["mixed_precision"] = {"mixed-bf16": "bf16", "mixed-fp16": "fp16"}.get(
        plan["precision"], "no"
    )
    return keys


def _comments(plan: dict[str, Any], rl: dict[str, Any], summary: str) -> list[str]:
    """The header: the plan, the launch command, the user's fields, what TRL decides itself."""
    cmd = f"trl {rl['rl']} --config plan.yaml"
    flags = " ".join(f"--{k} {v}" for k, v in _accelerate_keys(plan).items())
    lines = [
        f"# trainmem recommend: {summary}",
        f"# run: {cmd} (the keys from accelerate_config on are accelerate launch's, as "
        f"{cmd} {flags})",
        f"# keys: {TRL_VERSION}; yours to add: dataset_name, learning_rate, output_dir, "
        "report_to ..." + (", reward_funcs" if rl["rl"] == "grpo" else ""),
    ]
    if plan["num_nodes"] > 1:
        lines.append(
            f"# each of the {plan['num_nodes']} nodes: {cmd} --machine_rank RANK "
            "--main_process_ip FIRST_NODE"
        )
    if rl["rl"] == "grpo":
        prompt = plan["seq_len"] - rl["response_len"]
        lines.append(f"# prompts: filter the dataset to at most {prompt} tokens (GRPOConfig has "
                     "no max_prompt_length)")  # fmt: skip
        seqs = plan["micro_batch_size"] * rl["rollout_tp"] * _steps_per_generation(plan, rl)
        if rl["rollout"] == "vllm" and (
            rl["rollout_max_num_seqs"],
            rl["rollout_max_num_batched_tokens"],
        ) != (seqs, TRL_VLLM_MAX_NUM_BATCHED_TOKENS):
            lines.append(
                f"# note: TRL builds vLLM with max_num_seqs {seqs} and max_num_batched_tokens "
                f"{TRL_VLLM_MAX_NUM_BATCHED_TOKENS} (trl/generation/vllm_generation.py); the plan "
                f"was estimated with {rl['rollout_max_num_seqs']} and "
                f"{rl['rollout_max_num_batched_tokens']}: add --rollout-max-num-seqs {seqs} "
                f"--rollout-max-num-batched-tokens {TRL_VLLM_MAX_NUM_BATCHED_TOKENS} to estimate "
                "what TRL runs"
            )
    if rl.get("rl_mean_seq_len"):
        lines.append(f"# estimated with {rl['rl_mean_seq_len']} real tokens per sequence; TRL's "
                     "config does not state them")  # fmt: skip
    return lines


def _steps_per_generation(plan: dict[str, Any], rl: dict[str, Any]) -> int:
    """GRPOConfig.__post_init__'s steps_per_generation: generation_batch_size / (per-device
    batch x processes), by default gradient_accumulation_steps."""
    per_step = plan["micro_batch_size"] * plan["num_gpus"]
    return max(rl["rollout_batch_size"] * rl["rl_group_size"] // per_step, 1)


def _yaml_lists(fields: dict[str, Any], yaml: Any) -> list[str]:
    """Block YAML of `fields` (lists as flow sequences of plain names)."""
    out: list[str] = []
    for key, value in fields.items():
        if isinstance(value, list):
            out.append(f"{key}: [{', '.join(str(v) for v in value)}]")
        else:
            out += yaml({key: value})
    return out
