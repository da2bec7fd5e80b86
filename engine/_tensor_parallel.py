"""Tensor parallelism (and sequence parallelism): how weights, activations, the loss and the
step time split over the `tp` ranks of a layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ._codes import LOSS_VOCAB_PARALLEL
from ._collectives import ring_time_s
from ._frameworks import (
    LOSS_PARALLEL,
    TP_EMBEDDING_GRAD_REPLICATED,
    TP_NORMS_PLAIN_TENSORS,
    TP_SEQUENCE_PARALLEL,
)
from ._model import ModelSpec, ParamTensor
from ._time_params import TimeParams

if TYPE_CHECKING:  # the step's shape and links (engine/_time.py imports this module)
    from ._time import Links, StepShape

if TYPE_CHECKING:
    from ._states import LocalTensor

TP_COLLECTIVES_PER_LAYER = 4.0
"""Tensor-parallel all-reduces per layer and micro-batch: 2 forward, 2 backward (+2 when the
forward is recomputed). Source: Narayanan et al. 2021 Sec. 3.2 (the f and g operators)."""


def split_numel(shape: tuple[int, ...], split: str, tp) -> np.ndarray:
    """Elements of one tensor on one tensor-parallel rank (dim padded up, as DTensor shards)."""
    rest = 1
    for d in shape[1:]:
        rest *= d
    if split in ("col", "vocab"):
        return np.ceil(shape[0] / tp) * rest
    if split == "row" and len(shape) == 2:
        return shape[0] * np.ceil(shape[1] / tp)
    return np.full(np.shape(tp), float(np.prod(shape)))


def local_dim0(p: ParamTensor, tp) -> np.ndarray:
    """A tensor's dim 0 on one tensor-parallel rank (what ZeRO-3/FSDP then shard)."""
    dim0 = p.shape[0] if p.shape else 1
    if p.tp_split in ("col", "vocab"):
        return np.ceil(dim0 / tp)
    return dim0 * np.ones_like(np.asarray(tp, dtype=np.float64))


def sequence_parallel_on(sequence_parallel, tp, fw) -> np.ndarray:
    """Whether rows run sequence parallelism: tensor parallelism (tp > 1) with
    `--sequence-parallel`, or under a framework whose TP is sequence-parallel by default
    (FrameworkSpec.tp_sequence_parallel: torchtitan). The one definition the numpy, scalar and
    compiled paths and the step-time model read.
    Ignores: turning a framework's default off (torchtitan's
    --parallelism.no-enable-sequence-parallel has no flag here; its TOML reader says so)."""
    on = np.asarray(sequence_parallel, dtype=bool) | TP_SEQUENCE_PARALLEL[np.asarray(fw)]
    return on & (np.asarray(tp) > 1)


def sequence_parallel_divisor(sp, tp) -> np.ndarray:
    """What divides the norms' and residuals' activations: tp with sequence parallelism, else 1.

    Source: Korthikanti et al. 2022, Sec. 4.2.2 (sequence parallelism splits the LayerNorm and
    dropout regions over the tensor-parallel ranks).
    """
    return np.where(sp, tp, 1.0)


def loss_tp_divisor(fw, tp, loss=None) -> np.ndarray:
    """What divides the logits and loss tensors: tp where the framework computes a
    vocab-parallel loss (FrameworkSpec.loss_parallel: Megatron, torchtitan) or the row asks
    for one (`loss`, the resolved LOSSES code: `--loss vocab-parallel`), else 1 (HF tp_plan
    and torchtune gather the logits).

    Source: megatron/core/tensor_parallel/cross_entropy.py (vocab_parallel_cross_entropy);
    torchtitan 0.3.0 torchtitan/components/loss.py (_LossParallelCrossEntropy on Shard(-1)
    logits).
    """
    parallel = LOSS_PARALLEL[np.asarray(fw, dtype=np.int64)]
    if loss is not None:
        parallel = parallel | (np.asarray(loss) == LOSS_VOCAB_PARALLEL)
    return np.where(parallel, tp, 1.0)


def hf_embedding_gradient_bytes(
    m: ModelSpec, full: Sequence[LocalTensor], *, fw, tp, grads_sharded, first, grad_e, last=False
) -> np.ndarray:
    """Extra gradient bytes of HF tensor parallelism (FrameworkSpec.tp_embedding_grad_replicated):
    a vocab-sharded embedding's gradient comes out full size on every rank of the first stage
    (unless ZeRO-2+ shards gradients), except where a tied head on the same rank (`last`)
    already holds the sharded gradient.

    Source: torch/distributed/tensor/_ops/_embedding_ops.py (the embedding backward's gradient
    is replicated, the Shard(0) gradient a view of it: its storage is the whole table); a tied
    weight's gradient is accumulated into the head's, already sharded
    (torch/csrc/autograd/functions/accumulate_grad.h). Traced: bench/conformance_tp.py (tied
    llama tp=2 sp: the sharded size).
    """
    emb_local = sum((t.numel for t in full if t.tensor.group == "embed"), np.zeros(1))
    return np.where(
        TP_EMBEDDING_GRAD_REPLICATED[np.asarray(fw, dtype=np.int64)]
        & (tp > 1)
        & ~grads_sharded
        & first
        & ~(m.tie_word_embeddings & last),
        (m.num_parameters_in("embed") - emb_local) * grad_e,
        0.0,
    )


def hf_tied_embedding_backward_bytes(m: ModelSpec, full: Sequence[LocalTensor], *, fw, tp, grad_e):
    """What a vocab-sharded, tied embedding's backward holds beyond the two local-size copies
    that _rank_states.TIED_GRAD_COPIES counts: the embedding's gradient is computed full size,
    then its Shard(0) slice copied out (local) and added into the head's (local).

    Source: torch/distributed/tensor/_ops/_embedding_ops.py (replicated embedding gradient,
    redistributed to Shard(0)); traced: bench/conformance_tp.py (tied llama, tp 2 and 4,
    sequence parallel: embedding_dense_backward of the whole table, then a clone and an add of
    the local shard). Where: FrameworkSpec.tp_embedding_grad_replicated.
    """
    replicated = TP_EMBEDDING_GRAD_REPLICATED[np.asarray(fw, dtype=np.int64)]
    whole = m.num_parameters_in("embed")
    emb_local = sum((t.numel for t in full if t.tensor.group == "embed"), np.zeros(1))
    return np.where(
        replicated & (tp > 1) & m.tie_word_embeddings & (emb_local < whole), whole * grad_e, 0.0
    )


def hf_replicated_group_numel(
    full: Sequence[LocalTensor], *, fw, tp, sp, states_sharded, lora, dp: np.ndarray
) -> np.ndarray:
    """Elements of the replicated tensors (norms) that HF TP without SP keeps as plain tensors:
    a separate, smaller (device, dtype) group of the foreach optimizer step.

    Source: the foreach step runs one group of tensors at a time (torch/optim/optimizer.py
    `_group_tensors_by_device_and_dtype`); HF TP without SP keeps the replicated norms as plain
    tensors, apart from the sharded ones (FrameworkSpec.tp_norms_plain_tensors).
    """
    replicated = sum(
        (t.numel * t.count for t in full if t.tensor.tp_split == "rep" and not t.tensor.expert),
        np.zeros_like(dp),
    )
    plain = TP_NORMS_PLAIN_TENSORS[np.asarray(fw, dtype=np.int64)]
    return np.where(plain & (tp > 1) & ~sp & ~states_sharded & ~lora, replicated, 0.0)


def tp_exposed_s(m: ModelSpec, x: StepShape, links: Links, *, params: TimeParams) -> np.ndarray:
    """Exposed time of the tensor-parallel collectives of one step.

    Per layer and micro-batch 2 all-reduces forward, 2 backward, +2 recomputed, of b s h
    activations (SP: all-gather + reduce-scatter, the same bytes); across nodes the per-GPU
    network share. Source: Narayanan et al. 2021 Sec. 3.2; Korthikanti et al. 2022 Sec. 4.2.
    Assumes: `tp_overlap_fraction` of it hidden (0 without async TP).
    """
    tokens_per_micro, act_bytes, t, p, num_micro, full = (
        x.tokens_per_micro,
        x.act_bytes,
        x.t,
        x.p,
        x.num_micro,
        x.full,
    )
    gpn, intra, inter = links.network()
    tp_bw = np.where(t > gpn, inter, intra)
    tp_one = ring_time_s(
        tokens_per_micro * m.hidden_size * act_bytes, t, tp_bw, all_reduce=True, params=params
    )
    calls = (TP_COLLECTIVES_PER_LAYER + 2.0 * full) * m.num_hidden_layers
    return calls / p * num_micro * tp_one * (1.0 - params.tp_overlap_fraction)
