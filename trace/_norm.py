"""torch's own RMSNorm on a fake `cuda` device, saving what the CUDA kernel saves.

torch.nn.RMSNorm / F.rms_norm (torchtitan's norms) run `aten::rms_norm`. A CUDA build sends it
to the fused kernel `_fused_rms_norm`, whose autograd node saves the input and the fp32 rstd
only. A CPU build of torch has no such kernel: on a fake CUDA device the op decomposes and
saves an fp32 copy of the input, the normalised fp32 tensor and the output as well (about four
times the bytes per norm). During a trace, an AutogradCUDA kernel for `rms_norm` restores the
CUDA behaviour: an autograd function that saves (input, rstd, weight) and runs
`_fused_rms_norm_backward`.

Python RMSNorm modules (Hugging Face's LlamaRMSNorm and the like) do not call the op and are not
affected.

Source: aten/src/ATen/native/native_functions.yaml (_fused_rms_norm: CUDA kernel),
tools/autograd/derivatives.yaml (_fused_rms_norm: saves input, rstd), torch 2.13; checked on
torchtitan's Llama 3 (tests/data/framework_traces/torchtitan_llama3_ac.json, "fused" rows).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

DEFAULT_EPS = 1e-6
"""What F.rms_norm uses for eps=None on a 16/32-bit input (torch.finfo(dtype).eps is what the
kernel uses; the value does not change memory)."""


def _fused_rms_norm_function() -> Any:
    import torch

    class FusedRMSNorm(torch.autograd.Function):
        """Forward as the kernel computes it; saves (input, rstd, weight) as the kernel does."""

        @staticmethod
        def forward(ctx, x, shape, weight, eps):  # type: ignore[no-untyped-def]
            dims = tuple(range(-len(shape), 0))
            xf = x.float()
            rstd = torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + (eps or DEFAULT_EPS))
            out = xf * rstd
            if weight is not None:
                out = out * weight
            ctx.shape = list(shape)
            ctx.save_for_backward(x, rstd, weight)
            return out.to(x.dtype)

        @staticmethod
        def backward(ctx, grad):  # type: ignore[no-untyped-def]
            x, rstd, weight = ctx.saved_tensors
            dx, dw = torch.ops.aten._fused_rms_norm_backward(
                grad, x, ctx.shape, rstd, weight, [True, weight is not None]
            )
            return dx, None, dw, None

    return FusedRMSNorm


@contextlib.contextmanager
def gpu_rms_norm() -> Iterator[None]:
    """Route aten::rms_norm on `cuda` tensors to the fused kernel's saved set for the duration."""
    from torch.library import _scoped_library

    function = _fused_rms_norm_function()

    def rms_norm(x, normalized_shape, weight=None, eps=None):  # type: ignore[no-untyped-def]
        return function.apply(x, tuple(normalized_shape), weight, eps)

    with _scoped_library("aten", "IMPL") as lib:
        lib.impl("rms_norm", rms_norm, "AutogradCUDA")
        yield
