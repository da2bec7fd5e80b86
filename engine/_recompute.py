"""Activation recomputation (checkpointing): what each policy keeps for backward, what it brings
back while a layer recomputes, and the forward FLOPs it repeats.

Policies: none; selective (the attention core is recomputed, Korthikanti et al. 2022 Sec. 5);
full (only each block's input is kept, the block runs forward again in backward).
"""

from __future__ import annotations

import numpy as np

from ._codes import RECOMPUTE_FULL, RECOMPUTE_NONE, RECOMPUTE_SELECTIVE
from ._model import ModelSpec


def attention_core_bytes(m: ModelSpec, *, T, s, e, tp, eager) -> np.ndarray:
    """Bytes of the attention core one layer saves: what selective recomputation drops.

    Flash: the attention output and the fp32 logsumexp [b, a, s]; eager adds the fp32 softmax
    (and its 16-bit cast) over a s x s scores per sequence.
    Source: Korthikanti et al. 2022 Sec. 5 (selective activation recomputation of the core
    attention); hf_attention_bytes for the tensors.
    """
    a_r = m.num_attention_heads / tp
    flash_core = e * T * m.o_dim / tp + 4.0 * a_r * T
    eager_core = flash_core + (4.0 + np.where(e < 4, e, 0.0)) * a_r * s * T
    return np.where(eager, eager_core, flash_core)


def saved_blocks_bytes(rc, *, blocks, core, checkpointed, num_layers) -> np.ndarray:
    """Bytes the stage's `num_layers` blocks keep for backward under policy `rc`: all of
    `blocks` (none), less each layer's attention `core` (selective), each layer's
    `checkpointed` input only (full)."""
    return np.where(
        rc == RECOMPUTE_FULL,
        checkpointed * num_layers,
        np.where(rc == RECOMPUTE_SELECTIVE, blocks - core * num_layers, blocks),
    )


def recompute_excess_bytes(
    rc, *, multi, last, layer_recomputed, core, outside, rope, zero_col
) -> np.ndarray:
    """What a pipeline stage recomputing one layer in backward holds beyond what is stored, the
    loss tensors being freed by then: the excess over `outside` less the `rope` tables, if any.

    Full recompute brings back a whole layer (`layer_recomputed`: the framework's own
    no-recompute layer); selective the attention core of one layer.
    Assumes: one layer recomputes at a time, after the stage's loss tensors are freed.
    """
    return np.where(
        multi & (rc != RECOMPUTE_NONE),
        np.maximum(
            np.where(rc == RECOMPUTE_FULL, layer_recomputed, core)
            - np.where(last, outside - rope, zero_col),
            0.0,
        ),
        0.0,
    )


def recompute_flop_factors(recompute) -> tuple[np.ndarray, np.ndarray]:
    """(full, attention) as 0/1 floats: whether the blocks' forward runs again (full) and
    whether the attention core does (full or selective)."""
    full = (recompute == RECOMPUTE_FULL).astype(np.float64)
    return full, (recompute != RECOMPUTE_NONE).astype(np.float64)
