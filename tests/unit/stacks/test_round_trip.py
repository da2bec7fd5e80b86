"""Every launch config `recommend` writes is read back by `check` to the plan it was rendered
from: the layout, batch, precision, recompute and offload fields, and the same peak.

Flags are given only for what a format does not carry: the GPU (but for sbatch's --gres), the
model (a DeepSpeed JSON, an accelerate config, a Trainer launch line name none), the sequence
length and the Trainer's batch arguments where they are a comment of the file. Megatron runs Adam
fused (megatron/core/optimizer/__init__.py: Transformer Engine's or apex's FusedAdam; there is no
foreach AdamW to ask for), so a Megatron plan of torch's AdamW reads back as adamw-fused: the
peak is compared with the plan's optimizer given as the flag, and the difference is said here
rather than hidden.
"""

from __future__ import annotations

from typing import Any

import pytest

import trainmem
from trainmem.plan import render
from trainmem.stacks import check_report

FIELDS = ("num_gpus", "tp", "pp", "cp", "zero", "micro_batch_size", "precision", "recompute",
          "offload", "framework")  # fmt: skip

JOBS = {
    "deepspeed": dict(model="llama-3.2-1b", fleet="8xh100-sxm-80gb", framework="deepspeed",
                      seq_len=2048, global_batch_size=64),
    "deepspeed-offload": dict(model="llama-3.1-8b", fleet="2xa10g", framework="deepspeed",
                              seq_len=1024, global_batch_size=16, max_pp=1, max_cp=1),
    "megatron": dict(model="llama-3.1-8b", fleet="16xh100-sxm-80gb", framework="megatron",
                     seq_len=4096, global_batch_size=256),
    "hf": dict(model="llama-3.2-1b", fleet="8xh100-sxm-80gb", framework="hf", seq_len=2048,
               global_batch_size=64),
    "torchtitan": dict(model="llama-3.1-8b", fleet="8xh100-sxm-80gb", framework="torchtitan",
                       seq_len=8192, global_batch_size=64),
}  # fmt: skip


@pytest.fixture(scope="module")
def plans() -> dict[str, dict[str, Any]]:
    return {name: trainmem.recommend(**job) for name, job in JOBS.items()}


def _trainer_flags(plan: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    """What a Trainer script's own arguments say (the model, the length, the batch)."""
    gbs = plan["micro_batch_size"] * plan["grad_accum_steps"] * plan["dp"]
    return {"model": job["model"], "seq_len": job["seq_len"], "global_batch_size": gbs}


CASES = [
    ("deepspeed", "deepspeed", ("deepspeed",)),
    ("deepspeed-offload", "deepspeed", ("deepspeed",)),
    ("deepspeed", "deepspeed", ("torchrun", "deepspeed")),
    ("deepspeed", "deepspeed", ("slurm", "deepspeed")),
    ("megatron", "megatron", ("torchrun",)),
    ("megatron", "megatron", ("slurm",)),
    ("hf", "accelerate", ("accelerate",)),
    ("torchtitan", "torchtitan", ("torchtitan",)),
]
NAMES = {"deepspeed": "ds_config.json", "torchrun": "run.sh", "slurm": "job.sbatch",
         "accelerate": "accelerate.yaml", "torchtitan": "train.sh"}  # fmt: skip


def _id(value: Any) -> str:
    return "+".join(value) if isinstance(value, tuple) else str(value)


@pytest.mark.parametrize(("job", "stack", "formats"), CASES, ids=_id)
def test_recommend_reads_back_to_its_plan(
    plans: dict[str, dict[str, Any]], job: str, stack: str, formats: tuple[str, ...]
) -> None:
    plan = plans[job]
    assert plan["fits"]
    files = {NAMES[f]: render(plan, f) for f in formats}
    flags: dict[str, Any] = {}
    if job.startswith("deepspeed") or job == "hf":
        flags = _trainer_flags(plan, JOBS[job])
    if formats == ("deepspeed",):
        flags["num_gpus"] = plan["num_gpus"]  # a DeepSpeed JSON alone says no GPU count
    if job == "hf":
        flags["micro_batch_size"] = plan["micro_batch_size"]  # a comment of the YAML
    if job == "megatron":
        flags["optimizer"] = plan["optimizer"]  # see the module docstring
    if "slurm" not in formats:
        flags["gpu"] = plan["gpu"]  # only an sbatch script's --gres names the GPU
    report = check_report(files, **flags)
    assert report["stack"] == stack
    assert report["unmodelled"] == []
    for field in FIELDS:
        assert report["config"][field] == plan[field], field
        if field not in flags:
            assert (
                report["read"][field]["from"] != "trainmem-default"
                or plan[field] == (report["read"][field]["value"])
            ), field
    gbs = plan["micro_batch_size"] * plan["grad_accum_steps"] * plan["dp"]
    assert report["config"]["global_batch_size"] in (0, gbs)
    assert report["config"]["optimizer"] == plan["optimizer"]
    assert report["peak_device_bytes"] == pytest.approx(plan["peak_device_bytes"], abs=1)


def test_megatron_plan_reads_back_as_fused_adam(plans: dict[str, dict[str, Any]]) -> None:
    """Without the flag, the Megatron script reads back as what Megatron runs."""
    plan = plans["megatron"]
    report = check_report({"run.sh": render(plan, "torchrun")})
    assert report["read"]["optimizer"]["value"] == "adamw-fused"
    # Fused: no foreach temporaries at the step, a device step counter per tensor; the peak of
    # this plan is not at the step, so they differ by the counters only.
    assert report["peak_device_bytes"] == pytest.approx(plan["peak_device_bytes"], rel=1e-5)


RL_JOBS = {
    # GRPO with LoRA, the trainer offloaded, the reference the LoRA base (verl-data's shape)
    "grpo-lora": dict(model="qwen2.5-7b", fleet="8xh100-sxm-80gb", framework="verl", rl="grpo",
                      seq_len=1536, response_len=1024, global_batch_size=320, rl_group_size=5,
                      rollout_batch_size=64, rollout_tp=2, rollout_gpu_memory_utilization=0.3,
                      lora_rank=32, rl_trainer_offload="params+optimizer"),
    # PPO with a critic, packed by tokens, an offloaded reference
    "ppo-packed": dict(model="qwen2-1.5b", fleet="8xh100-sxm-80gb", framework="verl", rl="ppo",
                       seq_len=2048, response_len=1024, global_batch_size=256, rl_group_size=1,
                       rl_max_token_len_per_gpu=8192, ref_model="offloaded"),
}  # fmt: skip
RL_FIELDS = ("rl", "rollout", "rollout_tp", "rollout_gpu_memory_utilization", "rl_group_size",
             "response_len", "rollout_batch_size", "rollout_max_num_seqs",
             "rollout_max_num_batched_tokens", "ref_model", "rl_trainer_offload",
             "log_prob_micro_batch_size", "rl_max_token_len_per_gpu", "lora_rank")  # fmt: skip


@pytest.mark.parametrize("job", sorted(RL_JOBS))
def test_verl_recipe_reads_back_to_its_plan(job: str) -> None:
    """`recommend --format verl` of an RL job is read back by `check` (stacks/_verl.py) to the
    plan's layout and RL fields, and the same peak (the GPU is a flag: verl's config names
    none)."""
    plan = trainmem.recommend(**RL_JOBS[job])
    assert plan["fits"]
    report = check_report({"run.sh": render(plan, "verl")}, gpu=plan["gpu"])
    assert report["stack"] == "verl"
    for field in (*FIELDS, "seq_len", "global_batch_size"):
        assert report["config"][field] == plan[field], field
    for field in RL_FIELDS:
        assert report["config"][field] == plan["rl_job"][field], field
    assert report["peak_device_bytes"] == pytest.approx(plan["peak_device_bytes"], abs=1)


def test_verl_format_needs_an_rl_job() -> None:
    plan = trainmem.recommend(**JOBS["hf"])
    with pytest.raises(ValueError, match="format verl: an RL job"):
        render({**plan, "framework": "verl"}, "verl")


def test_verl_format_of_a_job_without_rl_is_refused_before_the_search(capsys) -> None:
    """One line, exit 2, nothing on stdout and no search (no re-plan note)."""
    from trainmem.cli import main

    code = main(["recommend", "--model", "qwen2.5-0.5b", "--fleet", "8xh100-sxm-80gb",
                 "--global-batch-size", "64", "--format", "verl"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.strip().splitlines() == [
        "error: format verl: an RL job (--rl grpo|ppo) renders as a verl recipe"
    ]


TRL_JOBS = {
    # GRPO with LoRA, vLLM colocated (TP 2, TRL's 0.3 utilization, asleep at level 2 while
    # training), the reference the LoRA base (beta > 0); TRL builds vLLM's max_num_seqs and
    # max_num_batched_tokens itself (plan/_trl.py), so the plan is asked with them.
    "grpo-lora": dict(model="qwen2.5-7b", fleet="8xh100-sxm-80gb", framework="deepspeed",
                      rl="grpo", seq_len=1536, response_len=1024, global_batch_size=256,
                      rl_group_size=8, rollout_tp=2, rollout_gpu_memory_utilization=0.3,
                      lora_rank=32, rollout_max_num_batched_tokens=4096),
    # DPO of the full model with its reference (DPOConfig's beta, ZeRO-3 over the GPUs)
    "dpo": dict(model="qwen2.5-7b", fleet="8xh100-sxm-80gb", framework="deepspeed", rl="dpo",
                seq_len=2048, global_batch_size=64),
}  # fmt: skip


def _trl_plan(job: str) -> dict[str, Any]:
    """The plan of TRL_JOBS[job]; a GRPO plan asked again with the max_num_seqs TRL builds for
    its micro-batch (trl/generation/vllm_generation.py: per-device batch x vLLM TP x
    steps_per_generation), which must not change the layout."""
    plan = trainmem.recommend(**TRL_JOBS[job])
    if job.startswith("grpo"):
        rl = plan["rl_job"]
        seqs = plan["micro_batch_size"] * rl["rollout_tp"] * plan["grad_accum_steps"]
        again = trainmem.recommend(**TRL_JOBS[job], rollout_max_num_seqs=seqs)
        assert {f: again[f] for f in FIELDS} == {f: plan[f] for f in FIELDS}
        plan = again
    return plan


@pytest.mark.parametrize("job", sorted(TRL_JOBS))
def test_trl_config_reads_back_to_its_plan(job: str) -> None:
    """`recommend --format trl` of a GRPO or DPO job is read back by `check` (stacks/_hf.py, the
    accelerate keys TRL's CLI passes on included) to the plan's layout, its RL job (auto and 0
    resolved as the plan resolves them) and the same peak; the GPU is a flag."""
    from trainmem.plan._recommend import rl_job

    plan = _trl_plan(job)
    assert plan["fits"]
    text = render(plan, "trl")
    assert "# note:" not in text  # the plan is what TRL runs
    report = check_report({"plan.yaml": text}, gpu=plan["gpu"])
    assert report["stack"] == "hf"
    assert report["unmodelled"] == []
    for field in (*FIELDS, "seq_len", "global_batch_size", "optimizer"):
        assert report["config"][field] == plan[field], field
    read = rl_job(report["config"], report["config"])
    assert read is not None
    fields = RL_FIELDS if job.startswith("grpo") else ("rl", "rollout", "ref_model", "lora_rank")
    for field in (*fields, "rollout_sleep_level"):
        assert read[field] == plan["rl_job"][field], field
    assert report["peak_device_bytes"] == pytest.approx(plan["peak_device_bytes"], abs=1)
