"""Framework behaviour is data (engine/_frameworks.py FrameworkSpec), never a test of the
framework's code in a formula: a new framework is one FrameworkSpec entry, which must give a
value for every required field and then reaches the engine and recommend with no other edit.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainmem.engine import FRAMEWORKS
from trainmem.engine._frameworks import (
    _SPEC_VALUES,
    FRAMEWORK_SPECS,
    FrameworkSpec,
    framework_specs,
)
from trainmem.plan._recommend import FRAMEWORK_PRECISIONS, LAUNCHABLE

ENGINE = Path(__file__).resolve().parents[3] / "engine"
FRAMEWORK_CONSTANTS = {"HF", "MEGATRON", "DEEPSPEED", "TORCHTITAN", "TORCHTUNE", "LITGPT"}
"""The names of the frameworks' codes (engine/_codes.py: named codes index their vocabulary,
tests/unit/engine/test_registries.py), which no formula may compare with."""
FRAMEWORK_COLUMNS = {"fw", "framework", "fw_code", "framework_code", "hf_code"}
"""Names that hold a framework's code or name in the engine."""
NEW_FIELDS = (
    "pp_receive_buffer_per_micro_batch",
    "tp_embedding_grad_replicated",
    "tp_norms_plain_tensors",
    "fsdp2_casts_fp32_adapters",
    "transformers_model_code",
    "megatron_core_blocks",
    "eager_scores_global_buffer",
    "checkpoint_keeps_mask",
    "fp32_main_grad_buffer",
    "tp_loss_gradients_sharded",
    "launch_axes",
    "launch_precisions",
    "launch_source",
)
"""The decisions that were `fw == X` branches or hand-kept plan tables: required fields."""


def _is_framework_constant(node: ast.AST) -> bool:
    """HF / x.MEGATRON / "megatron" / FRAMEWORKS.index(...)."""
    if isinstance(node, ast.Name):
        return node.id in FRAMEWORK_CONSTANTS
    if isinstance(node, ast.Attribute):
        return node.attr in FRAMEWORK_CONSTANTS
    if isinstance(node, ast.Constant):
        return node.value in FRAMEWORKS
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr == "index" and "FRAMEWORKS" in ast.unparse(node.func.value)
    return False


CASTS = {"asarray", "array", "int", "str", "astype", "int64"}
"""Calls that leave a framework column what it is (a comparison of a cast is one of the column)."""


def _is_framework_column(node: ast.AST) -> bool:
    """fw, x.fw, c["framework"], config["framework"], np.asarray(fw), fw.astype(...), ..."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name not in CASTS:
            return False
        if name == "astype" and isinstance(func, ast.Attribute):
            return _is_framework_column(func.value)
        return bool(node.args) and _is_framework_column(node.args[0])
    if isinstance(node, ast.Name):
        return node.id in FRAMEWORK_COLUMNS
    if isinstance(node, ast.Attribute):
        return node.attr in FRAMEWORK_COLUMNS
    if isinstance(node, ast.Subscript):
        key = node.slice
        return isinstance(key, ast.Constant) and key.value in FRAMEWORK_COLUMNS
    return False


def framework_comparisons(source: str) -> list[str]:
    """Every comparison in `source` that tests a framework by its code or name: a comparison
    with a framework constant, or an equality / membership test of a framework column."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            equality = any(
                isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot))
                for op in node.ops
            )
            if any(_is_framework_constant(o) for o in operands) or (
                equality and any(_is_framework_column(o) for o in operands)
            ):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.keyword) and node.arg == "hf_code":
            found.append(f"{node.value.lineno}: hf_code={ast.unparse(node.value)}")
    return found


@pytest.mark.parametrize(
    "old",
    [
        "np.where(fw == HF, one, 0.0)",
        "np.where((x.fw == MEGATRON) & x.eager, s, 0.0)",
        "m = checkpointing & (x.fw != MEGATRON)",
        "t = (x.fw == HF) | (x.fw == DEEPSPEED)",
        "f(megatron=fw == MEGATRON)",
        "tp = t if config['framework'] == 'megatron' else 1",
        "a = np.asarray(fw) == hf_code",
        "f(fw, hf_code=HF)",
        "a = codes.TORCHTITAN == fw",
        "a = fw == FRAMEWORKS.index('litgpt')",
        "a = c['framework'] in (1, 2)",
        "a = np.asarray(c['framework'], dtype=np.int64) == 3",
        "a = str(config['framework']) != 'hf'",
    ],
)
def test_the_scan_catches_the_old_forms(old) -> None:
    assert framework_comparisons(old), old


def test_no_framework_comparison_in_engine() -> None:
    found = {
        str(path.relative_to(ENGINE.parent)): hits
        for path in sorted(ENGINE.rglob("*.py"))
        if (hits := framework_comparisons(path.read_text()))
    }
    assert not found, f"a framework tested by its code (make it a FrameworkSpec field): {found}"


def test_new_decisions_are_required_fields() -> None:
    fields = {f.name: f for f in dataclasses.fields(FrameworkSpec)}
    for name in NEW_FIELDS:
        assert fields[name].default is dataclasses.MISSING, name
        assert fields[name].default_factory is dataclasses.MISSING, name


@pytest.mark.parametrize("missing", NEW_FIELDS)
def test_a_framework_without_a_field_fails_naming_both(missing) -> None:
    values = {k: v for k, v in _SPEC_VALUES["hf"].items() if k != missing}
    with pytest.raises(ValueError, match=f"'newfw'.*{missing}") as error:
        framework_specs({"newfw": values})
    assert "\n" not in str(error.value)


def test_every_missing_field_is_named_on_one_line() -> None:
    values = {k: v for k, v in _SPEC_VALUES["hf"].items() if k not in NEW_FIELDS[:2]}
    with pytest.raises(ValueError) as error:
        framework_specs({"hf": _SPEC_VALUES["hf"], "newfw": values})
    text = str(error.value)
    assert "newfw" in text and "\n" not in text
    assert all(name in text for name in NEW_FIELDS[:2])


def test_specs_are_built_from_their_values() -> None:
    assert tuple(_SPEC_VALUES) == FRAMEWORKS
    assert framework_specs(_SPEC_VALUES) == FRAMEWORK_SPECS


SINGLE = {"tp": (1,), "pp": (1,), "virtual_stages": (1,), "cp": (1,), "ep": (1,)}
LAUNCHABLE_BEFORE = {
    "megatron": {"offload": ("none", "optimizer"),
                 "recompute": ("none", "selective", "full", "selective-layer")},
    "deepspeed": {**SINGLE, "recompute": ("none", "full")},
    "hf": {**SINGLE, "zero": (0, 2, 3), "recompute": ("none", "full"),
           "offload": ("none", "optimizer+params")},
    "torchtitan": {"zero": (0, 3), "offload": ("none",),
                   "recompute": ("none", "selective", "full", "selective-op")},
    "torchtune": {**SINGLE, "zero": (0, 3), "offload": ("none", "optimizer+params"),
                  "recompute": ("none", "selective", "full", "selective-layer")},
    "litgpt": {**SINGLE, "zero": (0, 3), "offload": ("none",), "recompute": ("none", "full")},
    # issue 29: verl's actor is FSDP-only (its trainer runs no tp/pp/cp for the FSDP backend).
    "verl": {**SINGLE, "zero": (3,), "recompute": ("none", "full"), "offload": ("none",)},
}  # fmt: skip
"""plan/_recommend.py's hand-kept table before it was derived from FrameworkSpec."""
PRECISIONS_BEFORE = {
    "megatron": ("mixed-bf16", "mixed-fp16", "fp8-mixed", "mxfp8", "nvfp4", "fp32"),  # + issue 29
    "deepspeed": ("mixed-bf16", "mixed-fp16", "fp32"),
    "hf": ("mixed-bf16", "mixed-fp16", "fp32"),
    "torchtitan": ("mixed-bf16", "fp8-mixed", "fp32"),
    "torchtune": ("bf16", "fp32"),
    "litgpt": ("amp-bf16", "bf16", "amp-fp16", "fp16", "fp32"),
    "verl": ("mixed-bf16",),  # issue 29
}


def test_recommend_tables_derived_unchanged() -> None:
    """The same values, in the same order (each axis's values, and the axes)."""
    assert set(LAUNCHABLE) == set(FRAMEWORKS) == set(FRAMEWORK_PRECISIONS)
    for name in FRAMEWORKS:
        assert list(LAUNCHABLE[name].items()) == list(LAUNCHABLE_BEFORE[name].items()), name
        assert FRAMEWORK_PRECISIONS[name] == PRECISIONS_BEFORE[name], name


SPECS_LINE = "FRAMEWORK_SPECS: dict[str, FrameworkSpec] = framework_specs(_SPEC_VALUES)"
FIXTURE_SCRIPT = textwrap.dedent(
    """
    import importlib.machinery, json, sys

    # A fixture framework added as a new framework is: its name appended to the vocabulary
    # (engine/_vocab.py) and one entry of FrameworkSpec values (engine/_frameworks.py), here
    # hf's values under a new name. Both modules are compiled from their own source with that
    # addition, so that everything derived at import (codes, tables, choices, plan) sees it.
    ADDED = {
        "_vocab.py": ("", '\\nFRAMEWORKS = (*FRAMEWORKS, "fixture")\\n'),
        "_frameworks.py": (SPECS_LINE, '_SPEC_VALUES["fixture"] = dict(_SPEC_VALUES["hf"])\\n'),
    }

    class Loader(importlib.machinery.SourceFileLoader):
        def get_code(self, fullname):
            source = self.get_data(self.path).decode()
            anchor, added = ADDED[self.path.rsplit("/", 1)[-1]]
            assert anchor in source, anchor
            source = (source.replace(anchor, added + anchor, 1) if anchor
                      else source + added)
            return compile(source, self.path, "exec")

    class Finder:
        def find_spec(self, fullname, path=None, target=None):
            if fullname not in ("trainmem.engine._vocab", "trainmem.engine._frameworks"):
                return None
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            spec.loader = Loader(fullname, spec.origin)
            return spec

    sys.meta_path.insert(0, Finder())
    import trainmem
    from trainmem.engine import FRAMEWORKS
    from trainmem.plan._recommend import FRAMEWORK_PRECISIONS, LAUNCHABLE
    assert FRAMEWORKS[-1] == "fixture"
    assert LAUNCHABLE["fixture"] == LAUNCHABLE["hf"]
    assert FRAMEWORK_PRECISIONS["fixture"] == FRAMEWORK_PRECISIONS["hf"]

    job = dict(model="llama-3.2-1b", gpu="h100-sxm-80gb", num_gpus=8, tp=2, pp=2, zero=3,
               micro_batch_size=2, global_batch_size=64, seq_len=2048, lora_rank=8)
    out = {}
    for fw in ("hf", "fixture"):
        out[fw] = {
            "estimate": trainmem.estimate(framework=fw, **job),
            "recommend": trainmem.recommend(model="gpt2", fleet="2xt4-16gb", seq_len=1024,
                                            global_batch_size=32, max_pp=1, max_cp=1,
                                            max_micro_batch_size=4, framework=fw),
        }
    print(json.dumps(out, default=str))
    """
).replace("SPECS_LINE", repr(SPECS_LINE))


def test_a_fixture_framework_reaches_the_engine_and_recommend() -> None:
    """A framework added as one FrameworkSpec (hf's values, a new name) runs through estimate
    and recommend with no KeyError, and gives hf's answer (nothing else is keyed by name)."""
    env = {**os.environ, "TRAINMEM_KERNEL": "numpy"}
    run = subprocess.run(
        [sys.executable, "-c", FIXTURE_SCRIPT], capture_output=True, text=True, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    # The error bars are the one thing keyed by name, on purpose: they come from the evidence
    # of each stack (report/error_bars.json), and a new stack has none (it takes the pooled
    # interval). Everything else is hf's.
    for answer in out.values():
        _drop_error_bars(answer)
    text = {fw: json.dumps(out[fw], sort_keys=True) for fw in out}
    assert "fixture" not in text["hf"]
    assert text["fixture"].replace("fixture", "hf") == text["hf"]


ERROR_BAR_KEYS = ("peak_device_bytes_low", "peak_device_bytes_high", "fit_probability")


def _drop_error_bars(node) -> None:
    """Remove the error-bar keys (and the `error_bars` block) wherever they are in `node`."""
    if isinstance(node, dict):
        for key in (*ERROR_BAR_KEYS, "error_bars"):
            node.pop(key, None)
        for value in node.values():
            _drop_error_bars(value)
    elif isinstance(node, list):
        for value in node:
            _drop_error_bars(value)
