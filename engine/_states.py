"""The rank's parameter inventory: every parameter tensor's elements on one rank after tensor,
expert and ZeRO-3/FSDP sharding, and byte sums over it as the caching allocator sees them.

The techniques that shard are in their own modules (_tensor_parallel.py, _expert_parallel.py,
_data_parallel.py); the model states built on the inventory are assembled in _rank_states.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._data_parallel import zero3_shard_numel
from ._expert_parallel import expert_split
from ._lora import LORA_TARGETS as LORA_TARGETS  # re-exported (engine/__init__.py)
from ._lora import lora_mask as lora_mask  # re-exported (engine/_grid.py)
from ._lora import lora_num_parameters as lora_num_parameters  # re-exported
from ._model import ModelSpec, ParamTensor
from ._tensor_parallel import local_dim0, split_numel
from ._units import round_to_block


@dataclass(frozen=True, slots=True)
class LocalTensor:
    """One parameter tensor kind on one rank: its local elements per occurrence and how many
    occurrences the rank holds (e.g. blocks on the pipeline stage), per row."""

    tensor: ParamTensor
    numel: np.ndarray
    count: np.ndarray


def local_tensors(
    m: ModelSpec,
    *,
    tp,
    ep,
    counts: dict[str, np.ndarray],
    shard,
    dp_shard,
    etp=1.0,
) -> list[LocalTensor]:
    """Every parameter tensor's elements on one rank (tensor, expert and ZeRO-3/FSDP sharding).

    `counts` gives each group's occurrences on this rank (0 where the stage does not hold it).
    Expert tensors [E, ...] are divided over `ep` ranks, then like every tensor their local dim 0
    is sharded over the data-parallel ranks (experts: dp / ep) when `shard`, padded up.
    Source: torch.distributed.fsdp.fully_shard (FSDP2: per-parameter dim-0 sharding, padded);
    Megatron-Core expert parallelism (experts split over the EP group, data-parallel over the
    rest).
    """
    out = []
    for p in m.param_tensors():
        numel = split_numel(p.shape, p.tp_split, tp)
        dim0 = local_dim0(p, tp)
        group_dp = dp_shard
        if p.expert:
            numel, dim0, group_dp = expert_split(
                numel, p.shape[0], tp=tp, ep=ep, etp=etp, dp_shard=dp_shard
            )
        numel = zero3_shard_numel(numel, dim0, group_dp, shard)
        out.append(LocalTensor(p, numel, counts[p.group]))
    return out


def group_numel(items: list[LocalTensor], group: str) -> np.ndarray:
    """Local elements of one occurrence of a group (e.g. one block's attention)."""
    return sum((t.numel for t in items if t.tensor.group == group), np.zeros(1))


def total_numel(items: list[LocalTensor]) -> np.ndarray:
    return sum((t.numel * t.count for t in items), np.zeros(1))


def layer_numel(items: list[LocalTensor], counts: dict[str, np.ndarray]) -> np.ndarray:
    """Local elements of the stage's first block: attention and norms, and its dense MLP where
    the stage holds dense blocks, else its MoE block."""
    return group_numel(items, "layer") + np.where(
        counts["mlp"] > 0, group_numel(items, "mlp"), group_numel(items, "moe")
    )


def largest_layer_numel(items: list[LocalTensor], counts: dict[str, np.ndarray]) -> np.ndarray:
    """Local elements of the stage's largest block: attention and norms, and the larger of its
    dense MLP and its MoE block among those the stage holds (DeepSeek's first dense blocks
    beside its MoE ones: the MoE block's buffers are the ones alive at the peak)."""
    mlp = np.where(counts["mlp"] > 0, group_numel(items, "mlp"), 0.0)
    moe = np.where(counts["moe"] > 0, group_numel(items, "moe"), 0.0)
    return group_numel(items, "layer") + np.maximum(mlp, moe)


def rounded_bytes(items: list[LocalTensor], elem_bytes, *, where=None) -> np.ndarray:
    """Sum of per-tensor bytes, each rounded to the allocator block (what memory_allocated sees).

    `where(tensor)` (optional) returns a per-row mask of the tensors to include.
    """
    total: Any = 0.0
    for t in items:
        b = round_to_block(t.numel * elem_bytes) * t.count
        total = total + (b if where is None else np.where(where(t.tensor), b, 0.0))
    return np.asarray(total)


def rank_bytes(
    full: list[LocalTensor], part: list[LocalTensor], elem_bytes, sharded, *, where=None
) -> np.ndarray:
    """rounded_bytes of the rank's tensors: sharded (`part`) where `sharded`, else whole."""
    whole = rounded_bytes(full, elem_bytes, where=where)
    split = rounded_bytes(part, elem_bytes, where=where)
    return np.where(sharded, split, whole)
