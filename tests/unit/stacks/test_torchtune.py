"""The torchtune reader (stacks/_torchtune.py): torchtune 0.6.1's own recipe configs
(tests/data/stacks/torchtune, copied verbatim from pytorch/torchtune v0.6.1) read field by field
against tables written from the files, detection, bad values, and `check_report` against
`trainmem.estimate` with the flags an expert would write.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import trainmem
from trainmem.stacks import check_report, detect, parse, read_job, resolve_model, stacks
from trainmem.stacks._torchtune import STACK, preset_name

DATA = Path(__file__).resolve().parents[2] / "data" / "stacks" / "torchtune"
FULL_D = "stack-default:torchtune 0.6.1 recipes/full_finetune_distributed.py "
LORA_D = "stack-default:torchtune 0.6.1 recipes/lora_finetune_distributed.py "
NPROC = "file:# tune run --nproc_per_node"
ONE = "file:# tune run"
ALL = "q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
TARGETS = "file:model.lora_attn_modules+apply_lora_to_mlp"


class Want(NamedTuple):
    fields: list[tuple[str, Any, str]]
    """(field, value, origin); an origin ending in a space is a prefix (a stack default's
    source goes on)."""
    unmodelled: tuple[str, ...] = ()


def common(*, ac: bool, fused: bool = True, compiled: bool = False) -> list[tuple[str, Any, str]]:
    """dtype bf16, the optimizer, CEWithChunkedOutputLoss, compile, AC, no activation offload:
    what most 0.6.1 configs say."""
    return [
        ("precision", "bf16", "file:dtype"),
        ("optimizer", "adamw-fused", "file:optimizer.fused")
        if fused
        else ("optimizer", "adamw", "file:optimizer._component_"),
        ("loss", "chunked-output", "file:loss._component_"),
        ("compile", "blocks+loss" if compiled else "none", "file:compile"),
        ("recompute", "full" if ac else "none", "file:enable_activation_checkpointing"),
        ("activation_offload", False, "file:enable_activation_offloading"),
    ]


def lora(rank: int, *, qlora: bool = False) -> list[tuple[str, Any, str]]:
    out = [
        ("lora_rank", rank, "file:model.lora_rank"),
        ("lora_targets", ALL, TARGETS),
    ]
    return out + ([("qlora", True, "file:model._component_")] if qlora else [])


MODEL = "file:model._component_"
MB = "file:batch_size"
GBS = "file:gradient_accumulation_steps"
OIB = "file:optimizer_in_bwd"
PAGED_8BIT = ("optimizer", "adamw-8bit", "file:optimizer._component_")

EXPECTED: dict[str, Want] = {
    # tune run --nproc_per_node 4 full_finetune_distributed; ac_mode selective, ac_option 2
    "dev_8B_full_experimental.yaml": Want(
        [
            ("num_gpus", 4, NPROC),
            ("model", "llama-3-8b", MODEL),
            ("grad_accum_steps", 1, GBS),
            ("micro_batch_size", 2, MB),
            ("precision", "bf16", "file:dtype"),
            ("optimizer", "adamw-fused", "file:optimizer.fused"),
            ("loss", "chunked-output", "file:loss._component_"),
            ("compile", "none", "file:compile"),
            ("recompute", "selective-layer", "file:ac_mode"),
            ("recompute_every", 2, "file:ac_option"),
            ("activation_offload", False, "file:enable_activation_offloading"),
            ("zero", 3, FULL_D),
        ]
    ),
    "gemma2_2B_full.yaml": Want(
        [
            ("num_gpus", 4, NPROC),
            ("model", "gemma-2-2b", MODEL),
            ("grad_accum_steps", 1, GBS),
            ("micro_batch_size", 2, MB),
            *common(ac=True),
            ("optimizer_in_backward", False, OIB),
            ("zero", 3, FULL_D),
        ]
    ),
    "gemma2_9B_lora.yaml": Want(
        [
            ("num_gpus", 4, NPROC),
            ("model", "gemma-2-9b", MODEL),
            *lora(64),
            ("grad_accum_steps", 1, GBS),
            ("micro_batch_size", 4, MB),
            *common(ac=True),
            ("zero", 3, LORA_D),
        ]
    ),
    "llama3_1_70B_full.yaml": Want(
        [
            ("num_gpus", 8, NPROC),
            ("model", "llama-3.1-70b", MODEL),
            ("grad_accum_steps", 1, GBS),
            ("micro_batch_size", 2, MB),
            *common(ac=True, fused=False),
            ("optimizer_in_backward", False, OIB),
            ("tp", 1, "file:tensor_parallel_dim"),
            ("zero", 3, FULL_D),
            ("offload", "optimizer+params", "file:fsdp_cpu_offload"),
        ],
        ("custom_sharded_layers",),
    ),
    "llama3_1_70B_lora.yaml": Want(
        [
            ("num_gpus", 8, NPROC),
            ("model", "llama-3.1-70b", MODEL),
            *lora(16),
            ("grad_accum_steps", 1, GBS),
            ("micro_batch_size", 2, MB),
            *common(ac=True),
            ("zero", 3, LORA_D),
        ]
    ),
    "llama3_1_8B_full.yaml": Want(
        [
            ("num_gpus", 4, NPROC),
            ("model", "llama-3.1-8b", MODEL),
            ("grad_accum_steps", 1, GBS),
            ("micro_batch_size", 2, MB),
            *common(ac=True),
            ("optimizer_in_backward", False, OIB),
            ("zero", 3, FULL_D),
        ],
        ("custom_sharded_layers",),
    ),
    # PagedAdamW8bit with optimizer_in_bwd, one GPU
    "llama3_1_8B_full_single_device.yaml": Want(
        [
            ("num_gpus", 1, ONE),
            ("model", "llama-3.1-8b", MODEL),
            ("grad_accum_steps", 1, GBS),
            ("micro_batch_size", 2, MB),
            *common(ac=True)[:1],
            PAGED_8BIT,
            *common(ac=True)[2:],
            ("optimizer_in_backward", True, OIB),
        ],
        ("optimizer._component_",),
    ),
    # 2 GPUs, batch 2, accumulation 8: 2 x 8 x 2 = 32
    "llama3_1_8B_lora.yaml": Want(
        [
            ("num_gpus", 2, NPROC),
            ("model", "llama-3.1-8b", MODEL),
            *lora(8),
            ("micro_batch_size", 2, MB),
            ("grad_accum_steps", 8, GBS),
            *common(ac=False),
            ("zero", 3, LORA_D),
        ]
    ),
    "llama3_1_8B_lora_single_device.yaml": Want(
        [
            ("num_gpus", 1, ONE),
            ("model", "llama-3.1-8b", MODEL),
            *lora(8),
            ("micro_batch_size", 2, MB),
            ("grad_accum_steps", 8, GBS),
            *common(ac=True),
        ]
    ),
    "llama3_1_8B_qlora_single_device.yaml": Want(
        [
            ("num_gpus", 1, ONE),
            ("model", "llama-3.1-8b", MODEL),
            *lora(8, qlora=True),
            ("micro_batch_size", 2, MB),
            ("grad_accum_steps", 8, GBS),
            *common(ac=True),
        ]
    ),
    "llama3_2_1B_full_single_device.yaml": Want(
        [
            ("num_gpus", 1, ONE),
            ("model", "llama-3.2-1b", MODEL),
            ("grad_accum_steps", 1, GBS),
            ("micro_batch_size", 4, MB),
            *common(ac=False)[:1],
            PAGED_8BIT,
            *common(ac=False)[2:],
            ("optimizer_in_backward", True, OIB),
        ],
        ("optimizer._component_",),
    ),
    "llama3_2_1B_lora_single_device.yaml": Want(
        [
            ("num_gpus", 1, ONE),
            ("model", "llama-3.2-1b", MODEL),
            *lora(64),
            ("micro_batch_size", 4, MB),
            ("grad_accum_steps", 8, GBS),
            *common(ac=False),
        ]
    ),
    # 4 GPUs, batch 4, accumulation 8: 128
    "llama3_2_3B_full.yaml": Want(
        [
            ("num_gpus", 4, NPROC),
            ("model", "llama-3.2-3b", MODEL),
            ("micro_batch_size", 4, MB),
            ("grad_accum_steps", 8, GBS),
            *common(ac=True),
            ("optimizer_in_backward", False, OIB),
            ("zero", 3, FULL_D),
        ]
    ),
    "llama3_2_3B_qlora_single_device.yaml": Want(
        [
            ("num_gpus", 1, ONE),
            ("model", "llama-3.2-3b", MODEL),
            *lora(64, qlora=True),
            ("micro_batch_size", 4, MB),
            ("grad_accum_steps", 8, GBS),
            *common(ac=True),
        ]
    ),
    # no tune run line (sbatch); packed with max_seq_len 1024; compile on; Llama 3.3 = 3.1 70B
    "llama3_3_70B_full_multinode.yaml": Want(
        [
            ("model", "llama-3.1-70b", MODEL),
            ("grad_accum_steps", 1, GBS),
            ("micro_batch_size", 4, MB),
            ("seq_len", 1024, "file:tokenizer.max_seq_len"),
            *common(ac=True, compiled=True),
            ("optimizer_in_backward", False, OIB),
            ("zero", 3, FULL_D),
            ("offload", "none", "file:fsdp_cpu_offload"),
        ],
        ("custom_sharded_layers",),
    ),
    "llama3_8B_dora.yaml": Want(
        [
            ("num_gpus", 2, "file:# tune run --nproc_per_node"),
            ("model", "llama-3-8b", MODEL),
            *lora(8),
            ("grad_accum_steps", 1, GBS),
            ("micro_batch_size", 2, MB),
            *common(ac=False),
            ("zero", 3, LORA_D),
        ],
        ("model.use_dora",),
    ),
    # PagedAdamW (32-bit), optimizer in backward, activation offloading
    "mistral_7B_full_low_memory.yaml": Want(
        [
            ("num_gpus", 1, ONE),
            ("model", "mistral-7b", MODEL),
            ("grad_accum_steps", 1, GBS),
            ("micro_batch_size", 2, MB),
            *common(ac=True, fused=False)[:-1],
            ("activation_offload", True, "file:enable_activation_offloading"),
            ("optimizer_in_backward", True, OIB),
        ],
        ("optimizer._component_",),
    ),
    "mistral_7B_lora.yaml": Want(
        [
            ("num_gpus", 2, NPROC),
            ("model", "mistral-7b", MODEL),
            *lora(64),
            ("grad_accum_steps", 1, GBS),
            ("micro_batch_size", 4, MB),
            *common(ac=True),
            ("zero", 3, LORA_D),
        ],
        ("model.apply_lora_to_output",),
    ),
    "phi3_mini_full.yaml": Want(
        [
            ("num_gpus", 4, NPROC),
            ("model", "phi-3-mini", MODEL),
            ("micro_batch_size", 2, MB),
            ("grad_accum_steps", 8, GBS),
            *common(ac=True),
            ("optimizer_in_backward", False, OIB),
            ("zero", 3, FULL_D),
        ]
    ),
    "phi3_mini_qlora_single_device.yaml": Want(
        [
            ("num_gpus", 1, ONE),
            ("model", "phi-3-mini", MODEL),
            *lora(8, qlora=True),
            ("micro_batch_size", 2, MB),
            ("grad_accum_steps", 8, GBS),
            *common(ac=True),
        ]
    ),
    "qwen2_5_0.5B_full.yaml": Want(
        [
            ("num_gpus", 2, NPROC),
            ("model", "qwen2.5-0.5b", MODEL),
            ("micro_batch_size", 2, MB),
            ("grad_accum_steps", 8, GBS),
            *common(ac=False),
            ("optimizer_in_backward", False, OIB),
            ("zero", 3, FULL_D),
        ]
    ),
    "qwen2_5_7B_lora_single_device.yaml": Want(
        [
            ("num_gpus", 1, ONE),
            ("model", "qwen2.5-7b", MODEL),
            *lora(8),
            ("micro_batch_size", 2, MB),
            ("grad_accum_steps", 8, GBS),
            *common(ac=True),
        ]
    ),
}


def text(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def test_every_copied_config_has_a_table() -> None:
    assert sorted(p.name for p in DATA.glob("*.yaml")) == sorted(EXPECTED)
    assert len(EXPECTED) >= 15
    provenance = (DATA / "PROVENANCE.md").read_text()
    assert "a6290a5b40758f13bca61c386bc8756a49ef417e" in provenance
    for name in EXPECTED:
        assert f"| {name} |" in provenance


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reads_each_config(name: str) -> None:
    reading = read_job({name: text(name)})
    assert reading.stack == "torchtune" and reading.stack_version == "0.6.1"
    got = {k: r for k, r in reading.fields.items() if k != "framework"}
    want = EXPECTED[name]
    assert sorted(got) == sorted(f for f, _, _ in want.fields)
    for field, value, origin in want.fields:
        read = got[field]
        assert read.value == value, field
        assert type(read.value) is type(value), field
        if origin.endswith(" "):
            assert read.origin.startswith(origin), (field, read.origin)
            assert read.file is None
        else:
            assert read.origin == origin, field
            assert read.file == name
    assert reading.unmodelled == [f"{name}:{key}" for key in want.unmodelled]
    assert reading.fields["framework"].value == "torchtune"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_model_names_resolve_offline(name: str) -> None:
    model = read_job({name: text(name)}).fields["model"].value
    assert resolve_model(model) == model


def test_no_fixed_length_is_a_warning() -> None:
    reading = read_job({"a.yaml": text("llama3_1_8B_lora.yaml")})
    assert "seq_len" not in reading.fields
    assert any("tokenizer.max_seq_len: not set" in w for w in reading.warnings)
    packed = read_job({"b.yaml": text("llama3_3_70B_full_multinode.yaml")})
    assert not any("truncation" in w for w in packed.warnings)
    assert any("give --num-gpus" in w for w in packed.warnings)


# ---- detection -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detects_torchtune_and_no_other_stack(name: str) -> None:
    doc = parse(name, text(name))
    assert detect(doc) == "torchtune"
    assert STACK.detect(doc) == 10
    for other in stacks().values():
        if other.name != "torchtune":
            assert other.detect(doc) < 10, other.name


OTHER_FILES = {
    "ds.json": '{"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 2}',
    "axolotl.yaml": "base_model: meta-llama/Llama-3.1-8B\nadapter: lora\nlora_r: 16\n"
    "sequence_len: 4096\nmicro_batch_size: 2\n",
    "titan.toml": '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 2\n',
    "hf.json": '{"per_device_train_batch_size": 4, "gradient_checkpointing": true}',
    "accelerate.yaml": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n",
    "train.sh": "torchrun --nproc_per_node 8 train.py --bf16\n",
}


@pytest.mark.parametrize("name", sorted(OTHER_FILES))
def test_does_not_claim_other_stacks_files(name: str) -> None:
    assert STACK.detect(parse(name, OTHER_FILES[name])) == 0


def test_does_not_claim_other_stacks_test_data() -> None:
    for path in sorted(DATA.parent.glob("*/*")):
        if path.parent.name == "torchtune" or path.suffix in (".md", ".py", ""):
            continue
        try:
            doc = parse(path.name, path.read_text(encoding="utf-8"))
        except ValueError:
            continue
        assert STACK.detect(doc) == 0, path


# ---- bad values ----------------------------------------------------------------------------


def edited(name: str, pattern: str, replacement: str) -> str:
    new, count = re.subn(pattern, replacement, text(name), count=1, flags=re.M)
    assert count == 1, pattern
    return new


@pytest.mark.parametrize(
    ("pattern", "replacement", "message"),
    [
        (r"^batch_size: 2", "batch_size: two", "x.yaml: batch_size: expected an integer"),
        (r"^batch_size: 2", "batch_size: 0", "x.yaml: batch_size: expected an integer >= 1"),
        (r"^dtype: bf16", "dtype: fp16", "x.yaml: dtype: expected bf16 or fp32"),
        (r"lora_rank: 8", "lora_rank: -4", "x.yaml: model.lora_rank: expected an integer >= 1"),
        (r"'output_proj'", "'o_proj'", "x.yaml: model.lora_attn_modules: expected q_proj"),
        (
            r"apply_lora_to_mlp: True",
            "apply_lora_to_mlp: maybe",
            "x.yaml: model.apply_lora_to_mlp: expected true or false",
        ),
        (r"^compile: False", "compile: often", "x.yaml: compile: expected true or false"),
        (
            r"--nproc_per_node 2",
            "--nproc_per_node two",
            "x.yaml: # tune run --nproc_per_node: expected an integer",
        ),
        (
            r"^gradient_accumulation_steps: 8",
            "gradient_accumulation_steps: 0",
            "x.yaml: gradient_accumulation_steps: expected an integer >= 1",
        ),
        (
            r"^enable_activation_offloading: False",
            "enable_activation_offloading: True",
            "x.yaml: enable_activation_offloading: expected false without",
        ),
    ],
)
def test_bad_values_are_one_line_naming_file_and_key(
    pattern: str, replacement: str, message: str
) -> None:
    files = {"x.yaml": edited("llama3_1_8B_lora.yaml", pattern, replacement)}
    with pytest.raises(ValueError) as info:
        read_job(files)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_bad_ac_values() -> None:
    for value, message in (("sometimes", "x.yaml: ac_mode: expected"),):
        files = {"x.yaml": edited("dev_8B_full_experimental.yaml", r"'selective'", value)}
        with pytest.raises(ValueError, match=f"^{message}"):
            read_job(files)
    files = {"x.yaml": edited("dev_8B_full_experimental.yaml", r"^ac_option: 2", "ac_option: op")}
    with pytest.raises(ValueError, match="^x.yaml: ac_option: expected an integer"):
        read_job(files)


# ---- what the shipped configs do not show ----------------------------------------------------

HEAD = "#   tune run --nproc_per_node 8 full_finetune_distributed --config x\n"


def synthetic(body: str, head: str = HEAD) -> Any:
    model = "model:\n  _component_: torchtune.models.llama3_1.llama3_1_8b\ndtype: bf16\n"
    return read_job({"x.yaml": head + model + body})


def test_reshard_after_forward_false_is_zero_2() -> None:
    r = synthetic("fsdp_reshard_after_forward: False\n")
    assert (r.get("zero"), r.fields["zero"].origin) == (2, "file:fsdp_reshard_after_forward")


def test_global_batch_over_data_parallel_ranks() -> None:
    r = synthetic(
        "tensor_parallel_dim: 2\nbatch_size: 3\ngradient_accumulation_steps: 4\n",
        "#   tune run --nnodes 2 --nproc_per_node 8 full_finetune_distributed --config x\n",
    )
    assert r.get("num_gpus") == 16 and r.get("tp") == 2
    assert r.get("grad_accum_steps") == 4
    # The core derives the global batch once the GPUs are known (dp = 16 / tp 2 = 8).
    from trainmem.stacks._check import global_batch, resolved_fields

    resolved_fields(r, {}, base_dir=None, local_paths=False, models_dir=None)
    assert r.get("global_batch_size") == 3 * 4 * 8
    assert r.fields["global_batch_size"].origin == "file:gradient_accumulation_steps"
    assert global_batch is not None


def test_accumulation_without_gpus_is_a_warning() -> None:
    r = synthetic("batch_size: 3\ngradient_accumulation_steps: 4\n", head="")
    assert "global_batch_size" not in r.fields and "zero" not in r.fields
    assert r.get("grad_accum_steps") == 4  # the global batch follows --num-gpus


@pytest.mark.parametrize(
    ("body", "recompute", "every"),
    [
        ("ac_mode: selective\nac_option: 1\n", "full", None),
        ("ac_mode: selective\nac_option: 3\n", "selective-layer", 3),
        ("ac_mode: full\n", "full", None),
        ("enable_activation_checkpointing: True\nac_mode: selective\nac_option: 2\n", "none", None),
    ],
)
def test_ac_modes(body: str, recompute: str, every: int | None) -> None:
    r = synthetic(body)
    assert r.get("recompute") == recompute
    assert r.get("recompute_every") == every


def test_ac_mode_is_ignored_by_lora_recipes() -> None:
    head = "#   tune run --nproc_per_node 2 lora_finetune_distributed --config x\n"
    r = synthetic("ac_mode: selective\nac_option: 2\noptimizer_in_bwd: True\n", head)
    assert "recompute" not in r.fields and "optimizer_in_backward" not in r.fields
    assert any("ac_mode: not read by torchtune 0.6.1" in w for w in r.warnings)


def test_single_device_ignores_fsdp_keys() -> None:
    head = "#   tune run lora_finetune_single_device --config x\n"
    r = synthetic("fsdp_cpu_offload: True\n", head)
    assert "offload" not in r.fields and "zero" not in r.fields
    assert r.get("num_gpus") == 1


def test_packed_fixed_length() -> None:
    r = synthetic("tokenizer:\n  max_seq_len: 8192\ndataset:\n  packed: True\n")
    assert (r.get("seq_len"), r.fields["seq_len"].origin) == (8192, "file:tokenizer.max_seq_len")
    assert not any("truncation" in w for w in r.warnings)
    unpacked = synthetic("tokenizer:\n  max_seq_len: 8192\n")
    assert any("truncation" in w for w in unpacked.warnings)


def test_lora_builder_defaults_and_options() -> None:
    body = (
        "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_3b\n"
        "  lora_attn_modules: [q_proj, k_proj]\n  quantize_base: True\n  lora_dropout: 0.1\n"
    )
    r = read_job({"x.yaml": HEAD.replace("full_", "lora_") + body + "dtype: bf16\n"})
    assert r.get("lora_rank") == 8
    assert r.fields["lora_rank"].origin.startswith("stack-default:torchtune 0.6.1 torchtune/")
    assert (r.get("lora_targets"), r.fields["lora_targets"].origin) == (
        "q_proj,k_proj",
        "file:model.lora_attn_modules",
    )
    assert (r.get("qlora"), r.fields["qlora"].origin) == (True, "file:model.quantize_base")
    assert r.unmodelled == ["x.yaml:model.lora_dropout"]


@pytest.mark.parametrize(
    ("optimizer", "name", "unmodelled"),
    [
        ("  _component_: torch.optim.AdamW\n", "adamw", False),
        ("  _component_: torch.optim.Adam\n  fused: True\n", "adamw-fused", False),
        ("  _component_: bitsandbytes.optim.AdamW8bit\n", "adamw-8bit", False),
        ("  _component_: torch.optim.SGD\n  momentum: 0.9\n", "sgd-momentum", False),
        ("  _component_: torch.optim.SGD\n", "sgd", False),
        ("  _component_: torchao.optim.AdamW4bit\n", None, True),
    ],
)
def test_optimizers(optimizer: str, name: str | None, unmodelled: bool) -> None:
    r = synthetic("optimizer:\n" + optimizer)
    assert r.get("optimizer") == name
    assert (r.unmodelled == ["x.yaml:optimizer._component_"]) is unmodelled


def test_losses() -> None:
    r = synthetic("loss:\n  _component_: torch.nn.CrossEntropyLoss\n")
    assert r.get("loss") == "full"
    r = synthetic("loss:\n  _component_: torchtune.modules.loss.LinearCrossEntropyLoss\n")
    assert "loss" not in r.fields and r.unmodelled == ["x.yaml:loss._component_"]
    r = synthetic(
        "loss:\n  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss\n"
        "  num_output_chunks: 16\n"
    )
    assert r.get("loss") == "chunked-output"
    assert r.unmodelled == ["x.yaml:loss.num_output_chunks"]


def test_other_recipes_are_unmodelled() -> None:
    head = "#   tune run --nproc_per_node 2 lora_dpo_distributed --config x\n"
    r = synthetic("", head)
    assert r.get("num_gpus") == 2
    assert r.unmodelled == ["x.yaml:# tune run"]
    assert any("DPO" in w for w in r.warnings)


def test_checkpoint_dir_when_the_component_is_not_torchtune() -> None:
    body = "model:\n  _component_: my.models.build\ncheckpointer:\n  checkpoint_dir: /m/x\n"
    r = read_job({"x.yaml": body + "optimizer:\n  _component_: torchtune.x\n"})
    assert (r.get("model"), r.fields["model"].origin) == (
        "/m/x",
        "file:checkpointer.checkpoint_dir",
    )


@pytest.mark.parametrize(
    ("component", "preset"),
    [
        ("torchtune.models.llama3_1.qlora_llama3_1_405b", "llama-3.1-405b"),
        ("torchtune.models.qwen2_5.lora_qwen2_5_14b_instruct", "qwen2.5-14b"),
        ("torchtune.models.qwen2.qwen2_1_5b", "qwen2-1.5b"),
        ("torchtune.models.gemma.gemma_7b", "gemma-7b"),
        ("torchtune.models.phi4.phi4_14b", "phi-4"),
        ("torchtune.models.llama2.lora_llama2_70b", "llama-2-70b"),
    ],
)
def test_preset_names(component: str, preset: str) -> None:
    assert preset_name(component) == preset
    assert resolve_model(preset) == preset


# ---- end to end ------------------------------------------------------------------------------


def test_check_report_equals_estimate_single_device_lora() -> None:
    name = "llama3_2_1B_lora_single_device.yaml"
    report = check_report({name: text(name)})
    expert = trainmem.estimate(
        model="llama-3.2-1b",
        framework="torchtune",
        num_gpus=1,
        precision="bf16",
        lora_rank=64,
        lora_targets=ALL,
        micro_batch_size=4,
        global_batch_size=32,
        optimizer="adamw-fused",
        recompute="none",
        loss="chunked-output",
        compile="none",
    )
    assert report["peak_device_bytes"] == expert["peak_device_bytes"]
    assert report["stack"] == "torchtune" and report["unmodelled"] == []


def test_check_report_equals_estimate_fsdp_cpu_offload() -> None:
    name = "llama3_1_70B_full.yaml"
    report = check_report({name: text(name)}, seq_len=4096)
    expert = trainmem.estimate(
        model="llama-3.1-70b",
        framework="torchtune",
        num_gpus=8,
        zero=3,
        offload="optimizer+params",
        precision="bf16",
        micro_batch_size=2,
        seq_len=4096,
        optimizer="adamw",
        recompute="full",
        loss="chunked-output",
        optimizer_in_backward=False,
    )
    assert report["peak_device_bytes"] == expert["peak_device_bytes"]
    assert report["read"]["seq_len"] == {"value": 4096, "from": "flag"}
    assert report["unmodelled"] == [f"{name}:custom_sharded_layers"]


def test_what_the_recipes_refuse() -> None:
    with pytest.raises(ValueError, match="^x.yaml: optimizer_in_bwd: expected false with"):
        synthetic("optimizer_in_bwd: True\ngradient_accumulation_steps: 2\n")
    with pytest.raises(ValueError, match="^x.yaml: optimizer.fused: expected false with"):
        synthetic(
            "tensor_parallel_dim: 2\noptimizer:\n  _component_: torch.optim.AdamW\n  fused: True\n"
        )


def test_full_recipe_on_tensor_parallel_ranks_only_does_not_shard() -> None:
    r = synthetic("tensor_parallel_dim: 8\n")
    assert r.get("tp") == 8 and "zero" not in r.fields


def test_a_shell_file_forced_to_torchtune_is_one_line() -> None:
    with pytest.raises(ValueError, match="^run.sh: not a torchtune config"):
        read_job({"run.sh": "tune run lora_finetune_single_device --config x.yaml\n"}, "torchtune")
