"""Write the torch-format snapshot fixtures of tests/unit/report/test_explain.py (no GPU, no torch).

These are NOT written by torch: no GPU was available to record one, and no public repository
shipped a snapshot pickle that could be found. They are built here to the exact structure
torch 2.13 writes (read from torch/csrc/cuda/memory_snapshot.cpp `_memory_snapshot_pickled`
and torch/cuda/memory.py `_snapshot`): the top-level keys segments / device_traces /
allocator_settings; a segment's device, address, total_size, allocated_size, active_size,
requested_size, stream, segment_type, segment_pool_id (a tuple), is_expandable, frames, blocks;
a block's address, size, requested_size, state, frames; a trace entry's action, addr (an oom's
device_free), size, stream, frames, time_us; frames innermost first, C++ frames first (the
recorder's default stacks="all"), then Python's. The training loop they record:

    model = nn.Linear(2048, 2048).to("cuda")          # history recorded from here
    opt = torch.optim.AdamW(model.parameters())       # foreach
    for step in range(2):
        x = torch.randn(64, 2048, device="cuda")
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.memory._dump_snapshot("linear_adamw.pickle")

and, for oom.pickle, the same loop dying in its first backward on the weight's gradient (an
OOM observer's dump: the trace ends with the oom entry).

Run: python tests/data/snapshots/make_torch_format.py (rewrites both files).
"""

from __future__ import annotations

import pickle
from pathlib import Path

HERE = Path(__file__).resolve().parent
SITE = "/usr/local/lib/python3.12/site-packages"
MIB = 1 << 20
H100_MEMORY_BYTES = 85_899_345_920
"""hardware/gpus h100-sxm-80gb memory_bytes: the OOM dump's device_free is counted from it."""
CONTEXT_BYTES = 800 * MIB
"""The CUDA context the OOM dump implies (the device's used memory less reserved)."""
WEIGHT, BIAS, BATCH = 2048 * 2048 * 4, 2048 * 4, 64 * 2048 * 4
WORKSPACE = 32 * MIB  # cuBLAS `:4096:8` on sm90, made by the first matmul

CPP_MALLOC = [
    ("??", 0, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)"),
    ("??", 0, "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, unsigned long, CUstream_st*)"),
    ("??", 0, "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)"),
    ("??", 0, "at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)"),
]
AUTOGRAD = [
    ("??", 0, "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)"),
    ("??", 0, "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
    ("??", 0, "torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)"),
]
WORKSPACE_CPP = [
    ("/pytorch/aten/src/ATen/cuda/CublasHandlePool.cpp", 167, "at::cuda::getCUDABlasLtWorkspace()"),
    ("/pytorch/aten/src/ATen/cuda/CUDABlas.cpp", 1581, "at::cuda::blas::gemm_and_bias<float>(...)"),
]
MODULE = [
    (f"{SITE}/torch/nn/modules/module.py", 1786, "_call_impl"),
    (f"{SITE}/torch/nn/modules/module.py", 1775, "_wrapped_call_impl"),
]
TRAIN = (f"{HERE.name}/train.py", 9, "<module>")
STACKS = {
    "to_cuda": [(f"{SITE}/torch/nn/modules/module.py", 1369, "convert"), (f"{SITE}/torch/nn/modules/module.py", 942, "_apply"), (f"{SITE}/torch/nn/modules/module.py", 1383, "to"), (TRAIN[0], 3, "<module>")],
    "batch": [(TRAIN[0], 6, "<module>")],
    "linear": [(f"{SITE}/torch/nn/modules/linear.py", 134, "forward"), *MODULE, (TRAIN[0], 7, "<module>")],
    "loss": [(f"{SITE}/torch/_tensor.py", 40, "wrapped"), (TRAIN[0], 7, "<module>")],
    "backward": AUTOGRAD,
    "root_grad": [(f"{SITE}/torch/autograd/__init__.py", 91, "_make_grads"), (f"{SITE}/torch/autograd/__init__.py", 346, "backward"), (f"{SITE}/torch/_tensor.py", 647, "backward"), (TRAIN[0], 8, "<module>")],
    "adamw_init": [(f"{SITE}/torch/optim/adamw.py", 130, "_init_group"), (f"{SITE}/torch/optim/adamw.py", 226, "step"), (f"{SITE}/torch/optim/optimizer.py", 516, "wrapper"), (TRAIN[0], 9, "<module>")],
    "adamw_foreach": [(f"{SITE}/torch/optim/adamw.py", 555, "_multi_tensor_adamw"), (f"{SITE}/torch/optim/adamw.py", 254, "step"), (f"{SITE}/torch/optim/optimizer.py", 516, "wrapper"), (TRAIN[0], 9, "<module>")],
}


class _Recorder:
    """A bump allocator writing torch-format trace entries (one segment per block of 1 MiB or
    more, rounded to 2 MiB; smaller blocks in 2 MiB small segments)."""

    def __init__(self) -> None:
        self.trace: list[dict] = []
        self.live: dict[int, tuple[int, list]] = {}
        self.segments: list[list] = []  # [address, total, small, cursor]
        self.next = 0x7F3A_0000_0000

    def _frames(self, where: str, *, cpp: list | None = None) -> list[dict]:
        raw = [*(cpp or []), *CPP_MALLOC, *STACKS.get(where, [])]
        if where == "backward":
            raw = [*CPP_MALLOC, *AUTOGRAD]
        return [{"filename": f, "line": line, "name": n} for f, line, n in raw]

    def _entry(self, action: str, addr: int, size: int, frames: list) -> None:
        self.trace.append(
            {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames,
             "time_us": 1_733_000_000_000_000 + 1000 * len(self.trace)}
        )

    def alloc(self, size: int, where: str, *, cpp: list | None = None) -> int:
        rounded = -(-size // 512) * 512
        small = rounded <= MIB
        seg = next((s for s in self.segments if s[2] == small and s[1] - s[3] >= rounded), None)
        if seg is None:
            total = 2 * MIB if small else -(-rounded // (2 * MIB)) * 2 * MIB
            seg = [self.next, total, small, 0]
            self.next += total
            self.segments.append(seg)
            self._entry("segment_alloc", seg[0], total, [])
        addr = seg[0] + seg[3]
        seg[3] += rounded
        frames = self._frames(where, cpp=cpp)
        self.live[addr] = (rounded, frames)
        self._entry("alloc", addr, size, frames)
        return addr

    def free(self, addr: int) -> None:
        size, frames = self.live.pop(addr)
        self._entry("free_requested", addr, size, frames)
        self._entry("free_completed", addr, size, frames)

    def oom(self, size: int, device_free: int) -> None:
        self.trace.append(
            {"action": "oom", "device_free": device_free, "size": size, "stream": 0,
             "frames": self._frames("backward"), "time_us": 1_733_000_000_000_000}
        )

    def snapshot(self) -> dict:
        segments = []
        for address, total, small, cursor in self.segments:
            blocks, allocated, at = [], 0, address
            for addr in sorted(a for a in self.live if address <= a < address + total):
                if addr > at:
                    blocks.append(_block(at, addr - at, None))
                size, frames = self.live[addr]
                blocks.append(_block(addr, size, frames))
                allocated += size
                at = addr + size
            if at < address + total:
                blocks.append(_block(at, address + total - at, None))
            segments.append(
                {"device": 0, "address": address, "total_size": total,
                 "allocated_size": allocated, "active_size": allocated,
                 "requested_size": allocated, "stream": 0,
                 "segment_type": "small" if small else "large", "segment_pool_id": (0, 0),
                 "is_expandable": False, "frames": [], "blocks": blocks}
            )
        settings = {
            "PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
            "garbage_collection_threshold": 0.0, "expandable_segments": False,
            "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False, "roundup_power2_divisions": {},
        }
        return {"segments": segments, "device_traces": [self.trace], "allocator_settings": settings}


def _block(address: int, size: int, frames: list | None) -> dict:
    return {"address": address, "size": size, "requested_size": size if frames else 0,
            "state": "active_allocated" if frames is not None else "inactive",
            "frames": frames or []}


def record(*, oom: bool) -> dict:
    """The training loop above, as the allocator would trace it."""
    r = _Recorder()
    weight, bias = r.alloc(WEIGHT, "to_cuda"), r.alloc(BIAS, "to_cuda")
    states: list[int] = []
    for step in range(2):
        x = r.alloc(BATCH, "batch")
        if step == 0:
            r.alloc(WORKSPACE, "linear", cpp=WORKSPACE_CPP)
        out = r.alloc(BATCH, "linear")
        sq = r.alloc(BATCH, "loss")
        loss = r.alloc(4, "loss")
        r.free(sq)  # pow's output: mean saves only its size
        grad_loss = r.alloc(4, "root_grad")  # loss.backward()'s ones_like, on the main thread
        grad_sq = r.alloc(BATCH, "backward")
        grad_out = r.alloc(BATCH, "backward")
        r.free(grad_sq)
        if oom:
            r.oom(WEIGHT, H100_MEMORY_BYTES - CONTEXT_BYTES - sum(s[1] for s in r.segments))
            return r.snapshot()
        grads = [r.alloc(WEIGHT, "backward"), r.alloc(BIAS, "backward")]
        for a in (grad_out, grad_loss, out, loss):
            r.free(a)
        if step == 0:
            states = [r.alloc(n, "adamw_init") for n in (WEIGHT, WEIGHT, BIAS, BIAS)]
        temps = [r.alloc(n, "adamw_foreach") for n in (WEIGHT, BIAS)]
        for a in (*temps, *grads):
            r.free(a)
        if step == 0:
            r.free(x)
    del weight, bias, states
    return r.snapshot()


def main() -> None:
    for name, oom in (("linear_adamw.pickle", False), ("oom.pickle", True)):
        with open(HERE / name, "wb") as f:
            pickle.dump(record(oom=oom), f)
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()
