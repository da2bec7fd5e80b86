"""Context parallelism (ring attention): the sequence split over `cp` ranks, K and V blocks

passed around the ring.

The activations of a micro-batch shrink to T = b s / cp tokens per rank
(engine/_rank_activations.py); what is left here is the ring's own buffers and traffic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ._collectives import exposed_s, group_bandwidth
from ._model import ModelSpec
from ._time_params import TimeParams

if TYPE_CHECKING:  # the step's shape and links (engine/_time.py imports this module)
    from ._time import Links, StepShape

KV_BLOCKS_IN_FLIGHT = 2.0
"""The peer's K and V blocks are double-buffered (one computing, one arriving)."""


def ring_buffer_bytes(m: ModelSpec, *, T, e, tp, cp) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) bytes of the ring's buffers on one rank: the peer's K and V blocks,
    double-buffered, and in backward their fp32 gradient accumulators.

    Source: torch.distributed.tensor.experimental context_parallel (_RingRotater /
    _templated_ring_attention).
    """
    k_and_v = 2.0
    cp_fwd = np.where(cp > 1, KV_BLOCKS_IN_FLIGHT * k_and_v * e * T * m.kv_dim / tp, 0.0)
    cp_bwd = cp_fwd + np.where(cp > 1, k_and_v * 4.0 * T * m.kv_dim / tp, 0.0)
    return cp_fwd, cp_bwd


def cp_exposed_s(
    m: ModelSpec, x: StepShape, links: Links, *, attention_s, params: TimeParams
) -> np.ndarray:
    """Exposed time of the ring exchange of K and V chunks of one step.

    Forward (c-1) chunks, backward K, V and their gradients, per layer and micro-batch, hidden
    behind `cp_overlap_fraction` of the attention core. Source: Liu et al. 2023 (Ring
    Attention) Sec. 3.
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
    cp_bw = group_bandwidth(c, t, gpn, intra, inter) * params.collective_bandwidth_efficiency
    kv_chunk = tokens_per_micro * 2.0 * m.kv_dim / t * act_bytes
    L = m.num_hidden_layers
    cp_s = (c - 1.0) * kv_chunk * (3.0 + full) * L / p * num_micro / cp_bw
    return exposed_s(cp_s, params.cp_overlap_fraction * attention_s, params)
