"""`trainmem recommend`: plans equal `estimate`, the JSON contract, and each launch format valid
for its tool against the documented keys and flags shipped in tests/data with their sources (a
cheap second check: test_launch_tools.py has the tools themselves read every format)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import shlex
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from trainmem.catalog import load_model, model_config_dict
from trainmem.cli import main
from trainmem.cli._recommend import recommend_cmd
from trainmem.hardware import load_gpus, parse_fleet
from trainmem.plan import RECOMMEND_OPTIONS, REPORT_FIELDS
from trainmem.plan._launch import deepspeed_config, render
from trainmem.plan._recommend import (
    CONTRACT,
    LAUNCHABLE,
    LAYOUT,
    launchable,
    recommend_report,
    space_points,
)
from trainmem.sweep._exhaustive import run_exhaustive
from trainmem.sweep._space import make_space

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data"
JOB = {
    "model": "llama-3.1-8b",
    "fleet": "8xh100-sxm-80gb",
    "seq_len": 4096,
    "global_batch_size": 256,
}
ARGV = [
    "--model",
    "llama-3.1-8b",
    "--fleet",
    "8xh100-sxm-80gb",
    "--seq-len",
    "4096",
    "--global-batch-size",
    "256",
]


def _data(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


@pytest.fixture(scope="module")
def megatron() -> dict[str, Any]:
    return recommend_report(**JOB)


@pytest.fixture(scope="module")
def deepspeed() -> dict[str, Any]:
    return recommend_report(**JOB, framework="deepspeed")


@pytest.fixture(scope="module")
def fsdp() -> dict[str, Any]:
    return recommend_report(**JOB, framework="hf")


@pytest.fixture(scope="module")
def two_gpu_types() -> dict[str, Any]:
    return recommend_report(
        model="llama-3.2-1b",
        fleet="16xh100-sxm-80gb,8xa100-sxm-80gb",
        seq_len=2048,
        global_batch_size=64,
        num_alternatives=2,
    )


def _plans(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [report, *report["alternatives"]]


# ---- the plan: contract, arithmetic, equal to `estimate` ----------------------------------------


def test_contract_keys_and_arithmetic(megatron, deepspeed, fsdp, two_gpu_types) -> None:
    for report in (megatron, deepspeed, fsdp, two_gpu_types):
        assert report["fits"] is True and report["reason"] == ""
        keys = set(report) - {
            "alternatives",
            "model",
            "num_parameters",
            "architecture",
            "fleet",
            "objective",
            "headroom",
            "launch",
            "num_points",
            "num_fitting_layouts",
            "units",
        }
        for plan in _plans(report):
            assert set(CONTRACT) <= set(plan)
            assert keys <= set(plan), keys - set(plan)
            assert plan["fits"] is True and plan["headroom_bytes"] >= 0
            gbs = plan["micro_batch_size"] * plan["grad_accum_steps"] * plan["dp"]
            assert gbs == plan["global_batch_size"] == report["global_batch_size"]
            assert plan["num_nodes"] * plan["gpus_per_node"] == plan["num_gpus"]
            assert plan["dp"] * plan["tp"] * plan["pp"] * plan["cp"] == plan["num_gpus"]
            assert sum(plan["breakdown"].values()) == plan["peak_device_bytes"]
            assert plan["step_time_s"] > 0 and plan["cost_per_million_tokens"] > 0
        layouts = [tuple(p[k] for k in LAYOUT) for p in _plans(report)]
        assert len(set(layouts)) == len(layouts), "alternatives are distinct layouts"
    assert len(megatron["alternatives"]) == 4  # the default: the next best four
    costs = [p["cost_per_million_tokens"] for p in _plans(megatron)]
    assert costs == sorted(costs)


def _estimate(capsys, argv: list[str]) -> dict[str, Any]:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _independent_argv(plan: dict[str, Any], report: dict[str, Any]) -> list[str]:
    """The estimate flags of a plan, built here from its keys (not from estimate_command)."""
    argv = [
        "estimate",
        "--model",
        report["model"],
        "--gpu",
        plan["gpu"],
        "--json",
        "--headroom",
        str(report["headroom"]),
    ]
    for key in (
        "num_gpus",
        "seq_len",
        "global_batch_size",
        "micro_batch_size",
        "tp",
        "pp",
        "virtual_stages",
        "cp",
        "ep",
        "zero",
        "recompute",
        "offload",
        "precision",
        "optimizer",
        "framework",
    ):
        argv += ["--" + key.replace("_", "-"), str(plan[key])]
    return argv + (["--sequence-parallel"] if plan["sequence_parallel"] else [])


def test_every_plan_equals_estimate(capsys, megatron, deepspeed, fsdp, two_gpu_types) -> None:
    """The issue's "done when": the same configuration through `estimate` gives the same bytes,
    fit and (the pools' prices and node sizes being the profiles') time and cost."""
    for report in (megatron, deepspeed, fsdp, two_gpu_types):
        for k, plan in enumerate(_plans(report)):
            command = shlex.split(plan["estimate_command"])
            assert command[:2] == ["trainmem", "estimate"]
            built = [_independent_argv(plan, report)] if k < 2 else []  # the flags, built here
            for argv in (command[1:] + ["--json"], *built):
                est = _estimate(capsys, argv)
                assert est["peak_device_bytes"] == plan["peak_device_bytes"]
                assert est["headroom_bytes"] == plan["headroom_bytes"]
                assert est["fits"] is plan["fits"] is True
                assert est["gpu"]["name"] == plan["gpu"]
                assert est["time"]["step_time_s"] == pytest.approx(plan["step_time_s"], rel=1e-12)
                assert est["time"]["cost_per_million_tokens"] == pytest.approx(
                    plan["cost_per_million_tokens"], rel=1e-12
                )


def test_each_gpu_type_of_the_fleet_appears(two_gpu_types) -> None:
    gpus = [p["gpu"] for p in _plans(two_gpu_types)]
    assert {"h100-sxm-80gb", "a100-sxm-80gb"} <= set(gpus)
    assert len(two_gpu_types["alternatives"]) >= 2
    plans = _plans(two_gpu_types)
    extra = [k for k, p in enumerate(plans) if p["note"].startswith("best on ")]
    assert extra, "the a100 pool is never cheapest here: it comes as its best layout"
    for k in extra:
        assert plans[k]["note"] == f"best on {plans[k]['gpu']}"
        assert plans[k]["gpu"] not in gpus[:k]


def test_plan_is_the_sweeps_optimum(megatron) -> None:
    """Built on the sweep: the plan is run_exhaustive's optimum over the launchable space."""
    gpus = load_gpus()
    space = make_space(
        load_model("llama-3.1-8b"),
        parse_fleet("8xh100-sxm-80gb", gpus),
        gpus,
        seq_len=4096,
        global_batch_size=256,
        framework="megatron",
    )
    best = run_exhaustive(launchable(space, "megatron"), out=None, study="x").best[0]
    assert best["cost_per_million_tokens"] == pytest.approx(megatron["cost_per_million_tokens"])


def test_deterministic_and_pure(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert recommend_report(**JOB) == recommend_report(**JOB)
    assert main(["recommend", *ARGV, "--format", "slurm"]) == 0
    assert not list(tmp_path.iterdir()), "recommend writes nothing"


def test_frameworks_search_only_what_they_launch(deepspeed, fsdp) -> None:
    for report, framework in ((deepspeed, "deepspeed"), (fsdp, "hf")):
        assert report["framework"] == framework
        for plan in _plans(report):
            for axis, allowed in LAUNCHABLE[framework].items():
                assert plan[axis] in allowed, (axis, plan[axis])
    assert all(p["zero"] != 1 for p in _plans(fsdp))


def test_run_exhaustive_in_memory_equals_written(tmp_path) -> None:
    gpus = load_gpus()
    space = make_space(
        load_model("llama-3.2-1b"),
        parse_fleet("8xa100-sxm-40gb", gpus),
        gpus,
        seq_len=2048,
        global_batch_size=32,
        max_pp=2,
        max_cp=1,
    )
    kwargs = {"study": "m", "top": None, "distinct": LAYOUT, "chunk_size": 5000}
    memory = run_exhaustive(space, out=None, **kwargs)
    disk = run_exhaustive(space, out=tmp_path, **kwargs)
    assert memory.parquet == "" and disk.parquet
    assert memory.top.equals(disk.top) and memory.best == disk.best
    assert memory.top.select(LAYOUT).is_unique().all()
    assert memory.extra["closest"] is None


def test_nothing_fits_reports_the_closest(capsys) -> None:
    job = {"model": "llama-3.1-70b", "fleet": "8xl4-24gb", "seq_len": 4096, "global_batch_size": 64}
    report = recommend_report(**job)
    assert report["fits"] is False and report["reason"].startswith("nothing fits on 8xl4-24gb")
    assert report["alternatives"] == [] and report["num_fitting_layouts"] == 0
    assert report["gpu"] == "l4-24gb" and report["headroom_bytes"] < 0
    assert set(CONTRACT) <= set(report)
    argv = [
        "recommend",
        "--model",
        "llama-3.1-70b",
        "--fleet",
        "8xl4-24gb",
        "--global-batch-size",
        "64",
    ]
    assert main([*argv, "--json"]) == 0  # the exit-code contract: 1 only with --check
    assert json.loads(capsys.readouterr().out)["fits"] is False
    assert main([*argv, "--json", "--check"]) == 1
    capsys.readouterr()
    assert main([*argv, "--format", "torchrun", "--check"]) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("nothing fits")
    with pytest.raises(ValueError, match="nothing fits"):
        render(report, "torchrun")


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--model", "no-such-model"], "model"),
        (["--fleet", "8xno-such-gpu"], "gpu"),
        (["--format", "yaml"], "format"),
        (["--global-batch-size", "0"], "global-batch-size"),
        (["--format", "deepspeed", "--framework", "megatron"], "framework"),
        (["--framework", "deepspeed", "--precision", "fp8-mixed"], "precision"),
        (["--objective", "cost,time"], "objective"),
        (["--time-limit", "tomorrow"], "time-limit"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, extra: list[str], field: str) -> None:
    assert main(["recommend", *ARGV, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and field in err


def test_report_takes_every_command_option() -> None:
    """The HTTP service's rule: recommend_report(**fields) takes the command's options by name
    (all but the output ones), each declared once in RECOMMEND_OPTIONS."""
    cmd = inspect.signature(recommend_cmd).parameters
    assert list(cmd) == [o.name for o in RECOMMEND_OPTIONS]
    names = [n for n in cmd if n not in ("fmt", "as_json", "check")]
    inspect.signature(recommend_report).bind(**{n: cmd[n].default for n in names})
    assert set(names) == set(REPORT_FIELDS)


def test_cli_forms(capsys, megatron) -> None:
    assert main(["recommend", *ARGV, "--json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert as_json == json.loads(json.dumps(megatron))
    assert main(["recommend", *ARGV, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == as_json
    assert main(["recommend", *ARGV]) == 0
    text = capsys.readouterr().out
    assert "best: 8 x h100-sxm-80gb" in text and "runner-up 4" in text
    assert main(["recommend", *ARGV, "--format", "deepspeed"]) == 0
    assert json.loads(capsys.readouterr().out)["train_batch_size"] == 256


def test_user_model_gpu_and_optimizer_reach_the_estimate_command(capsys, tmp_path) -> None:
    """--models-dir, --hardware-dir and --optimizers-dir travel into estimate_command."""
    models, gpus = tmp_path / "models", tmp_path / "gpus"
    models.mkdir(), gpus.mkdir()
    config = model_config_dict("llama-3.2-1b")
    (models / "my-model.json").write_text(json.dumps({**config, "num_hidden_layers": 8}))
    toml = (ROOT / "hardware" / "gpus" / "h100-sxm-80gb.toml").read_text()
    (gpus / "my-gpu.toml").write_text(toml.replace('name = "h100-sxm-80gb"', 'name = "my-gpu"'))
    report = recommend_report(
        model="my-model",
        fleet="8xmy-gpu",
        seq_len=2048,
        global_batch_size=32,
        optimizer="adam-mini",
        framework="deepspeed",
        models_dir=str(models),
        hardware_dir=str(gpus),
        optimizers_dir=str(DATA / "examples" / "optimizers"),
    )
    assert report["fits"] and report["gpu"] == "my-gpu" and report["model"] == "my-model"
    for plan in _plans(report):
        est = _estimate(capsys, shlex.split(plan["estimate_command"])[1:] + ["--json"])
        assert est["peak_device_bytes"] == plan["peak_device_bytes"]
    cfg = deepspeed_config(report)  # a user optimizer: the script passes it to deepspeed
    assert "optimizer" not in cfg and cfg["zero_allow_untested_optimizer"] is True


def test_space_points_counts_without_searching(megatron) -> None:
    assert space_points(**JOB) == megatron["num_points"] > 1000
    assert space_points(**JOB, framework="deepspeed") < 1000
    with pytest.raises(ValueError, match="framework"):
        space_points(**JOB, framework="jax")
    with pytest.raises(TypeError):
        space_points(**JOB, no_such_field=1)


# ---- DeepSpeed ---------------------------------------------------------------------------------

DS_KEYS = _data("deepspeed_config_keys.json")
TYPES = {"int": int, "number": (int, float), "bool": bool}


def _variants(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan and changed copies covering each branch of a format (render is a pure function
    of the report, so the variants need no search)."""
    return [
        report,
        {
            **report,
            "zero": 3,
            "offload": "optimizer+params",
            "recompute": "full",
            "precision": "mixed-fp16",
        },
        {
            **report,
            "zero": 1,
            "offload": "optimizer",
            "optimizer": "sgd-momentum",
            "precision": "fp32",
        },
        {**report, "zero": 0, "optimizer": "adamw-8bit"},
        {
            **report,
            "zero": 3,
            "optimizer": "lion",
            "num_nodes": 2,
            "gpus_per_node": 8,
            "num_gpus": 16,
            "dp": 16,
            "grad_accum_steps": 16,
        },
    ]


def _check_keys(cfg: dict[str, Any], path: str = "") -> None:
    allowed = DS_KEYS["top_level"] if not path else DS_KEYS["sections"][path]
    for key, value in cfg.items():
        where = f"{path}.{key}" if path else key
        assert key in allowed, f"{where} is not a documented DeepSpeed key"
        if where in DS_KEYS["types"]:
            assert isinstance(value, TYPES[DS_KEYS["types"][where]]), where
            if DS_KEYS["types"][where] != "bool":
                assert not isinstance(value, bool), where
        if where in DS_KEYS["values"]:
            assert value in DS_KEYS["values"][where], where
        if where == "optimizer.params":
            assert set(value) <= set(DS_KEYS["optimizer_params"][cfg["type"]]), cfg["type"]
        elif isinstance(value, dict):
            _check_keys(value, where)


def test_deepspeed_config_has_documented_keys_only(deepspeed) -> None:
    for plan in _variants(deepspeed):
        cfg = json.loads(render(plan, "deepspeed"))
        _check_keys(cfg)
        assert cfg["train_batch_size"] == (
            cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * plan["dp"]
        )
        assert cfg["train_batch_size"] == plan["global_batch_size"] or plan["num_gpus"] == 16
        z = cfg["zero_optimization"]
        assert z["stage"] == plan["zero"]
        assert ("offload_optimizer" in z) == (plan["offload"] != "none")
        assert ("offload_param" in z) == (plan["offload"] == "optimizer+params")
        assert ("activation_checkpointing" in cfg) == (plan["recompute"] == "full")
        assert cfg["bf16"]["enabled"] == (plan["precision"] == "mixed-bf16")
        assert cfg["fp16"]["enabled"] == (plan["precision"] == "mixed-fp16")
        assert ("optimizer" in cfg) != cfg.get("zero_allow_untested_optimizer", False)
        assert "auto" not in json.dumps(cfg)
        h = plan["architecture"]["hidden_size"]
        if plan["zero"] >= 1:
            assert z["reduce_bucket_size"] == h * h  # the size the estimate assumes
        if plan["zero"] == 3:
            assert z["stage3_prefetch_bucket_size"] == int(0.9 * h * h)


def test_deepspeed_config_loads_in_deepspeed(deepspeed, monkeypatch) -> None:
    ds_config = pytest.importorskip("deepspeed.runtime.config")
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    for plan in _variants(deepspeed):
        cfg = deepspeed_config(plan)
        # mpu: the data-parallel world size DeepSpeed checks the batch against
        mpu = SimpleNamespace(get_data_parallel_world_size=lambda dp=plan["dp"]: dp)
        loaded = ds_config.DeepSpeedConfig(cfg, mpu=mpu)
        assert loaded.train_batch_size == cfg["train_batch_size"]
        assert loaded.gradient_accumulation_steps == plan["grad_accum_steps"]
        assert int(loaded.zero_optimization_stage) == plan["zero"]


# ---- torchrun and sbatch -----------------------------------------------------------------------

TORCHRUN = set(_data("torchrun_flags.json")["flags"])
MEGATRON = _data("megatron_args.json")
SBATCH = set(_data("sbatch_options.json")["options"])
TRAINER_ARGS = {
    "--per_device_train_batch_size",
    "--gradient_accumulation_steps",
    "--deepspeed",
    "--bf16",
    "--fp16",
    "--gradient_checkpointing",
}
"""The Hugging Face Trainer flags a deepspeed launch line uses (transformers/training_args.py
TrainingArguments fields; checked against the installed class when importable)."""


def _command(text: str, first: str) -> list[str]:
    """The tokens of the command starting with `first` (comments dropped, lines joined)."""
    lines = [ln for ln in text.replace("\\\n", " ").splitlines() if not ln.startswith("#")]
    (line,) = [ln for ln in lines if ln.startswith(first)]
    return shlex.split(line)


def _options(tokens: list[str]) -> dict[str, str | None]:
    """--flag value / --flag=value / --switch of an argument list."""
    out: dict[str, str | None] = {}
    for i, tok in enumerate(tokens):
        if tok.startswith("--"):
            key, eq, value = tok.partition("=")
            nxt = tokens[i + 1] if i + 1 < len(tokens) else "--"
            out[key] = value if eq else (None if nxt.startswith("--") else nxt)
    return out


def _check_torchrun(tokens: list[str], plan: dict[str, Any]) -> list[str]:
    """Validate the torchrun part; returns the script's arguments."""
    assert tokens[0] == "torchrun"
    script = next(i for i, t in enumerate(tokens) if i and not t.startswith("--"))
    launcher = _options(tokens[1:script])
    assert set(launcher) <= TORCHRUN, set(launcher) - TORCHRUN
    assert launcher["--nproc-per-node"] == str(plan["gpus_per_node"])
    assert launcher["--rdzv-backend"] == "c10d"
    args = tokens[script + 1 :]
    return args


def _check_script_args(args: list[str], plan: dict[str, Any]) -> None:
    opts = _options([a for a in args if a != "$EXTRA_ARGS"])
    if plan["framework"] == "megatron":
        assert set(opts) <= set(MEGATRON["flags"]), set(opts) - set(MEGATRON["flags"])
        for flag, choices in MEGATRON["choices"].items():
            assert flag not in opts or opts[flag] in choices, flag
        for flag, key in (
            ("--tensor-model-parallel-size", "tp"),
            ("--pipeline-model-parallel-size", "pp"),
            ("--context-parallel-size", "cp"),
            ("--micro-batch-size", "micro_batch_size"),
            ("--global-batch-size", "global_batch_size"),
            ("--seq-length", "seq_len"),
        ):
            assert opts[flag] == str(plan[key]), flag
        assert ("--use-distributed-optimizer" in opts) == (plan["zero"] >= 1)
        assert ("--recompute-granularity" in opts) == (plan["recompute"] != "none")
    else:
        assert set(opts) <= TRAINER_ARGS
        assert opts["--per_device_train_batch_size"] == str(plan["micro_batch_size"])
        assert opts["--gradient_accumulation_steps"] == str(plan["grad_accum_steps"])
        assert opts["--deepspeed"] == "ds_config.json"


def _alternatives(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each alternative as a report of its own (what render takes)."""
    return [{**report, **alt, "alternatives": []} for alt in report["alternatives"]]


def _launch_variants(megatron, deepspeed) -> list[dict[str, Any]]:
    multi = {"num_nodes": 4, "gpus_per_node": 8, "num_gpus": 32}
    return [
        megatron,
        *_alternatives(megatron),
        {
            **megatron,
            **multi,
            "tp": 4,
            "pp": 4,
            "virtual_stages": 2,
            "dp": 2,
            "zero": 3,
            "recompute": "full",
            "offload": "optimizer",
            "precision": "fp8-mixed",
        },
        {**megatron, "zero": 0, "optimizer": "sgd", "precision": "mixed-fp16"},
        deepspeed,
        {**deepspeed, **multi, "dp": 32, "grad_accum_steps": 8, "recompute": "full"},
    ]


def test_torchrun_line_is_valid(megatron, deepspeed) -> None:
    for plan in _launch_variants(megatron, deepspeed):
        text = render(plan, "torchrun")
        tokens = _command(text, "torchrun")
        args = _check_torchrun(tokens, plan)
        assert _options(tokens[:3])["--nnodes"] == str(plan["num_nodes"])
        _check_script_args(args, plan)
        if shutil.which("bash"):
            subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_torchrun_line_parses_with_torch(megatron, deepspeed) -> None:
    run = pytest.importorskip("torch.distributed.run")
    for plan in _launch_variants(megatron, deepspeed):
        args = run.get_args_parser().parse_args(_command(render(plan, "torchrun"), "torchrun")[1:])
        assert args.nnodes == str(plan["num_nodes"])
        assert int(args.nproc_per_node) == plan["gpus_per_node"]
        assert args.training_script == (
            "pretrain_gpt.py" if plan["framework"] == "megatron" else "train.py"
        )
        assert args.training_script_args[-1] == "$EXTRA_ARGS"


def test_trainer_flags_are_trainingarguments() -> None:
    transformers = pytest.importorskip("transformers")
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    assert {f.removeprefix("--") for f in TRAINER_ARGS} <= fields


def test_sbatch_script_is_valid(megatron, deepspeed) -> None:
    for plan in _launch_variants(megatron, deepspeed):
        text = render({**plan, "launch": {**plan["launch"], "time_limit": "2-00:00:00"}}, "slurm")
        assert text.startswith("#!/bin/bash\n")
        sbatch = {}
        for line in text.splitlines():
            if line.startswith("#SBATCH"):
                key, _, value = line.split()[1].partition("=")
                assert key in SBATCH, key
                sbatch[key] = value
        assert sbatch["--nodes"] == str(plan["num_nodes"])
        assert sbatch["--gpus-per-node"] == str(plan["gpus_per_node"])
        assert sbatch["--ntasks-per-node"] == "1" and sbatch["--time"] == "2-00:00:00"
        assert int(sbatch["--cpus-per-task"]) >= plan["gpus_per_node"]
        tokens = _command(text, "srun")
        _check_script_args(_check_torchrun(tokens[1:], plan), plan)
        if shutil.which("bash"):
            subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_launch_formats_refuse_other_frameworks(megatron, fsdp) -> None:
    with pytest.raises(ValueError, match="framework: format deepspeed"):
        render(megatron, "deepspeed")
    with pytest.raises(ValueError, match="framework: format torchrun"):
        render(fsdp, "torchrun")
    with pytest.raises(ValueError, match="optimizer"):
        render({**megatron, "optimizer": "lion"}, "torchrun")


# ---- accelerate --------------------------------------------------------------------------------

ACC = _data("accelerate_fsdp_keys.json")


def _fsdp_variants(fsdp: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        fsdp,
        *_alternatives(fsdp),
        {**fsdp, "zero": 3, "offload": "optimizer+params", "recompute": "full"},
        {**fsdp, "zero": 0, "precision": "mixed-fp16"},
        {
            **fsdp,
            "zero": 3,
            "num_nodes": 2,
            "gpus_per_node": 8,
            "num_gpus": 16,
            "dp": 16,
            "grad_accum_steps": 16,
            "precision": "fp32",
        },
    ]


def test_accelerate_config_is_valid(fsdp) -> None:
    yaml = pytest.importorskip("yaml")
    values = ACC["values"]
    for plan in _fsdp_variants(fsdp):
        text = render(plan, "accelerate")
        cfg = yaml.safe_load(text)
        assert set(cfg) <= set(ACC["top_level"]), set(cfg) - set(ACC["top_level"])
        assert set(cfg["fsdp_config"]) <= set(ACC["fsdp_config"])
        for key, allowed in values.items():
            section, _, name = key.rpartition(".")
            holder = cfg.get(section, {}) if section else cfg
            if name in holder:
                assert holder[name] in allowed, key
        fsdp_cfg = cfg["fsdp_config"]
        assert cfg["distributed_type"] == "FSDP" and cfg["machine_rank"] == 0
        assert cfg["num_processes"] == plan["num_gpus"]
        assert cfg["num_machines"] == plan["num_nodes"]
        assert (
            cfg["mixed_precision"]
            == {"mixed-bf16": "bf16", "mixed-fp16": "fp16", "fp32": "no"}[plan["precision"]]
        )
        sharding = {3: "FULL_SHARD", 2: "SHARD_GRAD_OP", 0: "NO_SHARD"}[plan["zero"]]
        assert fsdp_cfg["fsdp_sharding_strategy"] == sharding
        assert fsdp_cfg["fsdp_offload_params"] == (plan["offload"] == "optimizer+params")
        assert fsdp_cfg["fsdp_activation_checkpointing"] == (plan["recompute"] == "full")
        assert fsdp_cfg["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
        version = fsdp_cfg["fsdp_version"]
        assert version == (1 if plan["zero"] == 0 else 2)
        if version == 2:
            assert fsdp_cfg["fsdp_reshard_after_forward"] is (plan["zero"] == 3)
            assert not set(ACC["fsdp1_only"]) & set(fsdp_cfg)
            assert fsdp_cfg["fsdp_state_dict_type"] in values["fsdp2_state_dict_type"]
        else:
            assert fsdp_cfg["fsdp_reshard_after_forward"] == sharding
            assert fsdp_cfg["fsdp_backward_prefetch"] == "BACKWARD_PRE"
        m, a = plan["micro_batch_size"], plan["grad_accum_steps"]
        assert f"--per_device_train_batch_size {m} --gradient_accumulation_steps {a}" in text


def test_accelerate_config_runs_accelerate_launch(fsdp, tmp_path, monkeypatch) -> None:
    """`accelerate launch --config_file` reads it (unknown keys are an error there), exports the
    FSDP_* variables, and the FSDP plugin the script builds from them is the plan's."""
    pytest.importorskip("accelerate")
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    for k, plan in enumerate(_fsdp_variants(fsdp)):
        path = tmp_path / f"a{k}.yaml"
        path.write_text(render(plan, "accelerate"))
        argv = ["--config_file", str(path), "--main_process_ip", "10.0.0.1", "train.py"]
        args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
        assert args.num_processes == plan["num_gpus"] and args.use_fsdp
        env = prepare_multi_gpu_env(args)
        for key, value in env.items():
            if key.startswith(("FSDP_", "ACCELERATE_")):
                monkeypatch.setenv(key, value)
        # The plan's load: the hf stack's own (a whole CPU model sharded by fully_shard), not
        # accelerate's rank-0 broadcast (engine/_load.py).
        assert env["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "false"
        assert env["FSDP_SYNC_MODULE_STATES"] == "true"  # accelerate launch's default
        for key in ("FSDP_SYNC_MODULE_STATES", "FSDP_CPU_RAM_EFFICIENT_LOADING"):
            monkeypatch.setenv(key, "false")  # with these FSDP1 wants a GPU at construction
        plugin = FullyShardedDataParallelPlugin()
        assert plugin.fsdp_version == (1 if plan["zero"] == 0 else 2)
        assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]
        assert plugin.activation_checkpointing == (plan["recompute"] == "full")
        offloaded = type(plugin.cpu_offload).__name__ in ("CPUOffloadPolicy", "CPUOffload") and (
            getattr(plugin.cpu_offload, "offload_params", True)
        )
        assert offloaded == (plan["offload"] == "optimizer+params")
        if plugin.fsdp_version == 2:
            assert plugin.reshard_after_forward is (plan["zero"] == 3)
        else:
            assert plugin.sharding_strategy.name == "NO_SHARD"


def test_space_restriction_keeps_the_sweep_space(megatron) -> None:
    gpus = load_gpus()
    space = make_space(
        load_model("llama-3.1-8b"),
        parse_fleet("8xh100-sxm-80gb", gpus),
        gpus,
        seq_len=4096,
        global_batch_size=256,
    )
    for framework, keep in LAUNCHABLE.items():
        cut = launchable(space, framework)
        for axis, values in cut.axes.items():
            assert set(values) <= set(space.axes[axis])
            expected = [v for v in space.axes[axis] if axis not in keep or v in keep[axis]]
            assert list(values) == expected
    assert megatron["num_points"] == launchable(space, "megatron").num_points
    assert np.prod([len(v) for v in launchable(space, "deepspeed").axes.values()]) < 1000
