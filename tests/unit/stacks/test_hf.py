"""The HF Trainer / TRL reader (stacks/_hf.py): alignment-handbook recipes and TRL's CLI example
(tests/data/stacks/hf, copied verbatim) read field by field against tables written from the files,
detection, bad values, inline DeepSpeed and `fsdp`, and `check_report` against `trainmem.estimate`
with the flags an expert would write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pytest

import trainmem
from trainmem.stacks import check_report, detect, parse, read_job, resolve_model, stacks
from trainmem.stacks._hf import STACK

DATA = Path(__file__).resolve().parents[2] / "data" / "stacks" / "hf"
TF = "stack-default:transformers 5.24.0 src/transformers/training_args.py "
SFT = "stack-default:trl 1.9.0 trl/trainer/sft_config.py "
BASE = "stack-default:trl 1.9.0 trl/trainer/base_config.py "
PEFT = "stack-default:peft 0.21.2 utils/constants.py "
ALL7 = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


class Want(NamedTuple):
    fields: list[tuple[str, Any, str]]
    """(field, value, origin); an origin ending in a space is a prefix (a default's source)."""
    unmodelled: tuple[str, ...] = ()


def handbook_sft(model: str, micro: int, accum: int, seq: int, key: str = "max_seq_length"):
    """An alignment-handbook SFT recipe: torch_dtype bfloat16, bf16, flash_attention_2,
    gradient checkpointing, no optim (transformers' default) and TRL SFT's default loss."""
    return [
        ("model", model, "file:model_name_or_path"),
        ("micro_batch_size", micro, "file:per_device_train_batch_size"),
        ("grad_accum_steps", accum, "file:gradient_accumulation_steps"),
        ("seq_len", seq, f"file:{key}"),
        ("precision", "bf16", "file:torch_dtype"),
        ("recompute", "full", "file:gradient_checkpointing"),
        ("optimizer", "adamw-fused", TF),
        ("attention", "flash", "file:attn_implementation"),
        ("loss", "chunked", SFT),
    ]


def qlora(rank: int) -> list[tuple[str, Any, str]]:
    return [
        ("lora_rank", rank, "file:lora_r"),
        ("lora_targets", ALL7, "file:lora_target_modules"),
        ("qlora", True, "file:load_in_4bit"),
    ]


MISTRAL = "mistralai/Mistral-7B-v0.1"
EXPECTED: dict[str, Want] = {
    "ah_constitutional-ai_sft_config_anthropic.yaml": Want(handbook_sft(MISTRAL, 8, 4, 2048)),
    "ah_smollm2_sft_config.yaml": Want(handbook_sft("HuggingFaceTB/SmolLM2-1.7B", 4, 4, 8192)),
    "ah_smollm2_sft_config_smol.yaml": Want(handbook_sft("HuggingFaceTB/SmolLM2-360M", 4, 4, 8192)),
    "ah_smollm3_sft_sft.yaml": Want(
        [
            *handbook_sft("HuggingFaceTB/SmolLM3-3B-checkpoints", 1, 2, 65536, "max_length")[:-1],
            ("loss", "chunked", "file:use_liger_kernel"),
        ],
        ("packing",),
    ),
    "ah_starchat2-15b_sft_config_v0.1.yaml": Want(
        handbook_sft("bigcode/starcoder2-15b", 8, 2, 2048)
    ),
    "ah_tests_fixtures_config_sft_full.yaml": Want(handbook_sft(MISTRAL, 32, 2, 2048)),
    "ah_zephyr-7b-beta_sft_config_full.yaml": Want(handbook_sft(MISTRAL, 16, 1, 2048)),
    "ah_zephyr-7b-beta_sft_config_qlora.yaml": Want(handbook_sft(MISTRAL, 4, 2, 2048) + qlora(16)),
    "ah_zephyr-7b-gemma_sft_config_full.yaml": Want(handbook_sft("google/gemma-7b", 4, 4, 2048)),
    "ah_zephyr-141b-A35b_orpo_config_full.yaml": Want(
        [
            ("model", "mistral-community/Mixtral-8x22B-v0.1", "file:model_name_or_path"),
            ("micro_batch_size", 1, "file:per_device_train_batch_size"),
            ("grad_accum_steps", 1, "file:gradient_accumulation_steps"),
            ("seq_len", 2048, "file:max_length"),
            ("precision", "bf16", "file:torch_dtype"),
            ("recompute", "full", "file:gradient_checkpointing"),
            ("optimizer", "adamw-8bit", "file:optim"),
            ("attention", "flash", "file:attn_implementation"),
            # a preference trainer is --rl dpo; ORPO (its output_dir says so) loads no reference
            ("rl", "dpo", "file:beta"),
            ("ref_model", "none", "file:output_dir"),
        ],
    ),
    "ah_zephyr-7b-beta_dpo_config_full.yaml": Want(
        [
            ("model", "alignment-handbook/zephyr-7b-sft-full", "file:model_name_or_path"),
            ("micro_batch_size", 8, "file:per_device_train_batch_size"),
            ("grad_accum_steps", 2, "file:gradient_accumulation_steps"),
            ("seq_len", 1024, "file:max_length"),
            # torch_dtype: null is transformers 5's auto (the checkpoint's dtype): counted fp32
            ("precision", "amp-bf16", "file:bf16"),
            ("recompute", "full", "file:gradient_checkpointing"),
            ("optimizer", "adamw", "file:optim"),
            ("rl", "dpo", "file:beta"),  # the reference model: ref_model auto, a separate copy
        ],
        ("torch_dtype",),
    ),
    "ah_zephyr-7b-beta_dpo_config_qlora.yaml": Want(
        [
            ("model", "alignment-handbook/zephyr-7b-sft-qlora", "file:model_name_or_path"),
            ("micro_batch_size", 4, "file:per_device_train_batch_size"),
            ("grad_accum_steps", 4, "file:gradient_accumulation_steps"),
            ("seq_len", 1024, "file:max_length"),
            ("precision", "bf16", "file:torch_dtype"),
            ("recompute", "full", "file:gradient_checkpointing"),
            ("optimizer", "paged-adamw", "file:optim"),  # paged_adamw_32bit
            ("attention", "flash", "file:attn_implementation"),
            *qlora(128),
            ("rl", "dpo", "file:beta"),  # the reference: the LoRA base (ref_model auto)
        ],
    ),
    "trl_example_config.yaml": Want(  # the model, a dataset and a learning rate only
        [
            ("model", "Qwen/Qwen2.5-0.5B", "file:model_name_or_path"),
            ("micro_batch_size", 8, TF),
            ("seq_len", 1024, SFT),
            ("precision", "amp-bf16", BASE),
            ("recompute", "full", BASE),
            ("optimizer", "adamw-fused", TF),
            ("loss", "chunked", SFT),
        ]
    ),
}


def _read(name: str, text: str | None = None):
    return read_job({name: text if text is not None else (DATA / name).read_text()})


def _check(reading: Any, name: str, want: Want) -> None:
    got = {k: v for k, v in reading.fields.items() if k != "framework"}
    assert sorted(got) == sorted(f for f, _, _ in want.fields)
    for field, value, origin in want.fields:
        read = reading.fields[field]
        assert read.value == value, field
        assert type(read.value) is type(value), field
        if origin.endswith(" "):
            assert read.origin.startswith(origin), (field, read.origin)
            assert read.file is None
        else:
            assert read.origin == origin, field
            assert read.file == name
    assert reading.unmodelled == [f"{name}:{key}" for key in want.unmodelled]


def test_every_copied_config_has_a_table() -> None:
    assert sorted(p.name for p in DATA.glob("*.yaml")) == sorted(EXPECTED)
    assert len(EXPECTED) >= 12
    provenance = (DATA / "PROVENANCE.md").read_text()
    for name in EXPECTED:
        assert f"| {name} |" in provenance


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reads_each_config(name: str) -> None:
    reading = _read(name)
    assert reading.stack == "hf" and reading.stack_version == "transformers 5.24.0 / trl 1.9.0"
    _check(reading, name, EXPECTED[name])
    assert reading.fields["framework"].value == "hf"
    assert reading.fields["framework"].origin.startswith("stack-default:")


RESOLVED = {
    MISTRAL: "mistral-7b",
    "HuggingFaceTB/SmolLM2-1.7B": "smollm2-1.7b",
    "google/gemma-7b": "gemma-7b",
    "mistral-community/Mixtral-8x22B-v0.1": "mixtral-8x22b",
    "Qwen/Qwen2.5-0.5B": "qwen2.5-0.5b",
}


@pytest.mark.parametrize("model", sorted(RESOLVED))
def test_model_names_resolve_offline(model: str) -> None:
    assert resolve_model(model) == RESOLVED[model]


def test_unresolvable_model_names_are_one_line() -> None:
    """Fine-tuned checkpoints (zephyr-7b-sft-full) and models without a preset say so."""
    for model in ("alignment-handbook/zephyr-7b-sft-full", "bigcode/starcoder2-15b"):
        with pytest.raises(ValueError, match="cannot resolve") as err:
            resolve_model(model)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detects_hf_and_no_other_stack(name: str) -> None:
    doc = parse(name, (DATA / name).read_text())
    assert detect(doc) == "hf"
    for other in stacks().values():
        if other.name != "hf":
            assert other.detect(doc) < STACK.detect(doc), other.name


def test_does_not_claim_other_stacks_test_data() -> None:
    root = DATA.parent
    for path in sorted(root.glob("*/*")):
        if path.parent.name == "hf" or path.suffix not in (".yaml", ".yml", ".json", ".toml"):
            continue
        assert STACK.detect(parse(path.name, path.read_text())) == 0, path


PLAIN = """\
output_dir: out
per_device_train_batch_size: 2
gradient_accumulation_steps: 8
fp16: true
optim: adafactor
torch_compile: true
"""


def test_plain_trainer_arguments_keep_transformers_defaults() -> None:
    """No TRL key: transformers' defaults (no checkpointing, bf16 off), fp16 autocast."""
    reading = _read("args.yaml", PLAIN)
    assert reading.get("precision") == "amp-fp16"
    assert reading.fields["precision"].origin == "file:fp16"
    assert "recompute" not in reading.fields and "seq_len" not in reading.fields
    assert reading.get("optimizer") == "adafactor"
    assert reading.get("compile") == "blocks+loss"  # the whole model, its loss inside
    assert reading.fields["grad_accum_steps"].value == 8


def test_inline_deepspeed_and_fsdp() -> None:
    inline = "\n".join([
        "model_name_or_path: meta-llama/Llama-3.1-8B",
        "per_device_train_batch_size: 1",
        "bf16: true",
        "use_liger_kernel: true",
        "deepspeed:",
        "  zero_optimization: {stage: 3, offload_optimizer: {device: cpu}, "
        "offload_param: {device: cpu}}",
        "  bf16: {enabled: auto}",
    ])  # fmt: skip
    reading = _read("job.yaml", inline)
    assert reading.get("framework") == "deepspeed"
    assert reading.fields["zero"].origin == "file:deepspeed.zero_optimization.stage"
    assert reading.get("offload") == "optimizer+params"
    assert reading.get("precision") == "mixed-bf16"  # fp32 weights under DeepSpeed bf16
    fsdp = "per_device_train_batch_size: 2\noutput_dir: o\nbf16: true\n"
    fsdp += "fsdp: full_shard auto_wrap offload\n"
    reading = _read("fsdp.yaml", fsdp)
    assert (reading.get("zero"), reading.get("offload")) == (3, "optimizer+params")
    assert reading.get("precision") == "mixed-bf16"
    named = "per_device_train_batch_size: 2\noutput_dir: o\ndeepspeed: configs/ds_zero2.json\n"
    reading = _read("named.yaml", named)
    assert (reading.get("framework"), reading.get("zero")) == ("deepspeed", 2)
    assert any("guessed from the file name" in w for w in reading.warnings)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("per_device_train_batch_size", "two"),
        ("gradient_checkpointing", "maybe"),
        ("torch_dtype", "int4"),
        ("fsdp", "full_shard sideways"),
        ("lora_r", 0),
        ("max_length", -5),
        ("loss_type", "focal"),
    ],
)
def test_bad_values_are_one_line_naming_file_and_key(key: str, value: Any) -> None:
    lines = [
        "model_name_or_path: mistralai/Mistral-7B-v0.1",
        "use_peft: true",
        "output_dir: o",
        "per_device_train_batch_size: 4",
        "max_length: 512",
    ]
    text = "\n".join([ln for ln in lines if not ln.startswith(key)] + [f"{key}: {value}"])
    with pytest.raises(ValueError) as err:
        _read("bad.yaml", text)
    message = str(err.value)
    assert message.startswith(f"bad.yaml: {key}:"), message
    assert "\n" not in message


def test_check_report_equals_estimate_with_expert_flags() -> None:
    """The zephyr QLoRA SFT recipe with the handbook's own DDP accelerate config."""
    files = {
        "config_qlora.yaml": (DATA / "ah_zephyr-7b-beta_sft_config_qlora.yaml").read_text(),
        "ddp.yaml": (DATA.parent / "accelerate" / "ah_ddp.yaml").read_text(),
    }
    report = check_report(files)
    expert = trainmem.estimate(
        model="mistral-7b",
        num_gpus=8,
        micro_batch_size=4,
        global_batch_size=4 * 2 * 8,
        seq_len=2048,
        precision="bf16",
        recompute="full",
        optimizer="adamw-fused",
        attention="flash",
        lora_rank=16,
        lora_targets=ALL7,
        qlora=True,
        loss="chunked",
        framework="hf",
    )
    assert report["peak_device_bytes"] == expert["peak_device_bytes"]
    assert report["read"]["global_batch_size"] == {
        "value": 64,
        "from": "file:gradient_accumulation_steps",
        "file": "config_qlora.yaml",
    }
    assert report["read"]["num_gpus"]["file"] == "ddp.yaml"


GRPO = "stack-default:trl f2cd577 (1.10.0.dev0) trl/trainer/grpo_config.py "
GRPO_VLLM = "stack-default:trl f2cd577 (1.10.0.dev0) trl/trainer/grpo_trainer.py "


def test_trl_grpo_config_is_an_rl_job() -> None:
    """A GRPOConfig YAML (TRL's keys: num_generations, use_vllm, vllm_mode ...) is --rl grpo
    with the colocated vLLM as TRL builds it: max_num_seqs per_device x tp x steps_per_generation
    (the accumulation by default), max_num_batched_tokens 4096, awake through training (sleep
    level 0) without vllm_enable_sleep_mode, and no reference model at TRL's beta 0.0."""
    text = (
        "model_name_or_path: Qwen/Qwen2.5-7B-Instruct\nper_device_train_batch_size: 8\n"
        "gradient_accumulation_steps: 4\nnum_generations: 8\nmax_prompt_length: 512\n"
        "max_completion_length: 1024\nuse_vllm: true\nvllm_mode: colocate\n"
        "vllm_gpu_memory_utilization: 0.3\ngradient_checkpointing: true\nbf16: true\n"
    )
    assert detect(parse("grpo.yaml", text)) == "hf"
    reading = read_job({"grpo.yaml": text})
    want = [
        ("rl", "grpo", "file:num_generations"),
        ("rl_group_size", 8, "file:num_generations"),
        ("response_len", 1024, "file:max_completion_length"),
        ("seq_len", 1536, "file:max_prompt_length"),  # prompt + completion
        ("rollout", "vllm", "file:vllm_mode"),
        ("rollout_gpu_memory_utilization", 0.3, "file:vllm_gpu_memory_utilization"),
        ("rollout_tp", 1, GRPO),
        ("rollout_max_num_seqs", 32, GRPO_VLLM),  # 8 x 1 x 4
        ("rollout_max_num_batched_tokens", 4096, GRPO_VLLM),
        ("rollout_sleep_level", 0, "stack-default:trl f2cd577 trl/generation/"),
        ("ref_model", "none", GRPO),
    ]
    for field, value, origin in want:
        read = reading.fields[field]
        assert read.value == value, field
        assert (
            read.origin == origin
            or (origin.endswith(" ") or origin.endswith("/"))
            and (read.origin.startswith(origin))
        ), (field, read.origin)
    report = check_report({"grpo.yaml": text}, num_gpus=8)
    assert report["config"]["rl"] == "grpo" and set(report["rl"]["phases"]) == {
        "rollout", "score", "train"}  # fmt: skip
    # asleep at level 2 the engine keeps less in the train phase than awake (level 0)
    asleep = check_report({"grpo.yaml": text + "vllm_enable_sleep_mode: true\n"}, num_gpus=8)
    assert asleep["config"]["rollout_sleep_level"] == 2
    assert asleep["rl"]["phases"]["train"] < report["rl"]["phases"]["train"]


def test_trl_grpo_defaults_and_modes() -> None:
    base = "model_name_or_path: Qwen/Qwen2.5-0.5B\nnum_generations: 4\n"
    hf = read_job({"g.yaml": base})  # use_vllm False: the model's own generate
    assert hf.get("rollout") == "hf" and hf.get("response_len") == 512
    assert any("give --seq-len" in w for w in hf.warnings)  # no max_prompt_length
    server = read_job({"g.yaml": base + "use_vllm: true\nvllm_mode: server\nbeta: 0.04\n"})
    assert server.unmodelled == ["g.yaml:vllm_mode"]
    assert server.get("rollout") == "hf" and not server.has("ref_model")  # beta > 0: auto
    batch = read_job({"g.yaml": base + "generation_batch_size: 64\n"})
    assert batch.get("rollout_batch_size") == 16  # 64 completions / 4 per prompt


def test_dpo_precomputed_reference_is_not_loaded() -> None:
    text = "model_name_or_path: Qwen/Qwen2.5-0.5B\nbeta: 0.1\nprecompute_ref_log_probs: true\n"
    reading = read_job({"d.yaml": text})
    assert reading.get("rl") == "dpo"
    assert reading.fields["ref_model"].value == "none"
    assert reading.fields["ref_model"].origin == "file:precompute_ref_log_probs"


def test_trl_cli_accelerate_keys_and_vllm_context() -> None:
    """Keys TRL's CLI hands to `accelerate launch` (trl/scripts/utils.py: no dataclass declares
    them): accelerate_config zero1|zero2|zero3 is DeepSpeed at that stage, zero_stage over it,
    num_processes the GPUs; vllm_max_model_length is prompt + completion where GRPOConfig
    (no max_prompt_length since trl 0.28) gives no prompt length; generation_batch_size sets
    the steps per generation of vLLM's max_num_seqs."""
    base = (
        "model_name_or_path: Qwen/Qwen2.5-0.5B\nper_device_train_batch_size: 2\n"
        "gradient_accumulation_steps: 4\nnum_generations: 4\nmax_completion_length: 256\n"
        "use_vllm: true\nvllm_max_model_length: 768\nbf16: true\n"
    )
    zero3 = read_job({"g.yaml": base + "accelerate_config: zero3\nnum_processes: 8\n"})
    assert zero3.get("framework") == "deepspeed" and zero3.get("zero") == 3
    assert zero3.get("num_gpus") == 8 and zero3.get("precision") == "mixed-bf16"
    assert zero3.get("seq_len") == 768
    assert zero3.fields["seq_len"].origin == "file:vllm_max_model_length"
    assert zero3.get("rollout_max_num_seqs") == 2 * 1 * 4  # per_device x tp x accumulation
    zero0 = read_job({"g.yaml": base + "accelerate_config: zero1\nzero_stage: 0\n"})
    assert zero0.get("zero") == 0 and zero0.fields["zero"].origin == "file:zero_stage"
    gen = read_job({"g.yaml": base + "accelerate_config: zero2\nnum_processes: 4\n"
                    "generation_batch_size: 64\n"})  # fmt: skip
    assert gen.get("rollout_batch_size") == 16  # 64 completions / 4 per prompt
    assert gen.get("rollout_max_num_seqs") == 2 * 1 * 8  # 64 / (2 x 4 processes) steps
    other = read_job({"g.yaml": base + "accelerate_config: fsdp2\n"})
    assert not other.has("zero") and any("fsdp2" in w for w in other.warnings)
