"""The torchtitan reader (stacks/_torchtitan.py) on torchtitan's own TOML train configs
(v0.2.2 and v0.1.0: tests/data/stacks/torchtitan/, PROVENANCE.md) and on torchtitan 0.3.0
launch lines (trainmem recommend's own, run_train.sh), field by field against tables written
from the files and torchtitan's sources."""

from __future__ import annotations

from pathlib import Path

import pytest

import trainmem
from trainmem.stacks import check_report, detect, parse, read_job

DATA = Path(__file__).parents[2] / "data" / "stacks" / "torchtitan"
D = "default"
P = "file:parallelism."
SHARD = "parallelism.data_parallel_shard_degree"
SEL_OP = (
    "selective-op",
    "file:activation_checkpoint.mode,activation_checkpoint.selective_ac_option",
)
FULL = ("full", "file:activation_checkpoint.mode")


CP_KEY = "parallelism.context_parallel_degree"
NO_COMPILE = ("none", "file:compile.enable")


def _toml(model, micro, seq, recompute, *, tp=None, pp=None, cp=None, ep=None, etp=None,
          zero_keys=(SHARD, CP_KEY), compile_=NO_COMPILE, **more):  # fmt: skip
    out = {
        "model": (model, "file:model.name,model.flavor"),
        "zero": (3, "file:" + ",".join(zero_keys)),
        "precision": ("mixed-bf16", D),
        "seq_len": (seq, "file:training.seq_len"),
        "micro_batch_size": (micro, "file:training.local_batch_size"),
        "recompute": recompute,
        "optimizer": ("adamw-fused", "file:optimizer.name"),
        "loss": ("full", D),
    }
    for name, value, key in (("tp", tp, "tensor_parallel_degree"),
                             ("pp", pp, "pipeline_parallel_degree"),
                             ("cp", cp, "context_parallel_degree"),
                             ("ep", ep, "expert_parallel_degree"),
                             ("etp", etp, "expert_tensor_parallel_degree")):  # fmt: skip
        if value is not None:
            out[name] = (value, f"{P}{key}")
    if compile_ is not None:
        out["compile"] = compile_
    if tp is not None and tp > 1:
        out["sequence_parallel"] = (True, D)
    return {**out, **more}


Z1 = (SHARD,)
EXPECTED = {
    "llama3_debug_model.toml": _toml(
        "llama3-debugmodel", 8, 2048,
        ("selective-layer", SEL_OP[1]), tp=1, pp=1, cp=1,
        recompute_every=(2, "file:activation_checkpoint.selective_ac_option"),
    ),
    "llama3_8b.toml": _toml("llama-3.1-8b", 1, 8192, SEL_OP, tp=1, pp=1, cp=1),
    "v0.1.0_llama3_8b.toml": _toml("llama-3.1-8b", 1, 8192, SEL_OP, tp=1, pp=1, cp=1,
                                   compile_=("none", "file:training.compile")),
    "llama3_70b.toml": _toml("llama-3.1-70b", 8, 8192, FULL, tp=8, pp=1, cp=1),
    "llama3_405b.toml": _toml(
        "llama-3.1-405b", 2, 8192, FULL, tp=8, pp=1, cp=1,
        compile_=("blocks+loss", "file:compile.enable,compile.components"),
        precision=("fp8-mixed", "file:model.converters"),
    ),
    "qwen3_0.6b.toml": _toml("qwen3-0.6B", 4, 4096, SEL_OP, tp=1, cp=1),
    "qwen3_1.7b.toml": _toml("qwen3-1.7B", 4, 4096, SEL_OP, tp=1, cp=1),
    "qwen3_32b.toml": _toml("qwen3-32B", 2, 4096, FULL, tp=1, cp=1),
    "qwen3_moe_debug.toml": _toml("qwen3-debugmodel_moe", 4, 4096, SEL_OP, tp=1, ep=1, etp=1,
                                  zero_keys=Z1),
    "deepseek_v3_16b.toml": _toml("deepseek-v2-lite", 4, 4096, SEL_OP, tp=1, pp=1, ep=8, etp=1,
                                  zero_keys=Z1, compile_=None),
    "deepseek_v3_671b.toml": _toml("deepseek-v3", 4, 4096, SEL_OP, tp=1, pp=1, ep=1, etp=1,
                                   zero_keys=Z1, compile_=None),
    "llama4_17bx16e.toml": _toml("llama4-17bx16e", 8, 8192, FULL, tp=8, pp=1, cp=1, ep=1, etp=8),
    "llama4_17bx128e.toml": _toml(
        "llama4-17bx128e", 1, 8192, FULL, tp=8, pp=4, cp=1, ep=1, etp=8,
        micro_batch_size=(1, D), virtual_stages=(1, D),
    ),
    "gpt_oss_debug_model.toml": _toml("gpt_oss-debugmodel", 8, 2048,
                                      ("none", "file:activation_checkpoint.mode"),
                                      tp=1, ep=1, etp=1, zero_keys=Z1),
}  # fmt: skip
UNMODELLED = {
    "deepseek_v3_16b.toml": ["compile.components"],
    "deepseek_v3_671b.toml": ["compile.components"],
}


def _text(name: str) -> str:
    return (DATA / name).read_text()


def _check(reading, expected: dict, stack_source: str) -> None:
    got = {k: (r.value, r.origin) for k, r in reading.fields.items() if k != "framework"}
    assert set(got) == set(expected)
    for field, (value, origin) in expected.items():
        assert got[field][0] == value, field
        if origin == D:
            assert got[field][1].startswith(f"stack-default:{stack_source}"), field
        else:
            want = origin if origin.startswith("file:") else f"file:{origin}"
            assert got[field][1] == want, field


def test_every_copied_file_has_a_table() -> None:
    assert sorted(p.name for p in DATA.glob("*.toml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reads_the_toml(name: str) -> None:
    reading = read_job({name: _text(name)})
    _check(reading, EXPECTED[name], "torchtitan 0.2.2 torchtitan/")
    assert reading.unmodelled == [f"{name}:{k}" for k in UNMODELLED.get(name, [])]
    assert reading.fields["framework"].value == "torchtitan"
    assert any("give --num-gpus" in w for w in reading.warnings)  # shard degree -1


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detected_as_torchtitan(name: str) -> None:
    assert detect(parse(name, _text(name))) == "torchtitan"


def test_llama3_8b_resolves_and_estimates() -> None:
    name = "llama3_8b.toml"
    report = check_report({name: _text(name)}, num_gpus=8)
    expert = trainmem.estimate(
        model="llama-3.1-8b", gpu="h100-sxm-80gb", framework="torchtitan", num_gpus=8, zero=3,
        precision="mixed-bf16", micro_batch_size=1, seq_len=8192, recompute="selective-op",
        optimizer="adamw-fused", loss="full", tp=1, pp=1, cp=1, compile="none",
    )  # fmt: skip
    assert report["peak_device_bytes"] == expert["peak_device_bytes"]


def _recommend(**kw) -> tuple[dict, str]:
    plan = trainmem.recommend(
        model="llama-3.1-8b", framework="torchtitan", fleet="8xh100-sxm-80gb", seq_len=8192,
        global_batch_size=64, **kw,
    )  # fmt: skip
    return plan, trainmem.plan.render(plan, "torchtitan")


@pytest.mark.parametrize("kw", [{}, {"tp": 2, "max_pp": 1}])
def test_reads_back_recommends_launch_line(kw: dict) -> None:
    plan, script = _recommend(**kw)
    assert detect(parse("run.sh", script)) == "torchtitan"
    reading = read_job({"run.sh": script})
    for field in ("num_gpus", "tp", "pp", "cp", "ep", "zero", "precision", "seq_len",
                  "micro_batch_size", "global_batch_size", "compile"):  # fmt: skip
        assert reading.get(field) == plan[field], field
        assert reading.fields[field].origin.startswith("file:--"), field
    assert reading.get("model") == "llama-3.1-8b"
    assert reading.fields["model"].origin == "file:--config"
    assert reading.get("recompute") == {"selective": "selective-op"}.get(
        plan["recompute"], plan["recompute"]
    )
    if plan["tp"] > 1:
        assert reading.get("sequence_parallel") == plan["sequence_parallel"]
    # The script says the plan's AdamW (--optimizer.implementation foreach: torchtitan 0.3.0's
    # own default is fused), so the job reads back to the plan with no flag.
    assert reading.get("optimizer") == plan["optimizer"] == "adamw"
    assert reading.fields["optimizer"].origin == "file:--optimizer.implementation"
    report = check_report({"run.sh": script})
    assert report["peak_device_bytes"] == plan["peak_device_bytes"]


def test_run_train_line_with_overrides() -> None:
    line = (
        "NGPU=4 MODULE=llama3 CONFIG=llama3_70b ./run_train.sh --module llama3 --config "
        "llama3_70b --parallelism.tensor_parallel_degree=4 --training.local_batch_size 2 "
        "--compile.enable --compile.components model activation-checkpoint:selective\n"
    )
    reading = read_job({"launch.sh": line})
    src = "torchtitan 0.3.0 config_registry.py llama3_70b:"
    _check(reading, {
        "model": ("llama-3.1-70b", "--config"),
        "tp": (4, "--parallelism.tensor_parallel_degree"),
        "num_gpus": (4, "--nproc-per-node"),
        "zero": (0, D),
        "precision": ("mixed-bf16", D),
        "seq_len": (8192, D),
        "micro_batch_size": (2, "--training.local_batch_size"),
        "recompute": ("selective-op", "activation-checkpoint:selective"),
        "compile": ("blocks", "--compile.enable,--compile.components"),
        "optimizer": ("adamw-fused", D),
        "sequence_parallel": (True, D),
    }, src)  # fmt: skip


def test_a_0_2_line_and_hsdp() -> None:
    line = (
        "torchrun --nnodes 2 --nproc_per_node=8 -m torchtitan.train --job.config_file "
        "llama3_8b.toml --parallelism.data_parallel_replicate_degree 2 "
        "--parallelism.data_parallel_shard_degree 8 --training.global_batch_size 64\n"
    )
    reading = read_job({"run.sh": line})
    assert reading.get("num_gpus") == 16 and reading.get("dp_shard") == 8
    assert reading.get("global_batch_size") == 64 and reading.get("zero") == 3
    assert reading.fields["loss"].origin.startswith("stack-default:torchtitan 0.2.2")
    assert any("give that TOML file too" in w for w in reading.warnings)


def test_expandable_segments_env() -> None:
    line = (
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
        "torchrun --nproc-per-node=8 -m torchtitan.train --module llama3 --config llama3_8b\n"
    )
    reading = read_job({"run.sh": line})
    assert reading.get("allocator") == "expandable-segments"
    assert reading.fields["allocator"].origin == "file:PYTORCH_CUDA_ALLOC_CONF"
    assert reading.get("recompute") == "selective-op" and reading.get("num_gpus") == 8


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[model]\nflavor = '8B'\n[training]\nlocal_batch_size = 'two'\n",
         "bad.toml: training.local_batch_size: expected an integer"),
        ("[model]\nflavor = '8B'\n[training]\nmixed_precision_param = 'float16'\n",
         "bad.toml: training.mixed_precision_param: expected bfloat16 or float32"),
        ("[model]\nflavor = '8B'\n[activation_checkpoint]\nmode = 'some'\n",
         "bad.toml: activation_checkpoint.mode: expected none|selective|full"),
        ("[model]\nflavor = '8B'\n[activation_checkpoint]\nselective_ac_option = 'x'\n",
         "bad.toml: activation_checkpoint.selective_ac_option: expected an integer"),
        ("[model]\nflavor = '8B'\n[parallelism]\ndata_parallel_shard_degree = 0\n",
         "bad.toml: parallelism.data_parallel_shard_degree: expected -1 or >= 1"),
    ],
)  # fmt: skip
def test_bad_values_name_file_and_key(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        read_job({"bad.toml": text})
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_bad_launch_value() -> None:
    with pytest.raises(ValueError) as info:
        read_job({"run.sh": "torchrun -m torchtitan.train --training.seq_len x8\n"})
    assert str(info.value).startswith("run.sh: --training.seq_len: expected an integer")
