"""The verl reader (stacks/_verl.py) on verl's own example scripts (tests/data/stacks/verl,
PROVENANCE.md) and on a YAML of verl's config tree.

Each expected table was written by reading the script against verl b178a3c's defaults
(verl/trainer/config/_generated_ppo_trainer.yaml): (field, value, the key it comes from)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmem.cli import main
from trainmem.stacks import check_report, detect, parse, read_job

DATA = Path(__file__).parents[2] / "data" / "stacks" / "verl"
A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."

EXPECTED: dict[str, list[tuple[str, object, str]]] = {
    "qwen2-14b_grpo-lora_2_h100_fsdp_vllm.sh": [
        ("model", "Qwen/Qwen2.5-14B-Instruct", "actor_rollout_ref.model.path"),
        ("rl", "grpo", "algorithm.adv_estimator"),
        ("num_gpus", 2, "trainer.n_gpus_per_node"),  # 2 per node x 1 node
        ("seq_len", 1536, "data.max_prompt_length"),  # 512 + 1024
        ("response_len", 1024, "data.max_response_length"),
        ("rollout_batch_size", 116, "data.train_batch_size"),  # 58 x 1 x 2
        ("rl_group_size", 5, R + "n"),
        ("global_batch_size", 580, A + "ppo_mini_batch_size"),  # 116 prompts x n 5
        ("micro_batch_size", 58, A + "ppo_micro_batch_size"),  # global 116 / 2 GPUs
        ("log_prob_micro_batch_size", 58, R + "log_prob_micro_batch_size"),
        ("rollout", "vllm", R + "name"),
        ("rollout_tp", 2, R + "tensor_model_parallel_size"),
        ("rollout_gpu_memory_utilization", 0.25, R + "gpu_memory_utilization"),
        ("rollout_max_num_seqs", 512, R + "max_num_seqs"),
        ("rollout_max_num_batched_tokens", 1536, R + "max_num_batched_tokens"),
        ("lora_rank", 32, "actor_rollout_ref.model.lora_rank"),
        ("lora_targets", "all-linear", "actor_rollout_ref.model.target_modules"),
        ("recompute", "full", "actor_rollout_ref.model.enable_gradient_checkpointing"),
        ("rl_trainer_offload", "params+optimizer", A + "fsdp_config.param_offload"),
        ("ref_model", "shared-lora", "actor_rollout_ref.model.lora_rank"),
    ],
    "run_qwen2-7b_seq_balance.sh": [
        ("model", "Qwen/Qwen2-7B-Instruct", "actor_rollout_ref.model.path"),
        ("rl", "grpo", "algorithm.adv_estimator"),
        ("num_gpus", 8, "trainer.n_gpus_per_node"),
        ("rollout_batch_size", 1024, "data.train_batch_size"),
        ("global_batch_size", 1280, A + "ppo_mini_batch_size"),  # 256 x 5
        ("rl_max_token_len_per_gpu", 24000, A + "ppo_max_token_len_per_gpu"),  # use_dynamic_bsz
        ("rollout", "sglang", R + "name"),  # $rollout_name, set above the command
        ("rollout_gpu_memory_utilization", 0.6, R + "gpu_memory_utilization"),
        ("ref_model", "offloaded", "actor_rollout_ref.ref.fsdp_config.param_offload"),
        ("rl_trainer_offload", "none", A + "fsdp_config.param_offload"),
    ],
    "run_deepseek7b_llm.sh": [
        ("model", "deepseek-ai/deepseek-llm-7b-chat", "actor_rollout_ref.model.path"),
        ("rl", "ppo", "algorithm.adv_estimator"),  # gae: a critic
        ("micro_batch_size", 16, A + "ppo_micro_batch_size_per_gpu"),
        ("log_prob_micro_batch_size", 32, R + "log_prob_micro_batch_size_per_gpu"),
        ("rollout_tp", 4, R + "tensor_model_parallel_size"),
        ("seq_len", 1024, "data.max_prompt_length"),
    ],
}


def _files(name: str) -> dict[str, str]:
    return {name: (DATA / name).read_text()}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reads_verls_own_scripts(name: str) -> None:
    reading = read_job(_files(name))
    assert reading.stack == "verl"
    for field, value, key in EXPECTED[name]:
        read = reading.fields[field]
        assert (read.value, read.origin) == (value, f"file:{key}"), field
    assert reading.get("framework") == "verl"
    assert reading.fields["zero"].origin.startswith("stack-default:verl b178a3c")


def test_defaults_where_the_script_is_silent() -> None:
    reading = read_job(_files("run_qwen2-7b_seq_balance.sh"))
    # max_num_seqs / max_num_batched_tokens from verl's generated config
    for field, value in (("rollout_max_num_seqs", 256), ("rollout_max_num_batched_tokens", 8192)):
        read = reading.fields[field]
        assert read.value == value and "_generated_ppo_trainer.yaml" in read.origin, field
    # the deepseek PPO script has no KL term: verl builds no reference policy
    ppo = read_job(_files("run_deepseek7b_llm.sh"))
    assert ppo.get("ref_model") == "none"
    assert ppo.get("response_len") == 512 and ppo.get("global_batch_size") == 256  # n 1


def test_unmodelled_keys_are_said() -> None:
    reading = read_job(_files("qwen2-14b_grpo-lora_2_h100_fsdp_vllm.sh"))
    name = "qwen2-14b_grpo-lora_2_h100_fsdp_vllm.sh"
    assert reading.unmodelled == [
        f"{name}:{A}ulysses_sequence_parallel_size",
        f"{name}:{A}entropy_coeff",
    ]
    assert any("use_remove_padding: the train and score steps are the padded bound" in w
               for w in reading.warnings)  # fmt: skip
    # packed by tokens (use_dynamic_bsz): no padded-bound warning; entropy_coeff 0 is modelled
    packed = read_job(_files("run_qwen2-7b_seq_balance.sh"))
    assert not packed.unmodelled
    assert not any("use_remove_padding" in w for w in packed.warnings)


def test_the_tuning_recipe_reads_as_the_published_record_maps() -> None:
    """The reader and tests/rl_published.py (which maps the record of the same recipe by hand,
    verl-tuning-qwen2.5-14b-grpo-lora-2xh100-fits) give the same estimate fields."""
    from tests.rl_published import cases

    fields = next(
        f for r, f, _ in cases() if r["id"] == "verl-tuning-qwen2.5-14b-grpo-lora-2xh100-fits"
    )
    assert fields is not None
    report = check_report(_files("qwen2-14b_grpo-lora_2_h100_fsdp_vllm.sh"))
    config = report["config"]
    for key, value in fields.items():
        if key in ("model", "gpu"):
            continue
        assert config[key] == value, key
    assert report["model"] == fields["model"] == "qwen2.5-14b"


def test_a_yaml_of_verls_config_tree() -> None:
    text = """
algorithm:
  adv_estimator: grpo
data:
  train_batch_size: 64
  max_prompt_length: 512
  max_response_length: 1024
trainer:
  n_gpus_per_node: 8
  nnodes: 1
actor_rollout_ref:
  model:
    path: Qwen/Qwen2.5-7B-Instruct
    lora_rank: 32
    enable_gradient_checkpointing: true
  actor:
    ppo_mini_batch_size: 64
    ppo_micro_batch_size: 64
    ppo_micro_batch_size_per_gpu: null
    use_kl_loss: true
    fsdp_config: {param_offload: true, optimizer_offload: true}
  rollout:
    name: vllm
    n: 5
    tensor_model_parallel_size: 2
    gpu_memory_utilization: 0.2
    log_prob_micro_batch_size: 64
"""
    assert detect(parse("verl.yaml", text)) == "verl"
    reading = read_job({"verl.yaml": text})
    got = {k: reading.get(k) for k in ("micro_batch_size", "global_batch_size", "ref_model",
                                       "rl_trainer_offload", "rollout_tp", "num_gpus")}  # fmt: skip
    assert got == {
        "micro_batch_size": 8,  # the deprecated global 64 over 8 GPUs; _per_gpu null
        "global_batch_size": 320,
        "ref_model": "shared-lora",
        "rl_trainer_offload": "params+optimizer",
        "rollout_tp": 2,
        "num_gpus": 8,
    }
    assert reading.fields["micro_batch_size"].origin == f"file:{A}ppo_micro_batch_size"


def test_not_verl() -> None:
    assert detect(parse("train.sh", "torchrun --nproc_per_node 8 train.py --lr 1e-4\n")) != "verl"
    assert detect(parse("x.yaml", "data:\n  train_batch_size: 8\n")) != "verl"


def test_bad_value_is_one_line_naming_the_key(tmp_path: Path, capsys) -> None:
    script = tmp_path / "run.sh"
    script.write_text(
        "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo "
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct actor_rollout_ref.rollout.n=five\n"
    )
    assert main(["check", str(script)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert err == [f"error: {script}: {R}n: expected an integer, got 'five'"], err
    assert captured.out == ""


def test_check_with_the_expected_lengths(capsys) -> None:
    """The CLI with a flag over the file: the expected real tokens per sequence."""
    path = str(DATA / "qwen2-14b_grpo-lora_2_h100_fsdp_vllm.sh")
    code = main(["check", path, "--rl-mean-seq-len", "390", "--json"])
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["config"]["rl_mean_seq_len"] == 390
    assert report["read"]["rl_mean_seq_len"]["from"] == "flag"
    assert report["rl"]["peak_phase"] == "train"
    assert code in (0, 1)
