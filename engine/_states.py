"""Model states per rank: parameters, master weights, gradients, optimizer states.

Tables are indexed by the grid's integer codes (see _grid.py), so every lookup is one numpy
fancy-index over the whole column.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._model import ModelSpec
from ._units import ALLOCATOR_BLOCK_BYTES, round_to_block

# Per precision code: fp32, bf16, fp16, amp-bf16, amp-fp16, mixed-bf16, mixed-fp16.
PARAM_BYTES = np.array([4, 2, 2, 4, 4, 2, 2], dtype=np.float64)
"""Working weights. amp keeps fp32 parameters (torch.autocast casts per op)."""
MASTER_BYTES = np.array([0, 0, 0, 0, 0, 4, 4], dtype=np.float64)
"""fp32 master copy kept by mixed-precision frameworks (DeepSpeed, Megatron)."""
GRAD_BYTES = np.array([4, 2, 2, 4, 4, 2, 2], dtype=np.float64)
"""Gradient dtype = parameter dtype, except where a framework keeps fp32 grads (see below)."""
STATE_BYTES = np.array([4, 2, 2, 4, 4, 4, 4], dtype=np.float64)
"""Optimizer-state element bytes: the dtype of the parameters the optimizer steps."""
COMPUTE_BYTES = np.array([4, 2, 2, 2, 2, 2, 2], dtype=np.float64)
"""Activation dtype of matmul outputs."""
RESIDUAL_BYTES = np.array([4, 2, 2, 4, 4, 2, 2], dtype=np.float64)
"""Residual-stream dtype: fp32 under autocast (fp32 embedding output + bf16 branch = fp32)."""
IS_AMP = np.array([0, 0, 0, 1, 1, 0, 0], dtype=bool)
IS_MIXED = np.array([0, 0, 0, 0, 0, 1, 1], dtype=bool)

# Per optimizer code: adamw, adamw-fused, adamw-8bit, sgd, sgd-momentum, adafactor, lion.
NUM_STATES = np.array([2, 2, 2, 0, 1, 0, 1], dtype=np.float64)
"""Full-size state tensors per parameter (Adafactor's factored moments are handled apart).

Source: torch/optim/adamw.py (exp_avg, exp_avg_sq), sgd.py (momentum_buffer), lion-pytorch
(exp_avg); bitsandbytes AdamW8bit (two uint8 states)."""
STEP_TEMP_STATES = np.array([1, 0, 0, 0, 0, 0, 1], dtype=np.float64)
"""Full-size temporaries of a foreach step, in state units.

Source: torch/optim/adamw.py `_multi_tensor_adamw`: `exp_avg_sq_sqrt = torch._foreach_sqrt(...)`
allocates one state-sized list per (device, dtype) group, the rest runs in place (ground truth:
+1x parameter bytes); fused and sgd allocate none (ground truth: 0)."""
EIGHT_BIT_STATE_BYTES = 1.0 + 4.0 / 256
"""bitsandbytes 8-bit blockwise state: 1 byte + an fp32 absmax per 256-element block.

Source: bitsandbytes/optim/optimizer.py (Optimizer8bit, block_wise=True, blocksize 256)."""
EIGHT_BIT_MIN_NUMEL = 4096
"""bitsandbytes keeps tensors under `min_8bit_size` = 4096 elements in 32-bit states."""
FUSED_STEP_TENSOR_BYTES = ALLOCATOR_BLOCK_BYTES
"""Fused AdamW keeps each parameter's `step` as a device fp32 scalar (one 512-byte block);
foreach keeps it on the CPU (torch/optim/adamw.py, `_get_scalar_dtype`, capturable/fused)."""


def _split_numel(shape: tuple[int, ...], split: str, tp: np.ndarray) -> np.ndarray:
    """Elements of one tensor on one tensor-parallel rank (dim padded up, as DTensor shards)."""
    rest = 1
    for d in shape[1:]:
        rest *= d
    if split in ("col", "vocab"):
        return np.ceil(shape[0] / tp) * rest
    if split == "row" and len(shape) == 2:
        return shape[0] * np.ceil(shape[1] / tp)
    return np.full(np.shape(tp), float(np.prod(shape)))


def local_param_numel(
    m: ModelSpec, *, tp, num_layers_local, first_stage, last_stage, shard, dp_shard
) -> dict[str, Any]:
    """Per-rank parameter elements and per-tensor-rounded bytes factors, by group.

    Returns numel (elements) for: total, embed, layer (one layer), final_head (final norm + head),
    replicated (tp-replicated tensors), and max_tensor (largest local tensor), plus
    `bytes_per_elem_rounded` helpers are applied by the caller through `round_to_block`.
    Sharding by ZeRO-3/FSDP (`shard`) splits each tensor's dim 0 over `dp_shard` ranks, padded.
    Source: torch.distributed.fsdp.fully_shard (FSDP2: per-parameter dim-0 sharding, padded).
    """
    zeros = np.zeros(np.shape(tp), dtype=np.float64)
    out = {
        "embed": zeros.copy(),
        "layer": zeros.copy(),
        "final_head": zeros.copy(),
        "replicated": zeros.copy(),
        "max_tensor": zeros.copy(),
        "num_tensors": zeros.copy(),
    }
    rounded: dict[str, list[np.ndarray]] = {"embed": [], "layer": [], "final_head": []}
    for p in m.param_tensors():
        n = _split_numel(p.shape, p.tp_split, tp)
        # FSDP2 shards each tensor's local dim 0 over the data-parallel ranks, padding it up;
        # a dim-0 row stays whole.
        dim0 = p.shape[0] if p.shape else 1
        local_dim0 = np.ceil(dim0 / tp) if p.tp_split in ("col", "vocab") else dim0
        per_row = n / local_dim0
        n = np.where(shard, np.ceil(local_dim0 / dp_shard) * per_row, n)
        if p.group == "embed":
            key, present, count = "embed", first_stage, 1.0
        elif p.group == "layer":
            key, present, count = "layer", True, 1.0
        else:
            key, present, count = "final_head", last_stage, 1.0
        n = np.where(present, n, 0.0)
        out[key] = out[key] + n * count
        rounded[key].append(n)
        if p.tp_split == "rep":
            mult = num_layers_local if p.group == "layer" else 1.0
            out["replicated"] = out["replicated"] + n * mult
        out["max_tensor"] = np.maximum(out["max_tensor"], n)
        out["num_tensors"] = out["num_tensors"] + np.where(
            n > 0, num_layers_local if p.group == "layer" else 1.0, 0.0
        )
    out["total"] = out["embed"] + out["layer"] * num_layers_local + out["final_head"]
    out["_tensors"] = rounded  # type: ignore[assignment]
    return out


def rounded_bytes(numel_by_tensor: dict, elem_bytes, num_layers_local) -> np.ndarray:
    """Sum of per-tensor bytes, each rounded to the allocator block (what memory_allocated sees)."""
    total: Any = 0.0
    for key, tensors in numel_by_tensor.items():
        mult = num_layers_local if key == "layer" else 1.0
        for n in tensors:
            total = total + round_to_block(n * elem_bytes) * mult
    return np.asarray(total)


def eight_bit_state_bytes(m: ModelSpec, numel_by_tensor: dict, num_layers_local) -> np.ndarray:
    """bitsandbytes AdamW8bit states: 8-bit blockwise for big tensors, fp32 for small ones."""
    total: Any = 0.0
    for key, tensors in numel_by_tensor.items():
        mult = num_layers_local if key == "layer" else 1.0
        for n in tensors:
            per = np.where(n >= EIGHT_BIT_MIN_NUMEL, EIGHT_BIT_STATE_BYTES, 4.0)
            total = total + 2.0 * round_to_block(n * per) * mult
    return np.asarray(total)


def adafactor_state_bytes(m: ModelSpec, *, numel_local, num_layers_local) -> np.ndarray:
    """Adafactor (transformers.optimization.Adafactor, beta1=None): factored second moment.

    Source: Shazeer & Stern 2018, Sec. 3: a 2-D [r, c] parameter keeps r + c fp32 accumulators,
    a 1-D one its full size; no first moment by default.
    Assumes: tensor parallel shards shrink the row/column factors proportionally.
    """
    full = 0.0
    factored = 0.0
    for p in m.param_tensors():
        mult = m.num_hidden_layers if p.group == "layer" else 1.0
        if len(p.shape) == 2:
            factored += (p.shape[0] + p.shape[1]) * mult
        else:
            full += p.numel * mult
    frac = numel_local / max(m.num_parameters, 1)
    return 4.0 * (factored + full) * frac
