"""Preset parameter counts against PyTorch's own (tests/data/param_counts.json).

The counts were taken with torch + transformers on the meta device (see the file's `_provenance`):
`sum(p.numel() for p in model.parameters())`, tied embeddings once. BERT presets are compared with
BertForMaskedLM (RoBERTa presets with RobertaForMaskedLM), the model the engine describes (MLM
head included). Exact: integers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainmem.catalog import load_model, preset_names

PARAM_COUNTS = json.loads((Path(__file__).parents[1] / "data" / "param_counts.json").read_text())


def test_every_preset_has_a_reference_count() -> None:
    assert set(preset_names()) == set(PARAM_COUNTS) - {"_provenance"}


@pytest.mark.parametrize("name", preset_names())
def test_preset_num_parameters_equals_pytorch(name: str) -> None:
    reference = PARAM_COUNTS[name]
    model = load_model(name)
    if model.family == "bert":
        # not the bare BertModel / RobertaModel count
        assert reference["model_class"] in ("BertForMaskedLM", "RobertaForMaskedLM")
    assert model.num_parameters == reference["num_parameters"]
