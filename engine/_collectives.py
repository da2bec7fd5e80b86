"""Collective communication times: ring collectives, group bandwidth, overlap with compute.

The primitives the step-time terms of each parallelism (engine/_data_parallel.py,
_tensor_parallel.py, _context_parallel.py, ...) are built from.
"""

from __future__ import annotations

import numpy as np

from ._time_params import TimeParams


def ring_time_s(
    num_bytes: np.ndarray,
    group_size: np.ndarray,
    bytes_per_s: np.ndarray,
    *,
    all_reduce: bool | np.ndarray,
    params: TimeParams,
    num_calls: float | np.ndarray = 1.0,
) -> np.ndarray:
    """Ring collectives moving `num_bytes` (full, unsharded size) over `group_size` ranks.

    all-reduce 2(n-1)/n x bytes / bandwidth, all-gather or reduce-scatter (n-1)/n x bytes /
    bandwidth, plus a step latency per ring step of each of `num_calls` calls; 0 for one rank.
    Source: Patarasuk & Yuan 2009 (bandwidth-optimal ring all-reduce); nccl-tests
    doc/PERFORMANCE.md (bus bandwidth).
    """
    n = np.asarray(group_size, dtype=np.float64)
    passes = np.where(all_reduce, 2.0, 1.0)
    bw = np.asarray(bytes_per_s, dtype=np.float64) * params.collective_bandwidth_efficiency
    transfer = passes * (n - 1.0) / np.maximum(n, 1.0) * num_bytes / bw
    latency = num_calls * passes * (n - 1.0) * params.ring_step_latency_s
    return np.where(n > 1, transfer + latency, 0.0)


def group_bandwidth(
    group_size: np.ndarray,
    stride: np.ndarray,
    gpus_per_node: np.ndarray,
    intra: np.ndarray,
    inter: np.ndarray,
) -> np.ndarray:
    """Bus bandwidth per rank of a collective over `group_size` ranks spaced `stride` apart.

    Within one node: the intra-node link. Across nodes: the group's k ranks on a node each drive
    their own NIC (NCCL runs one ring per NIC), so node-to-node hops see k x the per-GPU network
    share, capped by the intra-node link. Source: NCCL multi-rail rings; DGX A100/H100 reference
    architecture (one compute HCA per GPU). Assumes: rail-optimized network, no SHARP, ranks
    numbered tp fastest, then cp, dp, pp (Megatron-LM's order).
    """
    span = np.asarray(group_size) * np.asarray(stride)
    k = np.clip(np.floor(np.asarray(gpus_per_node) / np.asarray(stride)), 1.0, group_size)
    return np.where(span <= gpus_per_node, intra, np.minimum(intra, inter * k))


def exposed_s(comm_s: np.ndarray, hideable_s: np.ndarray, params: TimeParams) -> np.ndarray:
    """What overlap leaves of `comm_s` run behind `hideable_s` of compute: the excess, plus
    `overlap_slowdown_fraction` of the hidden part. Source: TimeParams.overlap_slowdown_fraction.
    """
    hidden = np.minimum(comm_s, hideable_s)
    return comm_s - hidden + params.overlap_slowdown_fraction * hidden
