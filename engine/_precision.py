"""Mixed precision: the element sizes of each precision recipe, and autocast's weight copies.

One `Precision` per name of the vocabulary (engine/_vocab.py PRECISIONS); the per-code tables
the formulas index with a precision column are derived from them, in vocabulary order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._model import ModelSpec
from ._vocab import PRECISIONS


@dataclass(frozen=True, slots=True, kw_only=True)
class Precision:
    """Bytes per element of each tensor kind under one precision recipe."""

    param_bytes: float
    """Working weights. amp keeps fp32 parameters (torch.autocast casts per op)."""
    master_bytes: float
    """fp32 master copy kept by mixed-precision frameworks (DeepSpeed, Megatron, TE recipes)."""
    grad_bytes: float
    """Gradient dtype = parameter dtype, except where a framework keeps fp32 grads
    (engine/_data_parallel.py `model_state_element_bytes`)."""
    state_bytes: float
    """Optimizer-state element bytes: the dtype of the parameters the optimizer steps."""
    compute_bytes: float
    """Activation dtype of matmul outputs (fp8 recipes keep activations in bf16, _fp8.py)."""
    residual_bytes: float
    """Residual-stream dtype: fp32 under autocast (fp32 embedding output + bf16 branch = fp32)."""
    autocast: bool = False
    """torch.autocast over fp32 parameters."""
    mixed: bool = False
    """16-bit parameters with an fp32 master copy."""
    fp8: bool = False
    """Quantized block GEMMs (Transformer Engine / torchao recipes: fp8-mixed, mxfp8, nvfp4),
    see _fp8.py and _mx.py."""
    fp4: bool = False
    """The quantized GEMMs run at the fp4 rate (nvfp4), not the fp8 one."""


_FP32 = Precision(param_bytes=4, master_bytes=0, grad_bytes=4, state_bytes=4, compute_bytes=4,
                  residual_bytes=4)  # fmt: skip
_PURE_16 = Precision(param_bytes=2, master_bytes=0, grad_bytes=2, state_bytes=2, compute_bytes=2,
                     residual_bytes=2)  # fmt: skip
_AMP = Precision(param_bytes=4, master_bytes=0, grad_bytes=4, state_bytes=4, compute_bytes=2,
                 residual_bytes=4, autocast=True)  # fmt: skip
_MIXED = Precision(param_bytes=2, master_bytes=4, grad_bytes=2, state_bytes=4, compute_bytes=2,
                   residual_bytes=2, mixed=True)  # fmt: skip
_FP8 = Precision(param_bytes=2, master_bytes=4, grad_bytes=2, state_bytes=4, compute_bytes=2,
                 residual_bytes=2, mixed=True, fp8=True)  # fmt: skip
_NVFP4 = Precision(param_bytes=2, master_bytes=4, grad_bytes=2, state_bytes=4, compute_bytes=2,
                   residual_bytes=2, mixed=True, fp8=True, fp4=True)  # fmt: skip

PRECISION_SPECS: dict[str, Precision] = {
    "fp32": _FP32,
    "bf16": _PURE_16,
    "fp16": _PURE_16,
    "amp-bf16": _AMP,
    "amp-fp16": _AMP,
    "mixed-bf16": _MIXED,
    "mixed-fp16": _MIXED,
    "fp8-mixed": _FP8,
    "mxfp8": _FP8,
    "nvfp4": _NVFP4,
}
"""Every precision of the vocabulary by name."""

assert tuple(PRECISION_SPECS) == PRECISIONS, "one Precision per PRECISIONS name, in order"

PRECISION_RATES: dict[str, tuple[str, ...]] = {
    "fp32": ("fp32",),
    "bf16": ("bf16",),
    "fp16": ("fp16",),
    "amp-bf16": ("bf16",),
    "amp-fp16": ("fp16",),
    "mixed-bf16": ("bf16",),
    "mixed-fp16": ("fp16",),
    "fp8-mixed": ("fp8", "bf16"),
    "mxfp8": ("fp8", "bf16"),
    "nvfp4": ("fp4", "bf16"),
}
"""The matmul formats each precision runs, as a GPU profile's rate fields name them
(`<format>_flops`): a GPU whose rate of one of them is 0 cannot run the precision (V100 and T4
have no bf16, A100 no fp8). fp8 recipes run their other matmuls in bf16 (_fp8.py), and so do
the block-scaled ones (_mx.py), which need Blackwell's architecture besides (_mx.SM_RANGES)."""

assert tuple(PRECISION_RATES) == PRECISIONS, "one entry per PRECISIONS name, in order"


def _table(field: str, dtype: type = np.float64) -> np.ndarray:
    """One field of every Precision, indexed by precision code."""
    return np.array([getattr(PRECISION_SPECS[name], field) for name in PRECISIONS], dtype=dtype)


PARAM_BYTES = _table("param_bytes")
MASTER_BYTES = _table("master_bytes")
GRAD_BYTES = _table("grad_bytes")
STATE_BYTES = _table("state_bytes")
COMPUTE_BYTES = _table("compute_bytes")
RESIDUAL_BYTES = _table("residual_bytes")
IS_AMP = _table("autocast", bool)
IS_MIXED = _table("mixed", bool)
IS_FP8 = _table("fp8", bool)
IS_FP4 = _table("fp4", bool)

AUTOCAST_COPY_BYTES = 2.0
"""Bytes per element of autocast's cached 16-bit copy of an fp32 weight."""


def autocast_weight_copy_bytes(
    m: ModelSpec, *, amp, last, tp, num_layers, num_mlp, num_moe, full_recompute
) -> tuple[np.ndarray, np.ndarray]:
    """(saved copies, copies of the layers) of autocast's 16-bit weight casts on one rank.

    Source: aten/src/ATen/autocast_mode.cpp `cached_cast` (the 16-bit cast of an fp32 leaf
    weight is cached until the autocast region exits: from a weight's first use in forward to
    the end of backward; only for a weight that requires grad, so a frozen LoRA base, and a
    QLoRA base that is not an fp32 leaf at all, is cast per use and cached nothing: pass `amp`
    false for those rows); the ground-truth traces: with checkpointing (full recompute) only the
    head's copy stays, the layers' come back while a block recomputes (returned apart).
    Assumes: every 2-D weight of a block is a linear's, split over the tensor-parallel ranks;
    the adapters' own copies (r (d_in + d_out) each) are left out.
    """

    def linear_numel(group: str) -> int:
        return sum(p.numel for p in m.param_tensors() if p.group == group and len(p.shape) == 2)

    copies_layers = np.where(
        amp,
        AUTOCAST_COPY_BYTES
        * (
            linear_numel("layer") * num_layers
            + linear_numel("mlp") * num_mlp
            + linear_numel("moe") * num_moe
        )
        / tp,
        0.0,
    )
    copies_head = np.where(amp & last, AUTOCAST_COPY_BYTES * m.vocab_size * m.hidden_size / tp, 0.0)
    return np.where(full_recompute, copies_head, copies_layers + copies_head), copies_layers


AUTOCAST_BYTES_PER_WEIGHT = 6.0
"""HBM bytes torch.autocast moves per fp32 GEMM weight per forward pass: read 4, write the 16-bit
copy 2 (cached within the pass). Its backward writes the 16-bit weight gradient (2), reads it
and writes the fp32 .grad (2 + 4): 8 more. Source: torch.autocast's cast policy (CUDA ops list)."""
AUTOCAST_GRAD_BYTES_PER_WEIGHT = 8.0
"""The backward's 8 bytes of AUTOCAST_BYTES_PER_WEIGHT (none for frozen LoRA base weights)."""


def autocast_traffic_bytes_per_weight(amp, *, full, lora) -> np.ndarray:
    """HBM bytes autocast moves per GEMM weight and micro-batch: the 16-bit casts of each
    forward (again when recomputed, `full`), the weight gradient's cast back to fp32.
    Source: AUTOCAST_BYTES_PER_WEIGHT."""
    return np.where(
        amp,
        AUTOCAST_BYTES_PER_WEIGHT * (1.0 + full) + AUTOCAST_GRAD_BYTES_PER_WEIGHT * (lora == 0),
        0.0,
    )
