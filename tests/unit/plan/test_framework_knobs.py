"""Framework knobs in the launch configs: the allocator setting, Megatron's block recompute and
accelerate's compile setting are rendered where the framework has a setting for them."""

from __future__ import annotations

import pytest

import trainmem
from trainmem.plan import render

JOB = {"model": "llama-3.1-8b", "fleet": "8xh100", "seq_len": 4096, "global_batch_size": 256}


def test_expandable_segments_is_exported_before_the_launcher() -> None:
    report = trainmem.recommend(**JOB, allocator="expandable-segments")
    for fmt in ("torchrun", "slurm"):
        lines = render(report, fmt).splitlines()
        export = lines.index("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
        launcher = next(i for i, line in enumerate(lines) if "torchrun " in line)
        assert export < launcher, fmt
    plain = render(trainmem.recommend(**JOB), "torchrun")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in plain


def test_megatron_selective_layer_is_block_recompute_of_every_nth_layer() -> None:
    report = trainmem.recommend(**JOB, recompute="selective-layer", recompute_every=4)
    text = render(report, "torchrun")
    assert report["recompute"] == "selective-layer" and report["recompute_every"] == 4
    layers_per_stage = 32 // (report["pp"] * report["virtual_stages"])
    expected = f"--recompute-method block --recompute-num-layers {layers_per_stage // 4}"
    assert "--recompute-granularity full" in text and expected in text


def test_accelerate_compiles_with_inductor() -> None:
    job = {**JOB, "model": "llama-3.2-1b", "global_batch_size": 64, "framework": "hf"}
    assert "dynamo_backend: INDUCTOR" in render(
        trainmem.recommend(**job, compile="blocks"), "accelerate"
    )
    assert "dynamo_config" not in render(trainmem.recommend(**job), "accelerate")


def test_a_framework_gets_its_own_precision_when_none_is_given() -> None:
    # The search's default (mixed-bf16) is not one torchtune runs: its own (bf16) is used; an
    # explicit precision the framework does not run is still refused, naming the allowed ones.
    job = {**JOB, "model": "llama-3.2-3b", "fleet": "8xa100", "global_batch_size": 16}
    assert trainmem.recommend(**job, framework="torchtune")["precision"] == "bf16"
    with pytest.raises(ValueError, match="allowed: bf16, fp32"):
        trainmem.recommend(**job, framework="torchtune", precision="amp-bf16")
