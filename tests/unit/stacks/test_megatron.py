"""The Megatron reader (stacks/_megatron.py) on Megatron-LM's own example scripts and functional
test configs (tests/data/stacks/megatron, PROVENANCE.md), and on trainmem's own rendered plans.

Each expected table was written by reading the file: (field, value, origin); `framework` and the
optimizer default are the same for every file and checked apart."""

from __future__ import annotations

from pathlib import Path

import pytest

import trainmem
from trainmem.engine import DEFAULTS_BY_FIELD
from trainmem.stacks import check_report, detect, parse, read_job
from trainmem.stacks._megatron import OPTIMIZER_SOURCE
from trainmem.stacks._shell import UNKNOWN, expand, parse_script

DATA = Path(__file__).parents[2] / "data" / "stacks" / "megatron"
M = "MODEL_ARGS."

EXPECTED: dict[str, list[tuple[str, object, str]]] = {
    "train_gpt3_175b_distributed.sh": [
        ("tp", 8, "--tensor-model-parallel-size"), ("pp", 16, "--pipeline-model-parallel-size"),
        ("micro_batch_size", 1, "--micro-batch-size"),
        ("global_batch_size", 1536, "--global-batch-size"), ("seq_len", 2048, "--seq-length"),
        ("precision", "mixed-fp16", "--fp16"), ("model", "gpt3-175b", "--num-layers"),
        ("num_gpus", 8, "--nproc_per_node"),
    ],
    "train_llama3_8b_h100_fp8.sh": [
        ("tp", 1, "--tensor-model-parallel-size"), ("cp", 1, "--context-parallel-size"),
        ("micro_batch_size", 1, "--micro-batch-size"),
        ("global_batch_size", 128, "--global-batch-size"), ("seq_len", 8192, "--seq-length"),
        ("sequence_parallel", False, "--sequence-parallel"),
        ("precision", "fp8-mixed", "--fp8-format"), ("zero", 1, "--use-distributed-optimizer"),
        ("attention", "flash", "--attention-backend"), ("model", "llama-3-8b", "--num-layers"),
        ("num_gpus", 8, "--nproc_per_node"),
    ],
    "train_mixtral_8x7b_distributed.sh": [
        ("tp", 1, "--tensor-model-parallel-size"), ("pp", 4, "--pipeline-model-parallel-size"),
        ("ep", 8, "--expert-model-parallel-size"), ("micro_batch_size", 1, "--micro-batch-size"),
        ("global_batch_size", 256, "--global-batch-size"), ("seq_len", 4096, "--seq-length"),
        ("sequence_parallel", False, "--sequence-parallel"), ("precision", "mixed-bf16", "--bf16"),
        ("zero", 1, "--use-distributed-optimizer"), ("model", "mixtral-8x7b", "--num-layers"),
        ("num_gpus", 8, "--nproc_per_node"),
    ],
    "finetune_gpt_distributed-1.3b.sh": [
        ("micro_batch_size", 4, "--micro-batch-size"), ("seq_len", 2048, "--seq-length"),
        ("precision", "mixed-fp16", "--fp16"), ("num_gpus", 16, "--nproc_per_node"),
    ],
    "train_bert_340m_distributed.sh": [
        ("tp", 8, "--tensor-model-parallel-size"), ("pp", 16, "--pipeline-model-parallel-size"),
        ("micro_batch_size", 4, "--micro-batch-size"),
        ("global_batch_size", 32, "--global-batch-size"), ("seq_len", 512, "--seq-length"),
        ("precision", "mixed-fp16", "--fp16"), ("model", "bert-large-uncased", "--num-layers"),
        ("num_gpus", 8, "--nproc_per_node"),
    ],
    "pretrain_gpt.sh": [
        ("micro_batch_size", 4, "--micro-batch-size"),
        ("global_batch_size", 8, "--global-batch-size"), ("seq_len", 1024, "--seq-length"),
        ("precision", "mixed-fp16", "--fp16"), ("model", "gpt2-medium", "--num-layers"),
    ],
    "pretrain_gpt_distributed.sh": [
        ("micro_batch_size", 8, "--micro-batch-size"),
        ("global_batch_size", 64, "--global-batch-size"), ("seq_len", 1024, "--seq-length"),
        ("precision", "mixed-fp16", "--fp16"), ("model", "gpt2-medium", "--num-layers"),
        ("num_gpus", 8, "--nproc_per_node"),
    ],
    "pretrain_gpt_distributed_with_mp.sh": [
        ("tp", 2, "--tensor-model-parallel-size"), ("pp", 2, "--pipeline-model-parallel-size"),
        ("micro_batch_size", 4, "--micro-batch-size"),
        ("global_batch_size", 16, "--global-batch-size"), ("seq_len", 1024, "--seq-length"),
        ("sequence_parallel", True, "--sequence-parallel"), ("precision", "mixed-fp16", "--fp16"),
        ("model", "gpt2-medium", "--num-layers"), ("num_gpus", 8, "--nproc_per_node"),
    ],
    "pretrain_gpt3_175B.sh": [
        ("tp", 8, "--tensor-model-parallel-size"), ("pp", 16, "--pipeline-model-parallel-size"),
        ("micro_batch_size", 1, "--micro-batch-size"),
        ("global_batch_size", 1536, "--global-batch-size"), ("seq_len", 2048, "--seq-length"),
        ("precision", "mixed-fp16", "--fp16"), ("model", "gpt3-175b", "--num-layers"),
        ("num_gpus", 1024, "#SBATCH --nodes x #SBATCH --ntasks-per-node"),
    ],
    "gpt3_mcore_te_tp1_pp4_vp1_dist_optimizer_overlap_grad_reduce.yaml": [
        ("tp", 1, M + "--tensor-model-parallel-size"),
        ("pp", 4, M + "--pipeline-model-parallel-size"),
        ("micro_batch_size", 4, M + "--micro-batch-size"),
        ("global_batch_size", 32, M + "--global-batch-size"), ("seq_len", 1024, M + "--seq-length"),
        ("virtual_stages", 3, M + "--num-layers-per-virtual-pipeline-stage"),
        ("precision", "mixed-bf16", M + "--bf16"), ("zero", 1, M + "--use-distributed-optimizer"),
        ("attention", "eager", M + "--attention-backend"),
    ],
    "gpt3_7b_tp1_pp4_memory_speed.yaml": [
        ("tp", 1, M + "--tensor-model-parallel-size"),
        ("pp", 4, M + "--pipeline-model-parallel-size"),
        ("micro_batch_size", 1, M + "--micro-batch-size"),
        ("global_batch_size", 8, M + "--global-batch-size"), ("seq_len", 8192, M + "--seq-length"),
        ("virtual_stages", 8, M + "--num-layers-per-virtual-pipeline-stage"),
        ("precision", "mixed-bf16", M + "--bf16"), ("zero", 1, M + "--use-distributed-optimizer"),
    ],
    "gpt3_mcore_te_tp1_pp1_uniform_full_recompute.yaml": [
        ("tp", 1, M + "--tensor-model-parallel-size"),
        ("pp", 1, M + "--pipeline-model-parallel-size"),
        ("micro_batch_size", 4, M + "--micro-batch-size"),
        ("global_batch_size", 32, M + "--global-batch-size"), ("seq_len", 1024, M + "--seq-length"),
        ("precision", "mixed-bf16", M + "--bf16"),
        ("recompute", "full", M + "--recompute-granularity"),
        ("attention", "eager", M + "--attention-backend"),
    ],
    "gpt3_mcore_tp1_pp2_fp16.yaml": [
        ("tp", 1, M + "--tensor-model-parallel-size"),
        ("pp", 2, M + "--pipeline-model-parallel-size"),
        ("micro_batch_size", 4, M + "--micro-batch-size"),
        ("global_batch_size", 32, M + "--global-batch-size"), ("seq_len", 1024, M + "--seq-length"),
        ("precision", "mixed-fp16", M + "--fp16"), ("attention", "eager", M + "--transformer-impl"),
    ],
    "gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor.yaml": [
        ("tp", 2, M + "--tensor-model-parallel-size"),
        ("micro_batch_size", 4, M + "--micro-batch-size"),
        ("global_batch_size", 32, M + "--global-batch-size"), ("seq_len", 1024, M + "--seq-length"),
        ("precision", "mixed-bf16", M + "--bf16"),
        ("zero", 3, M + "--data-parallel-sharding-strategy"),
    ],
    "gpt3_weekly_dgx_h100_mcore_tp2_pp2_fp8_tp_pp_sp.yaml": [
        ("tp", 2, M + "--tensor-model-parallel-size"),
        ("pp", 2, M + "--pipeline-model-parallel-size"),
        ("micro_batch_size", 2, M + "--micro-batch-size"),
        ("global_batch_size", 128, M + "--global-batch-size"),
        ("seq_len", 1024, M + "--seq-length"),
        ("sequence_parallel", True, M + "--sequence-parallel"),
        ("precision", "fp8-mixed", M + "--fp8-format"),
    ],
    "gpt3_mcore_te_tp2_pp1_te_8experts2parallel_dist_optimizer.yaml": [
        ("tp", 2, M + "--tensor-model-parallel-size"),
        ("pp", 1, M + "--pipeline-model-parallel-size"),
        ("ep", 2, M + "--expert-model-parallel-size"),
        ("micro_batch_size", 4, M + "--micro-batch-size"),
        ("global_batch_size", 32, M + "--global-batch-size"), ("seq_len", 1024, M + "--seq-length"),
        ("sequence_parallel", True, M + "--sequence-parallel"),
        ("precision", "mixed-bf16", M + "--bf16"), ("zero", 1, M + "--use-distributed-optimizer"),
        ("attention", "eager", M + "--attention-backend"),
    ],
}  # fmt: skip
ETP_DEFAULT = {"gpt3_mcore_te_tp2_pp1_te_8experts2parallel_dist_optimizer.yaml": 2}
UNMODELLED = {
    "train_llama3_8b_h100_fp8.sh": ["--fp8-param-gather", "--grad-reduce-in-bf16",
                                    "--cross-entropy-loss-fusion", "--empty-unused-memory-level"],
}  # fmt: skip


def _text(name: str) -> str:
    return (DATA / name).read_text()


def test_every_copied_file_has_a_table() -> None:
    copied = {p.name for p in DATA.iterdir() if p.name != "PROVENANCE.md"}
    assert copied == set(EXPECTED)
    assert len(copied) >= 12


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reads_each_file(name: str) -> None:
    reading = read_job({name: _text(name)})
    assert reading.stack == "megatron" and reading.stack_version == "0.16.1"
    got = {k: (r.value, r.origin) for k, r in reading.fields.items()}
    want = {field: (value, f"file:{key}") for field, value, key in EXPECTED[name]}
    want["framework"] = ("megatron", "stack-default:megatron (trainmem: the stack's framework)")
    want["optimizer"] = ("adamw-fused", f"stack-default:{OPTIMIZER_SOURCE}")
    if name in ETP_DEFAULT:
        origin = got["etp"][1]
        assert origin.startswith("stack-default:") and "validate_args" in origin
        want["etp"] = (ETP_DEFAULT[name], origin)
    assert got == want
    assert reading.unmodelled == [f"{name}:{k}" for k in UNMODELLED.get(name, [])]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detects_megatron(name: str) -> None:
    assert detect(parse(name, _text(name))) == "megatron"


def test_model_strings_resolve() -> None:
    from trainmem.stacks import resolve_model

    for rows in EXPECTED.values():
        for field, value, _ in rows:
            if field == "model":
                assert resolve_model(str(value)) == value


def test_no_preset_warns_for_model() -> None:
    reading = read_job({"a.yaml": _text("gpt3_7b_tp1_pp4_memory_speed.yaml")})
    assert "model" not in reading.fields
    assert any("give --model" in w for w in reading.warnings)
    assert any("--num-gpus" in w for w in reading.warnings)


def test_fp32_default_and_no_sp_at_tp1() -> None:
    script = "torchrun --nproc_per_node 2 pretrain_gpt.py --micro-batch-size 2 --seq-length 64\n"
    reading = read_job({"run.sh": script})
    assert reading.fields["precision"].value == "fp32"
    assert reading.fields["precision"].origin.startswith("stack-default:megatron-core 0.16.1")
    assert reading.fields["num_gpus"].value == 2


@pytest.mark.parametrize(
    ("extra", "field", "value"),
    [
        ("--recompute-activations", "recompute", "selective"),
        ("--recompute-granularity selective", "recompute", "selective"),
        ("--recompute-granularity full --recompute-method block --recompute-num-layers 8",
         "recompute", "selective-layer"),
        ("--recompute-granularity full --recompute-method block --recompute-num-layers 16",
         "recompute", "full"),
        ("--transformer-impl local --no-masked-softmax-fusion", "attention", "eager-unfused"),
        ("--attention-backend unfused", "attention", "eager"),
        ("--use-legacy-models --use-flash-attn", "attention", "flash"),
        ("--optimizer sgd", "optimizer", "sgd-momentum"),
        ("--optimizer sgd --sgd-momentum 0", "optimizer", "sgd"),
        ("--use-distributed-optimizer --optimizer-cpu-offload", "offload", "optimizer"),
        ("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads", "zero", 2),
        ("--moe-expert-capacity-factor 1.25", "capacity_factor", 1.25),
    ],
)  # fmt: skip
def test_flags(extra: str, field: str, value: object) -> None:
    script = (
        "ARGS=(--num-layers 16 --hidden-size 256 --num-attention-heads 4)\n"
        f'torchrun pretrain_gpt.py "${{ARGS[@]}}" --micro-batch-size 1 {extra}\n'
    )
    reading = read_job({"x.sh": script})
    assert reading.fields[field].value == value
    if value == "selective-layer":
        assert reading.fields["recompute_every"].value == 2


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("--tensor-model-parallel-size two", "--tensor-model-parallel-size"),
        ("--recompute-granularity full", "--recompute-method"),
        ("--fp8-format e5m2", "--fp8-format"),
        ("--optimizer lamb", "--optimizer"),
        ("--use-megatron-fsdp --data-parallel-sharding-strategy all", "--data-parallel-sharding"),
    ],
)
def test_bad_values_name_file_and_key(extra: str, key: str) -> None:
    script = f"torchrun pretrain_gpt.py --micro-batch-size 1 {extra}\n"
    with pytest.raises(ValueError) as err:
        read_job({"bad.sh": script})
    message = str(err.value)
    assert "\n" not in message and message.startswith("bad.sh: ") and key in message


def test_yaml_bad_value() -> None:
    text = "MODEL_ARGS:\n  --micro-batch-size: 0\n"
    with pytest.raises(ValueError, match=r"^c\.yaml: MODEL_ARGS\.--micro-batch-size: "):
        read_job({"c.yaml": text})


def _plan(**kw: object) -> dict:
    return trainmem.recommend(
        model="llama-3.1-8b", fleet="16xh100-sxm-80gb", global_batch_size=256, seq_len=4096, **kw
    )


@pytest.mark.parametrize("fmt", ["torchrun", "slurm"])
def test_reads_back_the_plans_launch_lines(fmt: str) -> None:
    plan = _plan()
    text = trainmem.plan.render(plan, fmt)
    name = "plan.sh" if fmt == "torchrun" else "plan.slurm"
    reading = read_job({name: text})
    got = {k: r.value for k, r in reading.fields.items()}
    for field in (
        "tp",
        "pp",
        "cp",
        "micro_batch_size",
        "global_batch_size",
        "seq_len",
        "zero",
        "precision",
        "recompute",
        "num_gpus",
        "model",
        "framework",
    ):
        assert got.get(field, DEFAULTS_BY_FIELD.get(field)) == plan[field], field
    assert got["optimizer"] == "adamw-fused"  # Megatron's fused Adam (plan: adamw)


def test_check_report_equals_estimate() -> None:
    plan = _plan()
    text = trainmem.plan.render(plan, "torchrun")
    report = check_report({"plan.sh": text})
    flags = dict(
        num_gpus=8,
        tp=1,
        pp=1,
        cp=1,
        micro_batch_size=1,
        global_batch_size=256,
        seq_len=4096,
        zero=2,
        precision="mixed-bf16",
        optimizer="adamw-fused",
        framework="megatron",
    )
    expected = trainmem.estimate(model="llama-3.1-8b", **flags)["peak_device_bytes"]
    assert report["peak_device_bytes"] == expected
    assert report["stack"] == "megatron"


def test_check_report_on_an_example() -> None:
    text = _text("pretrain_gpt_distributed_with_mp.sh")
    report = check_report({"run.sh": text})
    flags = dict(
        num_gpus=8,
        tp=2,
        pp=2,
        micro_batch_size=4,
        global_batch_size=16,
        seq_len=1024,
        sequence_parallel=True,
        precision="mixed-fp16",
        optimizer="adamw-fused",
        framework="megatron",
    )
    expected = trainmem.estimate(model="gpt2-medium", **flags)["peak_device_bytes"]
    assert report["peak_device_bytes"] == expected


def test_shell_expansion() -> None:
    env: dict = {"A": "1", "ARR": ["--x 1", "--y"]}
    assert expand("${ARR[@]}", env) == ["--x", "1", "--y"]
    assert expand('"${ARR[@]}"', env) == ["--x 1", "--y"]
    assert expand("${B:-'two words'}", env) == ["two", "words"]
    assert expand("$((A*8))", env) == ["8"]
    assert expand("$1", env) == [UNKNOWN]
    script = parse_script(
        'X=4\nif [ "$X" == 4 ]; then Y=yes; else Y=no; fi\ncase $Y in y*) Z=1 ;; *) Z=2 ;; esac\n'
    )
    assert script.env["Y"] == "yes" and script.env["Z"] == "1"
