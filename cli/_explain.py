"""`trainmem explain SNAPSHOT`: a PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`,
an OOM-time dump alike) attributed to trainmem's components, beside the prediction of the same
job (report/_explain.py). The job is estimate's flags (every one, the same declarations), or
`--config FILE` (the job's own config files, read as `trainmem check` reads them; flags given
too override them).
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from trainmem.engine import FIELD_NAMES
from trainmem.report import AS_JSON, ESTIMATE_OPTIONS, EXIT_CODES, json_text, option_defaults
from trainmem.report._explain import (
    EXPLAIN_OWN_OPTIONS,
    explain_report,
    explain_table,
    job_overheads,
)
from trainmem.stacks._options import CHECK_OPTIONS

from ._options import typer_parameter

NOT_EXPLAINED = ("as_json", "check", "fix", "per_stage", "advice")
"""check's and estimate's options that print or search, not configure the job."""
EXPLAIN_OPTIONS = (
    *(o for o in CHECK_OPTIONS if o.name not in NOT_EXPLAINED),
    *EXPLAIN_OWN_OPTIONS,
    AS_JSON,
)
"""Every estimate option (unset by default: a --config file or estimate's default fills it),
check's --stack and --fleet, explain's own, --json."""


def predicted_report(config: list[str] | None, flags: dict[str, Any]) -> dict[str, Any]:
    """The prediction of the job: `trainmem check`'s of the config files (flags over them), or
    estimate's of the flags (estimate's defaults for the others); without the advice."""
    from trainmem.report import estimate_report
    from trainmem.report._validate import check_options
    from trainmem.stacks import check_report, read_files
    from trainmem.stacks._check import base_dir_of, fleet_flags

    given = {k: v for k, v in flags.items() if v is not None}
    stack, fleet = given.pop("stack", "auto"), given.pop("fleet", None)
    check_options(CHECK_OPTIONS, given)
    if config:
        return check_report(
            read_files(config),
            base_dir=base_dir_of(config),
            stack=stack,
            fleet=fleet,
            **{**given, "advice": False},
        )
    if fleet is not None:
        given.update(fleet_flags(fleet, given))
    estimate_names = {o.name for o in ESTIMATE_OPTIONS}
    values = {**option_defaults(ESTIMATE_OPTIONS), **given, "advice": False}
    values = {k: v for k, v in values.items() if k in estimate_names and k not in NOT_EXPLAINED}
    training = {k: values.pop(k) for k in list(values) if k in FIELD_NAMES}
    return estimate_report(training, advice=False, **values)


def explain_cmd(
    snapshot: str,
    *,
    as_json: bool,
    config: list[str] | None,
    calibrate: str | None,
    device_used_gib: float | None,
    **flags: Any,
) -> None:
    """A PyTorch memory snapshot attributed to trainmem's components, beside the prediction."""
    predicted = predicted_report(config, flags)
    gpu = predicted["gpu"]["name"]
    overheads, memory_bytes = job_overheads(
        gpu, flags.get("hardware_dir"), flags.get("overhead"), flags.get("overhead_file")
    )
    report = explain_report(
        snapshot,
        predicted=predicted,
        overheads=overheads,
        calibrate=calibrate,
        device_used_gib=device_used_gib,
        gpu_memory_bytes=memory_bytes,
    )
    typer.echo(json_text(report) if as_json else explain_table(report))


def _command() -> Any:
    def run(**values: Any) -> Any:
        return explain_cmd(values.pop("snapshot"), **values)

    snapshot = inspect.Parameter(
        "snapshot",
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[
            str,
            typer.Argument(
                metavar="SNAPSHOT",
                help="A torch.cuda.memory._dump_snapshot pickle (or an OOM-time dump).",
            ),
        ],
    )
    parameters = [snapshot, *(typer_parameter(o) for o in EXPLAIN_OPTIONS)]
    run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in parameters}
    run.__doc__ = explain_cmd.__doc__
    return run


def register(app: typer.Typer) -> None:
    """Add `explain` to the CLI app."""
    app.command("explain", epilog=EXIT_CODES)(_command())
