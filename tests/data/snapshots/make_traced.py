"""Write tiny_llama_amp.pickle: trainmem's tracer (trace/, a fake CUDA device on the CPU) running
one training step of tiny_llama.json (micro-batch 2, 64 tokens, amp-bf16, AdamW, no recompute),
written as a PyTorch memory snapshot (trace/_snapshot.py): setup, the warm-up optimizer step and
the measured step, every allocation with its Python stack (and the autograd engine's C++ frames
on its device thread). The README's `trainmem explain` example reads it.

The frames' paths are shortened to where they start inside a package (`torch/...`,
`transformers/...`, `trainmem/trace/...`), so that the file names no machine's folders.

Run: python tests/data/snapshots/make_traced.py (needs the trace extra: torch, transformers).
"""

from __future__ import annotations

import json
import pickle
import tempfile
from pathlib import Path

from trainmem.trace._core import trace_step

HERE = Path(__file__).resolve().parent
FLAGS = {
    "micro_batch_size": 2,
    "seq_len": 64,
    "precision": "amp-bf16",
    "recompute": "none",
    "attention": "flash",
    "optimizer": "adamw",
}


def short(path: str) -> str:
    """`path` from its package on (site-packages/ or the repository's trace/ folder)."""
    if "site-packages/" in path:
        return path.rsplit("site-packages/", 1)[1]
    if "/trace/" in path:
        return "trainmem/trace/" + path.rsplit("/trace/", 1)[1]
    return path.rsplit("/", 1)[-1]


def main() -> None:
    config = json.loads((HERE / "tiny_llama.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.pickle"
        measured = trace_step(config, **FLAGS, snapshot=str(raw))
        with open(raw, "rb") as f:
            snapshot = pickle.load(f)  # written by trace/_snapshot.py just now
    seen: dict[int, None] = {}
    for where in (*snapshot["device_traces"][0], *(b for s in snapshot["segments"] for b in s["blocks"])):
        for frame in where["frames"]:
            if id(frame) not in seen:
                seen[id(frame)] = None
                frame["filename"] = short(frame["filename"])
    with open(HERE / "tiny_llama_amp.pickle", "wb") as f:
        pickle.dump(snapshot, f)
    keys = ("parameters_bytes", "gradients_bytes", "optimizer_states_bytes", "activations_bytes")
    print({k: measured[k] for k in (*keys, "peak_allocated_bytes", "peak_reserved_simulated_bytes")})


if __name__ == "__main__":
    main()
