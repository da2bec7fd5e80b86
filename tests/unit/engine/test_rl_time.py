"""The RL step's time terms (engine/_rl_time.py): golden values worked by hand, what each
choice costs, and verl's own timing logs (tests/data/published/rl_timing.json)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from trainmem.catalog import load_model
from trainmem.engine import DEFAULTS_BY_FIELD, TimeParams, estimate_time, make_grid, time_inputs
from trainmem.hardware import get_gpu

RL_COLUMNS = ("rl_rollout_s", "rl_score_s", "rl_critic_s", "rl_sync_s", "rl_offload_s")
BASE = dict(
    num_gpus=8, zero=3, seq_len=1024, response_len=512, micro_batch_size=4,
    global_batch_size=64, framework="verl",
)  # fmt: skip


def timed(model: str, rows: list[dict[str, Any]], **params: float) -> dict[str, np.ndarray]:
    cols = {k: np.array([r.get(k, DEFAULTS_BY_FIELD[k]) for r in rows]) for k in set().union(*rows)}
    gpu = get_gpu("h100-sxm-80gb")
    return estimate_time(
        load_model(model), make_grid(cols), params=TimeParams(**params), **time_inputs(gpu)
    )


def test_rows_without_rl_have_no_rl_time() -> None:
    t = timed("qwen2.5-0.5b", [dict(BASE), dict(BASE, rl="grpo", rl_group_size=8)])
    for k in RL_COLUMNS:
        assert t[k][0] == 0.0, k
    rl = sum(t[k][1] for k in RL_COLUMNS)
    # The RL row's step is its trainer's (the same as the first row's: same batch) plus them.
    assert t["step_time_s"][1] == pytest.approx(t["step_time_s"][0] + rl, rel=1e-12)


def test_rollout_time_by_hand() -> None:
    """Qwen2.5-0.5B GRPO on 8 H100s, 64 sequences per step (8 prompts x 8), rollout tp 1: 8
    engines of 8 sequences, one wave of 512 decode steps. One step reads the bf16 weights
    (494,032,768 x 2 B) and the KV cache of 8 sequences at mean context 1024 - 256 = 768
    (24 layers x K,V x 2 heads x 64 x 2 B = 12,288 B a token): 1.0635 GB at 0.8 x 3.35 TB/s
    = 0.397 ms, plus the 15 ms step overhead; the prefill is 2 x N x 8 x 512 FLOPs at
    0.76 x 989.4 TFLOP/s = 5.4 ms. One optimizer step per rollout step."""
    t = timed("qwen2.5-0.5b", [dict(BASE, rl="grpo", rl_group_size=8)])
    n = 494_032_768
    read = n * 2 + 8 * 768 * 12_288
    step = read / (0.8 * 3.35e12) + 0.015
    prefill = 2 * n * 8 * 512 / (0.76 * 989.4e12)
    assert t["rl_rollout_s"][0] == pytest.approx(512 * step + prefill, rel=1e-9)
    # 64 prompts x 8 per rollout step: 64 sequences per engine in 8 waves of max_num_seqs 8,
    # which feed 8 optimizer steps: per optimizer step the same as above.
    many = dict(BASE, rl="grpo", rl_group_size=8, rollout_batch_size=64, rollout_max_num_seqs=8)
    t8 = timed("qwen2.5-0.5b", [many])
    assert t8["rl_rollout_s"][0] == pytest.approx(t["rl_rollout_s"][0], rel=1e-9)


def test_offload_time_by_hand() -> None:
    """params+optimizer offload of Qwen2.5-7B (7,615,616,512 parameters) over 8 GPUs, mixed
    bf16: 6 copies of the 2 + 4 B parameter shard and 2 of the 8 B optimizer-state shard, at
    0.8 x 63 GB/s of PCIe 5; one optimizer step per rollout step (64 responses)."""
    row = dict(BASE, rl="grpo", rl_group_size=8, precision="mixed-bf16")
    t = timed("qwen2.5-7b", [row, dict(row, rl_trainer_offload="params+optimizer")])
    n = 7_615_616_512
    moved = (6 * n * 6 + 2 * n * 8) / 8
    assert t["rl_offload_s"][0] == 0.0
    assert t["rl_offload_s"][1] == pytest.approx(moved / (0.8 * 63e9), rel=1e-9)
    assert t["step_time_s"][1] - t["step_time_s"][0] == pytest.approx(t["rl_offload_s"][1])


def test_what_each_algorithm_runs() -> None:
    """DPO: no rollout, sync or critic; its reference forward over chosen and rejected. PPO:
    the critic's update (a step like the actor's) and its values forward. LoRA: the sync
    sends the adapters only."""
    t = timed(
        "qwen2.5-0.5b",
        [
            dict(BASE, rl="dpo"),
            dict(BASE, rl="ppo", rl_group_size=1),
            dict(BASE, rl="grpo", rl_group_size=8),
            dict(BASE, rl="grpo", rl_group_size=8, lora_rank=16),
        ],
    )
    assert t["rl_rollout_s"][0] == t["rl_sync_s"][0] == t["rl_critic_s"][0] == 0.0
    assert t["rl_score_s"][0] > 0.0
    trainer_ppo = t["step_time_s"][1] - sum(t[k][1] for k in RL_COLUMNS)
    assert t["rl_critic_s"][1] == pytest.approx(trainer_ppo, rel=1e-12)
    # PPO scores old policy, reference and values (3 forwards); GRPO old policy and reference.
    assert t["rl_score_s"][1] / t["rl_score_s"][2] == pytest.approx(1.5, rel=1e-9)
    assert t["rl_sync_s"][3] < 0.05 * t["rl_sync_s"][2]  # 8.8M adapters of 494M weights


def test_against_verl_logs() -> None:
    """tests/rl_timing.py (bench/rl_time.py prints it): five verl runs' timing_s/gen against
    the rollout + sync estimate per rollout step. 0.45x-2.5x: the decode overhead per step is
    one fitted constant (rollout_step_overhead_s, geometric mean 1 over these runs) while the
    runs' own range from 7 to 33 ms, and the estimate bounds every response at response_len
    (the logs' longest are 73-100% of it)."""
    from tests.rl_timing import rows

    ratios = [r["est"]["gen"] / r["measured"]["gen"] for r in rows()]
    assert len(ratios) == 5
    assert all(0.45 < x < 2.5 for x in ratios), ratios
    assert 0.8 < float(np.exp(np.mean(np.log(ratios)))) < 1.25, ratios
