"""The LLaMA-Factory reader (stacks/_llamafactory.py) on llamafactory 0.9.6.dev0's own example
configs (tests/data/stacks/llamafactory/, PROVENANCE.md), field by field, against tables written
from the files and LLaMA-Factory's hparams/*.py, model/adapter.py and checkpointing.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import trainmem
from trainmem.stacks import (
    _llamafactory,
    check_report,
    detect,
    parse,
    read_job,
    resolve_model,
    stacks,
)

DATA = Path(__file__).parents[2] / "data" / "stacks" / "llamafactory"
LF = "stack-default:llamafactory 0.9.6.dev0 src/llamafactory"
GC = (f"{LF}/model/model_utils/checkpointing.py prepare_model_for_training "
      "(disable_gradient_checkpointing = False)")  # fmt: skip
FUSED = ("adamw-fused", "stack-default:transformers 5.8.0 src/transformers/training_args.py "
         "(optim = adamw_torch_fused, torch >= 2.8)")  # fmt: skip


def _job(model, micro, accum, precision, seq=2048, optimizer=FUSED, **more):
    out = {
        "model": (model, "file:model_name_or_path"),
        "micro_batch_size": (micro, "file:per_device_train_batch_size"),
        "grad_accum_steps": (accum, "file:gradient_accumulation_steps"),
        "seq_len": (seq, "file:cutoff_len"),
        "precision": precision,
        "recompute": ("full", GC),
        **more,
    }
    if optimizer is not None:
        out["optimizer"] = optimizer
    return out


LORA8 = {"lora_rank": (8, "file:lora_rank"), "lora_targets": ("all-linear", "file:lora_target")}
QLORA = {"qlora": (True, "file:quantization_bit")}
BF16 = ("bf16", "file:bf16")
AMP = ("amp-bf16", "file:bf16")
PURE = ("bf16", "file:pure_bf16")
MIXED = ("mixed-bf16", "file:bf16")
DS = {"framework": ("deepspeed", "file:deepspeed")}
Q4 = "Qwen/Qwen3-4B-Instruct-2507"
QVL = "Qwen/Qwen2.5-VL-7B-Instruct"
FROZEN = (True, f"{LF}/hparams/finetuning_args.py (freeze_vision_tower = True)")
LANGUAGE = {"lora_scope": ("language", f"{LF}/model/model_utils/visual.py patch_target_modules")}
"""A multimodal LoRA job: LoRA on the language model only (PEFT's all-linear would adapt the
tower's and projector's linears too)."""
L3 = "meta-llama/Meta-Llama-3-8B-Instruct"
OFF = {"overlap_comm": ("off", "file:deepspeed")}
"""examples/deepspeed/ds_z3_config.json's overlap_comm false (its buckets "auto")."""
EXPECTED = {
    "qwen3_lora_sft.yaml": (_job(Q4, 1, 8, BF16, **LORA8), []),
    "qwen3_lora_sft_ds3.yaml": (
        _job(Q4, 1, 2, MIXED, **LORA8, **DS, zero=(3, "file:deepspeed"), **OFF), []
    ),
    "qwen3_lora_dpo.yaml": (_job(Q4, 1, 8, BF16, **LORA8), ["stage"]),
    "qwen3_lora_kto.yaml": (_job(Q4, 1, 8, BF16, **LORA8), ["stage"]),
    "qwen3_lora_reward.yaml": (_job(Q4, 1, 8, BF16, **LORA8), ["stage"]),
    "qwen3_lora_pretrain.yaml": (_job(Q4, 1, 8, BF16, **LORA8), []),
    "qwen3_full_sft.yaml": (_job(Q4, 1, 2, MIXED, **DS, zero=(3, "file:deepspeed"), **OFF),
                            []),
    "qwen3_lora_sft_otfq.yaml": (_job(Q4, 1, 8, BF16, **LORA8, **QLORA), []),
    "llama3_lora_sft_awq.yaml": (
        _job("TechxGenus/Meta-Llama-3-8B-Instruct-AWQ", 1, 8, BF16, **LORA8),
        ["model_name_or_path"],
    ),
    "llama3_lora_sft_gptq.yaml": (
        _job("TechxGenus/Meta-Llama-3-8B-Instruct-GPTQ", 1, 8, BF16, **LORA8),
        ["model_name_or_path"],
    ),
    "extras_fsdp_qlora_llama3_lora_sft.yaml": (_job(L3, 1, 8, BF16, **LORA8, **QLORA), []),
    "extras_loraplus_llama3_lora_sft.yaml": (_job(L3, 1, 8, BF16, **LORA8), []),
    "extras_pissa_llama3_lora_sft.yaml": (_job(L3, 1, 8, BF16, **LORA8), []),
    "extras_galore_llama3_full_sft.yaml": (_job(L3, 1, 1, PURE, optimizer=None), ["use_galore"]),
    "extras_badam_llama3_full_sft.yaml": (
        _job(L3, 1, 8, ("fp32", f"{LF}/model/adapter.py init_adapter (trainable parameters cast "
                                "to fp32; bf16 = fp16 = False)"), optimizer=None),
        ["use_badam"],
    ),
    "extras_llama_pro_llama3_freeze_sft.yaml": (
        _job("models/llama3-8b-pro", 1, 8, AMP), ["finetuning_type", "use_llama_pro"]
    ),
    "extras_mod_llama3_full_sft.yaml": (
        _job(L3, 1, 8, PURE, optimizer=("paged-adamw-8bit", "file:optim")),
        ["mixture_of_depths"],
    ),
    "extras_fp8_llama3_fp8_fsdp_sft.yaml": (
        _job(L3, 1, 8, ("fp8-mixed", "file:fp8"), seq=1024, zero=(3, "file:fsdp")), []
    ),
    "extras_eaft_qwen25_05b_eaft_full.yaml": (
        _job("Qwen/Qwen2.5-0.5B-Instruct", 2, 8, AMP), ["use_eaft_loss"]
    ),
    "extras_asft_llama2_full_asft.yaml": (
        _job("models/Llama-2-7b", 4, 8, MIXED, **DS, zero=(0, "file:deepspeed")),
        ["use_asft_loss"],
    ),
    "extras_adam_mini_qwen2_full_sft.yaml": (
        _job("Qwen/Qwen2-1.5B-Instruct", 1, 8, AMP, optimizer=None), ["use_adam_mini"]
    ),
    # multimodal: the tower frozen by default (freeze_vision_tower), image_max_pixels' side
    "qwen2_5vl_full_sft.yaml": (
        _job(QVL, 1, 2, MIXED, **DS, zero=(3, "file:deepspeed"), **OFF,
             freeze_vision=(True, "file:freeze_vision_tower"),
             image_size=(512, "file:image_max_pixels")),
        [],
    ),
    "qwen2_5vl_lora_sft.yaml": (
        _job(QVL, 1, 8, BF16, **LORA8, **LANGUAGE, freeze_vision=FROZEN,
             image_size=(512, "file:image_max_pixels")),
        [],
    ),
    "llava1_5_lora_sft.yaml": (
        _job("llava-hf/llava-1.5-7b-hf", 1, 8, BF16, **LORA8, **LANGUAGE, freeze_vision=FROZEN,
             image_size=(768, f"{LF}/hparams/model_args.py (image_max_pixels = 768 * 768)")),
        [],
    ),
}  # fmt: skip
RESOLVES = {
    "extras_loraplus_llama3_lora_sft.yaml": "llama-3-8b",
    "llama3_lora_sft_awq.yaml": "llama-3-8b",
    "extras_eaft_qwen25_05b_eaft_full.yaml": "qwen2.5-0.5b",
    "extras_adam_mini_qwen2_full_sft.yaml": "qwen2-1.5b",
    "extras_asft_llama2_full_asft.yaml": "llama-2-7b",
    "qwen2_5vl_full_sft.yaml": "qwen2.5-vl-7b",
    "llava1_5_lora_sft.yaml": "llava-1.5-7b",
}


def _text(name: str) -> str:
    return (DATA / name).read_text()


def test_every_copied_file_has_a_table() -> None:
    names = sorted(p.name for p in DATA.glob("*.yaml"))
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
    assert (reading.stack, reading.stack_version) == ("llamafactory", "0.9.6.dev0")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detected_as_llamafactory(name: str) -> None:
    doc = parse(name, _text(name))
    assert detect(doc) == "llamafactory"
    others = {n: s.detect(doc) for n, s in stacks().items() if n != "llamafactory"}
    assert all(score < _llamafactory.detect(doc) for score in others.values()), others


@pytest.mark.parametrize("name", sorted(RESOLVES))
def test_model_resolves(name: str) -> None:
    assert resolve_model(read_job({name: _text(name)}).get("model")) == RESOLVES[name]


def test_warnings_say_what_is_inferred() -> None:
    ds3 = read_job({"d.yaml": _text("qwen3_lora_sft_ds3.yaml")}).warnings
    assert any("inferred from the name" in w and "ds_z3_config.json" in w for w in ds3)
    pt = read_job({"p.yaml": _text("qwen3_lora_pretrain.yaml")}).warnings
    assert any("stage pt: packing on by default" in w for w in pt)
    q = read_job({"q.yaml": _text("qwen3_lora_sft_otfq.yaml")}).warnings
    assert any("prepare_model_for_kbit_training" in w for w in q)


def test_defaults_of_a_bare_config() -> None:
    reading = read_job({"a.yaml": "model_name_or_path: meta-llama/Meta-Llama-3-8B\nstage: sft\n"})
    fields = {k: (r.value, r.origin) for k, r in reading.fields.items()}
    assert fields["lora_rank"] == (
        8,
        f"{LF}/hparams/finetuning_args.py (finetuning_type = lora, lora_rank = 8)",
    )
    assert fields["micro_batch_size"] == (
        8,
        "stack-default:transformers 5.8.0 src/transformers/training_args.py "
        "(per_device_train_batch_size = 8)",
    )
    assert fields["recompute"] == ("full", GC)
    assert fields["optimizer"] == FUSED
    assert fields["precision"][0] == "bf16"
    assert "lora_targets" not in fields and "seq_len" not in fields  # = trainmem's defaults


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        ("finetuning_type: full\nfp16: true\n", "precision", "amp-fp16"),
        ("finetuning_type: full\npure_bf16: true\n", "precision", "bf16"),
        ("finetuning_type: full\nbf16: true\nfsdp: full_shard auto_wrap\n", "precision",
         "mixed-bf16"),
        ("disable_gradient_checkpointing: true\n", "recompute", "none"),
        ("flash_attn: disabled\n", "attention", "eager"),
        ("enable_liger_kernel: true\n", "loss", "chunked"),
        ("optim: adamw_torch\n", "optimizer", "adamw"),
        ("deepspeed: examples/deepspeed/ds_z3_offload_config.json\n", "offload",
         "optimizer+params"),
        ("deepspeed: examples/deepspeed/ds_z2_offload_config.json\n", "optimizer", "adamw"),
    ],
)  # fmt: skip
def test_keys(text: str, field: str, value: str) -> None:
    reading = read_job({"k.yaml": "model_name_or_path: x/llama-3-8b\nstage: sft\n" + text})
    assert reading.get(field) == value


def test_eight_bit_and_dpo_liger_are_unmodelled() -> None:
    eight = read_job({"e.yaml": "model_name_or_path: x/llama-3-8b\nquantization_bit: 8\n"})
    assert not eight.has("qlora") and eight.unmodelled == ["e.yaml:quantization_bit"]
    dpo = read_job({"d.yaml": "model_name_or_path: x\nstage: dpo\nenable_liger_kernel: true\n"})
    assert not dpo.has("loss")  # the preference stages need the logits (model/loader.py)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("stage: sfft\n", "bad.yaml: stage: expected pt|sft|rm|ppo|dpo|kto, got 'sfft'"),
        ("finetuning_type: half\n", "bad.yaml: finetuning_type: expected lora|oft|freeze|full"),
        ("lora_rank: 0\n", "bad.yaml: lora_rank: expected an integer >= 1, got 0"),
        ("per_device_train_batch_size: one\n",
         "bad.yaml: per_device_train_batch_size: expected an integer, got 'one'"),
        ("cutoff_len: -1\n", "bad.yaml: cutoff_len: expected an integer >= 1, got -1"),
        ("flash_attn: fa9\n", "bad.yaml: flash_attn: expected auto|disabled|sdpa|fa2|fa3"),
        ("bf16: perhaps\n", "bad.yaml: bf16: expected true or false"),
        ("quantization_bit: four\n", "bad.yaml: quantization_bit: expected an integer"),
    ],
)  # fmt: skip
def test_bad_values_name_file_and_key(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        read_job({"bad.yaml": "model_name_or_path: x/llama-3-8b\ntemplate: llama3\n" + text})
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("name", "flags"),
    [
        ("extras_loraplus_llama3_lora_sft.yaml", dict(model="llama-3-8b", micro_batch_size=1,
         seq_len=2048, global_batch_size=8, precision="bf16", lora_rank=8,
         lora_targets="all-linear", optimizer="adamw-fused", recompute="full")),
        ("extras_fsdp_qlora_llama3_lora_sft.yaml", dict(model="llama-3-8b", micro_batch_size=1,
         seq_len=2048, global_batch_size=8, precision="bf16", lora_rank=8, qlora=True,
         optimizer="adamw-fused", recompute="full")),
        ("extras_eaft_qwen25_05b_eaft_full.yaml", dict(model="qwen2.5-0.5b", micro_batch_size=2,
         global_batch_size=16, precision="amp-bf16", optimizer="adamw-fused",
         recompute="full")),
    ],
)  # fmt: skip
def test_check_equals_the_expert_estimate(name: str, flags: dict) -> None:
    report = check_report({name: _text(name)})
    expert = trainmem.estimate(framework="hf", gpu="h100-sxm-80gb", **flags)
    assert report["peak_device_bytes"] == expert["peak_device_bytes"]


@pytest.mark.parametrize("stack", [n for n, s in stacks().items() if s.mapping_only])
@pytest.mark.parametrize("text", ["", "0", "hello world\n", "torchrun train.py\n"])
def test_a_script_forced_to_a_mapping_stack_is_one_line(stack: str, text: str) -> None:
    """--stack NAME (or `stack` over HTTP) on a file that is no mapping of keys (an empty file,
    plain text, a script): one line naming the file and the stack, never the reader's
    AttributeError on `doc.data` None (a 500 in test_serve's fuzzing); every mapping-only
    stack, LLaMA-Factory's among them."""
    with pytest.raises(ValueError, match=f"^x: stack {stack} reads a mapping of keys") as info:
        check_report({"x": text}, stack=stack)
    assert "\n" not in str(info.value)


def test_a_multimodal_job_freezes_its_tower_and_asks_for_its_images() -> None:
    """LLaMA-Factory freezes the tower and projector by default (finetuning_args.py): check's
    estimate is the frozen tower's; the images per sequence are the dataset's, so check warns
    until --images-per-sample gives them."""
    name = "qwen2_5vl_full_sft.yaml"
    text = _text(name)
    bare = check_report({name: text}, gpu="h100-sxm-80gb", num_gpus=8)
    assert any(w.startswith("images_per_sample:") for w in bare["warnings"])
    with_images = check_report({name: text}, gpu="h100-sxm-80gb", num_gpus=8, images_per_sample=2)
    assert not any(w.startswith("images_per_sample:") for w in with_images["warnings"])
    job = dict(
        model="qwen2.5-vl-7b", framework="deepspeed", gpu="h100-sxm-80gb", num_gpus=8, zero=3,
        micro_batch_size=1, seq_len=2048, global_batch_size=16, precision="mixed-bf16",
        optimizer="adamw-fused", recompute="full", images_per_sample=2, image_size=512,
    )  # fmt: skip
    expert = trainmem.estimate(**job, freeze_vision=True)
    assert with_images["peak_device_bytes"] == expert["peak_device_bytes"]
    trained = trainmem.estimate(**job, freeze_vision=False)
    assert trained["bytes"]["gradients"] > expert["bytes"]["gradients"]


@pytest.mark.parametrize(
    ("extra", "key", "why"),
    [
        ("freeze_multi_modal_projector: false\n", "freeze_multi_modal_projector",
         "the projector trained with the tower frozen; counted frozen"),
        ("freeze_vision_tower: false\n", "freeze_multi_modal_projector",
         "the projector frozen with the tower trained; counted trained"),
        ("freeze_language_model: true\n", "freeze_language_model",
         "the language model frozen; counted trained"),
    ],
)  # fmt: skip
def test_what_the_freeze_switches_leave_unmodelled(extra: str, key: str, why: str) -> None:
    text = "model_name_or_path: Qwen/Qwen2.5-VL-7B-Instruct\nfinetuning_type: full\n"
    text += "template: qwen2_vl\n" + extra
    reading = read_job({"v.yaml": text})
    assert f"v.yaml:{key}" in reading.unmodelled
    assert any(why in w for w in reading.warnings), reading.warnings


def test_a_text_job_gets_no_vision_fields() -> None:
    reading = read_job({"t.yaml": _text("qwen3_lora_sft.yaml")})
    assert not reading.has("freeze_vision") and not reading.has("image_size")


def test_a_multimodal_job_on_a_language_only_preset_says_the_tower_is_missing() -> None:
    """google/gemma-3-4b-it resolves to the gemma-3-4b preset, the language model only; a
    LLaMA-Factory job with its multimodal template loads the SigLIP tower too."""
    text = "model_name_or_path: google/gemma-3-4b-it\ntemplate: gemma3\nfinetuning_type: lora\n"
    report = check_report({"g.yaml": text}, gpu="h100-sxm-80gb")
    assert any("without the vision tower" in w for w in report["warnings"]), report["warnings"]
    plain = check_report(
        {"l.yaml": _text("extras_loraplus_llama3_lora_sft.yaml")}, gpu="h100-sxm-80gb"
    )
    assert not any("vision tower" in w for w in plain["warnings"])
