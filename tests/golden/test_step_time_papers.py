"""The step-time model against published training throughput.

The rows live in tests/data/step_time_published.json, each table with its full source:
- Narayanan et al. 2021 (arXiv 2104.04473) Table 1: achieved TFLOP/s per GPU of GPT 1.7B-1T on
  32-3072 A100s (Megatron-LM, tp/pp/dp as printed; micro-batch and interleaving from
  NVIDIA/Megatron-LM examples/sc21/run_table_1.sh);
- the same paper's Table 2, ZeRO-3 rows (DeepSpeed, 175B and 530B on 384-2240 A100s);
- torchtitan docs/performance.md: Llama 3.1 8B FSDP on 8 and 128 H100s (Tables 1 and 3, 5,762 and
  5,605 tokens/s/GPU, 33% MFU), and the 2024 A100 table (Llama 2/3, 8B-70B, 64 A100s);
- MosaicML llm-foundry scripts/train/benchmarking/README.md: MPT 125M-70B on A100 and H100;
- and, measured here, single-GPU steps of Hugging Face Llama models on an H200
  (tests/data/h200_step_time.json, bench/gpu_step_time.py).

Tolerance: 30% on every row, the target the step-time issue set. It is a ranking model with five
fitted constants (bench/calibrate_time.py, on the "calibration" tables; the "validation" tables
were never fitted), so a row far outside it means a missing mechanism, not noise. The README's
table (generated) states the observed errors: at most ~6% on Table 1, ~12% on Table 2, ~20% on
torchtitan (its 500 W H100s run below the SXM profile's peak).
Order: within a table, every pair whose published values differ by 10% or more is predicted in
the same order (smaller gaps are within run-to-run noise).
Known exceptions are pinned as strict xfails, so a fix shows up as an unexpected pass.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.step_time_table import BEGIN, END, README, Row, load_rows, markdown, predict
from trainmem.engine import estimate_time, make_grid, model_from_hf_config, time_inputs
from trainmem.hardware import get_gpu

ROWS = load_rows()
PREDICTED = dict(zip((f"{r.table}:{r.id}" for r in ROWS), predict(ROWS), strict=True))
TOLERANCE = 0.30
"""The issue's target for every published row."""
ORDER_GAP = 1.10
"""Pairs closer than 10% are not ordered (run-to-run noise; torchtitan's 8 vs 128 GPUs differ
by 2.8%)."""

KNOWN_OUTLIERS = {
    "mosaicml_h100:mpt-30b-s8192-n8-mb1": "predicted +33%: MPT-30B at 8k tokens with micro-batch "
    "1 and 21 accumulation steps on 8 H100s runs slower than its 4k and 2k rows suggest",
}
KNOWN_MISORDERED = {
    ("mosaicml_h100:mpt-13b-s2048-n64-mb2", "mosaicml_h100:mpt-3b-s32768-n8-mb3"),
    ("mosaicml_h100:mpt-13b-s2048-n64-mb2", "mosaicml_h100:mpt-1b-s65536-n8-mb1"),
    ("mosaicml_h100:mpt-13b-s2048-n8-mb2", "mosaicml_h100:mpt-3b-s32768-n8-mb3"),
    ("mosaicml_h100:mpt-13b-s2048-n8-mb2", "mosaicml_h100:mpt-1b-s65536-n8-mb1"),
    ("mosaicml_a100:mpt-760m-s2048-n8-mb24", "mosaicml_a100:mpt-760m-s512-n8-mb96"),
}
"""MPT-13B without checkpointing at micro-batch 2 on H100 reaches 39.8% MFU where MPT-7B reaches
46%, and MPT-760M on A100 is slower at 512 tokens than at 2048: the model predicts neither."""


def _key(row: Row) -> str:
    return f"{row.table}:{row.id}"


@pytest.mark.parametrize(
    "row",
    [
        pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=KNOWN_OUTLIERS[_key(r)]))
        if _key(r) in KNOWN_OUTLIERS
        else r
        for r in ROWS
    ],
    ids=_key,
)
def test_published_throughput_within_tolerance(row: Row) -> None:
    predicted = PREDICTED[_key(row)]
    assert predicted == pytest.approx(row.published, rel=TOLERANCE), (
        f"{row.metric}: published {row.published:.4g}, predicted {predicted:.4g} "
        f"({predicted / row.published - 1:+.1%})"
    )


@pytest.mark.parametrize("table", list(dict.fromkeys(r.table for r in ROWS)))
def test_order_between_configurations(table: str) -> None:
    rows = [r for r in ROWS if r.table == table]
    wrong = []
    for a, b in itertools.combinations(rows, 2):
        if max(a.published, b.published) / min(a.published, b.published) < ORDER_GAP:
            continue
        same = (a.published > b.published) == (PREDICTED[_key(a)] > PREDICTED[_key(b)])
        if not same and (_key(a), _key(b)) not in KNOWN_MISORDERED:
            wrong.append((a.id, b.id))
    assert not wrong


def test_known_misordered_pairs_are_still_misordered() -> None:
    """Strictness for KNOWN_MISORDERED: a fix shows up here."""
    for a, b in KNOWN_MISORDERED:
        row_a = next(r for r in ROWS if _key(r) == a)
        row_b = next(r for r in ROWS if _key(r) == b)
        assert (row_a.published > row_b.published) != (PREDICTED[a] > PREDICTED[b]), (a, b)


def test_torchtitan_order_8_gpus_faster_per_gpu_than_128() -> None:
    """torchtitan Tables 1 vs 3: 5,762 vs 5,605 tokens/s/GPU (the only H100 pair)."""
    eight, many = (PREDICTED[f"torchtitan_h100:llama-3.1-8b-fsdp{n}"] for n in (8, 128))
    assert eight > many


def test_torchtitan_mfu_within_tolerance() -> None:
    """torchtitan: 33% MFU (989 TFLOP/s peak) for Llama 3.1 8B FSDP without compile."""
    row = next(r for r in ROWS if r.id == "llama-3.1-8b-fsdp8")
    out = estimate_time(row.model, row.grid, **time_inputs(get_gpu(row.gpu)))
    assert float(out["mfu"][0]) == pytest.approx(0.337, rel=TOLERANCE)


@pytest.mark.parametrize("row", [r for r in ROWS if r.table == "narayanan2021_table1"], ids=_key)
def test_hardware_flops_are_narayanan_eq3_exactly(row: Row) -> None:
    """Eq. 3: F = 96 B s l h^2 (1 + s/6h + V/16lh) per step with full recomputation."""
    m, g = row.model, row.grid
    B, s = float(g["global_batch_size"][0]), float(g["seq_len"][0])
    h, L, V = m.hidden_size, m.num_hidden_layers, m.vocab_size
    eq3 = 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    out = estimate_time(m, g, **time_inputs(get_gpu(row.gpu)))
    assert float(out["hardware_flops_per_step"][0]) == pytest.approx(eq3, rel=1e-12)


def test_narayanan_eq4_training_time_estimate() -> None:
    """Sec. 5.1: GPT-3 175B, 300B tokens on 1024 A100s at 140 TFLOP/s takes 8TP/(nX) = 34 days.
    Our time_to_train_s at a step time that yields 140 TFLOP/s per GPU agrees (Eq. 4 drops the
    s/6h and V/16lh terms: within 5%)."""
    m = model_from_hf_config(
        {
            "model_type": "gpt2",
            "n_embd": 12288,
            "n_layer": 96,
            "n_head": 96,
            "vocab_size": 51200,
            "n_positions": 2048,
        },
        name="gpt3-175b",
    )
    g = make_grid(
        num_gpus=1024,
        tp=8,
        pp=16,
        global_batch_size=1536,
        seq_len=2048,
        precision="mixed-fp16",
        recompute="full",
        framework="megatron",
    )
    out = estimate_time(m, g, **time_inputs(get_gpu("a100-sxm-80gb")), tokens=300e9)
    scale = float(out["achieved_flops_per_gpu"][0]) / 140e12  # rescale our speed to theirs
    days = float(out["time_to_train_s"][0]) * scale / 86400
    assert days == pytest.approx(8 * 300e9 * 175e9 / (1024 * 140e12) / 86400, rel=0.05)
    assert days == pytest.approx(34, rel=0.05)


def test_readme_table_is_generated() -> None:
    table = README.read_text().split(BEGIN)[1].split(END)[0].strip()
    expected = markdown(ROWS, np.array([PREDICTED[_key(r)] for r in ROWS]))
    assert table == expected.strip(), "run: python -m bench.calibrate_time --update-readme"
