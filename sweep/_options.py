"""The options every search takes (sweep, recommend) and `trainmem sweep`'s, declared once
(trainmem.report.Option) in a module that imports no search: the command line lists them
without loading polars or Optuna."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from trainmem.engine import FIELD_NAMES, SWEEP_AXES
from trainmem.report import (
    ALLOW_LONG_SEQ,
    AS_JSON,
    FAMILY,
    HEADROOM,
    HOST_MEMORY_GIB,
    MODEL,
    PROFILE_FILE,
    SEARCH_OVERHEAD_OPTIONS,
    TOKENS,
    USER_DIRS,
    Option,
    training_options,
)
from trainmem.report._options import RISK_OPTIONS

SEARCH_DEFAULTS = {
    "seq_len": 4096,
    "global_batch_size": 256,
    "precision": "mixed-bf16",
    "framework": "megatron",
}
"""Training-field defaults of a search (sweep, recommend): Megatron's mixed bf16 at 4k tokens.
Sequence parallelism is on in every search point (not an option there)."""
MAX_PROCESSES = 1024
"""The most --jobs / --workers: each is a process of its own (~270 MB); 1,000,000 reached
joblib's own refusal ('Numeric literal 2000000 is too large'), a few hundred thousand would
have started that many."""
JOB_FIELDS = ("seq_len", "global_batch_size", "precision", "optimizer", "framework")
"""Training fields a search space always takes; the others fix or pin it only when given."""
OBJECTIVE_HELP = (
    "cost | time | gpus (time with --max-cost-per-million-tokens: the fastest under a budget; "
    "with --use-all-gpus: the fastest on whole pools)"
)
SEARCH_OPTIONS: tuple[Option, ...] = (
    Option(name="objective", type=str, default="cost", help=OBJECTIVE_HELP),
    Option(
        name="max_micro_batch_size",
        type=int,
        default=16,
        ge=1,
        le=1 << 16,
        help="Largest micro-batch tried.",
    ),
    Option(
        name="max_pp", type=int, default=16, ge=1, le=1024, help="Largest pipeline degree tried."
    ),
    Option(
        name="max_cp",
        type=int,
        default=4,
        ge=1,
        le=1024,
        help="Largest context-parallel degree tried.",
    ),
    HOST_MEMORY_GIB,
    Option(
        name="min_gpus",
        type=int,
        default=1,
        ge=1,
        le=1 << 24,
        help="Fewest GPUs a configuration may take (the GPU counts tried start there).",
    ),
    Option(
        name="use_all_gpus",
        type=bool,
        default=False,
        flag="--use-all-gpus",
        help="Only configurations that take a whole pool of the fleet.",
    ),
    Option(
        name="max_step_time_s",
        type=float | None,
        default=None,
        gt=0,
        flag="--max-step-time",
        help=(
            "Slowest step allowed, seconds: a slower configuration does not qualify "
            "(reason: step time above --max-step-time)."
        ),
    ),
    Option(
        name="max_cost_per_million_tokens",
        type=float | None,
        default=None,
        gt=0,
        flag="--max-cost-per-million-tokens",
        help=(
            "Cost budget, $ per million tokens: a dearer configuration does not qualify "
            "(reason: cost above --max-cost-per-million-tokens); with --objective time, the "
            "fastest plan under the budget."
        ),
    ),
    dataclasses.replace(
        TOKENS, help="Total training tokens: adds the time (and cost) to train them on the answer."
    ),
    ALLOW_LONG_SEQ,
    *RISK_OPTIONS,
    *SEARCH_OVERHEAD_OPTIONS,
)
FLEET = Option(
    name="fleet",
    type=str,
    default="8xh100-sxm-80gb",
    help="COUNTxGPU[,COUNTxGPU...] or a fleet TOML file.",
)


def extra_fields(job: Mapping[str, Any]) -> dict[str, Any]:
    """The job's training fields beyond JOB_FIELDS that fix or pin the space (None: searched;
    sequence_parallel: on in every search)."""
    fixed = (*JOB_FIELDS, "sequence_parallel")
    return {k: v for k, v in job.items() if k in FIELD_NAMES and k not in fixed and v is not None}


STORE_MODES = ("all", "valid", "fits", "best-per-layout")
"""What a sweep's parts hold of its points (metadata `trainmem_store`); anything but "all" is a
partial table (sweep/_parts.py `stored_rows`)."""
STORE_HELP = (
    "What the Parquet parts keep: all (every point), valid (valid layouts, fitting or not), "
    "fits (fitting points), best-per-layout (each layout's best fitting point by --objective; "
    "a layout: GPU type and count, tp, pp, virtual stages, cp, ep, with dp following; ZeRO, "
    "recompute, offload and micro-batch are chosen within it). Anything but all is a partial "
    "table (metadata trainmem_store); a rerun with --store all rebuilds the rest."
)


SWEEP_OPTIONS: tuple[Option, ...] = (
    MODEL,
    FAMILY,
    FLEET,
    *training_options(
        defaults=SEARCH_DEFAULTS, exclude=("sequence_parallel",), optional=SWEEP_AXES
    ),
    Option(
        name="method",
        type=str,
        default="exhaustive",
        choices=("exhaustive", "optuna"),
        help="exhaustive|optuna",
    ),
    Option(name="trials", type=int, default=200, ge=1, help="Optuna: the study's total trials."),
    Option(
        name="seed",
        type=int,
        default=0,
        ge=0,
        le=2**32 - 1,  # numpy's RandomState, which Optuna's samplers seed, takes no more
        help="Optuna sampler seed.",
    ),
    Option(
        name="objective",
        type=str,
        default="cost",
        help="cost | time | gpus; two comma-separated: the Pareto front.",
    ),
    Option(
        name="storage",
        type=str | None,
        default=None,
        help=(
            "Optuna storage URL (sqlite:///FILE, postgresql://...) to share a study between "
            "processes or machines. Default: in memory, rebuilt from the points in --out on a "
            "rerun (one process per study); with --workers > 1, or when it already holds the "
            "study, the SQLite file OUT/optuna.db."
        ),
    ),
    Option(name="study_name", type=str | None, default=None, help="Study name (default: derived)."),
    Option(
        name="workers",
        type=int,
        default=1,
        ge=1,
        le=MAX_PROCESSES,
        help="Optuna: local worker processes.",
    ),
    Option(
        name="warm_start",
        type=bool,
        default=True,
        flag="--warm-start",
        help=(
            "Optuna: a new study's first trials are the best layouts of the exhaustive "
            "search of a coarse version of the space, then of the cell around its optimum "
            "(a few % of its points)."
        ),
    ),
    Option(
        name="jobs",
        type=int,
        default=1,
        ge=1,
        le=MAX_PROCESSES,
        help="Exhaustive: local processes over the chunks.",
    ),
    Option(
        name="scheduler",
        type=str | None,
        default=None,
        help=(
            "Where the work runs: local (default: this machine, --jobs processes) or a Dask "
            "scheduler, tcp://HOST:PORT (dask://, tls:// too), whose workers evaluate the "
            "exhaustive search's chunks and write them to --out (a folder every node sees, or "
            "an s3://, gs://, hdfs:// URL), or run Optuna's --workers (with a "
            "postgresql:// or mysql:// --storage). Workers: pip install 'trainmem[distributed]'."
        ),
    ),
    Option(name="out", type=str, default="out", help="Output folder (Parquet points, Optuna db)."),
    Option(name="store", type=str, default="all", choices=STORE_MODES, help=STORE_HELP),
    *SEARCH_OPTIONS[1:],
    HEADROOM,
    *USER_DIRS,
    PROFILE_FILE,
    AS_JSON,
)
"""`trainmem sweep`: the search defaults (SEARCH_DEFAULTS); a searched field given pins its
axis, any other training field given is fixed for every point."""
