"""The `fit`, `sweep` and `points` commands, registered on the CLI's typer app by `register`.

Bad input raises ValueError (one line); the CLI's main() prints it and exits with code 2.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Annotated, Any

import typer

from trainmem.engine import (
    FRAMEWORKS,
    PRECISIONS,
    optimizer_columns,
)
from trainmem.hardware import GIB, load_gpus, parse_fleet
from trainmem.report import (
    check_headroom,
    choice,
    command_defaults,
    command_fields,
    jsonable,
    model_spec,
)
from trainmem.results import query_points
from trainmem.sweep import (
    Progress,
    SearchResult,
    Space,
    fit_report,
    make_space,
    parse_objectives,
    run_exhaustive,
    run_optuna,
)

from ._options import (
    AsJson,
    Attention,
    Cp,
    Ep,
    Framework,
    GlobalBatchSize,
    Gpu,
    HardwareDir,
    Headroom,
    LoraRank,
    LoraTargets,
    Loss,
    MicroBatchSize,
    Model,
    ModelsDir,
    NumGpus,
    Offload,
    Optimizer,
    OptimizersDir,
    Pp,
    Precision,
    ProfileFile,
    Qlora,
    Recompute,
    SeqLen,
    SequenceParallel,
    Tp,
    VirtualStages,
    Zero,
)

# ---- fit ---------------------------------------------------------------------------------------


def fit_cmd(
    model: Model = ("llama-3.1-8b"),
    gpu: Gpu = ("h100-sxm-80gb"),
    num_gpus: NumGpus = 1,
    seq_len: SeqLen = 2048,
    micro_batch_size: MicroBatchSize = 1,
    global_batch_size: GlobalBatchSize = 0,
    precision: Precision = "amp-bf16",
    optimizer: Optimizer = "adamw",
    recompute: Recompute = "none",
    attention: Attention = "flash",
    zero: Zero = 0,
    tp: Tp = 1,
    pp: Pp = 1,
    virtual_stages: VirtualStages = 1,
    cp: Cp = 1,
    sequence_parallel: SequenceParallel = False,
    framework: Framework = "hf",
    ep: Ep = 1,
    offload: Offload = "none",
    lora_rank: LoraRank = 0,
    lora_targets: LoraTargets = "all-linear",
    qlora: Qlora = False,
    loss: Loss = "full",
    headroom: Headroom = 0.10,
    hardware_dir: HardwareDir = (None),
    minimize: Annotated[
        str,
        typer.Option(help="micro-batch-size: the largest that fits; num-gpus: the fewest GPUs."),
    ] = "micro-batch-size",
    max_micro_batch_size: Annotated[int, typer.Option(help="Largest micro-batch tried.")] = 1024,
    max_num_gpus: Annotated[int, typer.Option(help="Most GPUs tried (num-gpus).")] = 16384,
    models_dir: ModelsDir = None,
    optimizers_dir: OptimizersDir = None,
    profile_file: ProfileFile = None,
    as_json: AsJson = False,
) -> None:
    """The largest micro-batch that fits (or, --minimize num-gpus, the fewest GPUs)."""
    result = fit_report(**command_fields(locals()))
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    report = result["estimate"]
    by_gpus = minimize == "num-gpus"
    answer = result["min_num_gpus" if by_gpus else "max_micro_batch_size"]
    if answer is None:
        typer.echo(f"nothing fits on {report['gpu']['name']} ({result['reason']})")
        for entry in result.get("advice", [])[:5]:
            verdict = "fits" if entry["fits"] else "still does not fit"
            typer.echo(
                f"  {entry['change']}: saves {entry['saved_bytes'] / GIB:.2f} GiB, {verdict}"
            )
        return
    what = "smallest GPU count" if by_gpus else "largest micro-batch size"
    typer.echo(
        f"{what} that fits: {answer} ({report['model']} on {report['config']['num_gpus']} x "
        f"{report['gpu']['name']}, seq {seq_len}): peak "
        f"{report['peak_device_bytes'] / GIB:.2f} GiB"
    )


# ---- sweep -------------------------------------------------------------------------------------

SHOW = ("gpu", "num_gpus", "tp", "pp", "virtual_stages", "cp", "ep", "dp", "zero", "recompute",
        "offload", "micro_batch_size", "grad_accum_steps")  # fmt: skip


def _default_study(model: str, fleet: str, seq_len: int, gbs: int, method: str) -> str:
    name = f"{model}-{fleet}-s{seq_len}-g{gbs}-{method}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_.-")[:120] or "study"


def _best_json(row: dict[str, Any]) -> dict[str, Any]:
    return jsonable({
        "configuration": {k: row[k] for k in SHOW},
        "fits": row["fits"],
        "cost_per_million_tokens": row["cost_per_million_tokens"],
        "step_time_s": row["step_time_s"],
        "tokens_per_second": row["tokens_per_second"],
        "mfu": row["mfu"],
        "peak_device_bytes": row["peak_device_bytes"],
        "breakdown": {k: row[k] for k in ("parameters", "master_weights", "gradients",
                                          "optimizer_states", "activations", "transient",
                                          "framework_overhead", "fragmentation")},
    })  # fmt: skip


def _top_table(result: SearchResult) -> str:
    cols = ("gpu", "num_gpus", "tp", "pp", "virtual_stages", "cp", "ep", "zero", "recompute",
            "offload", "micro_batch_size", "grad_accum_steps")  # fmt: skip
    heads = ("gpu", "n", "tp", "pp", "v", "cp", "ep", "zero", "recompute", "offload", "mbs",
             "accum")  # fmt: skip
    lines = [" ".join(f"{h:>9}" if i else f"{h:<16}" for i, h in enumerate(heads))
             + f"{'GiB':>8}{'step s':>9}{'$/Mtok':>9}"]  # fmt: skip
    for row in result.top.iter_rows(named=True):
        cells = " ".join(f"{row[c]!s:>9}" if i else f"{row[c]!s:<16}" for i, c in enumerate(cols))
        lines.append(
            f"{cells}{row['peak_device_bytes'] / GIB:>8.2f}{row['step_time_s']:>9.3g}"
            f"{row['cost_per_million_tokens']:>9.4g}"
        )
    return "\n".join(lines)


def sweep_cmd(
    model: Model = ("llama-3.1-8b"),
    fleet: Annotated[
        str, typer.Option(help="COUNTxGPU[,COUNTxGPU...] or a fleet TOML file.")
    ] = "8xh100-sxm-80gb",
    seq_len: SeqLen = 4096,
    global_batch_size: GlobalBatchSize = 256,
    method: Annotated[str, typer.Option(help="exhaustive|optuna")] = "exhaustive",
    trials: Annotated[int, typer.Option(help="Optuna: the study's total trials.")] = 200,
    seed: Annotated[int, typer.Option(help="Optuna sampler seed.")] = 0,
    objective: Annotated[
        str, typer.Option(help="cost|time|gpus; two comma-separated: the Pareto front.")
    ] = "cost",
    storage: Annotated[
        str | None, typer.Option(help="Optuna RDB URL (default: sqlite file in --out).")
    ] = None,
    study_name: Annotated[str | None, typer.Option(help="Study name (default: derived).")] = None,
    workers: Annotated[int, typer.Option(help="Optuna: local worker processes.")] = 1,
    jobs: Annotated[int, typer.Option(help="Exhaustive: local processes over the chunks.")] = 1,
    out: Annotated[str, typer.Option(help="Output folder (Parquet points, Optuna db).")] = "out",
    precision: Precision = "mixed-bf16",
    optimizer: Optimizer = "adamw",
    framework: Framework = "megatron",
    max_micro_batch_size: Annotated[int, typer.Option(help="Largest micro-batch tried.")] = 16,
    max_pp: Annotated[int, typer.Option(help="Largest pipeline degree tried.")] = 16,
    max_cp: Annotated[int, typer.Option(help="Largest context-parallel degree tried.")] = 4,
    headroom: Headroom = 0.10,
    hardware_dir: HardwareDir = (None),
    models_dir: ModelsDir = None,
    optimizers_dir: OptimizersDir = None,
    profile_file: ProfileFile = None,
    as_json: AsJson = False,
) -> None:
    """Search a fleet for the cheapest (or fastest, or smallest) configuration that fits."""
    choice("method", method, ("exhaustive", "optuna"))
    choice("precision", precision, PRECISIONS)
    optimizer_fields = optimizer_columns(optimizer, optimizers_dir)
    choice("framework", framework, FRAMEWORKS)
    objectives = parse_objectives(objective)
    check_headroom(headroom)
    gpus = load_gpus(hardware_dir)
    spec = model_spec(model, models_dir=models_dir, profile_file=profile_file)
    if spec.profile is not None and precision not in (
        command_defaults(sweep_cmd)["precision"],
        spec.profile.precision,
    ):
        raise ValueError(
            f"precision: --profile {profile_file} was traced with {spec.profile.precision}; "
            f"got --precision {precision}"
        )
    space = make_space(
        spec, parse_fleet(fleet, gpus), gpus,
        seq_len=seq_len, global_batch_size=global_batch_size, precision=precision,
        optimizer=optimizer_fields, framework=framework, max_micro_batch_size=max_micro_batch_size,
        max_pp=max_pp, max_cp=max_cp, headroom=headroom,
    )  # fmt: skip
    study = study_name or _default_study(spec.name, fleet, seq_len, global_batch_size, method)
    search = functools.partial(
        _search, space, method=method, out=out, study=study, objectives=objectives,
        trials=trials, seed=seed, storage=storage, workers=workers, jobs=jobs,
    )  # fmt: skip
    if as_json:
        result = search()
    else:
        from rich.progress import Progress as ProgressBar

        unit = "points" if method == "exhaustive" else "trials"
        with ProgressBar(transient=True) as bar:
            task = bar.add_task(f"{method}: {unit}", total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            result = search(progress=progress)
    payload: dict[str, Any] = {
        "study": study,
        "method": method,
        "objective": list(objectives),
        "best": _best_json(result.best[0]) if len(result.best) == 1 else None,
        "num_points": result.num_points,
        "parquet": result.parquet,
        "elapsed_s": round(result.elapsed_s, 3),
        **{k: v for k, v in result.extra.items() if k != "study"},
    }
    if len(objectives) > 1:
        payload["pareto"] = [_best_json(r) for r in result.best]
    if as_json:
        typer.echo(json.dumps(jsonable(payload), indent=2))
        return
    typer.echo(
        f"{method}: {result.num_points:,} points of {space.model.name} on {fleet} in "
        f"{result.elapsed_s:.2f} s -> {result.parquet}"
    )
    if not result.best:
        typer.echo("nothing fits")
        return
    typer.echo(_top_table(result))
    if len(objectives) > 1:
        typer.echo(f"Pareto front ({' vs '.join(objectives)}): {len(result.best)} points")


def _search(
    space: Space,
    *,
    method: str,
    out: str,
    study: str,
    objectives: tuple[str, ...],
    trials: int,
    seed: int,
    storage: str | None,
    workers: int,
    jobs: int,
    progress: Progress | None = None,
) -> SearchResult:
    if jobs < 1 or workers < 1:
        raise ValueError("--jobs and --workers must be >= 1")
    if method == "exhaustive":
        if storage or workers != 1:
            raise ValueError("--storage and --workers apply to --method optuna")
        return run_exhaustive(space, out=out, study=study, objectives=objectives, jobs=jobs,
                              progress=progress)  # fmt: skip
    if jobs != 1:
        raise ValueError("--jobs applies to --method exhaustive (optuna: --workers)")
    return run_optuna(space, out=out, study=study, trials=trials, objectives=objectives,
                      seed=seed, storage=storage, workers=workers, progress=progress)  # fmt: skip


# ---- points ------------------------------------------------------------------------------------


def points_cmd(
    path: Annotated[str, typer.Argument(help="Output folder of a sweep (or one study's).")] = "out",
    where: Annotated[
        str | None, typer.Option(help='SQL WHERE clause, e.g. "fits AND num_gpus <= 8".')
    ] = None,
    sort: Annotated[str | None, typer.Option(help="Sort by this column (ascending).")] = None,
    descending: Annotated[bool, typer.Option("--descending", help="Sort descending.")] = False,
    head: Annotated[int, typer.Option(help="At most this many rows.")] = 10,
    columns: Annotated[
        str | None, typer.Option(help="Comma-separated columns to show (default: a summary).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list of rows.")] = False,
) -> None:
    """Query stored points (polars): filter, sort, limit."""
    frame = query_points(path, where=where, sort=sort, descending=descending, head=head)
    if columns:
        wanted = [c.strip() for c in columns.split(",") if c.strip()]
        unknown = [c for c in wanted if c not in frame.columns]
        if unknown:
            raise ValueError(f"--columns: unknown column {unknown[0]!r}")
        frame = frame.select(wanted)
    elif not as_json:
        frame = frame.select([*SHOW, "peak_device_bytes", "fits", "step_time_s",
                              "cost_per_million_tokens"])  # fmt: skip
    if as_json:
        typer.echo(json.dumps(jsonable(frame.to_dicts()), indent=2))
        return
    import polars as pl

    with pl.Config(tbl_rows=max(head, 1), tbl_cols=-1, tbl_width_chars=200):
        typer.echo(str(frame))


def register(app: typer.Typer) -> None:
    """Add `fit`, `sweep` and `points` to the CLI app."""
    app.command("fit")(fit_cmd)
    app.command("sweep")(sweep_cmd)
    app.command("points")(points_cmd)
