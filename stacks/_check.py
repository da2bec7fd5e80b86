"""`trainmem check`: a job's own config files in, estimate's answer out, with every field's
origin.

`read_job` tells each file's stack, reads the main file then the auxiliary ones (DeepSpeed,
accelerate, launch lines) into one Reading; `check_report` lays flags over it, fills the rest
with trainmem's defaults, resolves the model offline and runs estimate.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from trainmem.catalog import load_model
from trainmem.engine import DEFAULTS_BY_FIELD, FIELD_NAMES, parallel_layout
from trainmem.report import ESTIMATE_OPTIONS, GPU, check_options

from ._files import parse
from ._models import resolve_model
from ._reading import Doc, Read, Reading
from ._stacks import AUXILIARY_ORDER, STACK_NAMES, Stack, stacks

STACK_CHOICES = ("auto", *STACK_NAMES)


def detect(doc: Doc) -> str | None:
    """The stack a file belongs to (highest detect score; None when no stack claims it)."""
    scores = [(s.detect(doc), -k, s.name) for k, s in enumerate(stacks().values())]
    score, _, name = max(scores)
    return name if score > 0 else None


def assign(docs: list[Doc], stack: str) -> list[tuple[Doc, Stack]]:
    """Each file with the stack that reads it: `stack` (unless auto) for every file that is not
    an auxiliary one (DeepSpeed, accelerate, a launch line), detection for the rest."""
    if stack not in STACK_CHOICES:
        raise ValueError(f"stack: unknown value {stack!r}; allowed: {', '.join(STACK_CHOICES)}")
    table = stacks()
    out = []
    for doc in docs:
        found = detect(doc)
        if stack != "auto" and (found is None or not table[found].auxiliary or len(docs) == 1):
            found = stack
        if found is None:
            raise ValueError(
                f"{doc.name}: cannot tell which stack this file is for; give --stack "
                f"({'|'.join(STACK_NAMES)})"
            )
        out.append((doc, table[found]))
    return out


def main_stack(assigned: list[tuple[Doc, Stack]]) -> Stack:
    """The job's stack: its one main file's, else its auxiliary files' first (DeepSpeed, then
    accelerate)."""
    mains = {s.name: doc.name for doc, s in assigned if not s.auxiliary}
    if len(mains) > 1:
        described = ", ".join(f"{f} ({s})" for s, f in mains.items())
        raise ValueError(f"files: {described} are configs of different stacks; check one job")
    if mains:
        return stacks()[next(iter(mains))]
    names = {s.name for _, s in assigned}
    for name in AUXILIARY_ORDER:
        if name in names and stacks()[name].selectable:
            return stacks()[name]
    raise ValueError("files: a launch line gives the GPUs only; add the job's training config file")


def read_job(files: Mapping[str, str], stack: str = "auto") -> Reading:
    """Every field a job's files give (with its origin and the stack's defaults), unresolved:
    the model is the name the file gives."""
    if not files:
        raise ValueError("files: give at least one config file")
    docs = [parse(name, text) for name, text in files.items()]
    assigned = assign(docs, stack)
    main = main_stack(assigned)
    reading = Reading(stack=main.name, stack_version=main.version)
    order = {name: k for k, name in enumerate(AUXILIARY_ORDER)}
    ordered = sorted(assigned, key=lambda ds: (ds[1].auxiliary, order.get(ds[1].name, -1)))
    for doc, s in ordered:
        if s.mapping_only and not isinstance(doc.data, Mapping):
            raise ValueError(
                f"{doc.name}: stack {s.name} reads a mapping of keys (YAML, JSON or TOML); "
                "this file reads as a script or plain text"
            )
        s.read(doc, reading)
    reading.default("framework", main.framework, f"{main.name} (trainmem: the stack's framework)")
    return reading


ESTIMATE_ONLY = tuple(
    o.name
    for o in ESTIMATE_OPTIONS
    if o.name not in FIELD_NAMES and o.name not in ("model", "as_json", "check")
)
"""estimate options that are not training fields (flags only; a file may give `gpu`)."""
TRAINMEM_DEFAULTS = {**DEFAULTS_BY_FIELD, "gpu": GPU.default}


def data_parallel(values: Mapping[str, Any]) -> int:
    """The data-parallel degree of a job's fields: the engine's one derivation
    (engine parallel_layout: num_gpus // (tp x pp x cp), at least 1)."""
    layout = {k: values[k] for k in ("num_gpus", "tp", "pp", "cp", "micro_batch_size")}
    return int(parallel_layout({**layout, "global_batch_size": 0})["dp"])


def resolved_fields(
    reading: Reading,
    flags: Mapping[str, Any],
    *,
    base_dir: str | None,
    local_paths: bool,
    models_dir: str | None,
) -> None:
    """Flags over the files, then trainmem's defaults for the rest, the model resolved."""
    for name, value in flags.items():
        if value is not None:
            reading.override(name, value, "flag")
    if not reading.has("model"):
        raise ValueError(
            "model: the files name no model; give --model (a preset or a config.json path)"
        )
    for name in ("gpu", *FIELD_NAMES):
        if not reading.has(name):
            reading.override(name, TRAINMEM_DEFAULTS[name], "trainmem-default")
    global_batch(reading)
    model = reading.fields["model"]
    if model.origin != "flag":
        resolved = resolve_model(
            str(model.value),
            models_dir=models_dir,
            base_dir=base_dir,
            local_paths=local_paths,
        )
        reading.override("model", resolved, model.origin, model.file)
        if resolved != model.value:
            reading.warn(f"model: {model.value!r} read as {resolved!r}")
    _images_warning(reading, models_dir=models_dir)


def _images_warning(reading: Reading, *, models_dir: str | None) -> None:
    """A vision-language model whose images per sequence no file or flag gives: the files
    cannot say (a dataset's), so the estimate is text only; a warning says so. A file that
    says its job is multimodal (a reader put freeze_vision) on a model read without a tower (a
    language-only preset, as the gemma-3-* ones are): a warning says the tower is missing."""
    try:
        vision = load_model(str(reading.fields["model"].value), models_dir=models_dir).vision
    except ValueError:  # estimate reports a model it cannot read, in its own words
        return
    multimodal = reading.fields["freeze_vision"].origin != "trainmem-default"
    if vision is None and multimodal:
        reading.warn(
            f"model: {reading.fields['model'].value!r} is read as a language model, without "
            "the vision tower this multimodal job loads: the tower's weights are not counted; "
            "give the checkpoint's config.json (--model PATH)"
        )
    if vision is not None and reading.fields["images_per_sample"].origin == "trainmem-default":
        reading.warn(
            "images_per_sample: a vision-language model's images per sequence are its "
            "dataset's; counted as text only: give --images-per-sample N"
        )


ACCUMULATION = "grad_accum_steps"
"""The micro-batches per optimizer step a file gives (HF `gradient_accumulation_steps`,
torchtune's, DeepSpeed's): readers put it, and the global batch is derived from it once every
field is known, so that a flag (`--num-gpus`, `--micro-batch-size`) changes it as the stack
would."""


def global_batch(reading: Reading) -> None:
    """global_batch_size = micro x accumulation x dp, when a file gives the accumulation and no
    file or flag gives the global batch itself (origin: the accumulation's key)."""
    accum = reading.fields.get(ACCUMULATION)
    gbs = reading.fields["global_batch_size"]
    if accum is None or gbs.origin != "trainmem-default":
        return
    values = {name: read.value for name, read in reading.fields.items()}
    total = int(values["micro_batch_size"]) * int(accum.value) * data_parallel(values)
    reading.fields["global_batch_size"] = Read(total, accum.origin, accum.file, accum.raw)


def check_report(
    files: Mapping[str, str],
    *,
    stack: str = "auto",
    base_dir: str | None = None,
    fleet: str | None = None,
    fix: bool = False,
    local_paths: bool = True,
    **flags: Any,
) -> dict[str, Any]:
    """`trainmem check --json`: estimate's report of the job the files describe, plus `read`
    (field -> value and origin), `stack`, `stack_version`, `unmodelled` and `warnings`; with
    `fix`, `fix` (the smallest edit of the files' own keys that fits, or None).

    `flags`: estimate's options given by the caller (None: not given); they override the files.
    `fleet`: one pool (`8xh100`), the GPU and the GPU count as flags. `local_paths` False
    (HTTP): a model name never reads a file.
    """
    from trainmem.report import estimate_report

    from ._options import CHECK_OPTIONS  # (it imports this module)

    if not isinstance(files, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        raise ValueError("files: expected a mapping of file name -> the file's text")
    given = {k: v for k, v in flags.items() if v is not None}
    check_options(CHECK_OPTIONS, given)  # the flags' bounds before any file (tp 2^63, nan)
    reading = read_job(files, stack)
    if fleet is not None:
        given.update(fleet_flags(fleet, given))
    options = {k: given.pop(k) for k in list(given) if k in ESTIMATE_ONLY and k != "gpu"}
    if fix:
        options["advice"] = True  # the fix is chosen among the advice's changes
    resolved_fields(
        reading,
        given,
        base_dir=base_dir,
        local_paths=local_paths,
        models_dir=options.get("models_dir"),
    )
    values = {name: read.value for name, read in reading.fields.items()}
    training = {k: values[k] for k in FIELD_NAMES}

    def run(changes: Mapping[str, Any]) -> dict[str, Any]:
        return estimate_report(
            {**training, **changes}, model=values["model"], gpu=values["gpu"], **options
        )

    try:
        report = run({})
    except ValueError as exc:
        raise ValueError(_with_origin(str(exc), reading.fields)) from None
    out = {**report, **reading_report(reading)}
    out["warnings"] = [*report.get("warnings", []), *out["warnings"]]  # estimate's first
    if fix:
        from ._fix import fix_report

        out["fix"] = fix_report(out, reading, run, lambda found: _reads_back(files, stack, found))
    return out


def reading_report(reading: Reading) -> dict[str, Any]:
    """The keys check adds to estimate's report: `stack`, `stack_version`, `read` (every field
    with its origin; the accumulation where a file gives it), `unmodelled`, `warnings`."""
    extra = (ACCUMULATION,) if reading.has(ACCUMULATION) else ()
    return {
        "stack": reading.stack,
        "stack_version": reading.stack_version,
        "read": {n: reading.fields[n].as_json() for n in ("model", "gpu", *FIELD_NAMES, *extra)},
        "unmodelled": list(reading.unmodelled),
        "warnings": list(reading.warnings),
    }


def _reads_back(files: Mapping[str, str], stack: str, found: list[dict[str, Any]]) -> bool:
    """Whether the files with `found` edits applied read back (the stack's reader accepts them)
    to the edits' values (flag edits are the command line's: nothing to read back)."""
    from ._fix import edited_texts

    texts = edited_texts(dict(files), found)
    if texts is None:
        return True  # a script or TOML edit: shown, not re-read
    try:
        again = read_job(texts, stack)
    except ValueError:
        return False
    return all(_same(again, e) for e in found if e["file"] is not None)


def _same(again: Reading, edit: dict[str, Any]) -> bool:
    """The edited file reads back, at the edit's key, to the change's value."""
    read = again.fields.get(edit["field"])
    return read is not None and read.origin == f"file:{edit['key']}" and read.value == edit["value"]


def fleet_flags(fleet: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """`--fleet COUNTxGPU` as the gpu and num_gpus flags (one pool; not with --gpu or
    --num-gpus)."""
    from trainmem.hardware import load_gpus, parse_fleet

    for name in ("gpu", "num_gpus"):
        if name in given:
            raise ValueError(f"fleet: give --fleet or --{name.replace('_', '-')}, not both")
    pools = parse_fleet(fleet, load_gpus(given.get("hardware_dir"))).pools
    if len(pools) != 1:
        raise ValueError(f"fleet: check plans one job on one pool, got {len(pools)} pools")
    return {"gpu": pools[0].gpu, "num_gpus": pools[0].num_nodes * pools[0].gpus_per_node}


def _with_origin(message: str, fields: Mapping[str, Read]) -> str:
    """A field's error with the file key it came from: `seq_len (a.yaml:max_seq_len): ...`."""
    line = message.splitlines()[0]
    name, sep, rest = line.partition(":")
    read = fields.get(name.strip())
    if not sep or read is None or read.file is None:
        return line
    return f"{name} ({read.file}:{read.origin.removeprefix('file:')}):{rest}"


def base_dir_of(paths: list[str]) -> str | None:
    """The folder of the first file given on the command line (relative model paths)."""
    return os.path.dirname(os.path.abspath(paths[0])) if paths else None
