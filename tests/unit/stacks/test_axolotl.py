"""The axolotl reader (stacks/_axolotl.py) on axolotl 0.18.0's own example configs
(tests/data/stacks/axolotl/, PROVENANCE.md), field by field, against tables written from the
files and axolotl's schema (src/axolotl/utils/schemas/*.py, utils/config/__init__.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import trainmem
from trainmem.stacks import _axolotl, check_report, detect, parse, read_job, resolve_model, stacks

DATA = Path(__file__).parents[2] / "data" / "stacks" / "axolotl"
D = "default"


def _job(model, micro, accum, seq, optimizer, precision="bf16", **more):
    return {
        "model": (model, "file:base_model"),
        "micro_batch_size": (micro, "file:micro_batch_size"),
        "grad_accum_steps": (accum, "file:gradient_accumulation_steps"),
        "seq_len": (seq, "file:sequence_len"),
        "precision": (precision, "file:bf16"),
        "recompute": ("full", "file:gradient_checkpointing"),
        "attention": ("flash", "file:attn_implementation"),
        "optimizer": (optimizer, "file:optimizer"),
        **more,
    }


SEVEN = "gate_proj,down_proj,up_proj,q_proj,v_proj,k_proj,o_proj"
LINEAR = ("all-linear", "file:lora_target_linear")


def _lora(rank, targets=LINEAR, qlora=False):
    out = {"lora_rank": (rank, "file:lora_r"), "lora_targets": targets}
    return {**out, "qlora": (True, "file:adapter")} if qlora else out


FSDP = {
    "zero": (3, "file:fsdp"),
    "offload": ("optimizer+params", "file:fsdp_config.fsdp_offload_params"),
    "load": ("meta-init", "file:fsdp_config.fsdp_cpu_ram_efficient_loading"),
}
DS = {"framework": ("deepspeed", "file:deepspeed")}
L1B, L8B = "NousResearch/Llama-3.2-1B", "NousResearch/Meta-Llama-3.1-8B"
EXPECTED = {
    "llama-3_lora-1b.yml": (
        _job(L1B, 2, 2, 2048, "adamw-8bit", **_lora(16, (SEVEN, "file:lora_target_modules"))),
        [],
    ),
    "llama-3_qlora-1b.yml": (
        _job(L1B, 2, 4, 2048, "adamw-8bit",
             **_lora(32, (SEVEN, "file:lora_target_modules"), qlora=True)),
        [],
    ),
    "llama-3_lora-1b-kernels.yml": (
        _job(L1B, 2, 2, 2048, "adamw-8bit", **_lora(16, (SEVEN, "file:lora_target_modules"))),
        ["lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel"],
    ),
    "llama-3_fft-8b.yaml": (_job(L8B, 1, 8, 8192, "paged-adamw-8bit"), []),
    "llama-3_fft-8b-liger-fsdp.yaml": (
        _job(L8B, 2, 4, 4096, "adamw-fused", "mixed-bf16", **FSDP,
             loss=("chunked", "file:liger_fused_linear_cross_entropy")),
        ["liger_rope", "liger_rms_norm", "liger_glu_activation"],
    ),
    "llama-3_qlora-fsdp-70b.yaml": (
        _job("casperhansen/llama-3-70b-fp16", 1, 4, 512, "adamw-fused", **FSDP,
             **_lora(8, qlora=True)),
        [],
    ),
    "llama-3_instruct-dpo-lora-8b.yml": (
        _job("meta-llama/Meta-Llama-3-8B-Instruct", 2, 4, 4096, "adamw-8bit", **_lora(32)),
        ["load_in_8bit", "rl"],
    ),
    "mistral_qlora.yml": (
        _job("mistralai/Mistral-7B-v0.1", 2, 4, 8192, "adamw-8bit", **_lora(32, qlora=True)),
        [],
    ),
    "mistral_mixtral-qlora-fsdp.yml": (
        _job("mistralai/Mixtral-8x7B-v0.1", 2, 4, 1024, "adamw-fused", **FSDP,
             **_lora(32, qlora=True)),
        [],
    ),
    "mistral_bigstral-ds-zero3.yaml": (
        _job("mistral-community/Mixtral-8x22B-v0.1", 1, 1, 2048, "adamw-8bit", "mixed-bf16",
             **DS, zero=(3, "file:deepspeed")),
        ["deepspeed", "unfrozen_parameters"],
    ),
    "llama-2_qlora.yml": (
        _job("NousResearch/Llama-2-7b-hf", 2, 4, 4096, "paged-adamw", **_lora(32, qlora=True)),
        [],
    ),
    "llama-2_fft_optimized.yml": (
        _job("NousResearch/Llama-2-7b-hf", 1, 1, 4096, "adamw-8bit"), ["flash_attn_fuse_mlp"]
    ),
    "phi_phi3-ft.yml": (
        _job("microsoft/Phi-3-mini-4k-instruct", 2, 1, 4096, "adamw-fused", **_lora(64)), []
    ),
    "phi_phi3-ft-fsdp.yml": (
        _job("microsoft/Phi-3-mini-4k-instruct", 12, 2, 4096, "adamw-fused", "mixed-bf16",
             **FSDP),
        [],
    ),
    "qwen2_qlora-fsdp.yaml": (
        _job("Qwen/Qwen2-7B", 1, 4, 2048, "adamw-fused", **FSDP, **_lora(32, qlora=True)), []
    ),
    "qwen3_qlora-fsdp.yaml": (
        _job("Qwen/Qwen3-8B", 1, 4, 2048, "adamw-fused", **FSDP, **_lora(32, qlora=True)), []
    ),
    "gemma2_qlora.yml": (
        _job("google/gemma-2-9b", 1, 4, 2048, "adamw-8bit", **_lora(32, qlora=True)), []
    ),
    "gpt-oss_gpt-oss-20b-fft-deepspeed-zero3.yaml": (
        _job("openai/gpt-oss-20b", 1, 2, 4096, "adamw-8bit", "mixed-bf16", **DS,
             zero=(3, "file:deepspeed"), loss=("chunked", "file:plugins"),
             activation_offload=(True, "file:activation_offloading")),
        ["deepspeed"],
    ),
    "jamba_qlora_deepspeed.yaml": (
        _job("ai21labs/Jamba-v0.1", 1, 4, 4096, "paged-adamw-8bit", "mixed-bf16", **DS,
             zero=(2, "file:deepspeed"), offload=("optimizer", "file:deepspeed"),
             zero_bucket_elems=(5e8, "file:deepspeed"), overlap_comm=("on", "file:deepspeed"),
             **_lora(8, qlora=True)),
        [],
    ),
    "tiny-llama_pretrain.yml": (_job("TinyLlama/TinyLlama-1.1B-Chat-v1.0", 2, 4, 2048,
                                     "adamw-8bit"), []),
}  # fmt: skip
RESOLVES = {
    "llama-3_lora-1b.yml": "llama-3.2-1b",
    "llama-3_fft-8b.yaml": "llama-3.1-8b",
    "llama-3_instruct-dpo-lora-8b.yml": "llama-3-8b",
    "mistral_qlora.yml": "mistral-7b",
    "mistral_mixtral-qlora-fsdp.yml": "mixtral-8x7b",
    "mistral_bigstral-ds-zero3.yaml": "mixtral-8x22b",
    "llama-2_qlora.yml": "llama-2-7b",
    "phi_phi3-ft.yml": "phi-3-mini",
    "qwen2_qlora-fsdp.yaml": "qwen2-7b",
    "qwen3_qlora-fsdp.yaml": "qwen3-8b",
    "gemma2_qlora.yml": "gemma-2-9b",
    "tiny-llama_pretrain.yml": "tinyllama-1.1b",
}


def _text(name: str) -> str:
    return (DATA / name).read_text()


def test_every_copied_file_has_a_table() -> None:
    names = sorted(p.name for p in DATA.iterdir() if p.suffix in (".yml", ".yaml"))
    assert names == sorted(EXPECTED) and len(names) >= 15


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reads_the_file(name: str) -> None:
    expected, unmodelled = EXPECTED[name]
    reading = read_job({name: _text(name)})
    got = {k: (r.value, r.origin) for k, r in reading.fields.items()}
    if "framework" not in expected:
        assert got.pop("framework")[0] == "hf"
    assert set(got) == set(expected)
    for field, (value, origin) in expected.items():
        assert got[field] == (value, origin), field
    assert reading.unmodelled == [f"{name}:{k}" for k in unmodelled]
    assert (reading.stack, reading.stack_version) == ("axolotl", "0.18.0")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detected_as_axolotl(name: str) -> None:
    doc = parse(name, _text(name))
    assert detect(doc) == "axolotl"
    others = {n: s.detect(doc) for n, s in stacks().items() if n != "axolotl"}
    assert all(score < _axolotl.detect(doc) for score in others.values()), others


@pytest.mark.parametrize("name", sorted(RESOLVES))
def test_model_resolves(name: str) -> None:
    assert resolve_model(read_job({name: _text(name)}).get("model")) == RESOLVES[name]


def test_deepspeed_name_is_said_to_be_inferred() -> None:
    reading = read_job({"j.yaml": _text("jamba_qlora_deepspeed.yaml")})
    assert any("inferred from the name" in w and "zero2.json" in w for w in reading.warnings)
    assert any("sample_packing" not in w for w in reading.warnings)


def test_packing_is_a_warning_and_seq_len_stays() -> None:
    reading = read_job({"l.yml": _text("llama-3_lora-1b.yml")})
    assert reading.get("seq_len") == 2048
    assert any("l.yml:sample_packing" in w for w in reading.warnings)


def test_defaults_of_a_bare_config() -> None:
    reading = read_job({"a.yml": "base_model: NousResearch/Llama-3.2-1B\nadapter: lora\n"
                        "lora_r: 8\nsequence_len: 1024\n"})  # fmt: skip
    fields = {k: (r.value, r.origin) for k, r in reading.fields.items()}
    assert fields["optimizer"] == (
        "adamw-fused",
        "stack-default:axolotl 0.18.0 src/axolotl/utils/schemas/training.py "
        "(optimizer = adamw_torch_fused)",
    )
    assert fields["precision"][0] == "bf16"
    assert fields["precision"][1].startswith(
        "stack-default:axolotl 0.18.0 src/axolotl/utils/config/__init__.py resolve_dtype"
    )
    assert fields["lora_targets"][0] == "q_proj,v_proj"
    assert "recompute" not in fields  # gradient_checkpointing = False, trainmem's none
    bare = read_job({"b.yml": "base_model: x/llama-3.2-1b\nmicro_batch_size: 1\n"})
    assert bare.fields["seq_len"].value == 512
    assert bare.fields["seq_len"].origin.endswith("config.py (sequence_len = 512)")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("bf16: false\nfp16: true\n", "fp16"),
        ("bf16: false\n", "fp32"),
        ("bf16: true\ndeepspeed: deepspeed_configs/zero1.json\n", "mixed-bf16"),
        ("bfloat16: true\nbf16: false\n", "bf16"),
        ("fp8: true\n", "fp8-mixed"),
    ],
)
def test_precisions(text: str, value: str) -> None:
    base = "base_model: x/llama-3.2-1b\nmicro_batch_size: 1\n"
    assert read_job({"p.yml": base + text}).get("precision") == value


def test_fsdp2_and_inline_deepspeed() -> None:
    base = "base_model: x/llama-3.2-1b\nmicro_batch_size: 1\n"
    v2 = read_job({"f.yml": base + "fsdp_version: 2\nfsdp_config:\n  reshard_after_forward: false"
                   "\n  activation_checkpointing: true\n"})  # fmt: skip
    assert v2.get("zero") == 2 and v2.get("recompute") == "full"
    assert not any("FSDP1" in w for w in v2.warnings)
    inline = read_job({"d.yml": base + "deepspeed:\n  zero_optimization: {stage: 2}\n"})
    assert inline.get("framework") == "deepspeed" and inline.get("zero") == 2
    offloaded = read_job({"o.yml": base + "deepspeed: zero3_bf16_cpuoffload_all.json\n"})
    assert offloaded.get("offload") == "optimizer+params"
    assert offloaded.get("optimizer") == "adamw"  # DeepSpeedCPUAdam on the host


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("micro_batch_size: two\n", "bad.yml: micro_batch_size: expected an integer, got 'two'"),
        ("micro_batch_size: 1\nsequence_len: 0\n",
         "bad.yml: sequence_len: expected an integer >= 1, got 0"),
        ("micro_batch_size: 1\nadapter: lora\n", "bad.yml: lora_r: expected an integer >= 1"),
        ("micro_batch_size: 1\nadapter: lora\nlora_r: 8\nlora_target_linear: maybe\n",
         "bad.yml: lora_target_linear: expected true or false"),
        ("micro_batch_size: 1\nbf16: sometimes\n", "bad.yml: bf16: expected true or false"),
        ("micro_batch_size: 1\nfsdp: [full_shard, everything]\n", "bad.yml: fsdp: expected"),
        ("micro_batch_size: 1\nfsdp_config: {sharding_strategy: HALF}\n",
         "bad.yml: fsdp_config.sharding_strategy: expected"),
    ],
)  # fmt: skip
def test_bad_values_name_file_and_key(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        read_job({"bad.yml": "base_model: x/llama-3.2-1b\n" + text})
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("name", "flags"),
    [
        ("llama-3_lora-1b.yml", dict(model="llama-3.2-1b", micro_batch_size=2, seq_len=2048,
         global_batch_size=4, precision="bf16", lora_rank=16, lora_targets=SEVEN,
         optimizer="adamw-8bit", recompute="full", attention="flash")),
        ("llama-3_qlora-1b.yml", dict(model="llama-3.2-1b", micro_batch_size=2, seq_len=2048,
         global_batch_size=8, precision="bf16", lora_rank=32, lora_targets=SEVEN, qlora=True,
         optimizer="adamw-8bit", recompute="full")),
        ("llama-3_fft-8b.yaml", dict(model="llama-3.1-8b", micro_batch_size=1, seq_len=8192,
         global_batch_size=8, precision="bf16", optimizer="paged-adamw-8bit",
         recompute="full")),
    ],
)  # fmt: skip
def test_check_equals_the_expert_estimate(name: str, flags: dict) -> None:
    report = check_report({name: _text(name)})
    expert = trainmem.estimate(framework="hf", gpu="h100-sxm-80gb", **flags)
    assert report["peak_device_bytes"] == expert["peak_device_bytes"]
