"""Expert parallelism (and expert tensor parallelism): the routed experts of an MoE block split
over `ep` ranks, each expert's width over `etp`; the all-to-all token exchange.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ._model import ModelSpec
from ._time_params import TimeParams

if TYPE_CHECKING:  # the step's shape and links (engine/_time.py imports this module)
    from ._time import Links, StepShape

ALL_TO_ALLS_PER_LAYER = 4.0
"""All-to-alls per MoE layer and micro-batch: dispatch and combine forward, both again backward
(+2 when the forward is recomputed). Source: Lepikhin et al. 2021 (GShard) Sec. 2.2;
Megatron-Core MoE token dispatcher."""
ALL_TO_ALL_BUFFERS = 2.0
"""Device buffers of the routed tokens in flight: the dispatch and the combine output."""


def expert_split(
    numel: np.ndarray, dim0: int, *, tp, ep, etp, dp_shard
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(elements, local dim 0, data-parallel shard group) of a routed-experts tensor [E, ...].

    Expert parallelism splits the experts (dim 0) over `ep` ranks; expert tensor parallelism
    each expert's intermediate dimension over `etp`; the remaining dp / ep ranks are the
    experts' data-parallel group (at least 1). `numel`: the tensor's elements after tensor
    parallelism (experts are replicated over tp).
    Source: Megatron-Core expert parallelism (experts split over the EP group, data-parallel
    over the rest; expert_tensor_parallel_size).
    """
    local_dim0 = np.ceil(dim0 / ep) * np.ones_like(np.asarray(tp, dtype=np.float64))
    numel = numel / dim0 * local_dim0 / etp
    return numel, local_dim0, np.maximum(dp_shard / ep, 1.0)


def routed_rows(m: ModelSpec, *, T, capacity) -> np.ndarray:
    """Token copies the experts process per micro-batch: T x top_k, padded to `capacity` x
    that (token-dropping routers) when `capacity` > 0."""
    return T * m.num_experts_per_tok * np.where(capacity > 0, capacity, 1.0)


def all_to_all_buffer_bytes(m: ModelSpec, *, rows, e, ep, num_moe) -> np.ndarray:
    """Bytes of the all-to-all dispatch and combine buffers of the routed tokens (`rows` token
    copies of width h in the compute dtype), on a rank whose stage holds MoE blocks.

    Source: Megatron-Core MoE token dispatcher (alltoall: permuted tokens out and back).
    Assumes: balanced routing (every rank receives rows / ep from each peer).
    """
    return np.where((ep > 1) & (num_moe > 0), ALL_TO_ALL_BUFFERS * e * rows * m.hidden_size, 0.0)


def expert_exposed_s(m: ModelSpec, x: StepShape, links: Links, *, params: TimeParams) -> np.ndarray:
    """Time of the expert all-to-alls of one step, all exposed.

    Per MoE layer and micro-batch an all-to-all dispatch and combine forward, both again
    backward (+ recomputed), of the top-k token copies; the ep ranks are dp ranks, across nodes
    when ep x tp x cp exceeds a node. Source: ALL_TO_ALLS_PER_LAYER.
    Assumes: balanced routing; no overlap with compute.
    """
    tokens_per_micro, act_bytes, t, c, p, num_micro, full = (
        x.tokens_per_micro,
        x.act_bytes,
        x.t,
        x.c,
        x.p,
        x.num_micro,
        x.full,
    )
    gpn, intra, inter = links.network()
    ep = np.maximum(x.ep, 1).astype(np.float64)
    ep_bw = np.where(ep * t * c > gpn, inter, intra) * params.collective_bandwidth_efficiency
    a2a_bytes = tokens_per_micro * m.num_experts_per_tok * m.hidden_size * act_bytes
    a2a_one = (ep - 1.0) / ep * a2a_bytes / ep_bw + (ep - 1.0) * params.ring_step_latency_s
    moe_layers = m.num_moe_layers / p
    calls = ALL_TO_ALLS_PER_LAYER + 2.0 * full
    return np.where(ep > 1, calls * moe_layers * num_micro * a2a_one, 0.0)
