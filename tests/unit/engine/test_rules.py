"""The layout rules are one table (engine/_rules.RULES): a rule added there reaches numpy's
estimate, the single-configuration estimate_one and the compiled loop with no other edit, and
the per-row programs generated from the engine's definitions agree with numpy's."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from trainmem import load_model
from trainmem.engine import _rules, estimate, estimate_one, make_grid, reason_text
from trainmem.engine._fast import _kernel, _rows
from trainmem.engine._rules import REASONS, RULES, Rule

HAS_NUMBA = importlib.util.find_spec("numba") is not None


def test_codes_are_unique_and_every_rule_has_its_sentence() -> None:
    codes = [r.code for r in RULES]
    assert len(set(codes)) == len(codes)
    assert all(REASONS[r.code] == r.message for r in RULES)
    assert REASONS[0] == "" and REASONS[_rules.PROFILE_MISMATCH].startswith("profile")


def test_a_gap_in_the_codes_is_refused_naming_them() -> None:
    extra = Rule(40, "never", lambda m, g, d: g["tp"] < 0)
    with pytest.raises(ValueError, match="layout rules: codes"):
        _rules.reasons_of((*RULES, extra))


FIXTURE_CODE = len(REASONS)
FIXTURE_RULE = Rule(
    FIXTURE_CODE,
    "seq_len must be a multiple of 8 x cp (a fixture's rule)",
    lambda m, g, d: (g["seq_len"] % (8 * np.maximum(g["cp"], 1)) != 0) & (m.num_hidden_layers > 1),
)
"""Reads a grid column, a model number and numpy: what a real rule reads."""


@pytest.fixture
def with_fixture_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """FIXTURE_RULE added to the table, first in precedence (one edit: RULES)."""
    monkeypatch.setattr(_rules, "RULES", (FIXTURE_RULE, *RULES))


ROWS = {"seq_len": [4100, 4096, 4100, 0], "tp": [1, 1, 3, 1], "num_gpus": 8}
EXPECTED = [FIXTURE_CODE, 0, FIXTURE_CODE, 1]
"""The fixture's rule comes first: it wins over tp 3 (rule 4); seq_len 0 breaks rule 1 only."""


def test_a_rule_added_to_the_table_reaches_numpy(with_fixture_rule, monkeypatch) -> None:
    monkeypatch.setenv("TRAINMEM_KERNEL", "numpy")
    m = load_model("llama-3-8b")
    out = estimate(m, make_grid(ROWS), columns=["reason", "fits"])
    assert out["reason"].tolist() == EXPECTED
    assert not out["fits"][0]
    assert reason_text(FIXTURE_CODE) == FIXTURE_RULE.message


def test_a_rule_added_to_the_table_reaches_the_scalar_path(with_fixture_rule) -> None:
    m = load_model("llama-3-8b")
    rows = [{k: (v[i] if isinstance(v, list) else v) for k, v in ROWS.items()} for i in range(4)]
    got = [estimate_one(m, row, columns=["reason"])["reason"] for row in rows]
    assert got == EXPECTED


@pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed")
def test_a_rule_added_to_the_table_reaches_the_compiled_loop(with_fixture_rule, monkeypatch):
    monkeypatch.setenv("TRAINMEM_KERNEL", "numba")
    m = load_model("llama-3-8b")
    out = estimate(m, make_grid(ROWS), columns=["reason"])
    assert out["reason"].tolist() == EXPECTED
    assert _kernel.compiled_for(len(EXPECTED)) is not None  # the compiled loop ran


def test_generated_python_programs_agree_with_numpy_on_random_rows() -> None:
    """The plain-Python rendering of the rules, on rows numpy evaluates (valid and not)."""
    rng = np.random.default_rng(7)
    n = 400
    cols = {
        "micro_batch_size": rng.integers(0, 5, n),
        "seq_len": rng.choice([0, 1000, 1024, 4096], n),
        "num_gpus": rng.choice([1, 6, 8, 16], n),
        "global_batch_size": rng.choice([0, 7, 32, 64], n),
        "tp": rng.integers(0, 5, n),
        "pp": rng.integers(0, 5, n),
        "cp": rng.integers(0, 3, n),
        "virtual_stages": rng.integers(0, 3, n),
        "zero": rng.integers(-1, 5, n),
        "dp_shard": rng.integers(0, 4, n),
        "ep": rng.integers(0, 3, n),
        "etp": rng.integers(0, 3, n),
        "capacity_factor_pct": rng.choice([-1, 0, 125], n),
        "offload": rng.integers(0, 3, n),
        "lora_rank": rng.integers(0, 3, n),
        "qlora": rng.random(n) < 0.3,
        "optimizer_in_backward": rng.random(n) < 0.3,
        "rl": rng.integers(0, 4, n),  # none, grpo, ppo, dpo
        "rollout_tp": rng.choice([1, 2, 3, 8], n),
    }
    for name in ("llama-3-8b", "mixtral-8x7b"):
        m = load_model(name)
        numbers = _rules.RuleModel.of(m)
        expected = _rules.broken_rule(numbers, cols)
        py = _rows.python_module()
        got = [
            int(py.reason(*(cols[k][i].item() for k in py.REASON_COLUMNS), *numbers)[0])
            for i in range(n)
        ]
        assert got == expected.tolist()
        assert len(set(got)) > 5  # the draw breaks many rules
