"""The accelerate config reader (stacks/_accelerate.py): TRL's, alignment-handbook's and
accelerate's own config YAMLs (tests/data/stacks/accelerate, copied verbatim) read field by field
against tables written from the files, detection, bad values, trainmem's own `--format
accelerate` output read back to the plan, and `check_report` of an HF config with its accelerate
config against `trainmem.estimate` with the flags an expert would write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pytest

import trainmem
from trainmem.plan import render
from trainmem.stacks import check_report, detect, parse, read_job, stacks
from trainmem.stacks._accelerate import STACK

DATA = Path(__file__).resolve().parents[2] / "data" / "stacks" / "accelerate"
HF_DATA = DATA.parent / "hf"
STACK_D = "stack-default:accelerate (trainmem: the stack's framework)"
GPUS = "file:num_processes"
MP = "file:mixed_precision"
DS = ("framework", "deepspeed", "file:distributed_type")
F = "file:fsdp_config."
LOAD = ("load", "meta-init", F + "fsdp_cpu_ram_efficient_loading")


class Want(NamedTuple):
    fields: list[tuple[str, Any, str]]
    unmodelled: tuple[str, ...] = ()


def ddp(gpus: int | None) -> Want:
    """MULTI_GPU / NO with bf16: autocast over fp32 weights."""
    gpu = [("num_gpus", gpus, GPUS)] if gpus is not None else []
    return Want([*gpu, ("precision", "amp-bf16", MP)])


DS_PLUGIN = (
    "stack-default:accelerate 1.15.0 src/accelerate/utils/dataclasses.py DeepSpeedPlugin (no "
    "DeepSpeed JSON: DeepSpeed's own zero_optimization defaults)"
)
"""No DeepSpeed JSON: the plugin's zero_optimization block has no bucket keys, so DeepSpeed's
own defaults apply (reduce_bucket_size 5e8; overlap_comm off under ZeRO 1-2)."""


def deepspeed(gpus: int, stage: int) -> list[tuple[str, Any, str]]:
    return [
        ("num_gpus", gpus, GPUS),
        DS,
        ("zero", stage, "file:deepspeed_config.zero_stage"),
        ("precision", "mixed-bf16", MP),
        ("zero_bucket_elems", 5e8, DS_PLUGIN),
        *([("overlap_comm", "off", DS_PLUGIN)] if stage < 3 else []),
    ]


def fsdp(gpus: int, key: str) -> list[tuple[str, Any, str]]:
    return [("num_gpus", gpus, GPUS), ("zero", 3, F + key), LOAD, ("precision", "mixed-bf16", MP)]


EXPECTED: dict[str, Want] = {
    "acc_deepspeed.yaml": Want([("num_gpus", 2, GPUS), DS]),  # stage in its JSON file
    "acc_fp8.yaml": Want([("precision", "fp8-mixed", MP)]),
    "acc_fsdp.yaml": Want(fsdp(2, "fsdp_sharding_strategy")),
    "acc_multi_gpu.yaml": ddp(2),
    "acc_multi_node.yaml": Want([("num_gpus", 8, GPUS)]),  # 2 machines, 8 processes in all
    "acc_single_accelerator.yaml": ddp(None),
    "ah_ddp.yaml": ddp(8),
    "ah_fsdp.yaml": Want(fsdp(8, "fsdp_sharding_strategy"), ("fsdp_config.fsdp_forward_prefetch",)),
    "ah_zero3.yaml": Want(deepspeed(8, 3)),
    "trl_alst_ulysses_4gpu.yaml": Want(
        deepspeed(4, 3), ("parallelism_config.parallelism_config_sp_size",)
    ),
    "trl_context_parallel_2gpu.yaml": Want(
        [
            *fsdp(2, "fsdp_reshard_after_forward"),
            ("recompute", "full", F + "fsdp_activation_checkpointing"),
            ("cp", 2, "file:parallelism_config.parallelism_config_cp_size"),
        ]
    ),
    "trl_deepspeed_zero1.yaml": Want(
        [
            *deepspeed(8, 1),
            ("grad_accum_steps", 1, "file:deepspeed_config.gradient_accumulation_steps"),
        ]
    ),
    "trl_deepspeed_zero2.yaml": Want(deepspeed(8, 2)),
    "trl_deepspeed_zero3.yaml": Want(deepspeed(8, 3)),
    # FSDP1: the strategy as fsdp_reshard_after_forward: FULL_SHARD (accelerate 1.x)
    "trl_fsdp1.yaml": Want(
        fsdp(8, "fsdp_reshard_after_forward"), ("fsdp_config.fsdp_forward_prefetch",)
    ),
    "trl_fsdp2.yaml": Want(fsdp(8, "fsdp_reshard_after_forward")),
    "trl_multi_gpu.yaml": ddp(8),
    "trl_single_gpu.yaml": ddp(1),
}


def _check(reading: Any, name: str, want: Want) -> None:
    fields = [*want.fields]
    if not any(f == "framework" for f, _, _ in fields):
        fields.append(("framework", "hf", STACK_D))
    assert sorted(reading.fields) == sorted(f for f, _, _ in fields)
    for field, value, origin in fields:
        read = reading.fields[field]
        assert read.value == value, field
        assert type(read.value) is type(value), field
        assert read.origin == origin, field
        assert read.file == (None if origin.startswith("stack-default:") else name)
    assert reading.unmodelled == [f"{name}:{key}" for key in want.unmodelled]


def test_every_copied_config_has_a_table() -> None:
    assert sorted(p.name for p in DATA.glob("*.yaml")) == sorted(EXPECTED)
    assert len(EXPECTED) >= 12
    provenance = (DATA / "PROVENANCE.md").read_text()
    for name in EXPECTED:
        assert f"| {name} |" in provenance


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reads_each_config(name: str) -> None:
    reading = read_job({name: (DATA / name).read_text()})
    assert reading.stack == "accelerate" and reading.stack_version == "1.15.0"
    _check(reading, name, EXPECTED[name])


def test_fsdp1_and_config_files_are_said() -> None:
    reading = read_job({"f.yaml": (DATA / "trl_fsdp1.yaml").read_text()})
    assert any("FSDP1" in w and "FSDP2" in w for w in reading.warnings)
    reading = read_job({"d.yaml": (DATA / "acc_deepspeed.yaml").read_text()})
    assert any("zero_stage1_config.json" in w and "give that JSON" in w for w in reading.warnings)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detects_accelerate_and_no_other_stack(name: str) -> None:
    doc = parse(name, (DATA / name).read_text())
    assert detect(doc) == "accelerate"
    for other in stacks().values():
        if other.name != "accelerate":
            assert other.detect(doc) < STACK.detect(doc), other.name


def test_does_not_claim_other_stacks_test_data() -> None:
    for path in sorted(DATA.parent.glob("*/*")):
        if path.parent.name == "accelerate" or path.suffix not in (".yaml", ".yml", ".json"):
            continue
        assert STACK.detect(parse(path.name, path.read_text())) == 0, path


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("distributed_type", "SIDEWAYS"),
        ("num_processes", 0),
        ("mixed_precision", "fp4"),
        ("fsdp_config", "{fsdp_sharding_strategy: HALF_SHARD}"),
        ("fsdp_config", "{fsdp_offload_params: perhaps}"),
    ],
)
def test_bad_values_are_one_line_naming_file_and_key(key: str, value: Any) -> None:
    base = {"distributed_type": "FSDP", "num_processes": 8, "mixed_precision": "bf16"}
    lines = [f"{k}: {v}" for k, v in {**base, key: value}.items()]
    with pytest.raises(ValueError) as err:
        read_job({"acc.yaml": "\n".join(lines)})
    message = str(err.value)
    assert message.startswith(f"acc.yaml: {key}"), message
    assert "\n" not in message


def test_hybrid_shard_shards_within_a_machine() -> None:
    text = (
        "distributed_type: FSDP\nnum_machines: 2\nnum_processes: 16\nfsdp_config:\n"
        "  fsdp_sharding_strategy: HYBRID_SHARD\n  fsdp_version: 1\n"
    )
    reading = read_job({"hsdp.yaml": text})
    assert (reading.get("zero"), reading.get("dp_shard"), reading.get("num_gpus")) == (3, 8, 16)


@pytest.mark.parametrize("zero_flags", [{}, {"recompute": "full"}, {"offload": "optimizer+params"}])
def test_reads_back_trainmems_own_accelerate_config(zero_flags: dict[str, Any]) -> None:
    """`recommend --format accelerate` rendered, then read: the plan's fields come back (the
    batch is in the Trainer's arguments, a comment there). Its fsdp_cpu_ram_efficient_loading
    is the plan's load (the hf stack's own, a whole CPU model: false)."""
    plan = trainmem.recommend(
        model="llama-3.2-1b", fleet="8xh100-sxm-80gb", seq_len=2048, global_batch_size=64,
        framework="hf", **zero_flags,
    )  # fmt: skip
    reading = read_job({"accelerate.yaml": render(plan, "accelerate")})
    assert reading.unmodelled == []
    want = {
        "num_gpus": plan["num_gpus"],
        "zero": plan["zero"],
        "precision": plan["precision"],
        "framework": "hf",
        "recompute": plan["recompute"] if plan["recompute"] == "full" else None,
        "offload": plan["offload"] if plan["offload"] != "none" else None,
        "load": "cpu-full-state-dict",
    }
    assert {k: reading.get(k) for k in want} == want


def test_check_report_equals_estimate_with_expert_flags() -> None:
    """The zephyr full SFT recipe (bf16 weights) under TRL's FSDP2 config on 8 GPUs."""
    files = {
        "config_full.yaml": (HF_DATA / "ah_zephyr-7b-beta_sft_config_full.yaml").read_text(),
        "fsdp2.yaml": (DATA / "trl_fsdp2.yaml").read_text(),
    }
    report = check_report(files)
    assert report["read"]["precision"]["value"] == "bf16"  # loaded in bf16: no fp32 master
    expert = trainmem.estimate(
        model="mistral-7b",
        num_gpus=8,
        micro_batch_size=16,
        seq_len=2048,
        precision="bf16",
        zero=3,
        recompute="full",
        optimizer="adamw-fused",
        attention="flash",
        loss="chunked",
        load="meta-init",
        framework="hf",
    )
    assert report["peak_device_bytes"] == expert["peak_device_bytes"]
