"""`trainmem check FILE [FILE ...]`: a job's own config files in (torchtune, axolotl,
LLaMA-Factory, LitGPT, HF / TRL, accelerate, DeepSpeed, torchtitan, Megatron, launch lines),
estimate's answer out, with what was read and from where (trainmem.stacks).

Exit codes: 0 fits, 1 does not fit, 2 bad input (one line on stderr naming the file and key).
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from trainmem.hardware import GIB
from trainmem.report import human_table, json_text
from trainmem.stacks import read_files
from trainmem.stacks._check import base_dir_of, check_report
from trainmem.stacks._options import CHECK_OPTIONS

from ._options import typer_parameter

CHECK_EXIT_CODES = "Exit codes: 0 it fits; 1 it does not fit; 2 bad input (one line on stderr)."


def check_cmd(files: list[str], *, as_json: bool, **options: Any) -> None:
    """Read a job's own config files and answer as estimate does: fits (exit 0) or not (1)."""
    report = check_report(read_files(files), base_dir=base_dir_of(files), **options)
    if as_json:
        typer.echo(json_text(report))
    else:
        typer.echo(human_check(report))
    if not report["fits"]:
        raise typer.Exit(1)


def human_check(report: dict[str, Any]) -> str:
    """What was read (field, value, origin), the warnings, estimate's table and the fix."""
    lines = [f"read as {report['stack']} {report['stack_version']}:"]
    for name, entry in report["read"].items():
        if entry["from"] == "trainmem-default":
            continue
        where = entry["from"] if "file" not in entry else f"{entry['file']}:{entry['from'][5:]}"
        lines.append(f"  {name:<22} {entry['value']!s:<24} {where}")
    defaults = [n for n, e in report["read"].items() if e["from"] == "trainmem-default"]
    if defaults:
        lines.append(f"  trainmem's defaults: {', '.join(defaults)}")
    lines += [f"warning: {w}" for w in report["warnings"]]
    lines += ["", human_table(report)]
    fix = report.get("fix")
    if fix:
        lines.append(
            f"fix: {fix['change']} (peak {fix['peak_device_bytes'] / GIB:.2f} GiB, "
            f"step time x{fix['step_time_ratio'] or 1:.2f})"
        )
        for e in fix["edits"]:
            where = f"{e['file']}: {e['key']}" if e["file"] else f"flag {e['key']}"
            lines.append(f"  {where}: {e['from']!r} -> {e['to']!r}")
    elif "fix" in report and not report["fits"]:
        lines.append("fix: no single change of the advice fits")
    return "\n".join(lines)


def _command() -> Any:
    def run(**values: Any) -> Any:
        return check_cmd(values.pop("files"), **values)

    files = inspect.Parameter(
        "files",
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[
            list[str], typer.Argument(metavar="FILE", help="The job's config files.")
        ],
    )
    parameters = [files, *(typer_parameter(o) for o in CHECK_OPTIONS)]
    run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in parameters}
    run.__doc__ = check_cmd.__doc__
    return run


def register(app: typer.Typer) -> None:
    """Add `check` to the CLI app."""
    app.command("check", epilog=CHECK_EXIT_CODES)(_command())
