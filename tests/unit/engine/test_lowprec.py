"""mxfp8 and nvfp4 (issue 29 part 3): the block-scaled recipes' weight caches and GEMM rates on
Blackwell, their refusal elsewhere (CLI and HTTP), and fp4_flops in the GPU profiles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainmem.cli import main
from trainmem.hardware import get_gpu, load_gpus

GOLDEN = [
    "estimate", "--model", "llama-3.1-8b", "--gpu", "b200-180gb", "--num-gpus", "8",
    "--framework", "megatron", "--zero", "1", "--micro-batch-size", "1", "--seq-len", "8192",
]  # fmt: skip
"""Llama 3.1 8B on 8 x B200 under Megatron (Transformer Engine), ZeRO-1, full recompute (the
job's default), one 8192-token micro-batch."""

BLOCK_LINEAR_NUMEL = 32 * (4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336)
"""Llama 3.1 8B's block linears: 32 x (q, k, v, o + gate, up, down) = 6,979,321,856."""
HEAD_NUMEL = 128256 * 4096
"""The LM head (untied), in bf16 under every recipe: 525,336,576."""
NUM_LINEARS = 32 * 7


def _estimate(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0
    answer: dict[str, Any] = json.loads(capsys.readouterr().out)
    return answer


def test_golden_llama_8b_on_8_b200(capsys: pytest.CaptureFixture[str]) -> None:
    """Memory components and step time per precision, each difference derived by hand.

    Memory: every component but `transient` (which holds the quantized weight caches) equals
    mixed-bf16's: bf16 parameters, fp32 master, fp32 Adam states, activations in bf16.
    The caches (row-wise + column-wise copies of each block-linear weight):
      fp8-mixed 2 bytes/element + 3 x 1024 x 4 bytes of amax history per linear;
      mxfp8     2 x (1 + 1/32) = 2.0625 bytes/element, no history;
      nvfp4     2 x (0.5 + 1/16) = 1.125 bytes/element + 3 fp32 amaxes per linear.
    GEMMs: with full recompute a block weight does 8 FLOPs per token, the head 6; the block
    share s = 8 B / (8 B + 6 H) = 0.94656 runs at the low-precision peak x 0.83
    (fp8_gemm_efficiency_ratio): B200 fp8 4,500 = 2 x bf16 2,250, fp4 9,000 = 4 x bf16, so
    gemm(mxfp8) = gemm(bf16) x ((1 - s) + s / (2 x 0.83)) and gemm(nvfp4) = gemm(bf16) x
    ((1 - s) + s / (4 x 0.83)). Tolerance 1e-12 relative: float rounding only.
    """
    runs = {
        p: _estimate([*GOLDEN, "--precision", p], capsys)
        for p in ("mixed-bf16", "fp8-mixed", "mxfp8", "nvfp4")
    }
    base = runs["mixed-bf16"]["bytes"]
    cache = {
        "fp8-mixed": 2.0 * BLOCK_LINEAR_NUMEL + 3 * 1024 * 4 * NUM_LINEARS,
        "mxfp8": 2.0625 * BLOCK_LINEAR_NUMEL,
        "nvfp4": 1.125 * BLOCK_LINEAR_NUMEL + 12 * NUM_LINEARS,
    }
    assert cache["mxfp8"] == 14_394_851_328 and cache["nvfp4"] == 7_851_739_776
    for p, extra in cache.items():
        got = runs[p]["bytes"]
        assert {k: v for k, v in got.items() if k != "transient"} == {
            k: v for k, v in base.items() if k != "transient"
        }
        assert got["transient"] - base["transient"] == pytest.approx(extra, rel=1e-12)
    gemm = {p: r["time"]["parts"]["gemm_time_s"] for p, r in runs.items()}
    share = 8 * BLOCK_LINEAR_NUMEL / (8 * BLOCK_LINEAR_NUMEL + 6 * HEAD_NUMEL)
    bf16 = gemm["mixed-bf16"]
    assert gemm["mxfp8"] == pytest.approx(bf16 * ((1 - share) + share / (2 * 0.83)), rel=1e-12)
    assert gemm["fp8-mixed"] == gemm["mxfp8"]  # the same fp8 rate; only the casts differ
    assert gemm["nvfp4"] == pytest.approx(bf16 * ((1 - share) + share / (4 * 0.83)), rel=1e-12)
    step = {p: r["time"]["step_time_s"] for p, r in runs.items()}
    assert step["nvfp4"] < step["mxfp8"] < step["fp8-mixed"] < step["mixed-bf16"]


def test_torchao_mx_keeps_no_quantized_copies(capsys: pytest.CaptureFixture[str]) -> None:
    """torchtitan's MX converter (torchao mx_mm) saves the bf16 input and weight: mxfp8's
    memory is mixed-bf16's to the byte; only the step time changes."""
    job = [*GOLDEN[:7], "--framework", "torchtitan", "--zero", "3", "--seq-len", "8192"]
    bf16 = _estimate([*job, "--precision", "mixed-bf16"], capsys)
    mx = _estimate([*job, "--precision", "mxfp8"], capsys)
    assert mx["bytes"] == bf16["bytes"]
    assert mx["time"]["step_time_s"] < bf16["time"]["step_time_s"]


@pytest.mark.parametrize(
    ("gpu", "precision", "words"),
    [
        ("h100-sxm-80gb", "mxfp8", "mxfp8 needs Blackwell block-scaled tensor cores (sm100 to "
         "sm119) and gpu h100-sxm-80gb is sm90"),
        ("h100-sxm-80gb", "nvfp4", "nvfp4 needs fp4 matmuls and gpu h100-sxm-80gb has none "
         "(fp4_flops = 0)"),
        ("rtx-5090-32gb", "mxfp8", "mxfp8 needs Blackwell block-scaled tensor cores (sm100 to "
         "sm119) and gpu rtx-5090-32gb is sm120"),
        ("mi355x-288gb", "nvfp4", "nvfp4 needs Blackwell block-scaled tensor cores (sm100 and "
         "above) and gpu mi355x-288gb is cdna4"),
        ("mi355x-288gb", "mxfp8", "mxfp8 needs Blackwell block-scaled tensor cores"),
    ],
)  # fmt: skip
def test_named_block_scaled_precision_refused_off_blackwell(
    gpu: str, precision: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """One line naming the field, the GPU and the precisions it runs; exit 2."""
    assert (
        main(["estimate", "--model", "llama-3.2-1b", "--gpu", gpu, "--precision", precision]) == 2
    )
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: precision: {words}")
    assert f"; allowed on {gpu}: fp32, bf16" in line and precision not in line.split("allowed")[1]


def test_nvfp4_runs_on_rtx_5090(capsys: pytest.CaptureFixture[str]) -> None:
    """TE's _compute_nvfp4_support accepts 12.0 (it refuses MXFP8 there only)."""
    job = ["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-5090-32gb", "--precision"]
    assert _estimate([*job, "nvfp4"], capsys)["config"]["precision"] == "nvfp4"


def test_sweep_skips_pools_without_the_precision(capsys: pytest.CaptureFixture[str]) -> None:
    """A fleet of H100s and B200s under mxfp8: only B200 configurations are offered."""
    argv = ["sweep", "--model", "llama-3.2-1b", "--fleet", "8xh100,8xb200", "--seq-len", "2048",
            "--global-batch-size", "64", "--precision", "mxfp8", "--json"]  # fmt: skip
    assert main(argv) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["top"] and {r["configuration"]["gpu"] for r in answer["top"]} == {"b200-180gb"}
    only_h100 = [*argv[:4], "8xh100", *argv[5:]]
    assert main(only_h100) == 2  # no pool runs it: refused in one line naming the field
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: precision: mxfp8 needs Blackwell block-scaled tensor cores")


def test_gpus_lists_fp4(capsys: pytest.CaptureFixture[str]) -> None:
    """`trainmem gpus` shows the fp4 rate (TFLOP/s, '-' where there is none) and its JSON
    the fp4_flops field."""
    assert main(["gpus"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "fp4 TFLOP/s" in lines[0]
    (b200,) = [line for line in lines if line.startswith("b200-180gb ")]
    (h100,) = [line for line in lines if line.startswith("h100-sxm-80gb ")]
    assert "9000.0" in b200.split() and "-" in h100.split()
    assert main(["gpus", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["gb300-288gb"]["fp4_flops"] == 15000e12
    assert rows["mi355x-288gb"]["fp4_flops"] == 10066.3e12
    assert rows["a100-sxm-80gb"]["fp4_flops"] == 0.0


def test_fp4_flops_sourced_and_optional(tmp_path: Path) -> None:
    """Every profile with an fp4 rate cites it; a file written before the field loads with 0;
    a negative rate is refused naming the field."""
    for g in load_gpus().values():
        if g.fp4_flops > 0:
            assert any(s.startswith("fp4_flops:") for s in g.sources), g.name
    text = Path(get_gpu("h100-sxm-80gb").path).read_text()
    assert "fp4_flops" not in text
    (tmp_path / "my-h100.toml").write_text(text.replace('"h100-sxm-80gb"', '"my-h100"'))
    assert load_gpus(tmp_path)["my-h100"].fp4_flops == 0.0
    (tmp_path / "my-h100.toml").write_text(
        text.replace('"h100-sxm-80gb"', '"my-h100"') + "fp4_flops = -1.0\n"
    )
    with pytest.raises(ValueError, match=r"fp4_flops must be finite .* or 0"):
        load_gpus(tmp_path)


def test_http_refuses_like_the_cli() -> None:
    """The same one-line reason over HTTP (a 4xx naming the field)."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from trainmem.serve._app import create_app

    with TestClient(create_app()) as http:
        bad = http.post(
            "/v1/estimate", json={"model": "llama-3.2-1b", "gpu": "h100", "precision": "mxfp8"}
        )
        assert 400 <= bad.status_code < 500
        assert "mxfp8 needs Blackwell block-scaled tensor cores" in bad.text
        good = http.post(
            "/v1/estimate", json={"model": "llama-3.2-1b", "gpu": "b200", "precision": "nvfp4"}
        )
        assert good.status_code == 200, good.text
