"""`recommend --format trl` (plan/_trl.py): the fields of TRL's GRPO / DPO config YAML a plan
decides, with their values, and the plans and jobs it refuses (one line; exit 2 before any
search on the CLI). The round trip through `trainmem check` is tests/unit/stacks/
test_round_trip.py."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

import trainmem
from trainmem.plan import FORMATS, render
from trainmem.plan._trl import TRL_NEEDS_RL

GRPO = dict(model="qwen2.5-7b", fleet="8xh100-sxm-80gb", rl="grpo", seq_len=1536,
            response_len=1024, global_batch_size=256, rl_group_size=8, rollout_tp=2,
            rollout_gpu_memory_utilization=0.3, lora_rank=32,
            lora_targets="q_proj,v_proj")  # fmt: skip
DPO = dict(model="qwen2.5-7b", fleet="8xh100-sxm-80gb", rl="dpo", seq_len=2048,
           global_batch_size=64, ref_model="none")  # fmt: skip


@pytest.fixture(scope="module")
def grpo() -> dict[str, Any]:
    return trainmem.recommend(**GRPO, framework="deepspeed")


@pytest.fixture(scope="module")
def dpo() -> dict[str, Any]:
    return trainmem.recommend(**DPO, framework="deepspeed")


def _fields(text: str) -> dict[str, Any]:
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def test_trl_is_a_format() -> None:
    assert "trl" in FORMATS


def test_grpo_fields(grpo: dict[str, Any]) -> None:
    assert grpo["fits"] and grpo["framework"] == "deepspeed"
    text = render(grpo, "trl")
    got = _fields(text)
    mb, accum = grpo["micro_batch_size"], grpo["grad_accum_steps"]
    assert got == {
        "model_name_or_path": "Qwen/Qwen2.5-7B",
        "per_device_train_batch_size": mb,
        "gradient_accumulation_steps": accum,
        "num_generations": 8,
        "max_completion_length": 1024,
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_tensor_parallel_size": 2,
        "vllm_gpu_memory_utilization": 0.3,
        "vllm_enable_sleep_mode": True,  # the plan's sleep level 2
        "vllm_max_model_length": 1536,  # prompt + completion: GRPOConfig has no prompt length
        "beta": 0.04,  # the reference (the LoRA base) is loaded
        "bf16": True,
        "fp16": False,
        "gradient_checkpointing": grpo["recompute"] == "full",
        "optim": "adamw_torch",
        "use_peft": True,
        "lora_r": 32,
        "lora_alpha": 64,
        "lora_target_modules": ["q_proj", "v_proj"],
        "accelerate_config": {1: "zero1", 2: "zero2", 3: "zero3"}.get(grpo["zero"], "zero1"),
        **({"zero_stage": 0} if grpo["zero"] == 0 else {}),
        "num_processes": grpo["num_gpus"],
        "mixed_precision": "bf16",
    }
    assert mb * accum * grpo["num_gpus"] == 256  # TRL's default generation batch: one step's
    assert "# run: trl grpo --config plan.yaml" in text
    assert "# prompts: filter the dataset to at most 512 tokens" in text
    # The plan was asked with vLLM's default max_num_batched_tokens, not the 4096 TRL builds
    assert "--rollout-max-num-batched-tokens 4096" in text


def test_grpo_without_reference_or_vllm(grpo: dict[str, Any]) -> None:
    rl = {**grpo["rl_job"], "ref_model": "none", "rollout": "hf"}
    got = _fields(render({**grpo, "rl_job": rl}, "trl"))
    assert got["beta"] == 0.0 and got["use_vllm"] is False
    assert not any(k.startswith("vllm_") for k in got)


def test_grpo_generation_batch(grpo: dict[str, Any]) -> None:
    """A rollout of other than one step's prompts is generation_batch_size completions."""
    per_step = grpo["micro_batch_size"] * grpo["num_gpus"]
    rl = {**grpo["rl_job"], "rollout_batch_size": per_step * 2}
    got = _fields(render({**grpo, "rl_job": rl}, "trl"))
    assert got["generation_batch_size"] == per_step * 2 * 8


def test_dpo_fields(dpo: dict[str, Any]) -> None:
    assert dpo["fits"] and dpo["rl_job"]["ref_model"] == "none"
    got = _fields(render(dpo, "trl"))
    assert got["max_length"] == 2048
    assert got["precompute_ref_log_probs"] is True  # reference-free: scored before training
    assert got["beta"] == 0.1
    assert "num_generations" not in got and "use_peft" not in got
    assert got["num_processes"] == dpo["num_gpus"]
    with_ref = {**dpo, "rl_job": {**dpo["rl_job"], "ref_model": "separate"}}
    assert _fields(render(with_ref, "trl"))["precompute_ref_log_probs"] is False


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tp": 2}, "format trl: TRL's trainers are data parallel (tp 1, pp 1, cp 1, ep 1); "
                    "the plan has tp 2 pp 1 cp 1 ep 1"),
        ({"offload": "optimizer"}, "offload: format trl's accelerate configs (zero1|zero2|zero3) "
                                   "offload none, not optimizer"),
        ({"rl_job": {"rollout_sleep_level": 1}}, "rollout_sleep_level: format trl sleeps vLLM "
                                                 "at 2 or not (0), not 1"),
        ({"rl_job": {"rollout": "sglang"}}, "rollout: format trl rolls out with vllm|hf, not "
                                            "sglang"),
        ({"rl_job": {"rl_trainer_offload": "params"}}, "rl_trainer_offload: format trl runs "
                                                       "none (TRL's trainers), not params"),
        ({"rl_job": {"rl": "ppo"}}, TRL_NEEDS_RL),
        ({"framework": "hf"}, "framework: format trl launches deepspeed, not hf"),
    ],
)  # fmt: skip
def test_refusals(grpo: dict[str, Any], change: dict[str, Any], message: str) -> None:
    plan = {**grpo, **change}
    if "rl_job" in change:
        plan["rl_job"] = {**grpo["rl_job"], **change["rl_job"]}
    with pytest.raises(ValueError) as err:
        render(plan, "trl")
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("rl", [None, "ppo"])
def test_cli_refuses_a_job_without_grpo_or_dpo_before_the_search(
    rl: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """One line, exit 2, nothing on stdout and no search (no re-plan note)."""
    from trainmem.cli import main

    args = ["recommend", "--model", "qwen2.5-0.5b", "--fleet", "8xh100-sxm-80gb",
            "--global-batch-size", "64", "--format", "trl"]  # fmt: skip
    code = main(args + (["--rl", rl] if rl else []))
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.strip().splitlines() == [f"error: {TRL_NEEDS_RL}"]
    assert "PPO" in TRL_NEEDS_RL
