"""The launch-line reader (stacks/_launch.py) on public launch scripts (tests/data/stacks/launch,
PROVENANCE.md) and on trainmem's own rendered torchrun / sbatch plans: num_gpus (and gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest

import trainmem
from trainmem.stacks import Reading, check_report, detect, parse, read_job
from trainmem.stacks._launch import detect as launch_detect
from trainmem.stacks._launch import read as launch_read

DATA = Path(__file__).parents[2] / "data" / "stacks" / "launch"
MEGATRON = Path(__file__).parents[2] / "data" / "stacks" / "megatron"
MAIN = "gpt3_mcore_tp1_pp2_fp16.yaml"
"""A main file that names no GPU count (a Megatron functional test's config)."""

EXPECTED: dict[str, tuple[int, str] | None] = {
    "SRUN.sh": (8, "#SBATCH --ntasks-per-node"),
    "accelerate_submit_multigpu.sh": (4, "--num_processes"),
    "accelerate_submit_multinode.sh": (16, "--num_processes"),
    "accelerate_submit_multinode_fsdp.sh": (16, "--num_processes"),
    "dschat_opt_single_gpu_run_6.7b_lora.sh": (1, "--num_gpus"),
    "dschat_single_gpu_run_1.3b.sh": (1, "--num_gpus"),
    "dschat_single_node_run_1.3b.sh": None,  # deepspeed without --num_gpus: every GPU there
    "llamafactory_ds_zero3.sh": (4, "--nproc_per_node"),
    "llamafactory_multi_node.sh": None,  # accelerate's config file says it
    "modelopt_sbatch.sh": (8, "#SBATCH --ntasks-per-node"),
    "multinode_trainer.slurm": (32, "--nnodes x --nproc_per_node"),
    "torchtitan_run_train.sh": (8, "--nproc_per_node"),
}
CLAIMED_BY_TORCHTITAN = {"multinode_trainer.slurm", "torchtitan_run_train.sh"}
"""torchtitan launch lines: the torchtitan reader takes them as its main file."""


def _text(name: str) -> str:
    return (DATA / name).read_text()


def test_every_copied_file_has_a_table() -> None:
    copied = {p.name for p in DATA.iterdir() if p.name != "PROVENANCE.md"}
    assert copied == set(EXPECTED) and len(copied) >= 12


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reads_each_file(name: str) -> None:
    doc = parse(name, _text(name))
    assert launch_detect(doc) == 5
    reading = Reading("launch", "x")
    launch_read(doc, reading)
    got = {k: (r.value, r.origin) for k, r in reading.fields.items()}
    want = EXPECTED[name]
    expected = {} if want is None else {"num_gpus": (want[0], f"file:{want[1]}")}
    if name == "torchtitan_run_train.sh":  # PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"
        expected["allocator"] = ("expandable-segments", "file:PYTORCH_CUDA_ALLOC_CONF")
    assert got == expected


@pytest.mark.parametrize("name", sorted(set(EXPECTED) - CLAIMED_BY_TORCHTITAN))
def test_detected_as_launch_and_read_with_a_main_file(name: str) -> None:
    assert detect(parse(name, _text(name))) == "launch"
    reading = read_job({MAIN: (MEGATRON / MAIN).read_text(), name: _text(name)})
    assert reading.stack == "megatron"
    want = EXPECTED[name]
    if want is None:
        assert "num_gpus" not in reading.fields
    else:
        read = reading.fields["num_gpus"]
        assert (read.value, read.origin, read.file) == (want[0], f"file:{want[1]}", name)


def test_a_launch_line_alone_is_no_job() -> None:
    with pytest.raises(ValueError, match="launch line gives the GPUs only"):
        read_job({"run.sh": _text("llamafactory_ds_zero3.sh")})


@pytest.mark.parametrize(
    ("text", "gpus", "key"),
    [
        ("tune run --nproc_per_node 8 --nnodes 2 lora_finetune_distributed --config c\n", 16,
         "--nnodes x --nproc_per_node"),
        ("litgpt finetune_lora meta-llama/Llama-3.2-1B --devices 4\n", 4, "--devices"),
        ("FORCE_TORCHRUN=1 NNODES=2 NPROC_PER_NODE=8 llamafactory-cli train x.yaml\n", 16,
         "NNODES x NPROC_PER_NODE"),
        ("deepspeed --num_gpus 8 --num_nodes 2 train.py --deepspeed ds.json\n", 16,
         "--num_nodes x --num_gpus"),
        ("python -m torch.distributed.run --nproc_per_node=4 --nnodes=1:2 train.py\n", 8,
         "--nnodes x --nproc_per_node"),
        ("mpirun -np 16 python train.py\n", 16, "-np"),
    ],
)  # fmt: skip
def test_launchers(text: str, gpus: int, key: str) -> None:
    reading = Reading("launch", "x")
    launch_read(parse("l.sh", text), reading)
    assert (reading.fields["num_gpus"].value, reading.fields["num_gpus"].origin) == (
        gpus,
        f"file:{key}",
    )


def test_sbatch_gpu_type() -> None:
    text = (
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gres=gpu:h100:8\n"
        'srun torchrun --nnodes="$SLURM_NNODES" --nproc-per-node=8 train.py\n'
    )
    reading = Reading("launch", "x")
    launch_read(parse("job.sbatch", text), reading)
    assert reading.fields["num_gpus"].value == 16
    assert reading.fields["gpu"].value == "h100-sxm-80gb"
    assert reading.fields["gpu"].origin == "file:#SBATCH --gres"
    unknown = Reading("launch", "x")
    launch_read(parse("j.sbatch", "#SBATCH --gres=gpu:weird9000:4\nsrun python t.py\n"), unknown)
    assert "gpu" not in unknown.fields and any("give --gpu" in w for w in unknown.warnings)


def test_bad_count_names_file_and_key() -> None:
    with pytest.raises(ValueError, match=r"^bad\.sh: --nproc_per_node: expected a process count"):
        launch_read(parse("bad.sh", "torchrun --nproc_per_node eight t.py\n"), Reading("l", "x"))


def test_unknown_count_is_warned() -> None:
    reading = Reading("launch", "x")
    launch_read(parse("u.sh", "torchrun --nproc_per_node $1 t.py\n"), reading)
    assert "num_gpus" not in reading.fields and any("--num-gpus" in w for w in reading.warnings)


@pytest.mark.parametrize("fmt", ["torchrun", "slurm"])
def test_reads_the_plans_gpus(fmt: str) -> None:
    plan = trainmem.recommend(
        model="llama-3.1-8b", fleet="16xh100-sxm-80gb", global_batch_size=256, seq_len=4096
    )
    reading = Reading("launch", "x")
    launch_read(parse("p.sh", trainmem.plan.render(plan, fmt)), reading)
    assert reading.fields["num_gpus"].value == plan["num_gpus"]


def test_check_report_with_a_launch_file_equals_estimate() -> None:
    files = {MAIN: (MEGATRON / MAIN).read_text(), "run.sh": _text("accelerate_submit_multigpu.sh")}
    report = check_report(files, model="gpt2")
    assert report["read"]["num_gpus"] == {
        "value": 4,
        "from": "file:--num_processes",
        "file": "run.sh",
    }
    flags = dict(num_gpus=4, tp=1, pp=2, micro_batch_size=4, global_batch_size=32, seq_len=1024,
                 precision="mixed-fp16", attention="eager", optimizer="adamw-fused",
                 framework="megatron")  # fmt: skip
    assert (
        report["peak_device_bytes"] == trainmem.estimate(model="gpt2", **flags)["peak_device_bytes"]
    )


def test_allocator_setting_of_the_launched_command() -> None:
    """`export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (what recommend writes) before
    the launcher: allocator expandable-segments, at that variable."""
    text = (
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
        "torchrun --nnodes 1 --nproc_per_node 8 train.py\n"
    )
    reading = Reading(stack="hf", stack_version="x")
    launch_read(parse("run.sh", text), reading)
    assert reading.get("num_gpus") == 8
    assert reading.get("allocator") == "expandable-segments"
    assert reading.fields["allocator"].origin == "file:PYTORCH_CUDA_ALLOC_CONF"
    plain = Reading(stack="hf", stack_version="x")
    launch_read(parse("run.sh", text.replace("True", "False")), plain)
    assert not plain.has("allocator")
