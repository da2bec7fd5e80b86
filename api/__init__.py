"""trainmem: predict the per-GPU memory of a training job before it runs.

It also searches a GPU fleet for the cheapest configuration that fits. The verbs of the command
line, as functions (each returns what `trainmem VERB --json` prints):

>>> import trainmem
>>> config = trainmem.TrainingConfig(num_gpus=8, zero=3, precision="mixed-bf16",
...                                  recompute="full", micro_batch_size=4, seq_len=8192)
>>> report = trainmem.estimate(config, model="llama-3.1-8b", gpu="h100-sxm-80gb")
>>> round(report["peak_device_bytes"] / 2**30, 2), report["fits"]
(86.55, False)
>>> trainmem.fit(config, model="llama-3.1-8b")["max_micro_batch_size"]
3

`trainmem.check(files)` reads a job's own config files (torchtune, axolotl, LLaMA-Factory,
LitGPT, HF / TRL, accelerate, DeepSpeed, torchtitan, Megatron) and answers as estimate does.
`trainmem.sweep(...)` searches a fleet (it is also the `trainmem.sweep` package, callable),
`trainmem.recommend(...)` plans a job with its launch configs; `load_model` and `load_gpu` read
presets, Hugging Face config.json files and GPU profiles. Sizes are bytes; GiB = 2**30.

Nothing heavy is imported until a verb runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from contextlib import AbstractContextManager

    from trainmem.engine import ModelSpec, TrainingConfig
    from trainmem.hardware import GpuProfile

__all__ = [
    "TrainingConfig",
    "check",
    "estimate",
    "fit",
    "load_gpu",
    "load_model",
    "recommend",
    "sweep",
]


def _named_precision(training: Any, options: dict[str, Any]) -> bool:
    """Whether the caller named `precision` (a keyword, or a key of the `training` dict).

    Named, a GPU that lacks it refuses it (ValueError), as `--precision` on the command line
    and `"precision"` in an HTTP body do. A TrainingConfig carries every field, so its
    precision counts as a default: on a GPU without bf16 the default bf16 precisions run as
    their fp16 counterpart, with a warning (report/_validate.py runnable_precision).
    """
    return "precision" in options or (isinstance(training, dict) and "precision" in training)


def _precision_named(named: bool) -> AbstractContextManager[None]:
    """report/_validate.py precision_given(named), imported when a verb runs."""
    from trainmem.report._validate import precision_given

    return precision_given(named)


def estimate(training: TrainingConfig | dict[str, Any] | None = None, /, **options: Any) -> dict:
    """Per-device memory of one job: breakdown, phase peaks, fit, step time and advice.

    `training`: a TrainingConfig (or a dict of its fields); `options`: model, gpu, headroom,
    tokens, overhead, time_param, per_stage, advice, the user folders, or training fields by
    name. Same keys as `trainmem estimate --json`. `advice=False` skips the search of changes
    that would make the job fit (no `advice` key; about 20x faster: for a loop over many jobs).
    A precision named (a keyword or a dict key) that the GPU lacks is a ValueError; left out
    (or in a TrainingConfig), the default bf16 one runs as fp16 on a GPU without bf16, with a
    warning.

    >>> r = estimate(model="gpt2", gpu="t4-16gb", micro_batch_size=4, seq_len=1024)
    >>> r["fits"], r["config"]["micro_batch_size"]
    (True, 4)
    """
    from trainmem.report import estimate_report

    with _precision_named(_named_precision(training, options)):
        return estimate_report(training, **options)


def check(files: Any, /, **options: Any) -> dict:
    """A job's own config files in, estimate's report out, plus what was read and from where.

    `files`: paths (a list, or one path), or a mapping of file name -> the file's text (as
    `POST /v1/check` takes them). `options`: any `trainmem check` flag (stack, fleet, fix, model,
    gpu, training fields...); a flag overrides the files. Same keys as `trainmem check --json`.

    >>> r = check({"ds.json": '{"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}}'},
    ...           model="llama-3.2-1b")
    >>> r["read"]["micro_batch_size"], r["config"]["framework"]
    ({'value': 2, 'from': 'file:train_micro_batch_size_per_gpu', 'file': 'ds.json'}, 'deepspeed')
    """
    from trainmem.stacks import check_report, read_files
    from trainmem.stacks._check import base_dir_of

    if isinstance(files, (str, bytes)) or hasattr(files, "__fspath__"):
        files = [files]
    with _precision_named("precision" in options):
        if isinstance(files, dict):
            return check_report(files, **options)
        paths = [str(f) for f in files]
        return check_report(read_files(paths), base_dir=base_dir_of(paths), **options)


def fit(training: TrainingConfig | dict[str, Any] | None = None, /, **options: Any) -> dict:
    """The largest micro-batch that fits (or, minimize="num-gpus", the fewest GPUs).

    >>> fit(model="gpt2", gpu="t4-16gb", seq_len=1024)["max_micro_batch_size"]
    7
    """
    from trainmem.sweep import fit_report

    with _precision_named(_named_precision(training, options)):
        return fit_report(training, **options)


def recommend(training: TrainingConfig | dict[str, Any] | None = None, /, **options: Any) -> dict:
    """The best plan for a job on a fleet, and its runners-up.

    The same keys as `trainmem recommend --format json`; render it with
    `trainmem.plan.render(report, "torchrun")`.

    >>> plan = recommend(model="gpt2", fleet="2xt4-16gb", seq_len=1024, global_batch_size=32,
    ...                  max_pp=1, max_cp=1, max_micro_batch_size=4)
    >>> plan["fits"], plan["num_gpus"] * plan["micro_batch_size"] * plan["grad_accum_steps"]
    (True, 32)
    """
    from trainmem.plan import recommend_report

    with _precision_named(_named_precision(training, options)):
        return recommend_report(training, **options)


def load_model(name: str, *, models_dir: str | None = None) -> ModelSpec:
    """A model preset by name, or a Hugging Face config.json by path (no network).

    >>> load_model("llama-3.1-8b").num_parameters
    8030261248
    """
    from trainmem.catalog import load_model as _load

    return _load(name, models_dir=models_dir)


def load_gpu(name: str, *, hardware_dir: str | None = None) -> GpuProfile:
    """A GPU profile by name (`trainmem gpus`), from the built-in files or `hardware_dir`.

    >>> load_gpu("h100-sxm-80gb").memory_bytes
    85899345920
    """
    from trainmem.hardware import get_gpu

    return get_gpu(name, hardware_dir)


def __getattr__(name: str) -> Any:
    """Lazy names: TrainingConfig (engine) and sweep (the callable trainmem.sweep package)."""
    if name == "TrainingConfig":
        from trainmem.engine import TrainingConfig

        return TrainingConfig
    if name == "sweep":
        return importlib.import_module("trainmem.sweep")
    raise AttributeError(f"module 'trainmem' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
