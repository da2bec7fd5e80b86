"""Test inputs drawn from the engine's declarations: hypothesis strategies and seeded grids.

Every grid field (engine/_grid.py `DEFAULTS`: TrainingConfig's knobs as grid columns, then the
user-optimizer columns) is drawn from what its declaration allows (engine/_config.py `KNOBS`,
`TYPES`): a closed vocabulary's names, both booleans, an int or float from its lower bound up,
a user optimizer through `spec_columns`. Nothing here lists the fields: a field declared
tomorrow is drawn the day it is declared (tests/unit/test_strategies.py checks every declared
field is drawn and takes more than one value). What is written by hand is said once below:
the size caps that keep the tests fast (`SIZES`), the domain of a free-text field (`TEXT`),
the fields held at their default (`HELD`, each with why), and the layout rules a valid row is
built to satisfy (`_layout`), which the test checks against the engine's `layout_reason`.

- `rows(model, valid_only=..., **overrides)`: one configuration (make_grid input) for laws.
- `grids(n, model=...)`: n such rows as columns, for equivalence tests on a few rows.
- `random_grid(seed, n, ...)`: a seeded numpy grid of many rows (mostly valid layouts), for the
  compiled-path equivalence tests where hypothesis would draw too slowly.
- `models()`: the built-in presets (every family the catalog ships).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from hypothesis import strategies as st

from trainmem.catalog import load_model, preset_names
from trainmem.engine import ModelSpec, make_grid
from trainmem.engine._config import (
    DEFAULTS_BY_FIELD,
    FIELD_NAMES,
    KNOBS,
    RL_ONLY_FIELDS,
    TYPES,
    grid_columns,
)
from trainmem.engine._grid import CATEGORICAL, DEFAULTS, OPTIMIZER_COLUMNS
from trainmem.engine._lora import LORA_TARGET_ALIASES, LORA_TARGETS
from trainmem.engine._optimizers import OptimizerSpec, spec_columns

_RL_HELD = (
    "rl",
    "rollout",
    "rollout_tp",
    "rollout_gpu_memory_utilization",
    "rl_group_size",
    "response_len",
    "rollout_batch_size",
    "rollout_max_num_seqs",
    "rollout_max_num_batched_tokens",
    "rollout_sleep_level",
    "ref_model",
    "rl_trainer_offload",
    "log_prob_micro_batch_size",
)
HELD: dict[str, str] = {
    name: (
        "an RL post-training field: the engine's step formulas do not read it (engine/_rl.py "
        "is a layer over the step's columns, with its own laws in tests/unit/engine/test_rl.py); "
        "drawing it would only shift the other fields' draws"
    )
    for name in _RL_HELD
}
"""Fields every strategy holds at its default, each with the reason. (A field put here is
still checked to be a declared one.)"""

SIZES: dict[str, tuple[Any, ...]] = {
    "micro_batch_size": (1, 2, 3, 4, 8),
    "seq_len": (128, 512, 1024, 2048, 4096),
    "tp": (1, 2, 4, 8),
    "pp": (1, 2, 4),
    "cp": (1, 2),
    "virtual_stages": (1, 2),
    "ep": (1, 2, 4),
    "etp": (1, 2),
    "lora_rank": (0, 0, 8, 16),
    "capacity_factor": (0.0, 1.0, 1.25, 2.0),
    "rollout_gpu_memory_utilization": (0.3, 0.5, 0.6, 0.9),
}
"""Values of the size fields, inside their declared bounds (the test checks it): the
declarations reach 2^22 tokens and 1,024-way parallelism, and the laws build whole grids per
example. A numeric field not named here draws from its lower bound to SPAN above it."""
SPAN = 4
DP_SIZES = (1, 2, 4, 8)
"""Data-parallel degrees of a valid layout (dp is derived, not a field: num_gpus is)."""
NUM_MICRO = (0, 1, 2, 4, 8)
"""Micro-batches per step of a valid layout; 0: global_batch_size 0 (no accumulation)."""
TEXT: dict[str, tuple[str, ...]] = {
    "lora_targets": tuple(
        dict.fromkeys(("all-linear", "q_proj,v_proj", *LORA_TARGETS, *LORA_TARGET_ALIASES))
    ),
}
"""Free-text fields (a str knob without choices) and the values they are drawn from: the
engine's own target names (engine/_lora.py)."""


def domain(name: str) -> tuple[Any, ...]:
    """The values training field `name` is drawn from (as declared, before grid_columns)."""
    if name in HELD:
        return (DEFAULTS_BY_FIELD[name],)
    knob, kind = KNOBS[name], TYPES[name]
    if name in SIZES:
        return SIZES[name]
    if knob.choices is not None:
        return knob.choices
    if name in CATEGORICAL:  # an open vocabulary (optimizer): the registry's names
        return CATEGORICAL[name]
    if kind is bool:
        return (False, True)
    if kind in (int, float):
        low = int(knob.ge) if knob.ge is not None else 0
        high = low + SPAN if knob.le is None else min(int(knob.le), low + SPAN)
        return tuple(kind(v) for v in range(low, high + 1))
    if name in TEXT:
        return TEXT[name]
    raise TypeError(f"{name}: a {kind.__name__} field without choices; give it a TEXT domain")


def models() -> st.SearchStrategy[ModelSpec]:
    """A built-in preset (every family the catalog ships)."""
    return st.sampled_from(preset_names()).map(load_model)


def user_optimizers() -> st.SearchStrategy[dict[str, Any]]:
    """The grid columns of a user optimizer (a TOML file's numbers, through spec_columns)."""
    amount = st.sampled_from((0.0, 0.5, 1.0, 2.0, 4.0))
    return st.builds(
        OptimizerSpec,
        name=st.just("user-optimizer"),
        description=st.just("drawn"),
        num_states=st.sampled_from((0.0, 1.0, 2.0, 4.0)),  # whole state tensors (a rule)
        state_bytes=amount,
        step_temp_states=amount,
        eight_bit_blockwise=st.booleans(),
        step_bytes_per_parameter=amount,
        path=st.just("drawn.toml"),
    ).map(spec_columns)


def _divisors(n: int, values: Sequence[int]) -> list[int]:
    return [v for v in values if v >= 1 and n % v == 0]


def _tp_fits(m: ModelSpec | None, tp: int) -> bool:
    """Heads divisible by tp; key/value heads and tp dividing one another."""
    if m is None:
        return True
    kv = max(m.num_key_value_heads, 1)
    return m.num_attention_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def _expert_fits(m: ModelSpec | None, ep: int, etp: int, dp: int, cp: int, tp: int) -> bool:
    """ep divides the experts and dp x cp, etp the expert width, ep x etp dp x cp x tp."""
    if m is not None and not m.is_moe:
        return ep == 1 and etp == 1
    if m is not None and (m.num_experts % ep or m.moe_intermediate_size % etp):
        return False
    return (dp * cp) % ep == 0 and (dp * cp * tp) % (ep * etp) == 0


class _Picker:
    """Draws a field from an override (a value or a strategy) or from the values allowed."""

    def __init__(self, draw: st.DrawFn, overrides: Mapping[str, Any]) -> None:
        self.draw, self.overrides = draw, overrides

    def __call__(self, name: str, values: Sequence[Any]) -> Any:
        if name in self.overrides:
            given = self.overrides[name]
            return self.draw(given) if isinstance(given, st.SearchStrategy) else given
        if name in HELD:
            return DEFAULTS_BY_FIELD[name]
        return self.draw(st.sampled_from(list(values) or [DEFAULTS_BY_FIELD[name]]))


def _layout(pick: _Picker, m: ModelSpec | None) -> dict[str, Any]:
    """The fields the layout rules tie together (engine/_estimate.py REASONS, _config.py
    cross_field_reason), drawn so that every rule holds for model `m` (None: the rules that
    need no model)."""
    layers = m.num_hidden_layers if m is not None else 0
    tp = pick("tp", [t for t in domain("tp") if _tp_fits(m, t)])
    pp = pick("pp", _divisors(layers, domain("pp")))
    stages = [v for v in domain("virtual_stages") if v == 1 or (pp > 1 and layers % (pp * v) == 0)]
    vs = pick("virtual_stages", stages)
    cp = pick("cp", domain("cp"))
    dp = pick.draw(st.sampled_from(DP_SIZES))
    ep = pick("ep", [e for e in domain("ep") if _expert_fits(m, e, 1, dp, cp, tp)])
    etp = pick("etp", [e for e in domain("etp") if _expert_fits(m, ep, e, dp, cp, tp)])
    mbs = pick("micro_batch_size", domain("micro_batch_size"))
    in_backward = pick("optimizer_in_backward", (False, True) if pp == 1 else (False,))
    num_micro = pick.draw(st.sampled_from(NUM_MICRO if not in_backward else (0, 1)))
    zero = pick("zero", domain("zero"))
    offloads = domain("offload")[: 1 + (zero >= 1) + (zero >= 3)]  # none, optimizer, +params
    rank = pick("lora_rank", domain("lora_rank"))
    layout = {
        "tp": tp,
        "pp": pp,
        "virtual_stages": vs,
        "cp": cp,
        "seq_len": pick("seq_len", [s for s in domain("seq_len") if s % cp == 0]),
        "num_gpus": pick("num_gpus", [tp * pp * cp * dp]),
        "ep": ep,
        "etp": etp,
        "micro_batch_size": mbs,
        "optimizer_in_backward": in_backward,
        "global_batch_size": pick("global_batch_size", [num_micro * mbs * dp]),
        "zero": zero,
        "offload": pick("offload", offloads),
        "dp_shard": pick("dp_shard", [0, *_divisors(dp, range(1, dp + 1))]),
        "lora_rank": rank,
        "qlora": pick("qlora", (False, True) if rank > 0 else (False,)),
    }
    # Drawn last, so that the fields declared before them draw as they did before them.
    return {**layout, **_rl_fields(pick, num_gpus=tp * pp * cp * dp)}


def _rl_fields(pick: _Picker, *, num_gpus: int) -> dict[str, Any]:
    """The RL fields of a valid row (engine/_config.py rl_reason): with rl none the RL-only
    fields at their defaults; dpo without a rollout engine; rollout_tp dividing num_gpus."""
    rl = pick("rl", domain("rl"))
    if rl == "none":
        return {"rl": rl, **{k: pick(k, [DEFAULTS_BY_FIELD[k]]) for k in RL_ONLY_FIELDS}}
    return {
        "rl": rl,
        "rollout": pick("rollout", ("auto",) if rl == "dpo" else domain("rollout")),
        "rollout_tp": pick("rollout_tp", _divisors(num_gpus, domain("rollout_tp"))),
    }


@st.composite
def _row(
    draw: st.DrawFn, m: ModelSpec | None, valid_only: bool, overrides: Mapping[str, Any]
) -> dict[str, Any]:
    pick = _Picker(draw, overrides)
    fields = {name: pick(name, domain(name)) for name in FIELD_NAMES}
    if valid_only or draw(st.integers(0, 3)) > 0:  # else: every field on its own, often invalid
        fields.update(_layout(pick, m))
    row = grid_columns(fields)
    optimizer = {} if "optimizer" in overrides else draw(st.none() | user_optimizers())
    row.update({**OPTIMIZER_COLUMNS, **(optimizer or {})})
    row.update({k: pick(k, [v]) for k, v in row.items() if k in overrides and k not in fields})
    return row


def rows(
    model: ModelSpec | None = None, *, valid_only: bool = True, **overrides: Any
) -> st.SearchStrategy[dict[str, Any]]:
    """One configuration as grid columns (make_grid input), every field drawn.

    valid_only: the layout rules hold for `model` (None: those that need no model); else three
    rows in four are valid and the fourth draws every field on its own. An override (a value
    or a strategy, by grid field name) replaces a field's draw; a valid layout is built around
    it where it can be.
    """
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"rows: unknown grid field(s) {', '.join(unknown)}")
    return _row(model, valid_only, overrides)


def columns_of(drawn: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Rows as columns (make_grid input)."""
    return {k: [r[k] for r in drawn] for k in drawn[0]}


def grids(
    n: int, model: ModelSpec | None = None, *, valid_only: bool = False, **overrides: Any
) -> st.SearchStrategy[dict[str, list[Any]]]:
    """n rows of `rows(model, ...)` as columns, for equivalence tests on a few rows."""
    one = rows(model, valid_only=valid_only, **overrides)
    return st.lists(one, min_size=n, max_size=n).map(columns_of)


def _choice(rng: np.random.Generator, values: Sequence[Any], n: int) -> np.ndarray:
    """n values drawn from `values` (a categorical's names as their grid codes)."""
    return np.asarray(values)[rng.integers(0, len(values), n)]


def _codes(name: str, values: Sequence[Any]) -> Sequence[Any]:
    """A field's values as make_grid takes them fastest: a categorical's as codes."""
    vocab = CATEGORICAL.get(KNOBS[name].grid or name) if name in KNOBS else None
    return [vocab.index(v) for v in values] if vocab else values


def _random_layout(rng: np.random.Generator, n: int, moe: bool) -> dict[str, np.ndarray]:
    """The layout fields of `random_grid`: mostly valid for any model of 8-GPU nodes (the
    rules that need the model, heads by tp and layers by pp, broken where the model says)."""
    pick = {k: _choice(rng, domain(k), n) for k in ("tp", "pp", "cp", "micro_batch_size")}
    tp, pp, cp, mb = pick["tp"], pick["pp"], pick["cp"], pick["micro_batch_size"]
    dp = _choice(rng, DP_SIZES, n)
    ep = _choice(rng, domain("ep") if moe else (1,), n)
    ep = np.where((dp * cp) % ep == 0, ep, 1)
    etp = _choice(rng, domain("etp") if moe else (1,), n)
    etp = np.where((dp * cp * tp) % (ep * etp) == 0, etp, 1)
    gbs = np.where(rng.random(n) < 0.5, 0, mb * dp * _choice(rng, NUM_MICRO[1:], n))
    zero = _choice(rng, domain("zero"), n)
    offload = _choice(rng, range(len(domain("offload"))), n)
    allowed = (zero >= 1).astype(int) + (zero >= 3)  # none; optimizer from 1; +params at 3
    rank = _choice(rng, domain("lora_rank"), n)
    return {
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "virtual_stages": np.where(pp > 1, _choice(rng, domain("virtual_stages"), n), 1),
        "micro_batch_size": mb,
        "num_gpus": tp * pp * cp * dp,
        "global_batch_size": gbs,
        "ep": ep,
        "etp": etp,
        "zero": zero,
        "offload": np.where(rng.random(n) < 0.9, np.minimum(offload, allowed), offload),
        "dp_shard": np.where(rng.random(n) < 0.7, 0, np.where(rng.random(n) < 0.5, 1, dp)),
        "lora_rank": rank,
        "qlora": (rng.random(n) < 0.3) & (rank > 0),
        "optimizer_in_backward": (rng.random(n) < 0.2) & (pp == 1) & (gbs == 0),
    }


def random_grid(seed: int, n: int, *, moe: bool = False, **overrides: Any) -> dict[str, np.ndarray]:
    """A grid of n rows, every field drawn from its declaration with numpy (seeded), the layout
    mostly valid; a fifth of the rows a user optimizer. For the compiled-path equivalence tests,
    whose grids of tens of thousands of rows hypothesis would draw too slowly. `moe`: draw
    expert parallelism too. Overrides (grid field name -> column or value) replace draws."""
    rng = np.random.default_rng(seed)
    fields = {k: _choice(rng, _codes(k, domain(k)), n) for k in FIELD_NAMES}
    fields.update(_random_layout(rng, n, moe))
    fields = grid_columns(fields)
    custom = rng.random(n) < 0.2
    amounts = (0.0, 0.5, 1.0, 2.0, 4.0)
    for name, default in OPTIMIZER_COLUMNS.items():
        drawn = _choice(rng, (False, True) if isinstance(default, bool) else amounts, n)
        fields[name] = np.where(custom, drawn, default)
    fields["optimizer_custom"] = custom
    fields["optimizer"] = np.where(
        custom, CATEGORICAL["optimizer"].index("adamw"), fields["optimizer"]
    )
    return make_grid({**fields, **overrides})
