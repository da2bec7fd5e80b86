"""A fake `cuda` device on a machine without a GPU, so that a traced step runs as a GPU would
run it: on a CPU-only torch, and on a CUDA build of torch (what `pip install torch` gives).

Fake tensors (torch._subclasses.fake_tensor.FakeTensorMode) can say `device='cuda'` on any torch
build, but without a GPU autograd cannot run on them: the autograd engine asks for the CUDA
device guard (c10::impl::getDeviceGuardImpl: it sizes its per-device queues by the guard's
deviceCount()) and for the current accelerator's stream and primary context (CUDA hooks). A CPU
build has neither; a CUDA build has real ones that count no device and fail
("hasPrimaryContext expects a valid device index, but got device_index=0"). A small C++
extension, compiled once with torch.utils.cpp_extension and cached, supplies both:

- it sets c10's own FakeGuardImpl<CUDA> as the CUDA device guard (the test double c10 ships in
  c10/core/impl/FakeGuardImpl.h: eight devices, streams as ids, events as no-ops); on a CPU build
  it stays, on a CUDA build the real guard is put back after the trace;
- while a trace runs, it swaps the vtable of the CUDA hooks object (a CPU build's default
  at::CUDAHooksInterface, or a CUDA build's at::cuda::detail::CUDAHooks: both hold no data) for
  one whose hasCUDA()/isBuilt()/hasPrimaryContext() say yes, so at::accelerator::getAccelerator()
  answers CUDA; the original vtable is put back afterwards. No CUDA call is ever made: every op
  runs on fake tensors. Where a GPU is there (a CUDA build that sees one) nothing is swapped.

The guard must be there before the process's first backward pass: the autograd engine sizes its
per-device queues once. A process that ran autograd before (a test session, a notebook) traces
in one fresh child process instead (autograd_sees_fake_cuda says which; _child.py: a child never
starts another one).

Python side, torch.autocast("cuda") would disable itself (torch.cuda.is_available() is False);
during the trace its two availability checks answer yes, so the real CUDA autocast op lists
apply.

Source: torch/csrc/autograd/engine.cpp (start_device_threads, ready_queue_by_index),
torch/csrc/autograd/input_buffer.cpp (InputBuffer::add asks for the accelerator's current
stream), aten/src/ATen/DeviceAccelerator.cpp (getAccelerator consults the CUDA hooks),
aten/src/ATen/cuda/detail/CUDAHooks.h, torch/amp/autocast_mode.py (the CUDA availability checks);
torch 2.13 (CPU build) and 2.14.1+cu130 (CUDA build, no GPU).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CPP_SOURCE = r"""
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>

#include <atomic>
#include <cstring>
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

// A CUDA build's hooks (ATen/cuda/detail/CUDAHooks.h): methods only, no data members.
constexpr const char* kCUDAHooksName = "N2at4cuda6detail9CUDAHooksE";

c10::impl::FakeGuardImpl<c10::DeviceType::CUDA> fake_guard;
const c10::impl::DeviceGuardImplInterface* saved_guard = nullptr;
bool guard_swapped = false;
void* saved_vptr = nullptr;

std::atomic<const c10::impl::DeviceGuardImplInterface*>& cuda_slot() {
  return c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::CUDA)];
}
}  // namespace

extern "C" {
// 1 when the hooks are of a kind install knows (a CPU build's, a CUDA build's, or the fake).
int trainmem_fake_cuda_supported() {
  const std::type_info& type = typeid(at::detail::getCUDAHooks());
  return type == typeid(FakeCUDAHooks) || type == typeid(at::CUDAHooksInterface) ||
         std::strcmp(type.name(), kCUDAHooksName) == 0;
}

// 0: installed; 1: hooks of an unknown kind (nothing done).
int trainmem_fake_cuda_install() {
  auto& hooks = const_cast<at::CUDAHooksInterface&>(at::detail::getCUDAHooks());
  const std::type_info& type = typeid(hooks);
  if (type == typeid(FakeCUDAHooks)) {
    return 0;
  }
  const bool cpu_build = type == typeid(at::CUDAHooksInterface);
  if (!cpu_build && std::strcmp(type.name(), kCUDAHooksName) != 0) {
    return 1;
  }
  auto& slot = cuda_slot();
  if (cpu_build) {
    if (slot.load() == nullptr) {
      slot.store(&fake_guard);  // stays: harmless without CUDA tensors, and autograd caches it
    }
  } else if (!guard_swapped) {
    // A CUDA build without a GPU: its real guard counts no device and fails on every call.
    saved_guard = slot.exchange(&fake_guard);
    guard_swapped = true;
  }
  std::memcpy(&saved_vptr, static_cast<void*>(&hooks), sizeof(void*));
  new (&hooks) FakeCUDAHooks();
  return 0;
}

void trainmem_fake_cuda_remove() {
  auto& hooks = const_cast<at::CUDAHooksInterface&>(at::detail::getCUDAHooks());
  if (typeid(hooks) == typeid(FakeCUDAHooks)) {
    std::memcpy(static_cast<void*>(&hooks), &saved_vptr, sizeof(void*));
  }
  if (guard_swapped) {
    cuda_slot().store(saved_guard);
    guard_swapped = false;
  }
}
}
"""


def _cache_dir() -> Path:
    root = os.environ.get("TRAINMEM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "trainmem"
    )
    return Path(root)


@contextlib.contextmanager
def _build_lock(build_dir: Path) -> Iterator[None]:
    """The extension's build folder, held by this process alone: an flock (released by the
    kernel when its holder dies, however it dies), under which torch's own `lock` file, which
    cpp_extension.load waits on forever when a killed builder left it (FileBaton.wait), can
    only be stale and is removed.
    Source: torch/utils/cpp_extension.py _jit_compile (FileBaton(build_directory/'lock'),
    baton.wait() while the file exists), torch/utils/file_baton.py."""
    import fcntl

    fd = os.open(build_dir / "trainmem-build.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits for a live builder only
        (build_dir / "lock").unlink(missing_ok=True)
        yield
    finally:
        os.close(fd)  # releases the flock


def _load_built(build_dir: Path, name: str, source: Path) -> Any:
    """cpp_extension.load of the extension in `build_dir` under _build_lock, and its ctypes
    library; a library a killed build left truncated (not loadable) is removed and built
    again, once."""
    from torch.utils import cpp_extension

    for attempt in (0, 1):
        with _build_lock(build_dir):
            path = cpp_extension.load(
                name=name,
                sources=[str(source)],
                build_directory=str(build_dir),
                is_python_module=False,
                verbose=False,
            )
            try:
                return ctypes.CDLL(str(path))
            except OSError:
                if attempt:
                    raise
                for stale in (Path(str(path)), build_dir / ".ninja_log", build_dir / "build.ninja"):
                    stale.unlink(missing_ok=True)
    raise AssertionError("not reached")


def torch_build() -> str:
    """This torch, as the errors name it: 'torch 2.14.1+cu130 (CUDA 13.0 build, no GPU seen)'."""
    import torch

    cuda = torch.version.cuda
    if not cuda:
        return f"torch {torch.__version__} (CPU build)"
    gpu = "a GPU seen" if _gpu_seen() else "no GPU seen"
    return f"torch {torch.__version__} (CUDA {cuda} build, {gpu})"


@functools.cache
def _gpu_seen() -> bool:
    """Whether a CUDA build of torch sees a GPU (a CPU build never does)."""
    import torch

    if not torch.backends.cuda.is_built():
        return False
    with warnings.catch_warnings():  # "CUDA initialization: Found no NVIDIA driver ..."
        warnings.simplefilter("ignore")
        return bool(torch.cuda.is_available())


@functools.cache
def _library() -> tuple[Any, str]:
    """(ctypes library, '') once built and loaded, (None, '') where a real GPU is there (the
    real CUDA guard and hooks serve fake tensors), or (None, why not)."""
    import torch

    if _gpu_seen():
        return None, ""
    key = hashlib.sha256(f"{torch.__version__}\n{CPP_SOURCE}".encode()).hexdigest()[:12]
    name = f"trainmem_fake_cuda_{key}"
    build_dir = _cache_dir() / name
    try:
        # Its import warns "No CUDA runtime is found" on a CUDA build without a GPU: expected.
        quiet = logging.getLogger("torch.utils.cpp_extension")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            from torch.utils import cpp_extension  # noqa: F401  (imported here, quietly)
        finally:
            quiet.setLevel(level)

        build_dir.mkdir(parents=True, exist_ok=True)
        source = build_dir / "fake_cuda.cpp"
        if not source.exists() or source.read_text() != CPP_SOURCE:
            source.write_text(CPP_SOURCE)
        lib = _load_built(build_dir, name, source)
    except Exception as exc:  # no compiler, no ninja, a read-only cache, ...
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return None, f"could not build the fake-cuda extension ({first_line[:200]})"
    if not lib.trainmem_fake_cuda_supported():
        return None, f"{torch_build()} has CUDA hooks of an unknown kind"
    return lib, ""


def fake_cuda_unavailable_reason() -> str:
    """'' when traces can run on a fake `cuda` device here, else why not (one line)."""
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
def autograd_failure() -> str:
    """'' when this process's autograd engine can run backward on fake `cuda` tensors, else the
    failure in one line. It can unless it started (sized its device queues) before the fake
    guard was registered."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with fake_cuda_device(), FakeTensorMode():
            x = torch.empty(2, device="cuda", requires_grad=True)
            (x * 2.0).sum().backward()
    except Exception as exc:  # any failure means: not in this process
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return f"{type(exc).__name__}: {first}"
    return ""


def autograd_sees_fake_cuda() -> bool:
    """Whether this process's autograd engine can run backward on fake `cuda` tensors."""
    return not autograd_failure()
