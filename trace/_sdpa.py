"""Scaled dot-product attention on a fake `cuda` device, with the kernel a GPU would pick.

On a fake device, torch.nn.functional.scaled_dot_product_attention runs its math fallback (the
CUDA kernel chooser, _fused_sdp_choice_stub, is not compiled into a CPU build): it materialises
the b x a x s x s scores that no GPU keeps. During a trace, a kernel registered for the op at the
AutogradCUDA key replaces the chooser with the choice a Hopper GPU makes and calls that kernel's
own aten op, whose autograd node saves what the CUDA kernel saves:

- flash: (query, key, value, out, logsumexp [b, a, s] fp32, philox seed/offset); no mask, 16-bit
  inputs only, head dim <= 256, grouped-query attention native (key/value keep their heads);
  head dims that are not multiples of 8 are padded first;
- efficient (memory-efficient, xformers' cutlass kernel): (query, key, value, out, logsumexp
  [b, a, ceil(s / 32) * 32] fp32, seed/offset, the additive mask); fp32 as well; equal heads;
- cudnn: (query, key, value, out, logsumexp [b, a, s, 1] fp32, seed/offset, the mask);
- math: the composite function (scores materialised), as on any device.

`kernel` is the preference (the ground truth's `sdpa_kernel`, "flash" by default, what an H100/
H200 picks); inputs the preferred kernel does not take fall back as the GPU's priority list does
(flash, efficient, math).

Source: aten/src/ATen/native/transformers/attention.cpp (scaled_dot_product_attention: the CUDA
branches, pad_last_dim<8>, convert_boolean_attn_mask, preprocess_mask: mask last dim aligned to
16), aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (use_flash_attention,
use_mem_efficient_attention: dtype, head-dim, mask and GQA constraints), torch 2.13.
Ignores: nested tensors, the sm86/89 head-dim > 192 backward limit, cudnn's version gates.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

SDPA_KERNELS = ("flash", "efficient", "cudnn", "math")
FLASH_MAX_HEAD_DIM = 256
"""sdp_utils.cpp check_head_dim_size_flash: flash takes head dims up to 256."""
CUDNN_MAX_HEAD_DIM = 128
"""sdp_utils.cpp check_cudnn_tensor_shapes: cuDNN's fused attention takes head dims up to 128."""
FLASH_HEAD_DIM_MULTIPLE = 8
"""attention.cpp pad_last_dim<8>: flash's q/k/v head dim is padded to a multiple of 8."""
MASK_ALIGNMENT = 16
"""attention.cpp preprocess_mask: the efficient kernel's mask last dim is padded to 16."""


def _backend(q: Any, k: Any, v: Any, mask: Any, kernel: str) -> str:
    """The kernel the GPU runs for these inputs, given the preferred one."""
    import torch

    low_precision = q.dtype in (torch.float16, torch.bfloat16)
    head_dim = q.size(-1)
    same_heads = q.size(-3) == k.size(-3) == v.size(-3) if q.dim() == 4 else True
    same_dims = head_dim == k.size(-1) == v.size(-1)
    causal_square = q.size(-2) == k.size(-2)
    flash_ok = mask is None and low_precision and head_dim <= FLASH_MAX_HEAD_DIM and same_dims
    efficient_ok = same_heads and q.dtype in (torch.float16, torch.bfloat16, torch.float32)
    cudnn_ok = low_precision and same_heads and head_dim <= CUDNN_MAX_HEAD_DIM and same_dims
    if kernel == "cudnn" and cudnn_ok and causal_square:
        return "cudnn"
    if kernel == "efficient" and efficient_ok:
        return "efficient"
    if kernel == "math":
        return "math"
    if flash_ok:
        return "flash"
    return "efficient" if efficient_ok else "math"


def _float_mask(mask: Any, dtype: Any) -> Any:
    """attention.cpp convert_boolean_attn_mask: True -> 0, False -> -inf, in the query dtype."""
    import torch

    if mask is None or mask.dtype != torch.bool:
        return mask
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, torch.full((), -math.inf, dtype=dtype, device=mask.device))


def _aligned_mask(mask: Any, q: Any, k: Any) -> Any:
    """attention.cpp preprocess_mask: expanded to [b, a, s_q, s_k], last dim padded to 16."""
    import torch

    mask = mask.expand(q.size(0), q.size(1), q.size(2), k.size(2))
    last = mask.size(-1)
    if last % MASK_ALIGNMENT:
        pad = MASK_ALIGNMENT - last % MASK_ALIGNMENT
        return torch.nn.functional.pad(mask, (0, pad))[..., :last]
    if any(stride % MASK_ALIGNMENT for stride in mask.stride()[:-1]):
        return mask.contiguous()
    return mask


def gpu_sdpa(kernel: str):  # type: ignore[no-untyped-def]
    """The replacement for aten::scaled_dot_product_attention (see the module docstring)."""
    import torch

    aten = torch.ops.aten

    def sdpa(
        q,
        k,
        v,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,  # type: ignore[no-untyped-def]
        enable_gqa=False,
    ):
        mask = _float_mask(attn_mask, q.dtype)
        backend = _backend(q, k, v, mask, kernel)
        needs_lse = q.requires_grad or k.requires_grad or v.requires_grad
        if backend == "flash":
            head_dim = q.size(-1)
            pad = -head_dim % FLASH_HEAD_DIM_MULTIPLE
            if pad:
                q, k, v = (torch.nn.functional.pad(t, (0, pad)) for t in (q, k, v))
            scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
            out = aten._scaled_dot_product_flash_attention(
                q, k, v, dropout_p, is_causal, False, scale=scale
            )[0]
            return out[..., :head_dim] if pad else out
        if backend == "efficient":
            if mask is not None:
                mask = _aligned_mask(mask, q, k)
            return aten._scaled_dot_product_efficient_attention(
                q, k, v, mask, needs_lse, dropout_p, is_causal, scale=scale
            )[0]
        if backend == "cudnn":
            return aten._scaled_dot_product_cudnn_attention(
                q, k, v, mask, needs_lse, dropout_p, is_causal, False, scale=scale
            )[0]
        return aten._scaled_dot_product_attention_math(
            q, k, v, mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
        )[0]

    return sdpa


@contextlib.contextmanager
def gpu_attention_kernels(kernel: str) -> Iterator[None]:
    """Route scaled_dot_product_attention on `cuda` tensors to `kernel`'s op for the duration."""
    if kernel not in SDPA_KERNELS:
        raise ValueError(
            f"sdpa_kernel: unknown value '{kernel}'; allowed: {', '.join(SDPA_KERNELS)}"
        )
    from torch.library import _scoped_library

    with _scoped_library("aten", "IMPL") as lib:
        lib.impl("scaled_dot_product_attention", gpu_sdpa(kernel), "AutogradCUDA")
        yield
