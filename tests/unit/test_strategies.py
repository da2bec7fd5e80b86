"""tests/strategies.py draws every declared field, inside what its declaration allows, and its
valid rows are valid by the engine's own rules: so a law or an equivalence test that draws from
it covers a field the day the field is declared, and no law is vacuous on invalid rows."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from tests import strategies
from tests.strategies import HELD, SIZES, domain, models, random_grid, rows
from trainmem.catalog import load_model
from trainmem.engine import layout_reason, make_grid, reason_text
from trainmem.engine._config import FIELD_NAMES, KNOBS, TYPES, bound_reason, cross_field_reason
from trainmem.engine._grid import DEFAULTS


def test_held_fields_are_declared_and_say_why() -> None:
    assert set(HELD) <= set(DEFAULTS)
    assert all(reason.strip() for reason in HELD.values())


def test_sizes_are_declared_fields_inside_their_bounds() -> None:
    for name, values in SIZES.items():
        knob = KNOBS[name]
        for value in values:
            assert isinstance(value, TYPES[name]), (name, value)
            assert bound_reason(value, ge=knob.ge, le=knob.le) is None, (name, value)


def test_every_field_has_a_domain_inside_its_declaration() -> None:
    for name in FIELD_NAMES:
        values = domain(name)
        knob = KNOBS[name]
        assert values, name
        if knob.choices is not None:
            assert set(values) <= set(knob.choices), name
        for value in values:
            assert bound_reason(value, ge=knob.ge, le=knob.le) is None, (name, value)


def test_a_field_declared_tomorrow_is_drawn(monkeypatch) -> None:
    """domain() reads the declarations when called: a new knob of each kind gets values."""
    from trainmem.engine._config import Knob

    new = {
        "new_count": (Knob(help="x", ge=3, le=1 << 20), int, (3, 4, 5, 6, 7)),
        "new_switch": (Knob(help="x"), bool, (False, True)),
        "new_mode": (Knob(help="x", choices=("a", "b")), str, ("a", "b")),
        "new_ratio": (Knob(help="x", ge=0, le=2), float, (0.0, 1.0, 2.0)),
    }
    for name, (knob, kind, expected) in new.items():
        monkeypatch.setitem(KNOBS, name, knob)
        monkeypatch.setitem(TYPES, name, kind)
        assert domain(name) == expected, name
    monkeypatch.setitem(KNOBS, "new_text", Knob(help="x"))
    monkeypatch.setitem(TYPES, "new_text", str)
    try:
        domain("new_text")
    except TypeError as e:
        assert "new_text" in str(e) and "TEXT" in str(e)
    else:
        raise AssertionError("a free-text field must be given its values")


def _values_seen(strategy: st.SearchStrategy, num_rows: int = 200) -> dict[str, set]:
    seen: dict[str, set] = {}

    @settings(max_examples=num_rows, derandomize=True, database=None, deadline=None)
    @given(strategy)
    def collect(row: dict) -> None:
        assert list(row) == list(DEFAULTS) or set(row) == set(DEFAULTS), set(row) ^ set(DEFAULTS)
        for k, v in row.items():
            seen.setdefault(k, set()).add(repr(v))

    collect()
    return seen


def test_every_declared_field_is_drawn_and_varies() -> None:
    """The fields the strategy draws are the grid's declared fields (no hand list): each takes
    more than one value, but the HELD ones."""
    drawn = st.tuples(models(), st.booleans()).flatmap(lambda mv: rows(mv[0], valid_only=mv[1]))
    seen = _values_seen(drawn)
    assert set(seen) == set(DEFAULTS)
    fixed = {k for k, v in seen.items() if len(v) < 2}
    assert fixed == set(HELD), fixed


def test_random_grid_draws_every_declared_field() -> None:
    g = random_grid(0, 5000, moe=True)
    assert set(g) == set(DEFAULTS)
    fixed = {k for k, v in g.items() if len(np.unique(v)) < 2}
    assert fixed == set(HELD), fixed


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_valid_rows_are_valid_layouts(data: st.DataObject) -> None:
    m = data.draw(models())
    row = data.draw(rows(m))
    reason = layout_reason(m, make_grid(**row))[0]
    assert reason == 0, (m.name, reason_text(reason), row)
    assert cross_field_reason(row) is None, row


def test_other_rows_are_often_invalid() -> None:
    m = load_model("llama-3.2-1b")
    quick = settings(max_examples=100, database=None)
    invalid = find(
        rows(m, valid_only=False),
        lambda r: layout_reason(m, make_grid(**r))[0] != 0,
        settings=quick,
    )
    assert layout_reason(m, make_grid(**invalid))[0] != 0


@settings(max_examples=10)
@given(rows(load_model("llama-3.2-1b"), zero=3, framework=st.just("megatron")))
def test_overrides_win(row: dict) -> None:
    assert row["zero"] == 3 and row["framework"] == "megatron"
    assert strategies.columns_of([row, row])["zero"] == [3, 3]
