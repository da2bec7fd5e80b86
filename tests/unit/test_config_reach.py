"""Every training field is declared once (engine TrainingConfig) and reaches every interface:
the CLI options of estimate, fit, sweep, heatmap and recommend, the HTTP request models, the
Python API, the grid and the points table."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import typer.main

import trainmem
from trainmem.cli import app
from trainmem.engine import (
    DEFAULTS,
    FIELD_NAMES,
    FIELDS,
    KNOBS,
    TrainingConfig,
    grid_columns,
    resolved_loss,
)

COMMANDS = ("estimate", "fit", "sweep", "heatmap", "recommend")
ALWAYS_ON_IN_SEARCHES = {"sweep": {"sequence_parallel"}, "recommend": {"sequence_parallel"}}
"""Fields a command fixes by design: every search point runs Megatron-style sequence
parallelism (said in the searches' help)."""


def _click_params(command: str) -> dict[str, object]:
    group = typer.main.get_command(app)
    return {p.name: p for p in group.commands[command].params}  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_training_field_is_an_option_of_every_command(command: str) -> None:
    params = _click_params(command)
    missing = set(FIELD_NAMES) - set(params) - ALWAYS_ON_IN_SEARCHES.get(command, set())
    assert not missing, f"{command} lacks --{', --'.join(sorted(missing))}"


@pytest.mark.parametrize("command", COMMANDS)
def test_options_carry_the_declared_help(command: str) -> None:
    params = _click_params(command)
    for name in FIELD_NAMES:
        if name in params:  # a help that lists the choices shows them as the type, [a|b|c]
            shown = f"{params[name].help or ''} {(params[name].metavar or '').replace(chr(10), '')}"
            declared = KNOBS[name].help.split(" (")[0]
            assert declared in shown or declared.replace(" | ", "|") in shown, name


def test_every_training_field_is_in_every_http_request() -> None:
    pytest.importorskip("fastapi")
    from trainmem.serve import create_app

    schema = create_app().openapi()["components"]["schemas"]
    for request in ("EstimateRequest", "FitRequest", "RecommendRequest"):
        props = schema[request]["properties"]
        always_on = ALWAYS_ON_IN_SEARCHES["recommend"] if request == "RecommendRequest" else set()
        missing = set(FIELD_NAMES) - set(props) - always_on
        assert not missing, (request, missing)


def test_http_bounds_are_the_declared_ones() -> None:
    pytest.importorskip("fastapi")
    from trainmem.serve import create_app

    props = create_app().openapi()["components"]["schemas"]["EstimateRequest"]["properties"]
    for name, knob in KNOBS.items():
        if knob.ge is not None:
            assert props[name].get("minimum") == knob.ge, name
        if knob.le is not None:
            assert props[name].get("maximum") == knob.le, name


def test_the_python_api_takes_every_field_by_name() -> None:
    # gpt2 has 1,024 learned positions: the default 2,048 tokens only with allow_long_seq.
    for verb in (trainmem.estimate, trainmem.fit):
        report = verb(**{f.name: f.default for f in FIELDS}, model="gpt2", allow_long_seq=True)
        assert report is not None
    config = TrainingConfig(**{f.name: f.default for f in FIELDS}).replace(seq_len=1024)
    # The report shows `--loss auto` resolved: the loss the framework runs.
    shown = {**config.as_dict(), "loss": resolved_loss(config.framework, config.loss)}
    assert trainmem.estimate(config, model="gpt2")["config"] == grid_columns(shown)


def test_grid_columns_are_the_fields() -> None:
    declared = list(grid_columns({f.name: f.default for f in FIELDS}))
    assert list(DEFAULTS)[: len(declared)] == declared


def test_unknown_choice_names_the_field_and_the_allowed_values() -> None:
    with pytest.raises(ValueError, match=r"recompute: unknown value 'some'; allowed: none, "):
        TrainingConfig(recompute="some")


def test_config_is_frozen_and_derives_the_layout() -> None:
    c = TrainingConfig(num_gpus=16, tp=2, pp=2, micro_batch_size=2, global_batch_size=64)
    assert (c.dp, c.grad_accum_steps) == (4, 8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.tp = 4  # type: ignore[misc]
    assert c.replace(tp=4).dp == 2


def test_one_declaration_site() -> None:
    """No command module spells a training field's help text again: it lives in the knob."""
    import trainmem.cli._options as cli_options

    source = inspect.getsource(cli_options)
    for knob in KNOBS.values():
        assert knob.help not in source


def test_report_signatures_take_the_declared_options_with_their_defaults() -> None:
    """The report functions spell their non-training options in their signatures (typed, for
    the Python API); each must be a declared option with the declared default."""
    from trainmem.plan import RECOMMEND_OPTIONS, recommend_report
    from trainmem.report import ESTIMATE_OPTIONS, estimate_report
    from trainmem.sweep import FIT_OPTIONS, SWEEP_OPTIONS, fit_report, run_sweep

    pairs = (
        (estimate_report, ESTIMATE_OPTIONS),
        (fit_report, FIT_OPTIONS),
        (recommend_report, RECOMMEND_OPTIONS),
        (run_sweep, SWEEP_OPTIONS),
    )
    # Keywords of Python callers, not options of a command: progress (a callback) and
    # fleet_label (how a fleet given in memory is named in the answer: serve, the Python API).
    callers_only = {"progress", "fleet_label"}
    for function, options in pairs:
        declared = {o.name: o.default for o in options if o.name not in FIELD_NAMES}
        params = inspect.signature(function).parameters
        for name, param in params.items():
            if param.kind is inspect.Parameter.KEYWORD_ONLY and name not in callers_only:
                assert name in declared, (function.__name__, name)
                assert param.default == declared[name], (function.__name__, name)
        missing = set(declared) - set(params) - {"as_json", "fmt", "check"}
        assert not missing, (function.__name__, missing)
