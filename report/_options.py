"""The commands' options, declared once as data: the CLI (trainmem.cli) makes typer options of
them, the HTTP service (trainmem.serve) pydantic request fields, the Python API keyword
arguments.

A command's options are the training configuration's fields (engine TrainingConfig: their
type, default, choices, bounds and help live there) plus its own `Option`s below. A command may
change a training field's default (sweep and recommend search mixed-bf16 on Megatron) and leave
fields out (the ones a sweep searches).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainmem.engine import FAMILIES, FIELDS, KNOBS, TYPES
from trainmem.engine._lengths import BATCHINGS


@dataclass(frozen=True, slots=True, kw_only=True)
class Option:
    """One command option: name (the Python keyword; --name-with-dashes on the CLI), type,
    default, help, choices and bounds (inclusive `ge`/`le`, exclusive `gt`/`lt`)."""

    name: str
    type: Any
    """int, float, bool, str, or an optional / list form: str | None, list[str] | None."""
    default: Any
    help: str
    flag: str | None = None
    """The CLI spelling when it is not --name-with-dashes (`--json`, `--per-stage`)."""
    choices: tuple[str, ...] | None = None
    ge: float | None = None
    le: float | None = None
    gt: float | None = None
    lt: float | None = None
    http: bool = True
    """Offered over HTTP (False: names a server path or only changes how output is printed)."""

    def with_default(self, default: Any) -> Option:
        return dataclasses.replace(self, default=default)


JOB_DEFAULT_MODEL = "llama-2-13b"
"""One job's --model default (estimate, fit, heatmap, compare): the design's first example."""
JOB_DEFAULTS = {
    "num_gpus": 8,
    "zero": 3,
    "recompute": "full",
    "precision": "mixed-bf16",
    "micro_batch_size": 4,
}
"""Training-field defaults of one job (estimate, fit, heatmap, compare; CLI and HTTP): the
design's first example, a 13B model on 8 x H100 with ZeRO-3 (FSDP full shard under hf), full
recompute, bf16 (FSDP MixedPrecision: 16-bit weights, fp32 master) and micro-batch 4. It fits
with the default 10% headroom (peak 32.6 GiB of 71.3 GiB at seq 2048), so that the first
command a user runs answers with a fitting job. The Python API (`trainmem.estimate()`) keeps
TrainingConfig's own defaults."""
TOKENS = Option(
    name="tokens",
    type=float | None,
    default=None,
    gt=0,
    le=1e18,
    help="Token budget: adds time and cost to train it.",
)
"""--tokens: the training run's tokens, for its time and cost (estimate, sweep, recommend)."""

DEFAULT_PRECISIONS = ("amp-bf16", str(JOB_DEFAULTS["precision"]))
"""The precisions a job gets when --precision is left out (TrainingConfig's, the one-job
commands'): on a GPU without bf16 they run as their fp16 counterpart (report/_validate.py
runnable_precision)."""

DEFAULTS_NOTE = {
    "precision": (
        " (default: mixed-bf16 for every command: one job, estimate, fit, heatmap, and a "
        "search, sweep, recommend)"
    ),
    "framework": (
        " (default: hf for one job: estimate, fit, heatmap; megatron for a search: sweep, "
        "recommend, whose tp/pp/cp layouts are Megatron's)"
    ),
}
"""Said in every command's --help: the one job's defaults (a Hugging Face run) and a search's
(Megatron's), so that no command differs from another silently."""


def training_options(
    *,
    defaults: Mapping[str, Any] | None = None,
    exclude: Sequence[str] = (),
    optional: Sequence[str] = (),
) -> tuple[Option, ...]:
    """The training configuration's fields as options (declaration order).

    `defaults` overrides a field's default for one command; `exclude` leaves fields out;
    `optional` fields default to None (unset: the command decides, e.g. a sweep searches it).
    """
    out = []
    for f in FIELDS:
        if f.name in exclude:
            continue
        k = KNOBS[f.name]
        kind = TYPES[f.name]
        default = (defaults or {}).get(f.name, f.default)
        if f.name in optional:
            kind, default = kind | None, None
        out.append(
            Option(
                name=f.name,
                type=kind,
                default=default,
                help=k.help + DEFAULTS_NOTE.get(f.name, ""),
                flag=k.flag,
                choices=None if k.open_choices else k.choices,
                ge=k.ge,
                le=k.le,
            )
        )
    return tuple(out)


def option_defaults(options: Sequence[Option]) -> dict[str, Any]:
    """Each option's default by name."""
    return {o.name: o.default for o in options}


AS_JSON = Option(
    name="as_json",
    type=bool,
    default=False,
    help="Print one JSON object.",
    flag="--json",
    http=False,
)
CHECK = Option(
    name="check",
    type=bool,
    default=False,
    flag="--check",
    http=False,
    help=(
        "Exit code 1 when it does not fit (recommend: when no plan fits); the exit codes "
        "are below (docs/exit-codes.md)."
    ),
)
EXIT_CODES = (
    "Exit codes: 0 the command ran (with --check: it fits); 1 with --check, it does not fit; "
    "2 bad input (one line on stderr naming the field)."
)
"""The exit-code contract every command shares (docs/exit-codes.md), shown in --help."""
MODEL = Option(
    name="model", type=str, default="llama-3.1-8b", help="Preset name or path to a HF config.json."
)
"""A search's --model (sweep, recommend)."""
JOB_MODEL = MODEL.with_default(JOB_DEFAULT_MODEL)
"""One job's --model (estimate, fit, heatmap, compare)."""
FAMILY = Option(
    name="family",
    type=str | None,
    default=None,
    choices=tuple(FAMILIES),
    help=(
        "Read a config.json whose model_type trainmem does not know with this family's layout "
        "(what the architecture does differently is then not counted)."
    ),
)
"""Forces a reader on an unknown model_type (engine FAMILIES); unset: the model_type decides."""
GPU = Option(
    name="gpu", type=str, default="h100-sxm-80gb", help="GPU profile name (see `trainmem gpus`)."
)
HEADROOM = Option(
    name="headroom",
    type=float,
    default=0.10,
    help="Fraction of usable memory kept free.",
    ge=0,
    lt=1,
)
HOST_MEMORY_GIB = Option(
    name="host_memory_gib",
    type=float | None,
    default=None,
    gt=0,
    le=1 << 20,
    help=(
        "Host RAM per node, GiB (default: the fleet pool's, else the GPU profile's). A "
        "configuration whose ranks on one node need more host memory (CPU offload) does not fit."
    ),
)
"""A node's host RAM: bounds what CPU offload may move off the GPUs (GiB at the edge)."""
ALLOW_LONG_SEQ = Option(
    name="allow_long_seq",
    type=bool,
    default=False,
    flag="--allow-long-seq",
    help=(
        "Estimate a seq_len beyond a model's learned position embeddings (GPT-2, BERT) as if "
        "its table were extended (a warning instead of an error)."
    ),
)
"""Learned absolute positions have max_position_embeddings rows: a longer sequence is refused
unless this is set (rotary models only get a warning: RoPE can be scaled)."""


def gib_to_bytes(gib: float | None) -> int | None:
    """A size given in GiB (2**30 bytes) at the edge as whole bytes; None stays None."""
    return None if gib is None else max(int(round(gib * 2**30)), 1)


HARDWARE_DIR = Option(
    name="hardware_dir",
    type=str | None,
    default=None,
    http=False,
    help="Folder of extra GPU TOML files (or TRAINMEM_HARDWARE_DIR).",
)
MODELS_DIR = Option(
    name="models_dir",
    type=str | None,
    default=None,
    http=False,
    help="Folder of extra model presets, NAME.json (or TRAINMEM_MODELS_DIR).",
)
OPTIMIZERS_DIR = Option(
    name="optimizers_dir",
    type=str | None,
    default=None,
    http=False,
    help="Folder of user optimizers, NAME.toml (or TRAINMEM_OPTIMIZERS_DIR).",
)
PROFILE_FILE = Option(
    name="profile_file",
    type=str | None,
    default=None,
    flag="--profile",
    http=False,
    help="Activation profile JSON (`trainmem trace --save-profile`) as the model.",
)
USER_DIRS = (HARDWARE_DIR, MODELS_DIR, OPTIMIZERS_DIR)
OVERHEAD_FILE = Option(
    name="overhead_file",
    type=str | None,
    default=None,
    http=False,
    help=(
        "TOML file of overhead values, the --overhead keys (what `trainmem explain "
        "--calibrate` writes); --overhead items given too win."
    ),
)
"""--overhead-file: every command that takes --overhead (report/_overhead_file.py)."""
OVERHEAD = Option(
    name="overhead",
    type=list[str] | None,
    default=None,
    help="Override an overhead parameter, KEY=BYTES (repeatable).",
)
"""--overhead KEY=VALUE (engine Overheads' names): over the GPU's own defaults."""
SEARCH_OVERHEAD = dataclasses.replace(
    OVERHEAD,
    help=(
        "Override an overhead parameter, KEY=BYTES (repeatable), on every pool's GPU: the key "
        "given replaces each GPU's own default, the others stay each GPU's."
    ),
)
"""A search's --overhead (sweep, recommend): the same values over every pool of the fleet."""
OVERHEAD_OPTIONS = (OVERHEAD, OVERHEAD_FILE)
"""--overhead and --overhead-file, for one job (estimate, fit, heatmap, compare, check)."""
SEARCH_OVERHEAD_OPTIONS = (SEARCH_OVERHEAD, OVERHEAD_FILE)
"""--overhead and --overhead-file of a search (sweep, recommend)."""

RISK_OPTIONS: tuple[Option, ...] = (
    Option(
        name="lengths",
        type=str | None,
        default=None,
        help=(
            "Token counts of the dataset's sequences, one per sequence: a Parquet, CSV or JSON "
            "file (a column named length or num_tokens, or the only one; JSON: a list). Adds "
            "the OOM risk of an epoch (the `risk` key)."
        ),
    ),
    Option(
        name="lengths_histogram",
        type=str | None,
        default=None,
        help=(
            "The dataset as (length, count) pairs: a CSV or Parquet with columns length,count, "
            "or JSON [[length, count], ...] (instead of --lengths)."
        ),
    ),
    Option(
        name="batching",
        type=str,
        default="pad-longest",
        choices=BATCHINGS,
        help=(
            "pad-longest | packed | bucketed (with --lengths: pad each micro-batch to its "
            "longest sequence; pack documents into rows of seq_len; pad to the length "
            "bucket's upper bound)."
        ),
    ),
    Option(
        name="buckets",
        type=str | None,
        default=None,
        help=(
            "bucketed: the buckets' upper bounds in tokens, comma-separated (default: powers "
            "of two, then seq_len)."
        ),
    ),
    Option(
        name="risk",
        type=float,
        default=0.001,
        ge=0,
        le=1,
        help=(
            "The OOM probability per epoch a job may take (with --lengths: fit's answer and a "
            "sweep's points keep under it)."
        ),
    ),
)
"""The dataset-risk options of estimate, fit and sweep (HTTP: `lengths` a list of counts,
`lengths_histogram` a list of [length, count] pairs; never a path)."""
ESTIMATE_OPTIONS: tuple[Option, ...] = (
    JOB_MODEL,
    FAMILY,
    GPU,
    *training_options(defaults=JOB_DEFAULTS),
    HEADROOM,
    HOST_MEMORY_GIB,
    ALLOW_LONG_SEQ,
    *USER_DIRS,
    OVERHEAD,
    OVERHEAD_FILE,
    Option(
        name="per_stage",
        type=bool,
        default=False,
        flag="--per-stage",
        help="Also report every pipeline stage's rank.",
    ),
    Option(
        name="advice",
        type=bool,
        default=True,
        flag="--advice",
        help=(
            "Search the changes that make the job fit (the `advice` key; about 95% of one "
            "estimate's time). --no-advice: the breakdown, peaks, fit and time only."
        ),
    ),
    AS_JSON,
    CHECK,
    TOKENS,
    Option(
        name="time_param",
        type=list[str] | None,
        default=None,
        help="Override a step-time constant, KEY=VALUE (repeatable).",
    ),
    PROFILE_FILE,
    *RISK_OPTIONS,
)
"""`trainmem estimate`, `POST /v1/estimate`, `trainmem.estimate`."""
