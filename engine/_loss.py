"""The loss: what the head and cross entropy keep and allocate, for the full loss (logits, their
fp32 copy and log-softmax) and a fused chunked one (`--loss chunked`, Liger-Kernel).

The loss runs on the last pipeline stage; the op-by-op tensors are in engine/_activations.py.
"""

from __future__ import annotations

import numpy as np

from ._activations import hf_loss_forward_extra_bytes, hf_outside_bytes
from ._model import ModelSpec

LOSS_GRADIENT_TENSORS = 2.0
"""Backward starts with the fp32 gradient of the log-softmax and of the logits: two fp32
[T, v] tensors (nll_loss_backward, then _log_softmax_backward_data)."""
PIPELINE_LOSS_INPUTS = 2.0
"""In a pipeline the schedule computes the loss apart (in its backward step); the last stage's
forward peaks just before the head writes the logits: two [T, h] tensors (ground truth, pp
rank 3)."""


def chunked_loss_bytes(m: ModelSpec, *, T, e, r, param_e, loss_tp_div, head_trainable) -> tuple:
    """(saved, transient) bytes of a fused linear + cross-entropy loss (`--loss chunked`).

    Source: Liger-Kernel LigerFusedLinearCrossEntropyFunction: the forward walks the tokens in
    chunks of next_power_of_2(ceil(T / ceil(V / H))) rows, computes each chunk's logits, loss and
    gradient at once, and keeps grad_input [T, h] and grad_weight [V, h] for backward; no
    [T, V] tensor outlives a chunk.
    """
    h, v = m.hidden_size, m.vocab_size
    T = np.asarray(T, dtype=np.float64)
    rows = np.ceil(T / np.ceil(v / h))
    chunk = np.minimum(T, 2.0 ** np.ceil(np.log2(np.maximum(rows, 1.0))))
    # grad_input in the hidden states' dtype; grad_weight = zeros_like(weight) (fp32 under amp).
    # grad_weight is the head's gradient, only earlier: it exists from the forward on.
    saved = r * T * h + np.where(head_trainable, param_e * v * h / loss_tp_div, 0.0)
    transient = (e + 4.0 + 4.0) * chunk * v / loss_tp_div
    return saved, transient


def outside_layers_bytes(
    m: ModelSpec, *, T, s, e, r, amp, tp, sp, loss_tp_div, chunked, param_e, head_trainable
) -> tuple[np.ndarray, np.ndarray]:
    """(saved outside the blocks, the chunked loss's transient) on the stage holding the head.

    The full loss saves the fp32 log-softmax [T, v]; the chunked one replaces it with its saved
    gradients (chunked_loss_bytes). Source: hf_outside_bytes, chunked_loss_bytes.
    """
    outside_all = hf_outside_bytes(
        m, T=T, s=s, e=e, r=r, amp=amp, tp=tp, sp=sp, loss_tp_div=loss_tp_div
    )
    chunk_saved, chunk_transient = chunked_loss_bytes(
        m, T=T, e=e, r=r, param_e=param_e, loss_tp_div=loss_tp_div, head_trainable=head_trainable
    )
    log_softmax = 4.0 * T * m.vocab_size / loss_tp_div
    outside_all = np.where(chunked, outside_all - log_softmax + chunk_saved, outside_all)
    return outside_all, chunk_transient


def loss_forward_extra_bytes(
    m: ModelSpec,
    *,
    T,
    e,
    r,
    amp,
    pp,
    last,
    chunked,
    loss_tp_div,
    logits_held,
    chunk_transient,
    zero_col,
) -> np.ndarray:
    """Transient bytes at the forward peak, at the loss (the last stage's only).

    Full loss: logits, their fp32 copy, the head input (hf_loss_forward_extra_bytes); chunked:
    one chunk's logits and gradients; in a pipeline, PIPELINE_LOSS_INPUTS [T, h] tensors less
    the held logits (counted in the stored activations).
    """
    full_loss_extra = hf_loss_forward_extra_bytes(
        m, T=T, e=e, r=r, amp=amp, loss_tp_div=loss_tp_div
    )
    loss_extra = np.where(
        pp > 1,
        PIPELINE_LOSS_INPUTS * e * T * m.hidden_size - logits_held,
        np.where(chunked, chunk_transient, full_loss_extra),
    )
    return np.where(last, loss_extra, zero_col)


def loss_gradient_bytes(
    m: ModelSpec, *, T, e, pp, last, chunked, loss_tp_div, sp_div, zero_col
) -> np.ndarray:
    """Transient bytes at the start of backward: the loss gradients (LOSS_GRADIENT_TENSORS fp32
    [T, v]; a fused chunked loss computed them in forward) and, on a pipeline's last stage, the
    gradient sent to the previous stage ([T, h] in the compute dtype)."""
    loss_grads = np.where(
        last & ~chunked, LOSS_GRADIENT_TENSORS * 4.0 * T * m.vocab_size / loss_tp_div, zero_col
    )
    return loss_grads + np.where(last & (pp > 1), e * T * m.hidden_size / sp_div, 0.0)
