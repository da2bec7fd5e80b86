"""The DeepSpeed JSON reader (stacks/_deepspeed.py): accelerate's test configs and
DeepSpeedExamples' (tests/data/stacks/deepspeed, copied verbatim) read field by field against
tables written from the files, detection, bad values, a DeepSpeed JSON beside an HF Trainer
config, trainmem's own `--format deepspeed` output read back to the plan, and `check_report`
against `trainmem.estimate` with the flags an expert would write.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import trainmem
from trainmem.plan import render
from trainmem.stacks import check_report, detect, parse, read_job, stacks
from trainmem.stacks._deepspeed import STACK

DATA = Path(__file__).resolve().parents[2] / "data" / "stacks" / "deepspeed"
BATCH_D = "stack-default:deepspeed 0.19.8 runtime/config.py _set_batch_related_parameters "
FP32_D = "stack-default:deepspeed 0.19.8 runtime/precision_config.py "
STACK_D = "stack-default:deepspeed (trainmem: the stack's framework)"
ZERO = "file:zero_optimization.stage"
OPT = ("optimizer", "adamw-fused", "file:optimizer.type")
TORCH_ADAMW = ("optimizer", "adamw", "file:optimizer.type")
HOST_ADAMW = TORCH_ADAMW
"""`"torch_adam": true` in the AdamW params: torch.optim.AdamW, not FusedAdam (deepspeed 0.19.8
runtime/engine.py get_optimizer_configuration)."""
ACCUM1 = ("grad_accum_steps", 1, "file:gradient_accumulation_steps")


class Want(NamedTuple):
    fields: list[tuple[str, Any, str]]
    """(field, value, origin); an origin ending in a space is a prefix (a default's source)."""
    unmodelled: tuple[str, ...] = ()


ZERO_D = "stack-default:deepspeed 0.19.8 runtime/zero/config.py"
"""DeepSpeed's own ZeRO defaults, for keys the config does not have (the HF Trainer fills
"auto" only): reduce_bucket_size 5e8 elements, overlap_comm off under ZeRO 1-2."""


def ds_buckets(stage: int) -> list[tuple[str, Any, str]]:
    """The reduce bucket and overlap_comm of a config without either key: DeepSpeed's own."""
    if stage < 1:
        return []
    off = [("overlap_comm", "off", ZERO_D + " (overlap_comm_valid)")] if stage < 3 else []
    return [("zero_bucket_elems", 5e8, ZERO_D), *off]


def fp16_zero(stage: int) -> Want:
    """DeepSpeedExamples' autotuning configs: micro-batch auto, fp16 on, one ZeRO stage."""
    return Want(
        [
            ("precision", "mixed-fp16", "file:fp16.enabled"),
            ("zero", stage, ZERO),
            *ds_buckets(stage),
        ]
    )


Z = "zero_optimization."
EXPECTED: dict[str, Want] = {
    "acc_ds_config_zero2.json": Want(  # bf16/fp16 and the batch sizes "auto": the Trainer's
        [
            ACCUM1,
            TORCH_ADAMW,
            ("zero", 2, ZERO),
            ("offload", "optimizer", f"file:{Z}offload_optimizer.device"),
            ("overlap_comm", "on", f"file:{Z}overlap_comm"),
        ],
        (f"{Z}allgather_bucket_size",),  # 2e8, not DeepSpeed's 5e8
    ),  # fmt: skip
    "acc_ds_config_zero3.json": Want(
        [
            ACCUM1,
            TORCH_ADAMW,
            ("zero", 3, ZERO),
            ("offload", "optimizer+params", f"file:{Z}offload_param.device"),
            ("overlap_comm", "on", f"file:{Z}overlap_comm"),
        ],
    ),  # fmt: skip
    "dse_DeepSpeed-ZenFlow_finetuning_zf_config.json": Want(
        [
            ACCUM1,
            ("micro_batch_size", 8, BATCH_D),
            ("precision", "mixed-bf16", "file:bf16.enabled"),
            HOST_ADAMW,  # DeepSpeedCPUAdam on the host (stacks/_deepspeed.py _host_adam)
            ("zero", 2, ZERO),
            ("offload", "optimizer", f"file:{Z}offload_optimizer.device"),
            *ds_buckets(2),
        ],
        (f"{Z}zenflow",),
    ),  # fmt: skip
    "dse_autotuning_hf_dsconfigs_ds_config_fp16_z0.json": fp16_zero(0),
    "dse_autotuning_hf_dsconfigs_ds_config_fp16_z1.json": fp16_zero(1),
    "dse_autotuning_hf_dsconfigs_ds_config_fp16_z2.json": fp16_zero(2),
    "dse_autotuning_hf_dsconfigs_ds_config_fp16_z3.json": fp16_zero(3),
    "dse_autotuning_hf_dsconfigs_ds_config_z3.json": Want(
        [("precision", "fp32", FP32_D), ("zero", 3, ZERO), *ds_buckets(3)]
    ),
    "dse_bf16_master_weight_baseline.json": Want(
        [
            ("micro_batch_size", 4, "file:train_micro_batch_size_per_gpu"),
            ACCUM1,
            ("precision", "mixed-bf16", "file:bf16.enabled"),
            OPT,
            ("zero", 3, ZERO),
            ("zero_bucket_elems", 5e7, f"file:{Z}reduce_bucket_size"),
            ("overlap_comm", "on", f"file:{Z}overlap_comm"),
        ],
        (f"{Z}stage3_param_persistence_threshold",),  # 1e5 with a 5e7 bucket (not h*h, 10 h)
    ),  # fmt: skip
    "dse_bf16_master_weight_bf16_full.json": Want(
        [
            ("micro_batch_size", 4, "file:train_micro_batch_size_per_gpu"),
            ACCUM1,
            ("precision", "mixed-bf16", "file:bf16.enabled"),
            OPT,
            ("zero", 3, ZERO),
            ("zero_bucket_elems", 5e7, f"file:{Z}reduce_bucket_size"),
            ("overlap_comm", "on", f"file:{Z}overlap_comm"),
        ],
        (
            "bf16.bf16_master_weights_and_grads",
            "bf16.bf16_optimizer_states",
            f"{Z}stage3_param_persistence_threshold",
            "torch_autocast",
        ),
    ),  # fmt: skip
    "dse_gan_gan_deepspeed_config.json": Want(  # train_batch_size alone, type Adam
        [
            ("micro_batch_size", 64, BATCH_D),
            ("precision", "fp32", FP32_D),
            ("optimizer", "adamw-fused", "file:optimizer.type"),
        ],
    ),  # fmt: skip
    "dse_imagenet_ds_fp16_z1_config.json": Want(
        [
            ACCUM1,
            ("micro_batch_size", 256, BATCH_D),
            ("precision", "mixed-fp16", "file:fp16.enabled"),
            OPT,
            ("zero", 1, ZERO),
            *ds_buckets(1),
        ],
        ("fp16.auto_cast",),
    ),  # fmt: skip
    "dse_inference_sglang_ds_offload_nvme_aio.json": Want(
        [
            ("micro_batch_size", 1, BATCH_D),
            ("precision", "fp32", FP32_D),
            ("zero", 3, ZERO),
            *ds_buckets(3),
        ],
        (f"{Z}offload_param.device", f"{Z}offload_param.device"),  # NVMe; parameters alone
    ),  # fmt: skip
    "dse_pipeline_parallelism_ds_config.json": Want(
        [
            ("micro_batch_size", 8, "file:train_micro_batch_size_per_gpu"),
            ("global_batch_size", 256, "file:train_batch_size"),
            ("precision", "fp32", FP32_D),
            OPT,
        ],
    ),  # fmt: skip
    "dse_tensor_parallel_hf_integration_ds_config.json": Want(
        [OPT, ("zero", 2, ZERO), *ds_buckets(2)], ("tensor_parallel.autotp_size",)
    ),
}


def _read(files: dict[str, str]):
    return read_job(files)


def _check(reading: Any, name: str, want: Want) -> None:
    fields = [*want.fields]
    if not any(f == "framework" for f, _, _ in fields):
        fields.append(("framework", "deepspeed", STACK_D))
    assert sorted(reading.fields) == sorted(f for f, _, _ in fields)
    for field, value, origin in fields:
        read = reading.fields[field]
        assert read.value == value, field
        assert type(read.value) is type(value), field
        if origin.endswith(" ") or origin.startswith("stack-default:"):
            assert read.origin.startswith(origin), (field, read.origin)
            assert read.file is None
        else:
            assert read.origin == origin, field
            assert read.file == name
    listed = [f"{name}:{key}" for key in want.unmodelled]
    assert reading.unmodelled == list(dict.fromkeys(listed))  # each key once


def test_every_copied_config_has_a_table() -> None:
    assert sorted(p.name for p in DATA.glob("*.json")) == sorted(EXPECTED)
    assert len(EXPECTED) >= 12
    provenance = (DATA / "PROVENANCE.md").read_text()
    for name in EXPECTED:
        assert f"| {name} |" in provenance


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reads_each_config(name: str) -> None:
    reading = _read({name: (DATA / name).read_text()})
    assert reading.stack == "deepspeed" and reading.stack_version == "0.19.8"
    _check(reading, name, EXPECTED[name])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detects_deepspeed_and_no_other_stack(name: str) -> None:
    doc = parse(name, (DATA / name).read_text())
    assert detect(doc) == "deepspeed"
    for other in stacks().values():
        if other.name != "deepspeed":
            assert other.detect(doc) < STACK.detect(doc), other.name


def test_does_not_claim_other_stacks_test_data() -> None:
    for path in sorted(DATA.parent.glob("*/*")):
        if path.parent.name == "deepspeed" or path.suffix not in (".yaml", ".yml", ".json"):
            continue
        assert STACK.detect(parse(path.name, path.read_text())) == 0, path


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("zero_optimization", "stage", 4),
        ("zero_optimization", "stage", "three"),
        (None, "train_micro_batch_size_per_gpu", 0),
        ("bf16", "enabled", "sometimes"),
        ("zero_optimization", "offload_optimizer", {"device": "disk"}),
    ],
)
def test_bad_values_are_one_line_naming_file_and_key(section: Any, key: str, value: Any) -> None:
    cfg: dict[str, Any] = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}
    (cfg.setdefault(section, {}) if section else cfg)[key] = value
    with pytest.raises(ValueError) as err:
        _read({"ds.json": json.dumps(cfg)})
    message = str(err.value)
    where = f"{section}.{key}" if section else key
    assert message.startswith(f"ds.json: {where}"), message
    assert "\n" not in message


HF = """\
model_name_or_path: meta-llama/Llama-3.1-8B
output_dir: out
per_device_train_batch_size: 2
gradient_accumulation_steps: 4
gradient_checkpointing: true
bf16: true
max_length: 4096
packing: false
deepspeed: ds_config_zero3.json
"""


def test_with_an_hf_config_the_auto_values_come_from_it() -> None:
    files = {
        "sft.yaml": HF,
        "ds_config_zero3.json": (DATA / "acc_ds_config_zero3.json").read_text(),
    }
    reading = _read(files)
    assert reading.stack == "hf"
    assert reading.fields["framework"].value == "deepspeed"
    assert reading.fields["framework"].file == "sft.yaml"
    assert reading.fields["micro_batch_size"].file == "sft.yaml"  # "auto" in the JSON
    assert reading.fields["zero"].origin == "file:zero_optimization.stage"
    assert reading.fields["zero"].file == "ds_config_zero3.json"
    assert reading.get("precision") == "mixed-bf16"  # fp32 weights, DeepSpeed bf16
    assert reading.fields["optimizer"].origin == "file:optimizer.type"  # replaces optim
    assert reading.get("offload") == "optimizer+params"


def test_check_report_equals_estimate_with_expert_flags() -> None:
    files = {
        "sft.yaml": HF,
        "ds_config_zero3.json": (DATA / "acc_ds_config_zero3.json").read_text(),
    }
    report = check_report(files, num_gpus=8)  # the global batch: 2 x 4 x 8 GPUs
    expert = trainmem.estimate(
        model="llama-3.1-8b",
        num_gpus=8,
        micro_batch_size=2,
        global_batch_size=64,
        seq_len=4096,
        precision="mixed-bf16",
        recompute="full",
        zero=3,
        offload="optimizer+params",
        optimizer="adamw-fused",
        loss="chunked",
        framework="deepspeed",
    )
    assert report["peak_device_bytes"] == expert["peak_device_bytes"]
    assert report["read"]["global_batch_size"]["value"] == 64


@pytest.mark.parametrize(
    "job",
    [
        {"global_batch_size": 64},
        {"global_batch_size": 256, "seq_len": 8192},
        {"global_batch_size": 32, "seq_len": 16384},
    ],
)
def test_reads_back_trainmems_own_deepspeed_config(job: dict[str, Any]) -> None:
    """`recommend --format deepspeed` rendered, then read: the plan's fields come back. Its
    bucket sizes are the Trainer's auto sizes of the model's hidden size: modelled."""
    plan = trainmem.recommend(
        model="llama-3.2-1b", fleet="8xh100-sxm-80gb", seq_len=job.get("seq_len", 2048),
        global_batch_size=job["global_batch_size"], framework="deepspeed",
    )  # fmt: skip
    reading = _read({"ds_config.json": render(plan, "deepspeed")})
    assert reading.unmodelled == []
    want = {
        "micro_batch_size": plan["micro_batch_size"],
        "global_batch_size": plan["micro_batch_size"] * plan["grad_accum_steps"] * plan["dp"],
        "grad_accum_steps": plan["grad_accum_steps"],
        "zero": plan["zero"],
        "precision": plan["precision"],
        "framework": "deepspeed",
    }
    if plan["offload"] != "none":
        want["offload"] = plan["offload"]
    got = {k: reading.get(k) for k in want}
    assert got == want
    # The plan's adamw is written as torch's AdamW (`torch_adam`); under offload the optimizer is
    # DeepSpeedCPUAdam on the host whatever the plan says (no GPU temporaries either way).
    offloaded = plan["offload"] != "none"
    assert reading.get("optimizer") == ("adamw-fused" if offloaded else plan["optimizer"])
