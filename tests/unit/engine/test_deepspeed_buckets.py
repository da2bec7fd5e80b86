"""DeepSpeed ZeRO's reduce buckets (engine/_data_parallel.py deepspeed_buffer_bytes): their size
(`zero_bucket_elems`, DeepSpeed's reduce_bucket_size; 0 the HF Trainer's "auto" h*h) and their
count (`overlap_comm`: a second buffer under ZeRO 1-2), from the config readers to the launch
config. Llama-2-7B (hidden 4,096) on 8 ranks, bf16 buffers: every figure is the model's own
arithmetic (deepspeed 0.19.8 zero/stage_1_and_2.py setup_buckets: buf_0, and buf_1 only with
overlap_comm, each of reduce_bucket_size elements in the 16-bit dtype)."""

from __future__ import annotations

import json

import pytest

from trainmem.catalog import load_model
from trainmem.engine._fast._scalar import estimate_one
from trainmem.plan._launch import deepspeed_config
from trainmem.stacks import read_job

M = load_model("llama-2-7b")
H2 = 4096 * 4096
JOB = {
    "framework": "deepspeed",
    "num_gpus": 8,
    "micro_batch_size": 1,
    "seq_len": 2048,
    "precision": "mixed-bf16",
    "recompute": "full",
}


def _backward(**fields) -> float:
    return estimate_one(M, **{**JOB, **fields})["peak_backward_bytes"]


def test_zero2_buckets_follow_reduce_bucket_size_and_overlap_comm() -> None:
    auto = _backward(zero=2)  # two buffers of h*h (the Trainer's auto, overlap on)
    assert _backward(zero=2, zero_bucket_elems=5e8) - auto == 2 * (5e8 - H2) * 2
    # DeepSpeed's own ZeRO-2 defaults (LLaMA-Factory's ds_z2_config.json, accelerate without a
    # DeepSpeed JSON): one 5e8-element buffer, 1e9 bytes, 0.93 GiB.
    assert (
        _backward(zero=2, zero_bucket_elems=5e8, overlap_comm="off") - auto == 5e8 * 2 - 2 * H2 * 2
    )
    assert _backward(zero=2, overlap_comm="on") == auto  # auto is on


def test_zero3_keeps_its_two_bucket_buffers_whatever_overlap_comm() -> None:
    """ZeRO-3's IPG bucket and its reduce-scatter input: overlap_comm does not add a buffer."""
    big = _backward(zero=3, zero_bucket_elems=5e8)
    assert big - _backward(zero=3) == 2 * (5e8 - H2) * 2
    assert _backward(zero=3, zero_bucket_elems=5e8, overlap_comm="off") == big


@pytest.mark.parametrize("framework", ["hf", "torchtitan", "megatron"])
def test_other_stacks_have_no_deepspeed_buckets(framework: str) -> None:
    fields = {"framework": framework, "zero": 1}
    assert _backward(**fields, zero_bucket_elems=5e8, overlap_comm="off") == _backward(**fields)


def test_the_readers_give_deepspeeds_own_defaults_where_a_config_has_no_bucket_keys() -> None:
    z2 = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1}
    got = read_job({"ds.json": json.dumps(z2)})
    assert got.get("zero_bucket_elems") == 5e8 and got.get("overlap_comm") == "off"
    z3 = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1}
    got = read_job({"ds.json": json.dumps(z3)})
    assert got.get("zero_bucket_elems") == 5e8 and not got.has("overlap_comm")  # on: ZeRO-3's
    auto = {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "overlap_comm": True}}
    got = read_job({"ds.json": json.dumps({**auto, "train_micro_batch_size_per_gpu": 1})})
    assert not got.has("zero_bucket_elems") and got.get("overlap_comm") == "on"
    acc = "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\nnum_processes: 8\n"
    got = read_job({"accelerate.yaml": acc})
    assert got.get("zero_bucket_elems") == 5e8 and got.get("overlap_comm") == "off"


def test_the_launch_config_writes_the_buckets_the_estimate_counted() -> None:
    plan = {
        "micro_batch_size": 1,
        "grad_accum_steps": 1,
        "dp": 8,
        "precision": "mixed-bf16",
        "optimizer": "adamw",
        "offload": "none",
        "zero": 2,
        "recompute": "full",
        "architecture": {"hidden_size": 4096},
    }
    zero = deepspeed_config(plan)["zero_optimization"]
    assert zero["reduce_bucket_size"] == H2 and zero["overlap_comm"] is True
    zero = deepspeed_config({**plan, "zero_bucket_elems": 5e8, "overlap_comm": "off"})[
        "zero_optimization"
    ]
    assert zero["reduce_bucket_size"] == 500_000_000 and zero["overlap_comm"] is False
