"""A real training step on the CPU with every storage tracked: bytes per phase, exactly.

Needs torch and transformers (not trainmem dependencies). Runs a warm-up step, then one measured
step of a Hugging Face causal LM built from a config (random weights): loss = model(input_ids,
labels=input_ids).loss, backward, AdamW(foreach).step(), zero_grad(set_to_none=True). A
TorchDispatchMode records every new storage (rounded to 512 bytes, as the CUDA caching allocator
counts memory_allocated) and drops it when the storage is freed. Prints one JSON object: params,
optimizer states, activations alive at the end of forward, and the peak of each phase (params and
states included).

Kernel choices are the CPU's (SDPA flash for CPU saves what the CUDA flash kernel saves; MLA's
unequal head dims fall back to the math kernel here). Used to check the MoE formulas
(tests/data/moe_cpu_trace.json).

Run: python -m bench.cpu_trace CONFIG_JSON MICRO_BATCH SEQ_LEN bf16|fp32 none|full
"""

from __future__ import annotations

import json
import sys
import weakref
from typing import Any

BLOCK_BYTES = 512


def _rounded(num_bytes: int) -> int:
    return (num_bytes + BLOCK_BYTES - 1) // BLOCK_BYTES * BLOCK_BYTES


def trace_step(config: dict[str, Any], micro_batch: int, seq_len: int, precision: str,
               recompute: str) -> dict[str, int]:  # fmt: skip
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from transformers import AutoConfig, AutoModelForCausalLM

    live: dict[int, int] = {}
    known: set[int] = set()
    state = {"current": 0, "phase": "forward"}
    peaks: dict[str, int] = {}

    def forget(key: int, size: int) -> None:
        if live.pop(key, None) is not None:
            state["current"] -= size

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if not isinstance(t, torch.Tensor):
                    continue
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key in live or key in known or storage.nbytes() == 0:
                    continue
                size = _rounded(storage.nbytes())
                live[key] = size
                state["current"] += size
                weakref.finalize(storage, forget, key, size)
            phase = str(state["phase"])
            peaks[phase] = max(peaks.get(phase, 0), int(state["current"]))
            return out

    cfg = AutoConfig.for_model(**config)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    if recompute == "full":
        model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    ids = torch.randint(0, cfg.vocab_size, (micro_batch, seq_len))

    def step() -> int:
        state["phase"] = "forward"
        loss = model(input_ids=ids, labels=ids).loss
        at_end_of_forward = int(state["current"])
        state["phase"] = "backward"
        loss.backward()
        del loss
        state["phase"] = "optimizer_step"
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return at_end_of_forward

    step()  # warm-up: optimizer states exist from here on

    def storages_bytes(tensors: Any) -> int:
        total = 0
        for t in tensors:
            key = t.untyped_storage().data_ptr()
            if key not in known:
                known.add(key)
                total += _rounded(t.untyped_storage().nbytes())
        return total

    params = storages_bytes(model.parameters())
    states = storages_bytes(
        v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()
    )
    known.add(ids.untyped_storage().data_ptr())
    with Track():
        activations = step()
    base = params + states
    return {
        "params": params,
        "states": states,
        "activations": activations,
        "peak_forward": base + peaks["forward"],
        "peak_backward": base + peaks["backward"],
        "peak_optimizer_step": base + peaks["optimizer_step"],
    }


def main() -> None:
    config, micro, seq, precision, recompute = sys.argv[1:6]
    print(json.dumps(trace_step(json.loads(config), int(micro), int(seq), precision, recompute)))


if __name__ == "__main__":
    main()
