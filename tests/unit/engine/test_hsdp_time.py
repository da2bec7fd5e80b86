"""HSDP in the step time (engine/_data_parallel.py fsdp_exposed_s, hsdp_replica_all_reduce_s):
the gathers and reduce-scatters inside the shard group, the gradient shards all-reduced over
the replicas. Issue "what a user meets": `--dp-shard` used to give full sharding's step time."""

from __future__ import annotations

import pytest

from trainmem.catalog import load_model
from trainmem.engine import estimate_time, make_grid, time_inputs
from trainmem.hardware import get_gpu

H100 = time_inputs(get_gpu("h100-sxm-80gb"))
M = load_model("llama-3.1-70b")
JOB = dict(
    num_gpus=64, zero=3, micro_batch_size=1, seq_len=8192, recompute="full",
    precision="mixed-bf16", framework="torchtitan",
)  # fmt: skip


def _fsdp_s(dp_shard: int, **gpu: float) -> float:
    out = estimate_time(M, make_grid({**JOB, "dp_shard": dp_shard}), **{**H100, **gpu})
    return float(out["fsdp_exposed_s"][0])


def test_one_replica_is_full_sharding() -> None:
    assert _fsdp_s(64) == _fsdp_s(0)


def test_hsdp_changes_the_fsdp_traffic() -> None:
    assert _fsdp_s(8) != pytest.approx(_fsdp_s(0), rel=1e-3)


def test_on_a_slow_network_hsdp_crosses_nodes_less() -> None:
    """Full sharding over 8 nodes sends every gather and reduce-scatter across nodes; 8-way
    shard groups inside each node send only the gradient shards' all-reduce (an eighth of
    the volume, twice): on a network 20x slower than the default it is the faster layout."""
    slow = {"inter_node_bytes_per_s": H100["inter_node_bytes_per_s"] / 20}
    assert _fsdp_s(8, **slow) < _fsdp_s(0, **slow)
    # and the slower network costs full sharding more than HSDP
    assert _fsdp_s(0, **slow) - _fsdp_s(0) > _fsdp_s(8, **slow) - _fsdp_s(8)
