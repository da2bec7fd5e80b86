"""The LitGPT reader (stacks/_litgpt.py) on LitGPT 0.5.13's own config_hub files
(tests/data/stacks/litgpt/, PROVENANCE.md), field by field, against tables written from the
files and litgpt 0.5.13's finetune/lora.py and finetune/full.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import trainmem
from trainmem.stacks import check_report, detect, parse, read_job, resolve_model

DATA = Path(__file__).parents[2] / "data" / "stacks" / "litgpt"
D = "default"
"""A stack default (origin `stack-default:...`)."""
QV = ("q_proj,v_proj", "file:lora_query,lora_key,lora_value,lora_projection,lora_mlp")
ALL = ("all-linear", "file:lora_query,lora_key,lora_value,lora_projection,lora_mlp")
ADAMW = ("adamw", "file:optimizer.class_path")


def _job(ckpt, gpus, micro, glob, **more):
    return {
        "model": (ckpt, "file:checkpoint_dir"),
        "num_gpus": (gpus, "file:devices"),
        "precision": ("bf16", "file:precision"),
        "micro_batch_size": (micro, "file:train.micro_batch_size"),
        "global_batch_size": (glob, "file:train.global_batch_size"),
        "seq_len": (512, "file:train.max_seq_length"),
        "optimizer": ADAMW,
        **more,
    }


def _lora(rank, targets, **more):
    return {"lora_rank": (rank, "file:lora_r"), "lora_targets": targets, **more}


QLORA = {"qlora": (True, "file:quantize")}
SHARDED = {"zero": (3, D), "recompute": ("full", D)}
L31, L32 = "checkpoints/meta-llama/Meta-Llama-3.1-8B", "checkpoints/meta-llama/Llama-3.2-1B"
EXPECTED = {
    "llama-3.1-8b_lora.yaml": (_job(L31, 1, 1, 8, **_lora(32, QV)), []),
    "llama-3.1-8b_qlora.yaml": (_job(L31, 1, 2, 8, **_lora(32, QV), **QLORA), []),
    "llama-3.1-8b_full.yaml": (_job(L31, 4, 4, 64, **SHARDED), []),
    "llama-3.2-1B_lora.yaml": (_job(L32, 1, 1, 8, **_lora(32, QV)), []),
    "llama-3.2-1B_qlora.yaml": (_job(L32, 1, 2, 8, **_lora(32, QV), **QLORA), []),
    "llama-3.2-1B_full.yaml": (_job(L32, 1, 4, 64), []),
    "gemma-2b_lora.yaml": (_job("checkpoints/google/gemma-2b", 1, 2, 6, **_lora(8, ALL)),
                           ["lora_head"]),
    "gemma-2b_full.yaml": (_job("checkpoints/google/gemma-2b", 4, 1, 16, **SHARDED), []),
    "gemma2-9b_qlora.yaml": (
        _job("checkpoints/google/gemma-2-9b", 1, 1, 6, **_lora(16, ALL), **QLORA),
        ["lora_head"],
    ),
    "phi-2_lora.yaml": (_job("checkpoints/microsoft/phi-2", 1, 4, 8, **_lora(8, ALL)),
                        ["lora_head"]),
    "phi-2_full.yaml": (_job("checkpoints/microsoft/phi-2", 2, 4, 8, **SHARDED), []),
    "phi-3_qlora.yaml": (
        _job("checkpoints/microsoft/Phi-3-mini-4k-instruct", 1, 4, 8, **_lora(8, ALL), **QLORA),
        ["lora_head"],
    ),
    "mistral-7b_qlora.yaml": (
        _job("checkpoints/mistralai/Mistral-7B-v0.1", 1, 2, 8, **_lora(32, QV), **QLORA),
        [],
    ),
    "falcon-7b_lora.yaml": (_job("checkpoints/tiiuae/falcon-7b", 1, 1, 8, **_lora(32, QV)), []),
    "llama-2-7b_full.yaml": (
        _job("checkpoints/meta-llama/Llama-2-7b-hf", 4, 4, 64, **SHARDED), []
    ),
    "tiny-llama_lora.yaml": (
        _job("checkpoints/TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", 1, 8, 8,
             **_lora(32, ALL)),
        ["lora_head"],
    ),
    "pretrain_tinyllama.yaml": (
        {
            "model": ("tiny-llama-1.1b", "file:model_name"),
            "precision": ("amp-bf16", "file:precision"),
            "micro_batch_size": (4, "file:train.micro_batch_size"),
            "global_batch_size": (512, "file:train.global_batch_size"),
            "seq_len": (2048, "file:train.max_seq_length"),
            "optimizer": ADAMW,
        },
        ["model_name"],
    ),
}  # fmt: skip
RESOLVES = {
    "llama-3.1-8b_lora.yaml": "llama-3.1-8b",
    "llama-3.2-1B_full.yaml": "llama-3.2-1b",
    "gemma-2b_lora.yaml": "gemma-2b",
    "gemma2-9b_qlora.yaml": "gemma-2-9b",
    "phi-2_lora.yaml": "phi-2",
    "phi-3_qlora.yaml": "phi-3-mini",
    "mistral-7b_qlora.yaml": "mistral-7b",
    "falcon-7b_lora.yaml": "falcon-7b",
    "llama-2-7b_full.yaml": "llama-2-7b",
}


def _text(name: str) -> str:
    return (DATA / name).read_text()


def test_every_copied_file_has_a_table() -> None:
    assert sorted(p.name for p in DATA.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reads_the_file(name: str) -> None:
    expected, unmodelled = EXPECTED[name]
    reading = read_job({name: _text(name)})
    got = {k: (r.value, r.origin) for k, r in reading.fields.items() if k != "framework"}
    assert set(got) == set(expected)
    for field, (value, origin) in expected.items():
        assert got[field][0] == value, field
        if origin == D:
            assert got[field][1].startswith("stack-default:litgpt 0.5.13 litgpt/finetune/"), field
        else:
            assert got[field][1] == origin, field
    assert reading.unmodelled == [f"{name}:{k}" for k in unmodelled]
    assert reading.fields["framework"].value == "litgpt"
    assert (reading.stack, reading.stack_version) == ("litgpt", "0.5.13")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detected_as_litgpt(name: str) -> None:
    assert detect(parse(name, _text(name))) == "litgpt"


@pytest.mark.parametrize("name", sorted(RESOLVES))
def test_model_resolves(name: str) -> None:
    model = read_job({name: _text(name)}).get("model")
    assert resolve_model(model) == RESOLVES[name]


def test_full_recipe_warns_about_its_unchunked_head() -> None:
    warnings = read_job({"f.yaml": _text("llama-3.1-8b_full.yaml")}).warnings
    assert any("model(input_ids)" in w for w in warnings)
    assert any("FSDP1" in w for w in warnings)


def test_defaults_of_a_bare_lora_config() -> None:
    text = "checkpoint_dir: checkpoints/meta-llama/Meta-Llama-3.1-8B\nlora_alpha: 16\n"
    reading = read_job({"lora.yaml": text})
    fields = {k: (r.value, r.origin) for k, r in reading.fields.items()}
    source = "stack-default:litgpt 0.5.13 litgpt/finetune/lora.py setup"
    assert fields["lora_rank"] == (8, f"{source} (lora_r=8)")
    assert fields["lora_targets"] == (
        "q_proj,v_proj",
        f"{source} (lora_query=True, lora_value=True)",
    )
    assert fields["global_batch_size"] == (16, f"{source} (TrainArgs(global_batch_size=16))")
    assert "precision" not in fields and "num_gpus" not in fields  # bf16-mixed, 1 = trainmem's


def test_targets_and_precisions() -> None:
    base = "checkpoint_dir: x/llama-3.1-8b\ntrain: {micro_batch_size: 1}\n"
    cases = {
        "lora_mlp: true\nlora_query: false\nlora_value: false\n": "gate_proj,up_proj,down_proj",
        "lora_key: true\nlora_projection: true\n": "q_proj,k_proj,v_proj,o_proj",
    }
    for extra, targets in cases.items():
        assert read_job({"lora.yaml": base + extra}).get("lora_targets") == targets
    for value, precision in (("bf16-mixed", "amp-bf16"), ("32-true", "fp32"), ("16-true", "fp16"),
                             ("16-mixed", "amp-fp16"), ("bf16", "amp-bf16")):  # fmt: skip
        assert read_job({"full.yaml": base + f"precision: {value}\n"}).get("precision") == precision


def test_quantize_variants() -> None:
    base = "checkpoint_dir: x/llama-3.1-8b\nprecision: bf16-true\nlora_r: 8\n"
    dq = read_job({"q.yaml": base + "quantize: bnb.nf4-dq\n"})
    assert dq.get("qlora") is True and dq.unmodelled == ["q.yaml:quantize"]
    assert "double quantisation" in dq.warnings[0]
    int8 = read_job({"q.yaml": base + "quantize: bnb.int8-training\n"})
    assert not int8.has("qlora") and int8.unmodelled == ["q.yaml:quantize"]


def test_sharded_lora_defaults() -> None:
    text = "checkpoint_dir: x/llama-3.1-8b\nlora_r: 8\ndevices: 4\nnum_nodes: 2\n"
    reading = read_job({"lora.yaml": text})
    assert reading.fields["num_gpus"].value == 8
    assert reading.fields["num_gpus"].origin == "file:devices,num_nodes"
    assert reading.fields["zero"].origin.startswith(
        "stack-default:litgpt 0.5.13 litgpt/finetune/lora.py setup (ModelParallelStrategy"
    )
    assert reading.get("recompute") == "full"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lora_r: zero\n", "bad.yaml: lora_r: expected an integer, got 'zero'"),
        ("lora_r: 8\ntrain: {micro_batch_size: 0}\n",
         "bad.yaml: train.micro_batch_size: expected an integer >= 1, got 0"),
        ("lora_r: 8\nprecision: 8-true\n", "bad.yaml: precision: expected"),
        ("lora_r: 8\nquantize: bnb.nf3\n", "bad.yaml: quantize: expected"),
        ("lora_r: 8\nlora_query: maybe\n", "bad.yaml: lora_query: expected true or false"),
        ("lora_r: 8\nprecision: bf16-mixed\nquantize: bnb.nf4\n",
         "bad.yaml: precision: LitGPT 0.5.13 refuses quantization with mixed precision"),
        ("lora_r: 8\nprecision: bf16-true\nquantize: bnb.nf4\ndevices: 2\n",
         "bad.yaml: quantize: LitGPT 0.5.13 quantizes on one device only"),
        ("lora_r: 8\ndevices: two\n", "bad.yaml: devices: expected an integer"),
    ],
)  # fmt: skip
def test_bad_values_name_file_and_key(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        read_job({"bad.yaml": "checkpoint_dir: x/llama-3.1-8b\n" + text})
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("name", "flags"),
    [
        ("llama-3.1-8b_lora.yaml", dict(model="llama-3.1-8b", num_gpus=1, precision="bf16",
         micro_batch_size=1, global_batch_size=8, seq_len=512, lora_rank=32,
         lora_targets="q_proj,v_proj", optimizer="adamw")),
        ("llama-3.1-8b_qlora.yaml", dict(model="llama-3.1-8b", num_gpus=1, precision="bf16",
         micro_batch_size=2, global_batch_size=8, seq_len=512, lora_rank=32,
         lora_targets="q_proj,v_proj", qlora=True, optimizer="adamw")),
        ("llama-3.1-8b_full.yaml", dict(model="llama-3.1-8b", num_gpus=4, precision="bf16",
         micro_batch_size=4, global_batch_size=64, seq_len=512, zero=3, recompute="full")),
    ],
)  # fmt: skip
def test_check_equals_the_expert_estimate(name: str, flags: dict) -> None:
    report = check_report({name: _text(name)})
    expert = trainmem.estimate(framework="litgpt", gpu="h100-sxm-80gb", **flags)
    assert report["peak_device_bytes"] == expert["peak_device_bytes"]
