"""Expert tensor parallelism and the expert capacity factor."""

from __future__ import annotations

import pytest

from trainmem.catalog import load_model
from trainmem.engine import estimate, make_grid
from trainmem.engine._activations import hf_moe_bytes


def _expert_numel(name: str) -> int:
    m = load_model(name)
    return sum(p.numel for p in m.param_tensors() if p.expert) * m.num_moe_layers


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite"])
def test_etp_splits_each_experts_weights(name: str) -> None:
    m = load_model(name)
    out = estimate(m, make_grid(num_gpus=8, ep=2, etp=[1, 2, 4], precision="bf16"))
    assert list(out["reason"]) == [0, 0, 0]
    expert_bytes = 2 * _expert_numel(name) / 2  # bf16, ep 2
    drop_2 = out["parameters"][0] - out["parameters"][1]
    drop_4 = out["parameters"][0] - out["parameters"][2]
    # Whole tensors are rounded to 512 B each: allow one block per expert tensor and layer.
    slack = 512 * 2 * m.num_moe_layers
    assert drop_2 == pytest.approx(expert_bytes / 2, abs=slack)
    assert drop_4 == pytest.approx(expert_bytes * 3 / 4, abs=slack)


def test_capacity_factor_pads_the_routed_rows() -> None:
    m = load_model("mixtral-8x7b")
    dropless = hf_moe_bytes(m, T=4096.0, e=2.0, e_expert=2.0, amp=False)
    padded = hf_moe_bytes(m, T=4096.0, e=2.0, e_expert=2.0, amp=False, capacity=1.25)
    rows = 4096 * m.num_experts_per_tok
    per_row = 2.0 * (2 * m.hidden_size + 4 * m.moe_intermediate_size) + 8 * 3 + 4
    assert padded - dropless == pytest.approx(0.25 * rows * per_row)
    out = estimate(m, make_grid(capacity_factor_pct=[0, 125], seq_len=4096))
    assert out["activations_total"][1] > out["activations_total"][0]


def test_expert_knobs_are_invalid_on_a_dense_model() -> None:
    m = load_model("llama-3-8b")
    out = estimate(m, make_grid(num_gpus=2, etp=[1, 2]))
    assert out["reason"][0] == 0 and out["reason"][1] != 0
