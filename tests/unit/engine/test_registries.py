"""The engine's code tables come from one place each, and its functions stay short.

Every per-optimizer table is derived from the built-in registry (engine/_optimizers.py), every
per-precision table from the Precision specs (engine/_precision.py), every named code from its
vocabulary (engine/_codes.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trainmem.catalog import load_optimizers
from trainmem.engine import OPTIMIZERS, PRECISIONS, _codes, _optimizers, _precision
from trainmem.engine._grid import CATEGORICAL

ENGINE = Path(_codes.__file__).parent
MAX_FUNCTION_LINES = 60
"""The issue "the engine organised by technique": no function in engine/ longer than this."""


def test_optimizer_vocabulary_is_the_registry() -> None:
    assert tuple(_optimizers.BUILTIN_OPTIMIZERS) == OPTIMIZERS
    assert CATEGORICAL["optimizer"] == OPTIMIZERS


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ("NUM_STATES", "num_states"),
        ("STEP_TEMP_STATES", "step_temp_states"),
        ("STEP_BYTES_PER_PARAMETER", "step_bytes_per_parameter"),
        ("IS_EIGHT_BIT", "eight_bit_blockwise"),
        ("HAS_DEVICE_STEP_SCALARS", "device_step_scalars"),
        ("IS_FACTORED", "factored_second_moment"),
    ],
)
def test_optimizer_tables_follow_the_registry(table: str, field: str) -> None:
    values = getattr(_optimizers, table)
    assert len(values) == len(OPTIMIZERS)
    for code, name in enumerate(OPTIMIZERS):
        assert values[code] == getattr(_optimizers.BUILTIN_OPTIMIZERS[name], field), name


def test_builtin_optimizers_listed_with_their_specs() -> None:
    listed = load_optimizers()
    assert tuple(listed) == OPTIMIZERS
    assert all(spec.path == "built-in" and spec.description for spec in listed.values())


@pytest.mark.parametrize(
    "table",
    [
        "PARAM_BYTES",
        "MASTER_BYTES",
        "GRAD_BYTES",
        "STATE_BYTES",
        "COMPUTE_BYTES",
        "RESIDUAL_BYTES",
        "IS_AMP",
        "IS_MIXED",
        "IS_FP8",
    ],
)
def test_precision_tables_follow_the_specs(table: str) -> None:
    field = {"IS_AMP": "autocast", "IS_MIXED": "mixed", "IS_FP8": "fp8"}.get(table, table.lower())
    values = getattr(_precision, table)
    assert len(values) == len(PRECISIONS)
    for code, name in enumerate(PRECISIONS):
        assert values[code] == getattr(_precision.PRECISION_SPECS[name], field), name


def test_named_codes_index_their_vocabulary() -> None:
    names = {
        "FP32": ("precision", "fp32"),
        "AMP_BF16": ("precision", "amp-bf16"),
        "FP8_MIXED": ("precision", "fp8-mixed"),
        "MEGATRON": ("framework", "megatron"),
        "TORCHTITAN": ("framework", "torchtitan"),
        "RECOMPUTE_SELECTIVE": ("recompute", "selective"),
        "EAGER": ("attention", "eager"),
        "OFFLOAD_PARAMS": ("offload", "optimizer+params"),
        "LOSS_CHUNKED": ("loss", "chunked"),
    }
    for constant, (field, name) in names.items():
        assert getattr(_codes, constant) == CATEGORICAL[field].index(name)
    assert _codes.OFFLOAD_NONE < _codes.OFFLOAD_OPTIMIZER < _codes.OFFLOAD_PARAMS


def test_engine_functions_are_short() -> None:
    long = []
    for path in sorted(ENGINE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.name}:{node.name} ({lines} lines)")
    assert not long, f"functions longer than {MAX_FUNCTION_LINES} lines: {', '.join(long)}"
