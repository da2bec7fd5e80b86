"""The RL fields a job chooses are search axes (issue 29): the rollout engine's tp, the
reference's placement and the verl trainer's offload between phases; without --rl they are
their defaults and the tables leave them out."""

from __future__ import annotations

import json

import pytest

from trainmem.catalog import load_model
from trainmem.cli import main
from trainmem.hardware import load_gpus, parse_fleet
from trainmem.sweep._space import make_space

GPUS = load_gpus()
RL_JOB = dict(rl="grpo", rl_group_size=5, response_len=512)


def space_of(training: dict, model: str = "qwen2.5-7b", framework: str = "verl"):
    return make_space(
        load_model(model),
        parse_fleet("8xh100", GPUS),
        GPUS,
        seq_len=1536,
        global_batch_size=320,
        framework=framework,
        max_pp=1,
        max_cp=1,
        training=training,
    )


def test_rl_axes_of_a_verl_job() -> None:
    space = space_of(RL_JOB)
    # Qwen2.5-7B's 28 attention heads: vLLM runs tp 1, 2 and 4 (not 8) within a node.
    assert space.axes["rollout_tp"] == (1, 2, 4)
    assert space.axes["rl_trainer_offload"] == ("none", "optimizer", "params", "params+optimizer")
    assert space.axes["ref_model"] == ("separate", "offloaded")
    lora = space_of({**RL_JOB, "lora_rank": 32})
    assert lora.axes["ref_model"] == ("shared-lora",)  # the base with the adapters off
    # Another stack: no verl offload between phases, the reference on the GPU.
    other = space_of(RL_JOB, framework="deepspeed")
    assert other.axes["rl_trainer_offload"] == ("none",)
    assert other.axes["ref_model"] == ("separate",)
    assert other.axes["rollout_tp"] == (1, 2, 4)
    # DPO generates nothing: no rollout tp to choose.
    assert space_of({"rl": "dpo"}).axes["rollout_tp"] == (1,)
    # A value the job gives pins its axis.
    pinned = space_of({**RL_JOB, "rollout_tp": 2, "rl_trainer_offload": "optimizer"})
    assert pinned.axes["rollout_tp"] == (2,) and pinned.axes["rl_trainer_offload"] == ("optimizer",)


def test_jobs_without_rl_search_one_value_of_each() -> None:
    space = space_of({})
    assert space.axes["rollout_tp"] == (1,)
    assert space.axes["ref_model"] == ("auto",)
    assert space.axes["rl_trainer_offload"] == ("none",)


def test_sweep_chooses_the_rl_axes(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """On 8 H100s the cheapest Qwen2.5-7B GRPO point keeps the trainer on the GPU (offload
    costs PCIe time every rollout step: 6 copies of the parameter shard, 2 of the optimizer
    states) wherever it fits without; the JSON and the table carry the choice, and a job
    without --rl has no RL column in its table."""
    args = ["sweep", "--model", "qwen2.5-7b", "--fleet", "8xh100", "--framework", "verl"]
    args += ["--seq-len", "1536", "--global-batch-size", "320", "--max-pp", "1", "--max-cp", "1"]
    rl = ["--rl", "grpo", "--rl-group-size", "5", "--response-len", "512"]
    main([*args, *rl, "--json", "--out", str(tmp_path / "a")])
    report = json.loads(capsys.readouterr().out)
    best = report["top"][0]["configuration"]
    assert best["rl_trainer_offload"] == "none"
    assert best["rollout_tp"] in (1, 2, 4) and best["ref_model"] in ("separate", "offloaded")
    main([*args, *rl, "--out", str(tmp_path / "b")])
    table = capsys.readouterr().out
    assert " rtp " in table and " rl_offload " in table
    main([*args, "--out", str(tmp_path / "c")])
    table = capsys.readouterr().out
    assert " rtp " not in table and "rl_offload" not in table


def test_offload_is_chosen_where_only_it_fits(tmp_path, capsys) -> None:
    """Qwen2-1.5B GRPO on one A100 40GB, verl's default 0.5 engine budget: its trainer (about
    25 GiB of parameters, master copy and AdamW states) fits its own step, not beside the
    engine's 20 GiB, so every fitting point moves the trainer's optimizer states (or more) to
    the host during the rollout (ZeRO offload pinned off: that is the other way)."""
    args = ["sweep", "--model", "qwen2-1.5b", "--fleet", "1xa100-sxm-40gb", "--framework"]
    args += ["verl", "--seq-len", "1024", "--global-batch-size", "40", "--max-pp", "1"]
    args += ["--max-cp", "1", "--rl", "grpo", "--rl-group-size", "5", "--response-len", "512"]
    args += ["--offload", "none", "--json"]
    main([*args, "--out", str(tmp_path / "a")])
    report = json.loads(capsys.readouterr().out)
    assert report["top"], "something fits"
    assert all(p["configuration"]["rl_trainer_offload"] != "none" for p in report["top"])
    assert report["top"][0]["configuration"]["rl_trainer_offload"] == "optimizer"
    main([*args, "--rl-trainer-offload", "none", "--out", str(tmp_path / "b")])
    assert not json.loads(capsys.readouterr().out)["top"]  # pinned off: nothing fits
