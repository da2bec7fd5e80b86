"""--help of every command: each option in one of the declared panels (cli/_options.py PANELS,
from the one PANEL_OF table), flags without a type, fixed choices shown as the type."""

from __future__ import annotations

import pytest
import typer.main

from trainmem.cli._app import LAZY_COMMANDS, app, main
from trainmem.cli._options import PANEL_OF, PANELS, choice_help, choices_metavar


def _commands() -> dict[str, object]:
    group = typer.main.get_command(app)
    return {"trainmem": group} | {name: group.commands[name] for name in group.list_commands(None)}


COMMANDS = _commands()


def _options(command: object) -> list:
    ctx = command.context_class(command)
    return [p for p in command.get_params(ctx) if p.param_type_name == "option"]


def test_every_command_is_walked() -> None:
    assert set(COMMANDS) == {"trainmem", "estimate", *LAZY_COMMANDS}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_sits_in_a_declared_panel(name: str) -> None:
    for option in _options(COMMANDS[name]):
        assert option.name in PANEL_OF, f"{name} {option.opts[0]}: add it to cli PANEL_OF"
        assert option.rich_help_panel == PANEL_OF[option.name] and option.rich_help_panel in PANELS


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_panels_come_in_the_declared_order(name: str) -> None:
    shown = [PANELS.index(o.rich_help_panel) for o in _options(COMMANDS[name])]
    assert shown == sorted(shown)


def test_the_table_names_only_declared_panels_and_each_name_once() -> None:
    assert set(PANEL_OF.values()) <= set(PANELS)
    every_name = {o.name for command in COMMANDS.values() for o in _options(command)}
    assert set(PANEL_OF) == every_name  # no stale entry either


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_flags_show_no_type(name: str) -> None:
    for option in _options(COMMANDS[name]):
        if option.is_flag:
            assert option.metavar == "", (name, option.opts)


def _help(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as done:
        app([*argv, "--help"], prog_name="trainmem")
    assert done.value.code == 0
    return capsys.readouterr().out


def test_estimate_help_reads_as_panels_flags_and_choices(capsys, monkeypatch) -> None:
    text = _help(["estimate"], capsys, monkeypatch)
    for panel in ("Model", "Parallelism", "Precision", "Memory techniques", "Hardware", "Output"):
        assert f"─ {panel} ─" in text
    assert "─ Options ─" not in text and "<bool>" not in text
    assert "[hf|megatron|deepspeed|" in text and "[none|optimizer|" in text
    assert "--advice" in text and "--no-advice" in text
    assert "EXIT_CODES" not in text and "Exit codes: 0" in text


@pytest.mark.parametrize("argv", [[], ["sweep"], ["recommend"], ["heatmap"], ["completion"]])
def test_no_help_shows_bool_or_typer_default_panel(argv, capsys, monkeypatch) -> None:
    text = _help(argv, capsys, monkeypatch)
    assert "<bool>" not in text and "─ Options ─" not in text


def test_choices_break_after_a_bar_on_long_lists() -> None:
    assert choices_metavar(("a", "b")) == "[a|b]"
    lines = choices_metavar(("none", "selective", "full", "selective-op", "selective-layer"))
    assert lines == "[none|selective|full|\nselective-op|\nselective-layer]"
    assert all(len(line) <= 28 for line in lines.splitlines())


def test_choices_still_refuse_an_unknown_value(capsys) -> None:
    assert main(["estimate", "--framework", "bogus"]) == 2
    assert capsys.readouterr().err.startswith("error: framework: unknown value 'bogus'")


@pytest.mark.parametrize(
    ("help_text", "shown"),
    [
        ("a | b | c", ""),
        ("a | b | c (a: the usual)", "a: the usual"),
        ("a | b | c (default: a summary).", "default: a summary"),
        ("a|b|c", ""),
        ("Pick one (a or b).", "Pick one (a or b)."),
    ],
)
def test_a_help_that_lists_the_choices_drops_the_list(help_text: str, shown: str) -> None:
    assert choice_help(help_text, ("a", "b", "c")) == shown
