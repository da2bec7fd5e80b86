"""make_grid: columns in (scalars broadcast), one numpy array per field out; user errors named."""

from __future__ import annotations

import numpy as np
import pytest

from trainmem.engine import (
    ATTENTION,
    DEFAULTS,
    FRAMEWORKS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    decode,
    make_grid,
)
from trainmem.engine._grid import CATEGORICAL
from trainmem.engine._states import lora_mask

VOCABULARIES = {
    "precision": PRECISIONS,
    "optimizer": OPTIMIZERS,
    "recompute": RECOMPUTE,
    "attention": ATTENTION,
    "framework": FRAMEWORKS,
}


def test_no_arguments_is_one_row_of_defaults() -> None:
    grid = make_grid()
    assert set(grid) == set(DEFAULTS)
    for field, default in DEFAULTS.items():
        assert grid[field].shape == (1,)
        value = decode(field, grid[field])[0] if field in CATEGORICAL else grid[field][0]
        if field == "lora_targets":
            default = lora_mask(default)
        assert value == default, field


def test_scalars_broadcast_against_a_column() -> None:
    grid = make_grid(micro_batch_size=[1, 2, 4], seq_len=4096, precision="bf16")
    assert all(column.shape == (3,) for column in grid.values())
    assert grid["micro_batch_size"].tolist() == [1, 2, 4]
    assert grid["seq_len"].tolist() == [4096] * 3
    assert decode("precision", grid["precision"]).tolist() == ["bf16"] * 3
    assert grid["tp"].tolist() == [DEFAULTS["tp"]] * 3


def test_equal_length_columns_pair_row_by_row() -> None:
    grid = make_grid(tp=[1, 2, 4], num_gpus=[8, 8, 16], recompute=["none", "full", "selective"])
    assert list(zip(grid["tp"], grid["num_gpus"], strict=True)) == [(1, 8), (2, 8), (4, 16)]
    assert decode("recompute", grid["recompute"]).tolist() == ["none", "full", "selective"]


def test_orthogonal_shapes_give_the_cross_product_row_major() -> None:
    grid = make_grid(micro_batch_size=[[1], [2]], zero=[0, 1, 3])
    assert grid["micro_batch_size"].tolist() == [1, 1, 1, 2, 2, 2]
    assert grid["zero"].tolist() == [0, 1, 3, 0, 1, 3]


def test_mismatched_lengths_raise_value_error() -> None:
    with pytest.raises(ValueError):
        make_grid(tp=[1, 2], pp=[1, 2, 4])


def test_mapping_and_keywords_merge_keywords_winning() -> None:
    grid = make_grid({"tp": 2, "pp": 2}, pp=4)
    assert (grid["tp"][0], grid["pp"][0]) == (2, 4)


def test_column_types() -> None:
    grid = make_grid(micro_batch_size=2.0, sequence_parallel=[0, 1], framework="megatron")
    assert grid["micro_batch_size"].dtype == np.int64  # a whole float is accepted as an int
    assert grid["sequence_parallel"].dtype == bool
    assert grid["sequence_parallel"].tolist() == [False, True]
    assert grid["framework"].dtype.kind == "i"
    assert decode("framework", grid["framework"]).tolist() == ["megatron"] * 2


@pytest.mark.parametrize(("field", "vocabulary"), sorted(VOCABULARIES.items()))
def test_categorical_names_round_trip(field: str, vocabulary: tuple[str, ...]) -> None:
    grid = make_grid({field: list(vocabulary)})
    assert decode(field, grid[field]).tolist() == list(vocabulary)


@pytest.mark.parametrize(("field", "vocabulary"), sorted(VOCABULARIES.items()))
def test_categorical_codes_are_accepted(field: str, vocabulary: tuple[str, ...]) -> None:
    codes = list(range(len(vocabulary)))
    assert make_grid({field: codes})[field].tolist() == codes


def test_unknown_field_names_the_field_and_the_allowed_ones() -> None:
    with pytest.raises(ValueError) as err:
        make_grid(batch_size=8)
    message = str(err.value)
    assert "batch_size" in message
    for field in DEFAULTS:
        assert field in message


@pytest.mark.parametrize(("field", "vocabulary"), sorted(VOCABULARIES.items()))
def test_unknown_value_names_the_field_the_value_and_the_allowed_ones(
    field: str, vocabulary: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError) as err:
        make_grid({field: [vocabulary[0], "no-such-value"]})
    message = str(err.value)
    assert field in message
    assert "no-such-value" in message
    for value in vocabulary:
        assert value in message


@pytest.mark.parametrize(("field", "vocabulary"), sorted(VOCABULARIES.items()))
def test_out_of_range_code_names_the_field_and_the_allowed_values(
    field: str, vocabulary: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError) as err:
        make_grid({field: len(vocabulary)})
    message = str(err.value)
    assert field in message
    for value in vocabulary:
        assert value in message


@pytest.mark.parametrize("value", [1.5, "two", [1, 2.5]])
def test_integer_field_rejects_non_whole_numbers_naming_the_field(value: object) -> None:
    with pytest.raises(ValueError, match="micro_batch_size"):
        make_grid(micro_batch_size=value)
