"""RL post-training phases (engine/_rl.py): vLLM's own KV sizing as golden numbers, the verl
GRPO example pinned, the laws (more utilization, more rollout bytes; offload, less resident),
the reports' keys, and bad input (one line naming the field, exit 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import trainmem
from trainmem.catalog import load_model
from trainmem.cli import app, main
from trainmem.engine import GIB
from trainmem.engine._rl import kv_bytes_per_token, kv_cache_bytes, rollout_weight_bytes

QWEN7B = load_model("qwen2.5-7b")

VERL_GRPO = {
    # verl examples/grpo_trainer/run_qwen2_5-7b_math.sh (commit 7cb8d02f) on 8 GPUs: rollout
    # tp 2, util 0.6, n 5, prompt 1024 + response 1024, 1024 prompts, ppo_mini_batch 256 prompts
    # (x 5 responses), micro 16, log-prob micro 16, gradient checkpointing, ref param_offload.
    "num_gpus": 8,
    "zero": 3,
    "precision": "mixed-bf16",
    "recompute": "full",
    "micro_batch_size": 16,
    "seq_len": 2048,
    "global_batch_size": 1280,
    "rl": "grpo",
    "rollout": "vllm",
    "rollout_tp": 2,
    "rollout_gpu_memory_utilization": 0.6,
    "rl_group_size": 5,
    "response_len": 1024,
    "rollout_batch_size": 1024,
    "ref_model": "offloaded",
    "log_prob_micro_batch_size": 16,
}


def _estimate(**fields):
    return trainmem.estimate(model="qwen2.5-7b", gpu="h100-sxm-80gb", advice=False, **fields)


def test_kv_sizing_matches_vllm() -> None:
    # vllm 0.33.0 vllm/v1/kv_cache_interface.py FullAttentionSpec.real_page_size_bytes with
    # block_size 16, num_kv_heads 4 // tp 2 = 2, head_size = head_size_v = 128, bf16:
    # 16 x 2 x (128 + 128) x 2 = 16,384 bytes per layer per block; x 28 layers = 458,752.
    # max_memory_usage_bytes at max_model_len 2048: cdiv(2048, 16) = 128 blocks.
    per_token = kv_bytes_per_token(QWEN7B, 2)
    assert float(per_token) * 16 == 458_752
    assert float(kv_cache_bytes(per_token, 2048, 1)) == 128 * 458_752
    # A partial block is a whole block: 2049 tokens take 129 blocks.
    assert float(kv_cache_bytes(per_token, 2049, 1)) == 129 * 458_752
    # tp beyond the KV heads replicates one head per rank (get_num_kv_heads: max(1, 4 // 8)).
    assert float(kv_bytes_per_token(QWEN7B, 8)) * 16 == 16 * 1 * 256 * 2 * 28


def test_rollout_weights_are_a_bf16_copy_over_the_rollout_tp() -> None:
    assert float(rollout_weight_bytes(QWEN7B, 2)) == QWEN7B.num_parameters * 2 / 2


def test_verl_grpo_example_pinned() -> None:
    r = _estimate(**VERL_GRPO)
    rl = r["rl"]
    # Regression pins of this model (exact to 0.01 GiB: the formulas are deterministic; a
    # change of a formula re-justifies these). rollout: trainer states 10.64 (fp32 params and
    # Adam states over 8 ranks) + trainer context/NCCL + vLLM 0.6 x 79.19 GiB (CUDA's total,
    # the profile's usable_bytes) + its context and CUDA graphs.
    assert r["phases"]["rollout"] / GIB == pytest.approx(60.74, abs=0.01)
    assert rl["trainer_resident_bytes"] / GIB == pytest.approx(10.64, abs=0.01)
    assert rl["rollout_budget_bytes"] == pytest.approx(0.6 * 85_027_979_264, rel=1e-9)
    assert rl["reference_bytes"] == 0  # ref param_offload
    # 256 sequences in flight (max_num_seqs 256 < 1024 x 5 / 4 engines) x 2048 tokens.
    assert rl["rollout_sequences"] == 256
    assert rl["kv_cache_needed_bytes"] == 256 * 128 * 458_752
    assert rl["kv_cache_available_bytes"] > rl["kv_cache_needed_bytes"]
    assert rl["rollout_starts"]
    # The recipe's 0.6 or safer is what the issue asks: the advice is the smallest budget that
    # holds the 256 sequences in flight without preemption, (7.09 GiB of weights over tp 2 +
    # 14.00 GiB of KV cache + the profile run's activations and non-torch memory) / 79.19 GiB
    # rounded up to 0.30; at most 0.70 fits beside the trainer's 10.64 GiB.
    assert r["advised_rollout_gpu_memory_utilization"] == pytest.approx(0.30)
    assert rl["max_rollout_gpu_memory_utilization"] == pytest.approx(0.70)
    assert (
        r["advised_rollout_gpu_memory_utilization"] <= VERL_GRPO["rollout_gpu_memory_utilization"]
    )
    assert set(r["phases"]) >= {"forward", "backward", "optimizer_step", "rollout", "score"}
    assert r["peak_device_bytes"] == max(r["phases"][k] for k in ("rollout", "score", "train"))


def test_more_utilization_more_rollout_bytes_and_offload_less_resident() -> None:
    low = _estimate(**{**VERL_GRPO, "rollout_gpu_memory_utilization": 0.4})
    high = _estimate(**VERL_GRPO)
    assert high["phases"]["rollout"] > low["phases"]["rollout"]
    assert high["rl"]["kv_cache_available_bytes"] > low["rl"]["kv_cache_available_bytes"]
    off = _estimate(**{**VERL_GRPO, "rl_trainer_offload": "params+optimizer"})
    assert off["rl"]["trainer_resident_bytes"] == 0
    assert off["phases"]["rollout"] < high["phases"]["rollout"]
    assert (
        off["advised_rollout_gpu_memory_utilization"]
        >= high["advised_rollout_gpu_memory_utilization"]
    )


def test_sleep_level_zero_keeps_the_budget_in_the_train_phase() -> None:
    awake = _estimate(**{**VERL_GRPO, "rollout_sleep_level": 0})
    asleep = _estimate(**VERL_GRPO)
    budget = asleep["rl"]["rollout_budget_bytes"]
    assert awake["phases"]["train"] - asleep["phases"]["train"] == pytest.approx(budget, abs=2)


def test_ppo_counts_a_critic_and_dpo_has_no_rollout() -> None:
    ppo = _estimate(**{**VERL_GRPO, "rl": "ppo"})
    assert ppo["rl"]["critic_resident_bytes"] == ppo["rl"]["trainer_resident_bytes"]
    dpo = _estimate(
        num_gpus=8, zero=3, precision="mixed-bf16", recompute="full", micro_batch_size=2, rl="dpo"
    )
    assert "rollout" not in dpo["phases"] and "score" in dpo["phases"]
    assert dpo["advised_rollout_gpu_memory_utilization"] is None
    plain = _estimate(
        num_gpus=8, zero=3, precision="mixed-bf16", recompute="full", micro_batch_size=4
    )
    assert dpo["rl"]["step_peak_device_bytes"] == plain["peak_device_bytes"]  # 2 pairs = 4 seqs


def test_non_rl_report_has_no_rl_keys() -> None:
    r = _estimate(num_gpus=8, zero=3)
    assert "rl" not in r and set(r["phases"]) == {"forward", "backward", "optimizer_step"}


def test_util_too_high_does_not_start() -> None:
    r = _estimate(**{**VERL_GRPO, "rollout_gpu_memory_utilization": 0.95})
    assert not r["rl"]["rollout_starts"] and not r["fits"]


def test_fit_judges_the_rollout_phase() -> None:
    fields = {k: v for k, v in VERL_GRPO.items() if k != "micro_batch_size"}
    loose = trainmem.fit(model="qwen2.5-7b", **fields)
    tight = trainmem.fit(model="qwen2.5-7b", **{**fields, "rollout_gpu_memory_utilization": 0.9})
    assert loose["fits"] and loose["estimate"]["rl"]["rollout_starts"]
    assert not tight["fits"]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--rollout", "vllm"], "rollout:"),
        (
            ["--rl", "grpo", "--rollout-gpu-memory-utilization", "0"],
            "rollout_gpu_memory_utilization",
        ),
        (
            ["--rl", "grpo", "--rollout-gpu-memory-utilization", "1.5"],
            "rollout_gpu_memory_utilization",
        ),
        (["--rl", "grpo", "--rollout-tp", "3"], "rollout_tp"),
        (["--rl", "grpo", "--response-len", "4096", "--seq-len", "2048"], "response_len"),
        (["--rl", "dpo", "--rollout", "vllm"], "rollout:"),
        (["--rl", "sft"], "rl"),
    ],
)
def test_bad_rl_input_is_one_line_exit_2(
    args: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert field in err and len(err.splitlines()) == 1, err


def test_cli_json_has_the_contract_keys() -> None:
    args = ["estimate", "--model", "qwen2.5-7b", "--json", "--rl", "grpo", "--rollout", "vllm"]
    args += ["--rollout-tp", "2", "--rollout-gpu-memory-utilization", "0.6"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert {"rollout", "score", "train"} <= set(report["phases"])
    assert "advised_rollout_gpu_memory_utilization" in report
    text = CliRunner().invoke(app, [a for a in args if a != "--json"])
    assert "KV cache:" in text.output and "advised rollout gpu_memory_utilization" in text.output
    assert np.isfinite(report["rl"]["peak_device_bytes"])


def test_http_estimate_takes_the_rl_fields() -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from trainmem.serve._app import create_app

    with TestClient(create_app()) as http:
        body = {"model": "qwen2.5-7b", **VERL_GRPO}
        got = http.post("/v1/estimate", json=body)
        assert got.status_code == 200, got.text
        report = got.json()
        assert {"rollout", "score", "train"} <= set(report["phases"])
        assert report["advised_rollout_gpu_memory_utilization"] == pytest.approx(0.30)
        bad = http.post("/v1/estimate", json={**body, "rollout_gpu_memory_utilization": 1.5})
        assert bad.status_code in (400, 422) and "rollout_gpu_memory_utilization" in bad.text


def test_sweep_judges_points_on_the_rl_phases(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sweep", "--model", "qwen2.5-7b", "--fleet", "8xh100", "--rl", "grpo"]
    args += ["--rollout-tp", "2", "--rl-group-size", "5", "--response-len", "1024"]
    args += ["--max-pp", "1", "--max-cp", "1", "--json"]
    main([*args, "--rollout-gpu-memory-utilization", "0.6", "--out", str(tmp_path / "a")])
    fitting = json.loads(capsys.readouterr().out)
    best = fitting["top"][0]
    # 0.6 x 79.19 GiB of engine budget alone: the point's peak is its rollout, above it.
    assert best["peak_device_bytes"] > 0.6 * 85_027_979_264
    main([*args, "--rollout-gpu-memory-utilization", "0.9", "--out", str(tmp_path / "b")])
    nothing = json.loads(capsys.readouterr().out)
    assert not nothing["top"]  # 71.3 GiB of budget: no room beside the trainer under 71.3


def test_published_verl_records() -> None:
    """tests/data/published/rl_measurements.json (copied from the rlpub helper, commit 4d66fee)
    through tests/rl_published.py: every record maps or says why not; the one measured GRPO
    record whose metric covers the in-process vLLM pool and whose config trainmem reads fully
    (play-verl Qwen2.5-0.5B, 8 GPUs, util 0.6, no offload) is within the issue's 10%; verl-data's
    six GRPO-LoRA logs, read with the real lengths they print (use_remove_padding), within 15%.
    The others are reported, not asserted: `python -m bench.rl_published` prints them (without
    logged lengths the train step is the padded bound; see docs/estimate.md)."""
    from tests.rl_published import cases, compare

    mapped = [(r, f) for r, f, why in cases() if f is not None or not why]
    assert len(mapped) >= 10
    (record, fields) = next((r, f) for r, f in mapped if r["id"].startswith("verl-playverl-grpo"))
    got = compare(record, fields)
    assert got["peak_phase"] == "rollout"
    # Within the 10% (-8.5% when written: 48.32 vs 52.80 GiB).
    assert abs(got["error"]) < 0.10, got
    # The advice is the recipe's utilization or safer (smaller: more room for the trainer).
    assert got["advised"] <= got["recipe_util"]
    logged = [(r, f) for r, f in mapped if f and f["rl_mean_seq_len"] and r.get("value_gib")]
    errors = sorted(abs(compare(r, f)["error"]) for r, f in logged)
    assert len(errors) == 6
    # -14.2% to +11.0% when written (median |error| 7.7%: 72B math -1.5%, 7B gsm8k -3.9%).
    # 15%: the logs give a step's mean tokens per sequence, not its longest micro-batch's (the
    # math logs' peak step was not found: their last step's lengths), and the vLLM release
    # (its KV sizing) is not printed.
    assert errors[-1] < 0.15 and errors[3] < 0.09, errors


def test_searches_keep_rollout_tp_dividing_the_gpus() -> None:
    """A layout whose GPU count rollout_tp does not divide is invalid in the vector path too
    (engine/_rules.py ROLLOUT_TP_LAYOUT): recommend picked 1 GPU for rollout_tp 2 before."""
    from tests.strategies import columns_of
    from trainmem.catalog import load_model
    from trainmem.engine import estimate as engine_estimate
    from trainmem.engine import make_grid
    from trainmem.engine._rules import REASONS, ROLLOUT_TP_LAYOUT

    m = load_model("qwen2.5-0.5b")
    base = dict(seq_len=512, response_len=256, micro_batch_size=1, rl="grpo", rollout_tp=2)
    rows = [{**base, "num_gpus": n, "global_batch_size": n} for n in (1, 2, 3, 4)]
    reasons = engine_estimate(m, make_grid(columns_of(rows)), columns=["reason"])["reason"]
    assert reasons.tolist() == [ROLLOUT_TP_LAYOUT, 0, ROLLOUT_TP_LAYOUT, 0]
    assert REASONS[ROLLOUT_TP_LAYOUT].startswith("rollout_tp must divide num_gpus")
    plan = trainmem.recommend(
        model="qwen2.5-7b", fleet="8xh100-sxm-80gb", framework="verl", rl="grpo",
        seq_len=1536, response_len=1024, global_batch_size=320, rl_group_size=5,
        rollout_batch_size=64, rollout_tp=2, rollout_gpu_memory_utilization=0.3, lora_rank=32,
        rl_trainer_offload="params+optimizer",
    )  # fmt: skip
    assert plan["num_gpus"] % 2 == 0
    assert all(a["num_gpus"] % 2 == 0 for a in plan["alternatives"])
