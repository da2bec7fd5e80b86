"""Pipeline parallelism: the blocks split over `pp` stages, micro-batches in flight (1F1B,
interleaved), receive buffers, the bubble and the point-to-point traffic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ._frameworks import PP_RECEIVE_BUFFER_PER_MICRO_BATCH
from ._model import ModelSpec
from ._vision_memory import vision_group_counts

if TYPE_CHECKING:  # the step's shape and links (engine/_time.py imports this module)
    from ._time import Links, StepShape

STAGE_ONLY, STAGE_FIRST, STAGE_MIDDLE, STAGE_LAST = 0, 1, 2, 3
"""Codes of a rank's stage position (the `stage_pos` column): the only stage (no pipeline),
the first, a middle or the last stage."""
RECEIVE_BUFFERS_MEGATRON = 2.0
"""Receive buffers per stage, as Megatron keeps them (two in flight), where a framework does not
allocate one per micro-batch (FrameworkSpec.pp_receive_buffer_per_micro_batch)."""


def stage_position(stage: np.ndarray, pp: np.ndarray) -> np.ndarray:
    """`stage_pos` codes of the 0-based `stage` of a pipeline of `pp` stages."""
    return np.where(
        pp <= 1,
        STAGE_ONLY,
        np.where(stage <= 0, STAGE_FIRST, np.where(stage >= pp - 1, STAGE_LAST, STAGE_MIDDLE)),
    ).astype(np.int8)


def stage_flags(c: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) stage flags from stage_pos: the only stage is both."""
    pos = c["stage_pos"]
    return (pos <= STAGE_FIRST), (pos == STAGE_ONLY) | (pos == STAGE_LAST)


def block_counts(m: ModelSpec, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Occurrences of each parameter group on this rank's pipeline stage.

    Assumes: blocks split evenly over stages (ceil(L/pp) on each); an MoE model's leading dense
    blocks sit on the first stage; a VLM's tower and projector on the first stage; Mllama's
    cross-attention blocks ceil(C/pp) on each.
    """
    first, last = stage_flags(c)
    layers = np.ceil(m.num_hidden_layers / c["pp"]).astype(np.float64)
    mlp = np.where(first, np.minimum(m.num_dense_layers, layers), 0.0) if m.is_moe else layers
    ones = np.ones_like(layers)
    counts = {
        "embed": np.where(first, ones, 0.0),
        "layer": layers,
        "mlp": mlp,
        "moe": layers - mlp if m.is_moe else 0.0 * layers,
        "final": np.where(last, ones, 0.0),
        "head": np.where(last, ones, 0.0),
    }
    if m.num_cross_attention_layers:  # spread over the stages like the blocks they are
        counts["cross"] = np.ceil(m.num_cross_attention_layers / c["pp"]).astype(np.float64)
    if m.vision is not None:  # the tower runs before the first block: the first stage
        counts.update(vision_group_counts(m, c, first, ones))
    return counts


def micro_batches_in_flight(*, pp, v, stage, num_micro, multi) -> np.ndarray:
    """Micro-batches whose activations stage `stage` holds at once.

    1F1B keeps min(pp - rank, m) micro-batches in flight on rank `stage`; interleaving (v
    virtual stages) multiplies the first stage's by 1 + (p - 1)/(p v). `multi`: pp > 1.
    Source: Narayanan et al. 2021, Sec. 2.2; Korthikanti et al. 2022, Sec. 4.2.2.
    """
    interleave = np.where(v > 1, 1.0 + (pp - 1.0) / (pp * v), 1.0)
    return np.where(
        multi,
        np.minimum(pp - stage, num_micro) * np.where(stage == 0, interleave, 1.0),
        1.0,
    )


def receive_buffer_bytes(one, *, fw) -> tuple[np.ndarray, np.ndarray]:
    """(per micro-batch, per stage) bytes of the activation receive buffers, `one` buffer's
    bytes each: one per micro-batch where the framework allocates so
    (FrameworkSpec.pp_receive_buffer_per_micro_batch: torch.distributed.pipelining), else two.
    Source: RECEIVE_BUFFERS_MEGATRON."""
    per_micro = PP_RECEIVE_BUFFER_PER_MICRO_BATCH[np.asarray(fw, dtype=np.int64)]
    return np.where(per_micro, one, 0.0), np.where(per_micro, 0.0, RECEIVE_BUFFERS_MEGATRON * one)


def held_logits_bytes(m: ModelSpec, *, T, e, pp, chunked, loss_tp_div) -> np.ndarray:
    """The last stage's output (the 16-bit logits), held by the schedule until its backward;
    a fused chunked loss has none. Source: torch.distributed.pipelining (a stage's outputs are
    kept for its backward step)."""
    return np.where((pp > 1) & ~chunked, e * T * m.vocab_size / loss_tp_div, 0.0)


def bubble_fraction(
    pp: np.ndarray | int, num_microbatches: np.ndarray | int, virtual_stages: np.ndarray | int
) -> np.ndarray:
    """Share of the step the pipeline sits idle: (p-1) / (m v + p - 1).

    Source: Narayanan et al. 2021 Sec. 2.2.1 (bubble / ideal time = (p-1)/m) and Sec. 2.2.2
    (interleaving divides it by v). Assumes: 1F1B, equal stages.
    """
    p = np.asarray(pp, dtype=np.float64)
    mv = np.asarray(num_microbatches, dtype=np.float64) * np.asarray(virtual_stages)
    return (p - 1.0) / (mv + p - 1.0)


def bubble_time_s(pipelined_s, x: StepShape) -> np.ndarray:
    """Pipeline fill and drain: (p-1)/(m v) of the work that runs in the pipeline.
    Source: bubble_fraction (bubble / ideal time)."""
    p, num_micro, v = x.p, x.num_micro, x.v
    return pipelined_s * (p - 1.0) / (num_micro * v)


def p2p_time_s(m: ModelSpec, x: StepShape, links: Links) -> np.ndarray:
    """Point-to-point traffic of one step: one activation per micro-batch and virtual stage each
    way, split over the TP ranks; across nodes when a stage spans whole nodes.

    Source: Narayanan et al. 2021 Sec. 4.1 (scatter/gather over the tensor-parallel ranks).
    Assumes: no overlap with compute.
    """
    n, p, v, t, num_micro = x.n, x.p, x.v, x.t, x.num_micro
    tokens_per_micro, act_bytes = x.tokens_per_micro, x.act_bytes
    gpn, intra, inter = links.network()
    pp_bw = np.where(n / p >= gpn, inter, intra)
    each_way = 2.0 * v * num_micro * tokens_per_micro * m.hidden_size * act_bytes
    return np.where(p > 1, each_way / t / pp_bw, 0.0)
