"""Bad input, every command: exit code 2, one stderr line `error: ...` naming the field, no
traceback, nothing written; and a property test of random values for estimate's flags."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainmem.catalog import load_model
from trainmem.cli import main
from trainmem.engine import KNOBS, Overheads, TimeParams

LLAMA = json.loads(
    (Path(load_model.__code__.co_filename).parent / "presets" / "llama-3.1-8b.json").read_text()
)

# ---- the table ---------------------------------------------------------------------------------

INT_BOUNDS = [
    (name, k.ge, k.le)
    for name, k in KNOBS.items()
    if k.ge is not None and name != "capacity_factor"
]
CASES: list[tuple[str, list[str], str]] = []
"""(id, argv, what the one error line must name); `{TMP}` is the case's folder."""


def case(id_: str, argv: list[str], names: str) -> None:
    CASES.append((id_, argv, names))


for name, ge, le in INT_BOUNDS:
    flag = "--" + name.replace("_", "-")
    case(f"estimate-{name}-below", ["estimate", flag, str(int(ge) - 1)], name)
    case(f"estimate-{name}-above", ["estimate", flag, str(int(le) + 1)], name)
    case(f"fit-{name}-below", ["fit", flag, str(int(ge) - 1)], name)
for value in ("-1", "nan", "inf", "65", "-inf"):
    case(
        f"estimate-capacity-factor-{value}",
        ["estimate", "--capacity-factor", value],
        "capacity_factor",
    )
for value in ("-0.1", "1", "nan", "inf", "2"):
    for command in ("estimate", "fit", "recommend", "sweep", "heatmap"):
        extra = ["--out", "{TMP}/o"] if command in ("sweep",) else []
        extra = ["--out", "{TMP}/o.png"] if command == "heatmap" else extra
        case(f"{command}-headroom-{value}", [command, "--headroom", value, *extra], "headroom")
for value in ("0", "-1", "nan", "inf", "1e19"):
    case(f"estimate-tokens-{value}", ["estimate", "--tokens", value], "tokens")
for name in ("precision", "recompute", "attention", "framework", "offload", "loss", "optimizer"):
    case(f"estimate-{name}-unknown", ["estimate", f"--{name}", "bogus"], name)
for value in ("abc", "1.5", "", "1e3"):
    case(f"estimate-seq-len-type-{value or 'empty'}", ["estimate", "--seq-len", value], "seq-len")
case("estimate-tp-type", ["estimate", "--tp", "two"], "tp")
case("estimate-seq-len-2^70", ["estimate", "--seq-len", str(2**70)], "seq_len")
case("estimate-virtual-stages-pp1", ["estimate", "--virtual-stages", "4"], "virtual_stages")
case("estimate-qlora-no-rank", ["estimate", "--qlora"], "qlora")
case(
    "estimate-lora-targets-empty",
    ["estimate", "--lora-rank", "8", "--lora-targets", ""],
    "lora_targets",
)
case("fit-lora-targets-commas", ["fit", "--lora-rank", "8", "--lora-targets", ",,"], "lora_targets")
for key in Overheads.names():
    for value in ("-1", "nan", "inf", "-1e30"):
        case(f"overhead-{key}-{value}", ["estimate", "--overhead", f"{key}={value}"], key)
case(
    "overhead-fraction-1",
    ["estimate", "--overhead", "fragmentation_fraction=1"],
    "fragmentation_fraction",
)
case("overhead-unknown", ["estimate", "--overhead", "bogus=1"], "bogus")
case("overhead-no-equals", ["estimate", "--overhead", "cuda_context_bytes"], "overhead")
case("overhead-not-number", ["estimate", "--overhead", "cuda_context_bytes=lots"], "overhead")
for key in TimeParams.names():
    for value in ("-1", "nan"):
        case(f"time-param-{key}-{value}", ["estimate", "--time-param", f"{key}={value}"], key)
case("time-param-unknown", ["estimate", "--time-param", "bogus=1"], "bogus")
for flag in ("--max-micro-batch-size", "--max-num-gpus"):
    case(f"fit{flag}-0", ["fit", flag, "0"], flag[2:].replace("-", "_"))
case("fit-minimize", ["fit", "--minimize", "bogus"], "minimize")
for flag in ("--max-pp", "--max-cp", "--max-micro-batch-size"):
    for command in ("recommend", "sweep"):
        extra = ["--out", "{TMP}/o"] if command == "sweep" else []
        case(f"{command}{flag}-0", [command, flag, "0", *extra], flag[2:].replace("-", "_"))
for flag in ("--trials", "--workers", "--jobs"):
    case(f"sweep{flag}-0", ["sweep", flag, "0", "--out", "{TMP}/o"], flag[2:])
case("sweep-out-file", ["sweep", "--out", "{TMP}/file.txt"], "out")
case("sweep-seq-len-0", ["sweep", "--seq-len", "0", "--out", "{TMP}/o"], "seq_len")
case(
    "sweep-global-batch--4",
    ["sweep", "--global-batch-size", "-4", "--out", "{TMP}/o"],
    "global_batch_size",
)
case("sweep-tp-0", ["sweep", "--tp", "0", "--out", "{TMP}/o"], "tp")
case("recommend-num-alternatives", ["recommend", "--num-alternatives", "-1"], "num_alternatives")
case("recommend-global-batch--4", ["recommend", "--global-batch-size", "-4"], "global_batch_size")
case("recommend-format", ["recommend", "--format", "bogus"], "format")
case("recommend-seq-len-nan", ["recommend", "--seq-len", "nan"], "seq-len")
case("heatmap-seq-len-0", ["heatmap", "--seq-len", "0", "--out", "{TMP}/o.png"], "seq_len")
case("heatmap-tp-0", ["heatmap", "--tp", "0", "--out", "{TMP}/o.png"], "tp")
case("heatmap-where-no-points", ["heatmap", "--where", "fits", "--out", "{TMP}/o.png"], "where")
case(
    "heatmap-points-corrupt",
    ["heatmap", "--points", "{TMP}/corrupt", "--out", "{TMP}/o.png"],
    "not a Parquet file",
)
for where, names in (
    ("fits AND (SELECT 1) = 1", "SELECT"),
    ("read_parquet('/etc/passwd') IS NULL", "read_parquet"),
    ("read_csv('/etc/passwd') IS NULL", "read_csv"),
    ("fits; DROP TABLE points", "';"),
    ("fits -- comment", "comments"),
    ("fits /* c */", "comments"),
    ("bogus_column = 1", "bogus_column"),
    ('"bogus" = 1', "bogus"),
    ("fits AND tp IN (SELECT tp FROM points)", "SELECT"),
    ("lower(gpu) = 'x'", "lower"),
    ("fits`", "`"),
):
    case(f"points-where-{where[:12]}", ["points", "{TMP}/points", "--where", where], names)
    case(
        f"heatmap-where-{where[:12]}",
        ["heatmap", "--points", "{TMP}/points", "--where", where, "--out", "{TMP}/o.png"],
        names,
    )
case("points-corrupt", ["points", "{TMP}/corrupt"], "not a Parquet file")
case("points-empty", ["points", "{TMP}/empty"], "points")
case("points-sort", ["points", "{TMP}/points", "--sort", "bogus"], "sort")
case("points-head", ["points", "{TMP}/points", "--head", "-1"], "head")
for command, flag in (
    ("models", "--models-dir"),
    ("gpus", "--hardware-dir"),
    ("optimizers", "--optimizers-dir"),
):
    case(f"{command}-dir-missing", [command, flag, "{TMP}/missing"], "dir")
    case(f"{command}-dir-file", [command, flag, "{TMP}/file.txt"], "dir")
BAD_CONFIGS: dict[str, Any] = {
    "hidden-negative": ({"hidden_size": -4096}, "hidden_size"),
    "hidden-zero": ({"hidden_size": 0}, "hidden_size"),
    "hidden-fraction": ({"hidden_size": 4096.5}, "hidden_size"),
    "hidden-string": ({"hidden_size": "4096"}, "hidden_size"),
    "hidden-bool": ({"hidden_size": True}, "hidden_size"),
    "hidden-huge": ({"hidden_size": 2**70}, "hidden_size"),
    "layers-zero": ({"num_hidden_layers": 0}, "num_hidden_layers"),
    "layers-negative": ({"num_hidden_layers": -2}, "num_hidden_layers"),
    "heads-zero": ({"num_attention_heads": 0}, "num_attention_heads"),
    "kv-heads-7": ({"num_key_value_heads": 7}, "num_key_value_heads"),
    "kv-heads-zero": ({"num_key_value_heads": 0}, "num_key_value_heads"),
    "vocab-zero": ({"vocab_size": 0}, "vocab_size"),
    "vocab-negative": ({"vocab_size": -1}, "vocab_size"),
    "intermediate-zero": ({"intermediate_size": 0}, "intermediate_size"),
    "intermediate-null-list": ({"intermediate_size": [1]}, "intermediate_size"),
    "head-dim-zero": ({"head_dim": 0}, "head_dim"),
    "hidden-indivisible": ({"hidden_size": 4100, "head_dim": None}, "hidden_size"),
    "tie-string": ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
    "dropout-2": ({"attention_dropout": 2}, "attention_dropout"),
    "max-positions-zero": ({"max_position_embeddings": 0}, "max_position_embeddings"),
}
for id_, (_, names) in BAD_CONFIGS.items():
    case(f"config-{id_}", ["estimate", "--model", f"{{TMP}}/{id_}.json"], names)
for id_ in ("binary", "list", "invalid", "empty"):
    case(f"config-{id_}", ["estimate", "--model", f"{{TMP}}/{id_}.json"], "model")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A case folder: bad config.json files, a corrupt and an empty points folder, a file, and
    a small sweep's points."""
    root = tmp_path_factory.mktemp("bad")
    for id_, (change, _) in BAD_CONFIGS.items():
        (root / f"{id_}.json").write_text(json.dumps({**LLAMA, **change}))
    (root / "binary.json").write_bytes(b"\xff\xfe\x00garbage\x89PNG")
    (root / "list.json").write_text("[1, 2]")
    (root / "invalid.json").write_text("{hidden_size: 1")
    (root / "empty.json").write_text("")
    (root / "corrupt").mkdir()
    (root / "corrupt" / "part-0.parquet").write_bytes(b"not parquet at all")
    (root / "empty").mkdir()
    (root / "file.txt").write_text("x")
    argv = ["sweep", "--model", "llama-3.2-1b", "--fleet", "8xa100-sxm-40gb", "--max-pp", "2"]
    assert main([*argv, "--max-cp", "1", "--out", str(root / "points"), "--json"]) == 0
    return root


def snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_the_table_is_large() -> None:
    assert len(CASES) >= 150
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("argv", "names"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_naming_it(capsys, folder, argv, names) -> None:
    capsys.readouterr()
    before = snapshot(folder)
    code = main([a.replace("{TMP}", str(folder)) for a in argv])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, (code, out[-300:], err[-500:])
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert names.lower() in lines[0].lower(), lines[0]
    assert snapshot(folder) == before, "bad input wrote files"


# ---- random values -----------------------------------------------------------------------------

NUMERIC_FLAGS = [
    *(f"--{n.replace('_', '-')}" for n, k in KNOBS.items() if k.ge is not None),
    "--headroom",
    "--tokens",
]
VALUES = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80).map(str),
    st.sampled_from(["0", "-1", "1", "2", "3", "64", str(2**31), str(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "-0.0", "1e300", "0.5", "1e-300"]),
    st.text(max_size=8),
    st.sampled_from(["", "ü", "/etc/passwd", "../x", "--", "1,2"]),
)


SIGNED = ("headroom_bytes", "saved_bytes")
"""Byte differences (negative: over the limit; a change that costs memory): finite only."""


def _byte_values(value: Any, key: str = "") -> list[float]:
    if isinstance(value, dict):
        return [v for k, item in value.items() for v in _byte_values(item, k)]
    if isinstance(value, list):
        return [v for item in value for v in _byte_values(item, key)]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if key.endswith("_bytes") and key not in SIGNED and number:
        return [float(value)]
    return []


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(flags=st.lists(st.tuples(st.sampled_from(NUMERIC_FLAGS), VALUES), min_size=1, max_size=3))
def test_estimate_random_values(capsys, flags) -> None:
    argv = ["estimate", "--model", "llama-3.2-1b", "--json"]
    for flag, value in flags:
        argv += [flag, value]
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        return
    assert code == 0, err
    report = json.loads(out)
    values = _byte_values(report)
    assert values and all(math.isfinite(v) and v >= 0 for v in values)
    assert math.isfinite(report["headroom_bytes"])
