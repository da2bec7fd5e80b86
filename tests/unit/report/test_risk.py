"""The OOM risk over a dataset (report/_risk.py, engine/_lengths.py) against an exact
enumeration of an epoch's micro-batches, and its laws (monotone in the micro-batch and in the
memory); the readers' one-line errors."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainmem.catalog import load_model
from trainmem.engine import estimate, make_grid, overheads_for
from trainmem.engine._lengths import max_length_pmf, subset_ratio
from trainmem.hardware import get_gpu
from trainmem.report._risk import Lengths, dataset_lengths, risk_answers

DATA = Path(__file__).parents[2] / "data" / "lengths" / "alpaca_eval_gpt4_llama2_lengths.csv"
GPU = get_gpu("h100-sxm-80gb")
OV = overheads_for(GPU.arch, cuda_context_bytes=GPU.cuda_context_bytes)
JOB = {"num_gpus": 8, "zero": 3, "recompute": "none", "precision": "mixed-bf16", "seq_len": 2048}


def _spec():
    return load_model("llama-2-7b")


def _peak(spec, rows: int, length: int) -> float:
    """One micro-batch's peak, estimated on its own (the enumeration's independent figure)."""
    grid = make_grid({**JOB, "micro_batch_size": rows, "seq_len": length})
    out = estimate(spec, grid, usable_bytes=GPU.usable_bytes, headroom=0.0, overheads=OV)
    return float(out["peak_device_bytes"][0])


def _answers(spec, data, micro_batches, *, headroom=0.0, usable=None, batching="pad-longest"):
    grid = make_grid(JOB)
    config = {k: v[0].item() for k, v in grid.items()}
    return risk_answers(
        spec,
        config,
        data,
        batching=batching,
        buckets=None,
        risk=0.001,
        micro_batches=np.asarray(micro_batches),
        usable_bytes=GPU.usable_bytes if usable is None else usable,
        headroom=headroom,
        overheads=OV,
    )


def _headroom_between(low: float, high: float) -> float:
    """A headroom whose limit lies between two peaks."""
    return 1.0 - (low + high) / 2 / GPU.usable_bytes


def test_subset_ratio_is_the_binomial_ratio():
    for good, total, k in [(3, 10, 2), (10, 10, 4), (2, 10, 3), (0, 5, 0), (700, 805, 16)]:
        want = math.comb(good, k) / math.comb(total, k)
        assert subset_ratio(good, total, k) == pytest.approx(want, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("b", [1, 2, 3, 4])
def test_pad_longest_epoch_equals_the_enumeration_of_every_permutation(b):
    """Seven sequences of the shipped dataset, every one of the 7! epochs cut into micro-batches
    of b (the last one at b rows, as the model says), each micro-batch's peak estimated on its
    own: the fraction of epochs with a micro-batch over the limit, and of micro-batches."""
    spec = _spec()
    table = dataset_lengths(None, str(DATA))
    assert table is not None
    lengths = [int(x) for x in np.repeat(table.lengths, table.counts)[::115]][:7]
    peaks = {v: _peak(spec, b, v) for v in set(lengths)}
    ordered = sorted(peaks.values())
    headroom = _headroom_between(ordered[len(ordered) // 2 - 1], ordered[len(ordered) // 2])
    limit = GPU.usable_bytes * (1 - headroom)
    bad_epochs = 0
    perms = list(itertools.permutations(range(7)))
    for perm in perms:
        batches = [perm[i : i + b] for i in range(0, 7, b)]
        bad_epochs += any(peaks[max(lengths[j] for j in batch)] > limit for batch in batches)
    subsets = list(itertools.combinations(range(7), min(b, 7)))
    bad_steps = sum(peaks[max(lengths[j] for j in s)] > limit for s in subsets)
    values, counts = np.unique(lengths, return_counts=True)
    (got,) = _answers(spec, Lengths(values, counts, "test"), [b], headroom=headroom)
    assert got["oom_probability"] == pytest.approx(bad_epochs / len(perms))
    assert got["step_oom_probability"] == pytest.approx(bad_steps / len(subsets), rel=1e-9)
    assert got["worst_step_peak_device_bytes"] == round(max(peaks.values()))


def test_step_distribution_of_the_shipped_dataset_equals_every_pair():
    """All C(805, 2) micro-batches of two of the shipped dataset: their step peaks' p50, p99
    and max and the fraction over a limit equal the order-statistics answer."""
    spec = _spec()
    data = dataset_lengths(None, str(DATA))
    assert data is not None and data.num_sequences == 805
    every = np.repeat(data.lengths, data.counts)
    i, j = np.triu_indices(len(every), k=1)
    longest = np.maximum(every[i], every[j])
    values = np.unique(longest)
    grid = make_grid({**JOB, "micro_batch_size": 2, "seq_len": values})
    out = estimate(spec, grid, usable_bytes=GPU.usable_bytes, headroom=0.0, overheads=OV)
    peak_of = dict(zip(values.tolist(), out["peak_device_bytes"].tolist(), strict=True))
    step = np.sort(np.array([peak_of[v] for v in longest.tolist()]))
    headroom = _headroom_between(step[len(step) * 9 // 10], step[len(step) * 9 // 10 + 1])
    limit = GPU.usable_bytes * (1 - headroom)
    (got,) = _answers(spec, data, [2], headroom=headroom)
    n = len(step)
    q = got["step_peak_quantiles"]
    assert q["p50"] == round(step[math.ceil(0.5 * n) - 1])
    assert q["p99"] == round(step[math.ceil(0.99 * n) - 1])
    assert q["max"] == got["worst_step_peak_device_bytes"] == round(step[-1])
    assert got["step_oom_probability"] == pytest.approx(np.mean(step > limit), rel=1e-9)
    assert got["oom_probability"] == 1.0  # the longest sequence's micro-batch exceeds


def test_packed_equals_the_enumerated_rows():
    """Packed: the documents (truncated to seq_len) concatenated and cut into rows of seq_len,
    micro-batches of b rows: every step is the estimate at (b, seq_len), whatever the order."""
    spec = _spec()
    data = dataset_lengths(None, str(DATA))
    assert data is not None
    b = 4
    tokens = int(np.sum(np.minimum(data.lengths, 2048) * data.counts))
    num_rows = -(-tokens // 2048)
    peak = _peak(spec, b, 2048)
    for headroom, want in ((_headroom_between(peak, peak * 1.01), 0.0), (0.5, 1.0)):
        (got,) = _answers(spec, data, [b], headroom=headroom, batching="packed")
        assert got["oom_probability"] == want
        assert got["worst_step_peak_device_bytes"] == round(peak)
        assert got["step_peak_quantiles"] == {
            "p50": round(peak),
            "p99": round(peak),
            "max": round(peak),
        }
        assert got["num_micro_batches"] == -(-num_rows // b)


def test_max_length_pmf_sums_to_one():
    pmf = max_length_pmf(np.array([3, 1, 4, 1, 5]), np.array([1, 2, 7, 14, 20]))
    assert np.allclose(pmf.sum(axis=1), 1.0)
    assert pmf[-1, -1] == pytest.approx(1.0)  # all 14 sequences: the longest is in


_hist = st.lists(st.integers(1, 4096), min_size=1, max_size=40)


@settings(max_examples=max(settings.default.max_examples // 3, 5))
@given(_hist, st.floats(0.0, 0.8))
def test_probability_is_monotone_in_the_micro_batch(lengths, headroom):
    values, counts = np.unique(lengths, return_counts=True)
    got = _answers(_spec(), Lengths(values, counts, "h"), list(range(1, 17)), headroom=headroom)
    for key in ("oom_probability", "step_oom_probability"):
        p = np.array([g[key] for g in got])
        assert np.all(np.diff(p) >= -1e-12), (key, p)


@settings(max_examples=max(settings.default.max_examples // 3, 5))
@given(_hist, st.integers(1, 16))
def test_probability_is_monotone_in_the_memory(lengths, b):
    values, counts = np.unique(lengths, return_counts=True)
    data = Lengths(values, counts, "h")
    spec = _spec()
    usable = np.linspace(20, 200, 10) * 2**30
    got = [_answers(spec, data, [b], usable=u)[0] for u in usable]
    for key in ("oom_probability", "step_oom_probability"):
        p = np.array([g[key] for g in got])
        assert np.all(np.diff(p) <= 1e-12), (key, p)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file"),
        ("length\n12\nabc\n", "entry 2 is 'abc'"),
        ("length\n0\n", "expected a whole number >= 1"),
        ("a,b\n1,2\n", "no column of token counts"),
        ("[1, 2", "not JSON"),
    ],
)
def test_bad_lengths_files_are_one_line(tmp_path, text, message):
    path = tmp_path / "l.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as error:
        dataset_lengths(str(path), None)
    assert "\n" not in str(error.value) and str(error.value).startswith("lengths: ")


def test_lengths_readers_agree(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    lengths = [5, 9, 9, 300, 5, 5]
    (tmp_path / "a.csv").write_text("num_tokens\n" + "\n".join(map(str, lengths)) + "\n")
    (tmp_path / "a.json").write_text(str(lengths))
    pq.write_table(pa.table({"length": lengths}), tmp_path / "a.parquet")
    (tmp_path / "h.csv").write_text("length,count\n5,3\n9,2\n300,1\n")
    got = [dataset_lengths(str(tmp_path / n), None) for n in ("a.csv", "a.json", "a.parquet")]
    got += [dataset_lengths(None, str(tmp_path / "h.csv")), dataset_lengths(lengths, None)]
    got += [dataset_lengths(None, [[5, 3], [9, 2], [300, 1]])]
    for g in got:
        assert g is not None
        assert g.lengths.tolist() == [5, 9, 300] and g.counts.tolist() == [3, 2, 1]


def test_estimate_cli_reports_the_risk_block_and_refuses_a_bad_file(tmp_path, capsys):
    from trainmem.cli import main

    code = main(
        [
            "estimate",
            "--model",
            "llama-2-7b",
            "--zero",
            "3",
            "--recompute",
            "none",
            "--micro-batch-size",
            "4",
            "--lengths-histogram",
            str(DATA),
            "--json",
            "--no-advice",
        ]
    )
    assert code == 0
    import json

    risk = json.loads(capsys.readouterr().out)["risk"]
    assert set(risk) >= {"oom_probability", "worst_step_peak_device_bytes", "step_peak_quantiles"}
    assert set(risk["step_peak_quantiles"]) == {"p50", "p99", "max"}
    bad = tmp_path / "bad.csv"
    bad.write_text("length\n-3\n")
    assert main(["estimate", "--lengths", str(bad), "--no-advice"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: lengths: ") and err.count("\n") == 1


def test_cli_json_has_the_contract_keys_at_the_top_level(capsys):
    import json

    from trainmem.cli import main

    job = ["--model", "llama-2-7b", "--zero", "3", "--recompute", "none", "--no-advice"]
    keys = ("oom_probability", "worst_step_peak_device_bytes", "step_peak_quantiles")
    for command in (["estimate", "--micro-batch-size", "4"], ["fit"]):
        argv = [*command, *job, "--lengths-histogram", str(DATA), "--json"]
        if command == ["fit"]:
            argv.remove("--no-advice")
        assert main(argv) == 0
        answer = json.loads(capsys.readouterr().out)
        assert all(answer[k] == answer["risk"][k] for k in keys), command
        bare = [a for a in argv if a not in ("--lengths-histogram", str(DATA))]
        assert main(bare) == 0
        assert not set(keys) & set(json.loads(capsys.readouterr().out))
