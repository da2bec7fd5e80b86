"""Activation terms of one micro-batch on one rank for a traced profile (family "profile").

The same keys as _rank_activations.activation_terms, from the profile's coefficients instead of
the op-by-op formulas. Rows the profile is not valid for carry a `reason` (_estimate.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ._model import ModelSpec
from ._offload import offloaded_activation_bytes
from ._pipeline import block_counts, receive_buffer_bytes, stage_flags
from ._precision import COMPUTE_BYTES

if TYPE_CHECKING:
    from ._activation_profile import Coefficients

BACKWARD_END_LAYERS = 2.0
"""Layers' worth of activation bytes alive at the end of backward: layer 0's saved tensors and
as many bytes of gradients in flight through it. Assumes: a layer's backward temporaries are
about its saved activations (the Llama ground truth: 0.8x to 1.3x)."""


def profile_bytes(k: Coefficients, *, b: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Bytes of one term for a micro-batch of b sequences of length s, without the constant.

    Source: the profile format (engine/_activation_profile.py): b (per_token s + per_token_sq s^2).
    """
    return b * (k.per_token * s + k.per_token_sq * s * s)


def profile_activation_terms(m: ModelSpec, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Activation bytes of one micro-batch on one stage, and the step's transients, from the
    profile's coefficients.

    Per layer: the coefficients x the layers on this stage. Outside the layers, and the transient:
    on the last pipeline stage, which holds the head and the loss (a profile does not split them
    from the embedding's, whose saved input ids are small). The size-independent `constant`
    parts are counted once per stage, not per micro-batch in flight (they are weight copies, not
    a micro-batch's tensors).
    Assumes: the row matches the profile's valid_for, tp = cp = 1 (else its reason says so);
    pipeline receive buffers of hidden_size values per token in the compute dtype.
    """
    p = m.profile
    assert p is not None, "profile_activation_terms needs a profile model"
    prec = c["precision"].astype(np.int64)
    b = c["micro_batch_size"].astype(np.float64)
    s = c["seq_len"].astype(np.float64)
    pp = c["pp"].astype(np.float64)
    fw = c["framework"].astype(np.int64)
    _, last = stage_flags(c)
    num_layers_local = block_counts(m, c)["layer"]
    per_layer = profile_bytes(p.per_layer, b=b, s=s)
    outside = np.where(last, profile_bytes(p.outside_layers, b=b, s=s), 0.0)
    constant = num_layers_local * p.per_layer.constant + np.where(
        last, p.outside_layers.constant, 0.0
    )
    transient = profile_bytes(p.transient, b=b, s=s) + p.transient.constant
    stage_layers = per_layer * num_layers_local
    offloaded = offloaded_activation_bytes(
        per_layer, num_layers=num_layers_local, enabled=c["activation_offload"]
    )
    stage_act = stage_layers + outside - offloaded
    # The loss's transients (forward, start of backward) are the last stage's; the end of
    # backward (a layer's recomputation and gradients) happens on every stage.
    forward = p.transient_phase == "forward"
    end = p.transient_phase == "backward_end"
    transient = np.where(last | end, transient, 0.0)
    zero_col = np.zeros_like(b)
    pipe_one = np.where(pp > 1, COMPUTE_BYTES[prec] * b * s * m.hidden_size, 0.0)
    pipe_per_micro, pipe_fixed = receive_buffer_bytes(pipe_one, fw=fw)
    return {
        "activations_per_layer": per_layer,
        "activations_outside_layers": outside,
        "activations_autocast_weight_copies": constant,
        "activations_offloaded": offloaded,
        "stage_act": stage_act,
        "small": zero_col,
        "step_held": zero_col,
        "fwd_extra": transient if forward else zero_col,
        "fwd_block_extra": np.full_like(b, -np.inf),
        "bwd_start_extra": transient if not (forward or end) else zero_col,
        "bwd_end_extra": (transient if end else BACKWARD_END_LAYERS * per_layer) - stage_act,
        "embed_extra": np.full_like(b, -np.inf),  # in the fitted transient (tied: twice)
        "recompute_excess": zero_col,
        "recompute_extra": np.full_like(b, -np.inf),
        "pipe_per_micro": pipe_per_micro,
        "pipe_fixed": pipe_fixed,
        "largest_block": zero_col,  # a profile names no tensor: the fraction's only
    }
