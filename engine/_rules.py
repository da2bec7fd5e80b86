"""The layout rules: one table, one definition of each rule.

A rule is a code (the `reason` column's value, an index into REASONS), its sentence, and a
vectorized predicate `broken(m, g, d)` over the grid's columns `g`, the layout `d`
(engine/_config.parallel_layout: dp, global batch, gradient accumulation) and the model's
numbers `m` (a RuleModel). `broken_rule` returns, per row, the code of the first rule in RULES
that the row breaks (np.select), 0 for a valid layout.

This table is the only definition: numpy runs it over columns (engine/_estimate.py), and the
compiled loop and the single-configuration path run programs generated from its trace
(engine/_fast/_rows.py), so that a rule added here reaches every path with no other edit
(tests/unit/engine/test_rules.py adds one in a fixture). A predicate is numpy over its
operands and nothing else (no `if`, `and`, `not`, `len` on a column or a model number: the
model's numbers enter the generated programs as values, not as Python constants).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ._codes import OFFLOAD_OPTIMIZER, OFFLOAD_PARAMS
from ._config import parallel_layout
from ._data_parallel import ZERO_PARAMETERS, ZERO_STATES
from ._vocab import RL_ALGORITHMS

GENERATING_RL = (RL_ALGORITHMS.index("grpo"), RL_ALGORITHMS.index("ppo"))
"""RL algorithms that generate with a rollout engine (dpo generates nothing)."""


class RuleModel(NamedTuple):
    """The model numbers the layout rules read (0 where a dense model has none)."""

    num_attention_heads: Any
    num_key_value_heads: Any
    num_hidden_layers: Any
    is_moe: Any
    num_experts: Any
    moe_intermediate_size: Any

    @classmethod
    def of(cls, m: Any) -> RuleModel:
        """A ModelSpec's numbers, as Python ints."""
        return cls(
            int(m.num_attention_heads),
            int(m.num_key_value_heads),
            int(m.num_hidden_layers),
            int(bool(m.is_moe)),
            int(m.num_experts or 0),
            int(m.moe_intermediate_size or 0),
        )


class Rule(NamedTuple):
    """One layout rule: its `reason` code, sentence, and where it is broken."""

    code: int
    message: str
    broken: Callable[[RuleModel, Any, Any], Any]


def _positive(m: RuleModel, g: Any, d: Any) -> Any:
    return (
        (g["micro_batch_size"] < 1)
        | (g["seq_len"] < 1)
        | (g["num_gpus"] < 1)
        | (g["tp"] < 1)
        | (g["pp"] < 1)
        | (g["cp"] < 1)
        | (g["virtual_stages"] < 1)
    )


def _parallel(g: Any) -> Any:
    return np.maximum(g["tp"] * g["pp"] * g["cp"], 1)


def _kv_heads(m: RuleModel, g: Any, d: Any) -> Any:
    """Key/value heads split over tp ranks, or replicated where tp exceeds them (GQA)."""
    tp = np.maximum(g["tp"], 1)
    return (m.num_key_value_heads % tp != 0) & (tp % np.maximum(m.num_key_value_heads, 1) != 0)


def _global_batch(m: RuleModel, g: Any, d: Any) -> Any:
    gbs = g["global_batch_size"]
    return (gbs > 0) & (gbs % np.maximum(g["micro_batch_size"] * d["dp"], 1) != 0)


def _experts(m: RuleModel, g: Any, d: Any) -> Any:
    """Source: Megatron-core's expert-parallel groups (ep within dp x cp, etp x ep within the
    dp x cp x tp ranks); a dense model has no experts to split."""
    ep, etp = g["ep"], g["etp"]
    dense = m.is_moe == 0
    dp_cp = d["dp"] * g["cp"]
    return (
        (ep < 1)
        | ((ep > 1) & (dense | (m.num_experts % np.maximum(ep, 1) != 0)))
        | (dp_cp % np.maximum(ep, 1) != 0)
        | (etp < 1)
        | ((etp > 1) & (dense | (m.moe_intermediate_size % np.maximum(etp, 1) != 0)))
        | ((dp_cp * g["tp"]) % np.maximum(ep * etp, 1) != 0)
        | (g["capacity_factor_pct"] < 0)
    )


def _offload(m: RuleModel, g: Any, d: Any) -> Any:
    return ((g["offload"] >= OFFLOAD_OPTIMIZER) & (g["zero"] < ZERO_STATES)) | (
        (g["offload"] == OFFLOAD_PARAMS) & (g["zero"] < ZERO_PARAMETERS)
    )


def _optimizer_in_backward(m: RuleModel, g: Any, d: Any) -> Any:
    """Source: torchtune/training/memory.py register_optim_in_bwd_hooks (each parameter steps
    and drops its gradient in backward; the recipes refuse gradient accumulation with it)."""
    return g["optimizer_in_backward"] & ((g["pp"] > 1) | (d["grad_accum_steps"] > 1))


def _dp_shard(m: RuleModel, g: Any, d: Any) -> Any:
    shard = g["dp_shard"]
    return (shard > 0) & (d["dp"] % np.maximum(shard, 1) != 0)


def _rollout_tp(m: RuleModel, g: Any, d: Any) -> Any:
    """Source: verl b178a3c verl/workers/fsdp_workers.py _build_rollout (the rollout device
    mesh: world_size // tensor_model_parallel_size engines, `assert world_size % infer_tp ==
    0`); engine/_config.py rl_reason, the same rule for one configuration."""
    generating = (g["rl"] == GENERATING_RL[0]) | (g["rl"] == GENERATING_RL[1])
    return generating & (g["num_gpus"] % np.maximum(g["rollout_tp"], 1) != 0)


PROFILE_MISMATCH = 12
PROFILE_MESSAGE = (
    "profile: precision, recompute and attention must be the traced ones (valid_for); tp, cp, "
    "ep and etp must be 1; no lora or qlora; loss full"
)
"""A traced profile's own rule (engine/_estimate.profile_mismatch): it depends on the profile,
not on numbers, so it is applied after the table, first."""
OPTIMIZER_IN_BACKWARD_LAYOUT = 13
DP_SHARD_LAYOUT = 14
ROLLOUT_TP_LAYOUT = 15

RULES: tuple[Rule, ...] = (
    Rule(
        1,
        "micro_batch_size, seq_len, num_gpus, tp, pp, cp and virtual_stages must be >= 1",
        _positive,
    ),
    Rule(
        2,
        "zero must be 0, 1, 2 or 3",
        lambda m, g, d: (g["zero"] < 0) | (g["zero"] > ZERO_PARAMETERS),
    ),
    Rule(
        3,
        "num_gpus must be divisible by tp*pp*cp",
        lambda m, g, d: g["num_gpus"] % _parallel(g) != 0,
    ),
    Rule(
        4,
        "num_attention_heads must be divisible by tp",
        lambda m, g, d: m.num_attention_heads % np.maximum(g["tp"], 1) != 0,
    ),
    Rule(5, "num_key_value_heads and tp must divide one another", _kv_heads),
    Rule(
        6,
        "num_hidden_layers must be divisible by pp*virtual_stages",
        lambda m, g, d: m.num_hidden_layers % np.maximum(g["pp"] * g["virtual_stages"], 1) != 0,
    ),
    Rule(
        7,
        "seq_len must be divisible by cp",
        lambda m, g, d: g["seq_len"] % np.maximum(g["cp"], 1) != 0,
    ),
    Rule(8, "global_batch_size must be divisible by micro_batch_size*dp", _global_batch),
    Rule(
        9,
        "ep must divide the number of experts and dp*cp, etp the expert width, ep*etp dp*cp*tp "
        "(and both be 1 for a dense model)",
        _experts,
    ),
    Rule(10, "offload needs zero >= 1 (optimizer+params: zero 3)", _offload),
    Rule(11, "qlora needs lora_rank > 0", lambda m, g, d: g["qlora"] & (g["lora_rank"] < 1)),
    Rule(
        DP_SHARD_LAYOUT,
        "dp_shard must divide dp (HSDP: dp / dp_shard replicas of the shard group)",
        _dp_shard,
    ),
    Rule(
        OPTIMIZER_IN_BACKWARD_LAYOUT,
        "optimizer_in_backward needs pp 1 and no gradient accumulation (one micro-batch per step)",
        _optimizer_in_backward,
    ),
    Rule(
        ROLLOUT_TP_LAYOUT,
        "rollout_tp must divide num_gpus (an RL job's rollout engines, one per rollout_tp GPUs)",
        _rollout_tp,
    ),
)
"""The layout rules in precedence order: a row breaking several gets the first one's code.
Codes are stable (points tables hold them): a new rule takes the next free code, wherever its
precedence puts it."""


def reasons_of(rules: tuple[Rule, ...]) -> tuple[str, ...]:
    """The sentence of every code, 0 (valid) = "", the profile's at PROFILE_MISMATCH (reason
    codes are 0..n without gaps)."""
    by_code = {0: "", PROFILE_MISMATCH: PROFILE_MESSAGE, **{r.code: r.message for r in rules}}
    if sorted(by_code) != list(range(len(by_code))):
        raise ValueError(f"layout rules: codes {sorted(by_code)} must be 0..n without gaps")
    return tuple(by_code[k] for k in range(len(by_code)))


REASONS = reasons_of(RULES)
"""Invalid-layout reasons; the `reason` column holds an index into this tuple (0 = valid).
Appended reasons keep the codes of the older ones (points tables stay readable)."""
assert REASONS[PROFILE_MISMATCH].startswith("profile")


def broken_rule(m: RuleModel, g: Any, rules: tuple[Rule, ...] | None = None) -> Any:
    """The code of the first rule of `rules` (default: RULES as it is now) each row breaks, 0
    where none (int8; one value where every column is one value)."""
    rules = RULES if rules is None else rules
    d = parallel_layout(g)
    return np.select([r.broken(m, g, d) for r in rules], [r.code for r in rules], 0).astype(np.int8)
