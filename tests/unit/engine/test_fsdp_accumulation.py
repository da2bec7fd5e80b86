"""FSDP with gradient accumulation as HF Trainer and LitGPT run it: gradient sync off on every
micro-batch but the last, so each rank holds the whole unsharded gradient
(engine/_data_parallel.py unsharded_accumulated_gradient_bytes; the traced cases are
tests/golden/test_fsdp1_trace.py's D and E)."""

from __future__ import annotations

import numpy as np
import pytest

from trainmem.catalog import load_model
from trainmem.engine import estimate_one
from trainmem.engine._data_parallel import unsharded_accumulated_gradient_bytes
from trainmem.engine._frameworks import FRAMEWORK_SPECS

M = load_model("llama-3-8b")
JOB = dict(
    micro_batch_size=4,
    seq_len=512,
    precision="bf16",
    optimizer="adamw",
    recompute="full",
    num_gpus=4,
    zero=3,
)


def test_the_formula_replaces_the_shards_by_the_whole_gradient() -> None:
    got = unsharded_accumulated_gradient_bytes(
        active=np.array([True, True, False]),
        trainable_numel=np.array([1000.0, 10.0, 1000.0]),
        element_bytes=2.0,
        gradient_bytes=np.array([500.0, 500.0, 500.0]),
    )
    # 2 bytes x 1000 whole, less the 500 of shards already counted; never negative; off: 0
    assert got.tolist() == [1500.0, 0.0, 0.0]


def test_which_stacks_accumulate_unsharded() -> None:
    """The stacks whose loops call no_sync / set_requires_gradient_sync(False) while they
    accumulate (each FrameworkSpec cites the file)."""
    on = {name for name, spec in FRAMEWORK_SPECS.items() if spec.fsdp_accumulates_unsharded}
    assert on == {"hf", "litgpt"}


@pytest.mark.parametrize("framework", ["litgpt", "hf"])
def test_accumulation_adds_the_unsharded_gradient_outside_the_optimizer_step(framework) -> None:
    one = estimate_one(M, **JOB, framework=framework, global_batch_size=16)
    four = estimate_one(M, **JOB, framework=framework, global_batch_size=64)
    whole = 2.0 * 8_030_261_248  # bf16, every parameter, unsharded
    # the forward peak grows by the whole gradient less nothing (no gradients at one micro-batch)
    assert four["peak_forward_bytes"] - one["peak_forward_bytes"] == pytest.approx(whole, rel=0.01)
    assert four["peak_optimizer_step_bytes"] == one["peak_optimizer_step_bytes"]
    # backward: the whole gradient instead of the shards (a quarter of it on 4 ranks) at most
    grown = four["peak_backward_bytes"] - one["peak_backward_bytes"]
    assert 0.7 * whole < grown <= whole


def test_stacks_that_reduce_every_micro_batch_are_unchanged() -> None:
    """torchtitan and torchtune reduce-scatter after every micro-batch: accumulation keeps
    only the gradient shards (as before)."""
    for framework in ("torchtitan", "torchtune"):
        one = estimate_one(M, **JOB, framework=framework, global_batch_size=16)
        four = estimate_one(M, **JOB, framework=framework, global_batch_size=64)
        shards = four["peak_forward_bytes"] - one["peak_forward_bytes"]
        assert shards < 0.3 * 2.0 * 8_030_261_248, framework


def test_one_rank_or_no_zero3_is_unchanged() -> None:
    """No FSDP (one GPU, or DDP): the gradients are whole anyway; nothing is added."""
    single = dict(JOB, num_gpus=1, zero=0, framework="litgpt")
    one = estimate_one(M, **single, global_batch_size=4)
    four = estimate_one(M, **single, global_batch_size=16)
    grads = four["peak_forward_bytes"] - one["peak_forward_bytes"]
    assert grads == pytest.approx(2.0 * 8_030_261_248, rel=0.01)  # the whole gradient, once
