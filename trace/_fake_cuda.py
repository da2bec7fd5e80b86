"""A fake `cuda` device on a CPU-only torch, so that a traced step runs as a GPU would run it.

Fake tensors (torch._subclasses.fake_tensor.FakeTensorMode) can say `device='cuda'` on any torch
build, but a CPU-only build cannot run autograd on them: the autograd engine asks for the CUDA
device guard (c10::impl::getDeviceGuardImpl) and for the current accelerator's stream
(at::accelerator::getCurrentStream), and a CPU build has neither. A ten-line C++ extension,
compiled once with torch.utils.cpp_extension and cached, supplies both:

- it registers c10's own FakeGuardImpl<CUDA> as the CUDA device guard (the test double c10 ships
  in c10/core/impl/FakeGuardImpl.h: eight devices, streams as ids, events as no-ops);
- while a trace runs, it swaps the vtable of the default at::CUDAHooksInterface object for one
  whose hasCUDA()/isBuilt() say yes, so at::accelerator::getAccelerator() answers CUDA; the
  original is put back afterwards. No CUDA call is ever made: every op runs on fake tensors.

The guard must be there before the process's first backward pass: the autograd engine sizes its
per-device queues once. A process that ran autograd before (a test session, a notebook) traces
in a fresh child process instead (autograd_sees_fake_cuda says which).

Python side, torch.autocast("cuda") would disable itself (torch.cuda.is_available() is False);
during the trace its two availability checks answer yes, so the real CUDA autocast op lists
apply. On a torch built with CUDA none of this is needed (FakeTensorMode registers a guard itself).

Source: torch/csrc/autograd/input_buffer.cpp (InputBuffer::add asks for the accelerator's
current stream), aten/src/ATen/DeviceAccelerator.cpp (getAccelerator consults the CUDA hooks),
torch/amp/autocast_mode.py (the CUDA availability checks), torch 2.13.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CPP_SOURCE = r"""
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>

#include <new>
#include <typeinfo>

namespace {
// The default hooks of a CPU build, except that CUDA is "there" (for the accelerator lookup).
struct FakeCUDAHooks final : at::CUDAHooksInterface {
  bool hasCUDA() const override { return true; }
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  void init() const override {}
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  bool isPinnedPtr(const void*) const override { return false; }
  int getNumGPUs() const override { return 1; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
};
static_assert(sizeof(FakeCUDAHooks) == sizeof(at::CUDAHooksInterface), "vtable swap only");

c10::impl::FakeGuardImpl<c10::DeviceType::CUDA> fake_guard;
}  // namespace

extern "C" {
// 0: installed; 1: this torch has real CUDA hooks (nothing to do).
int trainmem_fake_cuda_install() {
  auto& hooks = const_cast<at::CUDAHooksInterface&>(at::detail::getCUDAHooks());
  if (typeid(hooks) != typeid(at::CUDAHooksInterface) && typeid(hooks) != typeid(FakeCUDAHooks)) {
    return 1;
  }
  auto& slot = c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::CUDA)];
  if (slot.load() == nullptr) {
    slot.store(&fake_guard);  // stays: harmless without CUDA tensors, and autograd caches it
  }
  new (&hooks) FakeCUDAHooks();
  return 0;
}

void trainmem_fake_cuda_remove() {
  auto& hooks = const_cast<at::CUDAHooksInterface&>(at::detail::getCUDAHooks());
  if (typeid(hooks) == typeid(FakeCUDAHooks)) {
    new (&hooks) at::CUDAHooksInterface();
  }
}
}
"""


def _cache_dir() -> Path:
    root = os.environ.get("TRAINMEM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "trainmem"
    )
    return Path(root)


@functools.cache
def _library() -> tuple[Any, str]:
    """(ctypes library, '') once built and loaded, or (None, why not)."""
    import torch

    if torch.backends.cuda.is_built():
        return None, ""  # a CUDA build: FakeTensorMode sets a guard itself
    key = hashlib.sha256(f"{torch.__version__}\n{CPP_SOURCE}".encode()).hexdigest()[:12]
    name = f"trainmem_fake_cuda_{key}"
    build_dir = _cache_dir() / name
    try:
        from torch.utils import cpp_extension

        build_dir.mkdir(parents=True, exist_ok=True)
        source = build_dir / "fake_cuda.cpp"
        if not source.exists() or source.read_text() != CPP_SOURCE:
            source.write_text(CPP_SOURCE)
        path = cpp_extension.load(
            name=name, sources=[str(source)], build_directory=str(build_dir),
            is_python_module=False, verbose=False,
        )  # fmt: skip
        return ctypes.CDLL(str(path)), ""
    except Exception as exc:  # no compiler, no ninja, a read-only cache, ...
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return None, f"could not build the fake-cuda extension ({first_line[:200]})"


def fake_cuda_unavailable_reason() -> str:
    """'' when traces can run on a fake `cuda` device here, else why not (one line)."""
    import torch

    if torch.backends.cuda.is_built():
        return ""
    return _library()[1]


@contextlib.contextmanager
def fake_cuda_device() -> Iterator[None]:
    """A fake `cuda` device for the duration (see the module docstring); raises ValueError if
    it cannot be had (check fake_cuda_unavailable_reason first)."""
    import torch
    import torch.cuda.amp.common as amp_common

    lib, reason = _library()
    if reason:
        raise ValueError(f"trace: {reason}")
    if lib is not None:
        lib.trainmem_fake_cuda_install()
    saved = (
        amp_common.amp_definitely_not_available,
        torch.cuda.is_bf16_supported,
        torch.cuda.get_device_capability,
    )
    amp_common.amp_definitely_not_available = lambda: False
    torch.cuda.is_bf16_supported = lambda *args, **kwargs: True  # Hopper: bf16 everywhere
    # Hopper (sm90), as the SDPA kernel choice: transformers' MoE layers ask before they use
    # grouped_mm (transformers/integrations/moe.py _can_use_grouped_mm), which would otherwise
    # initialise the missing CUDA runtime.
    torch.cuda.get_device_capability = lambda *args, **kwargs: (9, 0)
    try:
        yield
    finally:
        (
            amp_common.amp_definitely_not_available,
            torch.cuda.is_bf16_supported,
            torch.cuda.get_device_capability,
        ) = saved
        if lib is not None:
            lib.trainmem_fake_cuda_remove()


@functools.cache
def autograd_sees_fake_cuda() -> bool:
    """Whether this process's autograd engine can run backward on fake `cuda` tensors: it can
    unless it started (sized its device queues) before the fake guard was registered."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with fake_cuda_device(), FakeTensorMode():
            x = torch.empty(2, device="cuda", requires_grad=True)
            (x * 2.0).sum().backward()
    except RuntimeError:
        return False
    return True
