"""Physical sanity of inputs and outputs (issue 31 item 2, issue 27 item 2): each case that used to
exit 0 with a meaningless answer is refused in one line naming the field (exit 2 on the CLI,
ValueError from the Python API, 422 over HTTP), nothing written, or answered with a warning on
stderr (and a `warnings` key in the JSON)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import trainmem
from trainmem.catalog import load_model
from trainmem.cli import main
from trainmem.engine import OptimizerSpec, Overheads
from trainmem.hardware import get_gpu, load_gpus
from trainmem.report import gpu_precisions, json_text, precision_reason

PRESETS = Path(load_model.__code__.co_filename).parent / "presets"
H100_TOML = (Path(get_gpu.__code__.co_filename).parent / "gpus" / "h100-sxm-80gb.toml").read_text()
SEARCH = ["--global-batch-size", "32", "--max-pp", "1", "--max-cp", "1"]


def _moe_config(folder: Path, top_k: int) -> str:
    config = json.loads((PRESETS / "mixtral-8x22b.json").read_text())
    path = folder / f"moe-top{top_k}.json"
    path.write_text(json.dumps({**config, "num_experts_per_tok": top_k}))
    return str(path)


def _gpu_dir(folder: Path, line: str, new: str) -> str:
    """A --hardware-dir holding the H100's profile, named `bad`, with `line` replaced."""
    out = folder / f"hw-{abs(hash(new))}"
    out.mkdir(exist_ok=True)
    lines = [
        new if raw.startswith(line + " ") else raw
        for raw in H100_TOML.replace('"h100-sxm-80gb"', '"bad"', 1).splitlines()
    ]
    (out / "bad.toml").write_text("\n".join(lines) + "\n")
    return str(out)


def _optimizer_dir(folder: Path, num_states: str) -> str:
    out = folder / f"opt-{num_states}"
    out.mkdir(exist_ok=True)
    text = (
        'name = "weird"\ndescription = "x"\n'
        f"num_states = {num_states}\nstate_bytes = 0\nstep_temp_states = 0\n"
        'eight_bit_blockwise = false\nstep_bytes_per_parameter = 20\nsources = ["x"]\n'
    )
    (out / "weird.toml").write_text(text)
    return str(out)


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _refused(capsys, folder: Path, argv: list[str], *names: str) -> str:
    capsys.readouterr()
    before = _snapshot(folder)
    code = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, (code, out[-300:], err[-500:])
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for name in names:
        assert name.lower() in lines[0].lower(), lines[0]
    assert _snapshot(folder) == before, "refused input wrote files"
    return lines[0]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return Path(tmp_path_factory.mktemp("sanity"))


# ---- 1. precisions a GPU lacks -----------------------------------------------------------------


def test_the_precisions_a_gpu_runs_come_from_its_rates() -> None:
    gpus = load_gpus()
    for name in ("v100-sxm2-16gb", "t4-16gb"):
        assert "amp-bf16" not in gpu_precisions(gpus[name]) and "amp-fp16" in gpu_precisions(
            gpus[name]
        )
    for name in ("a100-sxm-80gb", "v100-sxm2-32gb", "t4-16gb"):
        assert precision_reason("fp8-mixed", gpus[name]) is not None
    for name in ("h100-sxm-80gb", "b200-180gb"):
        assert precision_reason("fp8-mixed", gpus[name]) is None
    for g in gpus.values():  # a rate of 0 is exactly what rules a format out
        assert ("fp8-mixed" in gpu_precisions(g)) == (g.fp8_flops > 0 and g.bf16_flops > 0)


@pytest.mark.parametrize(
    ("gpu", "precision"),
    [
        ("a100-sxm-80gb", "fp8-mixed"),
        ("v100-sxm2-16gb", "fp8-mixed"),
        ("t4-16gb", "fp8-mixed"),
        ("v100-sxm2-16gb", "bf16"),  # mixed-bf16, amp-bf16: the defaults, run as fp16
        ("t4-16gb", "bf16"),
    ],
)
def test_a_precision_the_gpu_lacks_is_refused(capsys, folder, gpu: str, precision: str) -> None:
    argv = ["estimate", "--gpu", gpu, "--precision", precision, "--model", "llama-3.2-1b"]
    line = _refused(capsys, folder, argv, "precision", gpu, precision, "allowed")
    assert "fp16" in line  # the precisions it runs are named
    with pytest.raises(ValueError, match="precision"):
        trainmem.estimate(gpu=gpu, precision=precision, model="llama-3.2-1b")
    for command in (["fit"], ["heatmap", "--out", str(folder / "h.png")]):
        _refused(capsys, folder, [*command, *argv[1:]], "precision", gpu)


def test_the_default_bf16_on_a_gpu_without_bf16_runs_in_fp16_with_a_warning(capsys) -> None:
    code = main(["estimate", "--gpu", "v100-sxm2-16gb", "--model", "llama-3.2-1b", "--json"])
    out, err = capsys.readouterr()
    report = json.loads(out)
    # The one-job default (mixed-bf16) runs as mixed-fp16.
    assert code == 0 and report["config"]["precision"] == "mixed-fp16"
    assert err.startswith("warning: precision: ") and "mixed-fp16" in err
    assert report["warnings"] and "bf16" in report["warnings"][0]


def test_recommend_never_proposes_fp8_on_a_fleet_without_fp8(capsys, folder) -> None:
    argv = ["recommend", "--model", "llama-3.2-1b", "--precision", "fp8-mixed", *SEARCH]
    _refused(capsys, folder, [*argv, "--fleet", "8xa100-sxm-80gb"], "precision", "a100")
    with pytest.raises(ValueError, match="fp8"):
        trainmem.recommend(model="llama-3.2-1b", fleet="8xa100-sxm-80gb", precision="fp8-mixed")
    # A mixed fleet: only the H100s are proposed, the A100 points are invalid with a reason.
    plan = trainmem.recommend(
        model="llama-3.2-1b",
        fleet="8xa100-sxm-80gb,8xh100-sxm-80gb",
        precision="fp8-mixed",
        global_batch_size=32,
        max_pp=1,
        max_cp=1,
    )
    gpus = {plan["gpu"], *(a["gpu"] for a in plan["alternatives"])}
    assert plan["fits"] and gpus == {"h100-sxm-80gb"}


def test_sweep_skips_the_pools_that_cannot_run_the_precision(folder) -> None:
    run = trainmem.sweep(
        model="llama-3.2-1b",
        fleet="8xa100-sxm-80gb,8xh100-sxm-80gb",
        precision="fp8-mixed",
        global_batch_size=32,
        max_pp=1,
        max_cp=1,
        max_micro_batch_size=2,
        out=str(folder / "sweep"),
    )
    assert run["best"]["configuration"]["gpu"] == "h100-sxm-80gb"
    assert all(p["configuration"]["gpu"] == "h100-sxm-80gb" for p in run["top"])


# ---- 2. sequences beyond the model's positions -------------------------------------------------


@pytest.mark.parametrize(("model", "seq_len"), [("gpt2", 4096), ("bert-base-uncased", 8192)])
def test_beyond_learned_positions_is_refused_unless_allowed(
    capsys, folder, model: str, seq_len: int
) -> None:
    argv = ["estimate", "--model", model, "--seq-len", str(seq_len)]
    line = _refused(capsys, folder, argv, "seq_len", model, "--allow-long-seq")
    assert "allowed: up to" in line
    with pytest.raises(ValueError, match="seq_len"):
        trainmem.estimate(model=model, seq_len=seq_len)
    _refused(capsys, folder, ["fit", *argv[1:]], "seq_len")
    code = main([*argv, "--allow-long-seq", "--json", "--no-advice"])
    out, err = capsys.readouterr()
    assert code == 0 and err.startswith("warning: seq_len: ")
    assert json.loads(out)["warnings"][0].startswith("seq_len: ")


def test_beyond_rotary_positions_is_a_warning(capsys) -> None:
    code = main(["estimate", "--model", "llama-3.2-1b", "--seq-len", "262144", "--no-advice"])
    _, err = capsys.readouterr()
    assert code == 0 and err.startswith("warning: seq_len: ") and "RoPE" in err
    report = trainmem.estimate(model="llama-3.2-1b", seq_len=262144, advice=False)
    assert len(report["warnings"]) == 1
    assert "warnings" not in trainmem.estimate(model="llama-3.2-1b", advice=False)


def test_a_search_beyond_learned_positions_is_refused(capsys, folder) -> None:
    argv = ["recommend", "--model", "gpt2", "--seq-len", "2048", *SEARCH]
    _refused(capsys, folder, argv, "seq_len", "gpt2")


# ---- 3. MoE top-k and LoRA rank -----------------------------------------------------------------


def test_moe_top_k_above_the_experts_is_refused(capsys, folder) -> None:
    path = _moe_config(folder, 16)
    _refused(capsys, folder, ["estimate", "--model", path], "num_experts_per_tok", "1 to 8")
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        load_model(path)
    assert load_model(_moe_config(folder, 8)).num_experts_per_tok == 8


def test_lora_rank_above_the_adapted_matrices_is_refused(capsys, folder) -> None:
    argv = ["estimate", "--model", "llama-3.2-1b", "--lora-rank", "65536"]
    line = _refused(capsys, folder, argv, "lora_rank", "allowed: 1 to 512")
    assert "65536" in line
    with pytest.raises(ValueError, match="lora_rank"):
        trainmem.estimate(model="llama-3.2-1b", lora_rank=513)
    assert trainmem.estimate(model="llama-3.2-1b", lora_rank=512, advice=False)["fits"] in (
        True,
        False,
    )
    # Only q_proj adapted: its smaller side (2048) is the bound.
    trainmem.estimate(model="llama-3.2-1b", lora_rank=2048, lora_targets="q_proj", advice=False)
    _refused(capsys, folder, ["fit", *argv[1:]], "lora_rank")


# ---- 4. overheads -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "item",
    ["cuda_context_bytes=1e300", "cuda_context_bytes=1e20", "nccl_bytes_per_communicator=1e12"],
)
def test_an_overhead_beyond_the_gpu_is_refused(capsys, folder, item: str) -> None:
    _refused(capsys, folder, ["estimate", "--overhead", item], "overhead", item.split("=")[0])
    with pytest.raises(ValueError, match="overhead"):
        trainmem.estimate(overhead=[item])


def test_the_engine_caps_overheads_at_2_to_the_50() -> None:
    assert Overheads().with_overrides({"cuda_context_bytes": 2.0**50}).cuda_context_bytes == 2**50
    for value in (2.0**50 + 2**30, math.inf, math.nan, -1.0):
        with pytest.raises(ValueError, match="cuda_context_bytes"):
            Overheads().with_overrides({"cuda_context_bytes": value})


# ---- 5. user GPU and optimizer files; JSON never holds NaN -----------------------------------


@pytest.mark.parametrize(
    ("line", "new", "field"),
    [
        ("memory_bytes", "memory_bytes = 100_000_000_000_000_000", "memory_bytes"),
        ("memory_bytes", "memory_bytes = 1e23", "memory_bytes"),
        ("gpus_per_node", "gpus_per_node = 1_000_000_000", "gpus_per_node"),
        ("gpus_per_node", "gpus_per_node = 0", "gpus_per_node"),
        ("bf16_flops", "bf16_flops = 1e-300", "bf16_flops"),
        ("fp16_flops", "fp16_flops = 0.0", "fp16_flops"),
        ("fp16_flops", "fp16_flops = -1e12", "fp16_flops"),
        ("fp16_flops", "fp16_flops = nan", "fp16_flops"),
        ("fp32_flops", "fp32_flops = 1e30", "fp32_flops"),
        ("hbm_bandwidth_bytes_per_s", "hbm_bandwidth_bytes_per_s = 1e-3", "hbm_bandwidth"),
        ("price_per_hour_usd", "price_per_hour_usd = inf", "price_per_hour_usd"),
    ],
)
def test_absurd_gpu_profiles_are_refused_naming_file_and_field(
    capsys, folder, line: str, new: str, field: str
) -> None:
    hw = _gpu_dir(folder, line, new)
    for argv in (
        ["gpus", "--hardware-dir", hw],
        ["estimate", "--gpu", "bad", "--hardware-dir", hw],
    ):
        _refused(capsys, folder, argv, "bad.toml", field)
    with pytest.raises(ValueError, match=field):
        load_gpus(hw)


def test_a_fractional_or_absurd_optimizer_is_refused(capsys, folder) -> None:
    for value in ("1.5", "1e300", "nan"):
        opt = _optimizer_dir(folder, value)
        argv = ["estimate", "--optimizer", "weird", "--optimizers-dir", opt]
        _refused(capsys, folder, argv, "weird.toml", "num_states")
    with pytest.raises(ValueError, match="num_states"):
        OptimizerSpec(
            name="x",
            description="",
            num_states=2.5,
            state_bytes=0.0,
            step_temp_states=0.0,
            eight_bit_blockwise=False,
            step_bytes_per_parameter=20.0,
            path="x.toml",
        )


def test_json_text_never_writes_nan_or_infinity() -> None:
    text = json_text({"a": math.nan, "b": [math.inf, -math.inf], "c": 1.5})
    assert json.loads(text) == {"a": None, "b": [None, None], "c": 1.5}
    assert "NaN" not in text and "Infinity" not in text


# ---- 6. objectives, job names, a missing --optimizers-dir -------------------------------------


def test_duplicate_objectives_are_refused_before_anything_is_written(capsys, folder) -> None:
    out = folder / "dup"
    argv = ["sweep", "--objective", "cost,cost", "--out", str(out), "--model", "llama-3.2-1b"]
    _refused(capsys, folder, argv, "objective", "twice")
    assert not out.exists()


@pytest.mark.parametrize("flag", [["--job-name", "job\n"], ["--time-limit", "24:00:00\n"]])
def test_a_trailing_newline_fails_the_name_checks(capsys, folder, flag: list[str]) -> None:
    argv = ["recommend", "--model", "llama-3.2-1b", *SEARCH, *flag]
    _refused(capsys, folder, argv, flag[0].strip("-"))
    with pytest.raises(ValueError, match=flag[0].strip("-")):
        trainmem.recommend(model="llama-3.2-1b", **{flag[0].strip("-").replace("-", "_"): flag[1]})


def test_a_missing_optimizers_dir_is_refused_like_a_missing_hardware_dir(capsys, folder) -> None:
    missing = str(folder / "nowhere")
    for flag in ("--optimizers-dir", "--hardware-dir"):
        _refused(capsys, folder, ["estimate", flag, missing], "dir", "not a directory")
    with pytest.raises(ValueError, match="optimizers dir"):
        trainmem.estimate(optimizers_dir=missing)


# ---- HTTP ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def http() -> Any:
    pytest.importorskip("fastapi", reason="trainmem[serve] not installed")
    from fastapi.testclient import TestClient

    from trainmem.serve._app import create_app

    with TestClient(create_app()) as client:
        yield client


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/estimate", {"gpu": "a100-sxm-80gb", "precision": "fp8-mixed"}, "precision"),
        ("/v1/estimate", {"gpu": "v100-sxm2-16gb", "precision": "bf16"}, "precision"),
        ("/v1/fit", {"gpu": "t4-16gb", "precision": "bf16"}, "precision"),
        ("/v1/estimate", {"model": "gpt2", "seq_len": 4096}, "seq_len"),
        ("/v1/estimate", {"lora_rank": 65536}, "lora_rank"),
        ("/v1/estimate", {"overhead": ["cuda_context_bytes=1e14"]}, "cuda_context_bytes"),
        (
            "/v1/recommend",
            {"fleet": "8xa100-sxm-80gb", "precision": "fp8-mixed", "model": "llama-3.2-1b"},
            "precision",
        ),
        (
            "/v1/recommend",
            {"job_name": "job\n", "model": "llama-3.2-1b", "global_batch_size": 32},
            "job-name",
        ),
    ],
)
def test_http_refuses_them_with_422(http, path: str, body: dict[str, Any], field: str) -> None:
    got = http.post(path, json=body)
    assert got.status_code == 422, got.text
    assert field in got.json()["error"]


def test_http_answers_a_warning_in_the_json(http) -> None:
    got = http.post("/v1/estimate", json={"model": "gpt2", "seq_len": 4096, "allow_long_seq": True})
    assert got.status_code == 200 and got.json()["warnings"][0].startswith("seq_len: ")


def test_a_heatmap_of_precisions_skips_those_the_gpu_lacks(capsys, folder) -> None:
    argv = ["heatmap", "--gpu", "v100-sxm2-16gb", "--model", "llama-3.2-1b", "--x", "precision"]
    code = main([*argv, "--y", "micro_batch_size", "--out", str(folder / "p.png"), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["x_values"] == ["fp32", "fp16", "amp-fp16", "mixed-fp16"]
    only_bf16 = [*argv, "--x-values", "bf16,fp8-mixed", "--out", str(folder / "q.png")]
    _refused(capsys, folder, only_bf16, "precision", "v100")


def test_the_advice_never_swaps_to_a_gpu_that_cannot_run_the_precision() -> None:
    report = trainmem.estimate(model="llama-3.1-70b", precision="fp8-mixed")
    swaps = {a["gpu"] for a in report["advice"] if a["gpu"]}
    assert swaps and all(precision_reason("fp8-mixed", load_gpus()[g]) is None for g in swaps)
