"""The public Python API: `import trainmem` gives the verbs; their doctests run; nothing heavy
is imported until a verb runs."""

from __future__ import annotations

import doctest
import importlib
import inspect
import subprocess
import sys
import types

import pytest

import trainmem
import trainmem.engine._config as config_module


def test_doctests_of_the_public_api_run() -> None:
    for module in (trainmem, config_module):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_the_verbs_are_there() -> None:
    for name in trainmem.__all__:
        assert callable(getattr(trainmem, name)), name
    assert set(trainmem.__all__) >= {
        "estimate",
        "fit",
        "sweep",
        "recommend",
        "load_model",
        "load_gpu",
        "TrainingConfig",
    }


def test_sweep_is_the_package_and_the_verb(tmp_path) -> None:
    import trainmem.sweep._search  # noqa: F401  (a submodule import must not hide the verb)

    run = trainmem.sweep(
        model="gpt2",
        fleet="2xt4-16gb",
        seq_len=1024,
        global_batch_size=32,
        max_pp=1,
        max_cp=1,
        max_micro_batch_size=4,
        out=str(tmp_path),
    )
    assert run.result.num_points > 0 and run.result.best
    assert (
        run.result.best[0]["micro_batch_size"]
        * run.result.best[0]["grad_accum_steps"]
        * (run.result.best[0]["dp"])
        == 32
    )


def test_import_trainmem_loads_nothing_heavy() -> None:
    heavy = ("trainmem.", "polars", "optuna", "numpy")
    code = f"import sys, trainmem; print(sorted(m for m in sys.modules if m.startswith({heavy})))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "[]", loaded


SUBPACKAGES = (
    "cli",
    "engine",
    "hardware",
    "plan",
    "report",
    "results",
    "serve",
    "stacks",
    "sweep",
    "trace",
)


def _undocumented(module: types.ModuleType) -> list[str]:
    """Exported classes, functions and modules without a docstring of their own (a dataclass
    without one gets its signature as __doc__)."""
    missing = []
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj):
            doc = vars(obj).get("__doc__") or ""
            if not doc.strip() or doc.startswith(f"{obj.__name__}("):
                missing.append(name)
        elif (inspect.isroutine(obj) or inspect.ismodule(obj)) and not (obj.__doc__ or "").strip():
            missing.append(name)
    return missing


@pytest.mark.parametrize("package", ["trainmem", *(f"trainmem.{p}" for p in SUBPACKAGES)])
def test_every_export_has_a_docstring(package: str) -> None:
    """ruff's D rules see only the public modules (__init__.py); what they re-export from
    private modules is checked here."""
    assert not _undocumented(importlib.import_module(package))


@pytest.mark.parametrize("verb", ["estimate", "sweep"])
def test_an_unknown_framework_is_a_one_line_value_error(verb: str) -> None:
    """It was a KeyError from the loss's resolution before the field's own check ran."""
    options = {"model": "gpt2", "framework": "bogus"}
    if verb == "sweep":
        options["out"] = None
    with pytest.raises(ValueError, match=r"^framework: unknown value 'bogus'; allowed: hf, "):
        getattr(trainmem, verb)(**options)
