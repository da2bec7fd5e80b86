"""Write torch_profiler_cpu.pickle: a snapshot written by torch's own code on the CPU.

`torch.cuda.memory._snapshot()` needs a CUDA device; torch.cuda._memory_viz._profile_to_snapshot
does not: it turns a `torch.profiler` run with profile_memory=True (its memory profiler,
torch/profiler/_memory_profiler.py) into the snapshot structure memory_viz draws (segments,
device_traces with alloc / free_requested / free_completed entries and their Python frames),
each alloc entry with torch's own category of the tensor (parameter, gradient,
optimizer_state, activation, input, temporary, autograd_detail, unknown): a ground truth that
trainmem did not write. The training loop: a 2-layer MLP (512 -> 1024 -> 512, GELU) built
before the profiler starts, AdamW (foreach), two steps of a 64 x 512 batch, on the CPU (the
profiler snapshot's device is the CPU when no GPU is present: its last trace).

Its segments are the profiler's own construction: one per device spanning the lowest to the
highest address seen, so its reserved bytes mean nothing; its blocks have no `address` (the
C++ snapshot's have one; trainmem counts them from the segment's, as memory_snapshot.cpp
does). torch 2.13.0+cpu.

Run: python tests/data/snapshots/make_torch_profiler.py (needs torch).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from torch.cuda._memory_viz import _profile_to_snapshot

HERE = Path(__file__).resolve().parent


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512)
    )
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(
        activities=activities, profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        for _ in range(2):
            x = torch.randn(64, 512)
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    snapshot = _profile_to_snapshot(prof)
    for trace in snapshot["device_traces"]:  # the frames' file is this script's name alone
        for entry in trace:
            for frame in entry["frames"]:
                if frame["name"].startswith(str(HERE)):
                    frame["name"] = frame["name"][len(str(HERE)) + 1 :]
    with open(HERE / "torch_profiler_cpu.pickle", "wb") as f:
        pickle.dump(snapshot, f)
    print(f"wrote {HERE / 'torch_profiler_cpu.pickle'}")


if __name__ == "__main__":
    main()
