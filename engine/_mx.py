"""Block-scaled low-precision recipes: MXFP8 and NVFP4 (Blackwell tensor cores).

Both recipes are `fp8-mixed` in shape (engine/_precision.py: bf16 parameters and gradients, an
fp32 master copy and fp32 Adam states under the mixed-precision frameworks; the block linears'
GEMMs quantized, the embedding, the head, the attention core and the norms in bf16), with other
element sizes for the quantized copies and no delayed-scaling history:

- `mxfp8`: Transformer Engine `MXFP8BlockScaling` (E4M3 data, one E8M0 scale per 32 consecutive
  elements, row-wise and column-wise copies each quantized from the bf16 tensor) or torchao's MX
  training (torchao/prototype/moe_training/mxfp8_linear.py `mx_mm`); the GEMMs at the fp8 rate.
- `nvfp4`: Transformer Engine `NVFP4BlockScaling` (E2M1 data, 2 elements a byte, one E4M3 scale
  per 16 elements and an fp32 per-tensor amax/scale; weights 16x16 2-D block scaled, a random
  Hadamard transform on the wgrad GEMM's inputs, stochastic rounding of the gradients); the
  GEMMs at the fp4 rate (GpuProfile.fp4_flops).

Source: NVIDIA/TransformerEngine transformer_engine/common/recipe/__init__.py @ d0067d0d
(MXFP8BlockScaling, NVFP4BlockScaling: its fp4_quant_fwd_inp / fwd_weight / bwd_grad QParams),
transformer_engine/pytorch/module/linear.py @ d0067d0d (quantize_weight: the weight workspace
cached across micro-batches, row-wise for fprop and column-wise for dgrad), and
transformer_engine/pytorch/quantization.py @ d0067d0d (_compute_mxfp8_support: compute
capability 10.x only, "not supported on 12.0+"; _compute_nvfp4_support: 10.0 and above);
pytorch/ao torchao/prototype/moe_training/mxfp8_linear.py @ 36027d82 (mx_mm.forward saves
input_hp and weight_hp: nothing quantized outlives the GEMM).
"""

from __future__ import annotations

import numpy as np

from ._fp8 import FP8_SCALING_BYTES_PER_LINEAR, FP8_WEIGHT_CACHE_BYTES
from ._vocab import PRECISIONS

MXFP8_BLOCK = 32
"""Elements per E8M0 scale (MXFP8BlockScaling: "Each group of 32 consecutive values")."""
NVFP4_BLOCK = 16
"""Elements per E4M3 scale (NVFP4BlockScaling: "each group of 16 consecutive values")."""

MXFP8_BYTES_PER_ELEMENT = 1.0 + 1.0 / MXFP8_BLOCK
"""One quantized copy: 1 byte of E4M3 data + 1 byte of E8M0 scale per 32 elements."""
NVFP4_BYTES_PER_ELEMENT = 0.5 + 1.0 / NVFP4_BLOCK
"""One quantized copy: half a byte of E2M1 data + 1 byte of E4M3 scale per 16 elements. The
weights' 16x16 2-D scaling is stored in the same 1x16 scale layout the GEMM reads (one value
repeated over the block's 16 rows), so it takes the same bytes."""

MXFP8_WEIGHT_CACHE_BYTES = 2.0 * MXFP8_BYTES_PER_ELEMENT
"""Row-wise (fprop) and column-wise (dgrad) MXFP8 copies of each block-linear weight, kept
from forward to backward like fp8-mixed's (FP8_WEIGHT_CACHE_BYTES): 2.0625 bytes/element.
Source: module docstring (linear.py quantize_weight; the recipe quantizes both directions from
the bf16 weight)."""
NVFP4_WEIGHT_CACHE_BYTES = 2.0 * NVFP4_BYTES_PER_ELEMENT
"""Row-wise and column-wise NVFP4 copies of each block-linear weight: 1.125 bytes/element."""
NVFP4_SCALING_BYTES_PER_LINEAR = 3 * 4.0
"""The fp32 per-tensor amax of the input, weight and gradient quantizers of one linear (the
recipe's second scaling level); MXFP8 keeps none (its scales live in the quantized tensors)."""

MXFP8_CAST_BYTES_PER_ELEMENT = 2.0 + MXFP8_BYTES_PER_ELEMENT
"""HBM bytes of one MXFP8 cast of a bf16 element into one layout: read 2, write 1.03125
(3.03125); the block scales need no amax pass (each 32-element block's amax is taken on chip).
Counted per cast as engine/_time.py fp8_cast_bytes counts them (the input in forward and again
in backward, the output gradient twice). Source: torchao mxfp8_linear.py mx_mm (forward casts
input_hp and weight_hp; backward casts grad_output for dgrad and wgrad, weight_hp transposed
and input_hp column-wise). Ignores: Transformer Engine's fused cast writing both layouts from
one read (2 bytes less per element cast twice) and its keeping the column-wise input from
forward (no backward cast of the input)."""
NVFP4_CAST_BYTES_PER_ELEMENT = 2.0 + 2.0 + NVFP4_BYTES_PER_ELEMENT
"""HBM bytes of one NVFP4 cast of a bf16 element into one layout: the per-tensor amax pass
reads it (2: the fp32 global scale must be known before the E4M3 block scales), the cast reads
it again (2) and writes 0.5625 (4.5625). Counted as MXFP8_CAST_BYTES_PER_ELEMENT is.
Ignores: the random Hadamard transform and stochastic rounding's random bits (fused into the
column-wise cast kernel: no extra HBM pass)."""


def _per_code(values: dict[str, float]) -> np.ndarray:
    """A float64 table indexed by precision code: `values` by name, 0 for the others."""
    return np.array([values.get(name, 0.0) for name in PRECISIONS], dtype=np.float64)


WEIGHT_CACHE_BYTES = _per_code(
    {
        "fp8-mixed": FP8_WEIGHT_CACHE_BYTES,
        "mxfp8": MXFP8_WEIGHT_CACHE_BYTES,
        "nvfp4": NVFP4_WEIGHT_CACHE_BYTES,
    }
)
"""Bytes per block-linear weight element of the quantized weight copies a Transformer Engine
recipe keeps from forward to backward, by precision code (0: no quantized copies)."""
SCALING_BYTES_PER_LINEAR = _per_code(
    {"fp8-mixed": FP8_SCALING_BYTES_PER_LINEAR, "nvfp4": NVFP4_SCALING_BYTES_PER_LINEAR}
)
"""Scaling state per quantized linear beside its tensors, by precision code."""
CAST_BYTES_PER_ELEMENT = _per_code(
    {"mxfp8": MXFP8_CAST_BYTES_PER_ELEMENT, "nvfp4": NVFP4_CAST_BYTES_PER_ELEMENT}
)
"""HBM bytes per element quantized, by precision code; 0 for fp8-mixed, whose per-element
bytes are the calibrated TimeParams.fp8_cast_bytes_per_element (engine/_time.py)."""

SM_RANGES: dict[str, tuple[int, int]] = {"mxfp8": (100, 120), "nvfp4": (100, 1000)}
"""The compute capabilities (sm number, [low, high)) whose tensor cores the recipe runs on.
Source: transformer_engine/pytorch/quantization.py @ d0067d0d _compute_mxfp8_support (10.0 and
up, refused from 12.0: RTX 50xx has no MXFP8 for every GEMM layout) and _compute_nvfp4_support
(10.0 and up); torchao's MX training needs sm100 too (cuBLAS block-scaled GEMMs)."""


def arch_runs(precision: str, arch: str) -> bool:
    """Whether a GPU of architecture `arch` ("sm100", "cdna4") runs `precision`'s block-scaled
    GEMMs; True for a precision without an architecture rule (SM_RANGES)."""
    if precision not in SM_RANGES:
        return True
    low, high = SM_RANGES[precision]
    digits = arch.removeprefix("sm")
    return arch.startswith("sm") and digits.isdigit() and low <= int(digits) < high


def archs_text(precision: str) -> str:
    """The architectures `precision` runs on, in words (SM_RANGES): "sm100 to sm119"."""
    low, high = SM_RANGES[precision]
    return f"sm{low} and above" if high >= 1000 else f"sm{low} to sm{high - 1}"
