"""`trainmem trace`: measure one training step of a Hugging Face model on fake tensors.

Needs the optional extra `trainmem[trace]` (torch, transformers); the core install does not.
The step runs under torch's FakeTensorMode (real dispatcher, real autograd, real torch.optim and
checkpoint code, no data, no GPU): a warm-up step, then the measured one, exactly as the ground
truth was traced (loss = model(input_ids, labels=input_ids).loss; backward; optimizer.step();
zero_grad(set_to_none=True)). A TorchDispatchMode records every storage created, rounded to 512
bytes as the CUDA caching allocator counts memory_allocated, and forgets it when it is freed.

Device: the fake tensors live on the CPU (a CPU-only torch cannot run autograd on fake CUDA
tensors, it has no CUDA device guard). SDPA on the CPU picks its flash kernel, which saves what
the CUDA flash kernel saves; dropout is routed through native_dropout (CUDA's bool mask) and
attention dropout set to 0 for flash (the CUDA kernel saves no mask for it). Checked: Llama-family
ground-truth cases (bf16, fp32, amp, checkpointing, eager) match to 0.25% (activations) and the
peaks exactly. Known gaps: GPT-2 on the CPU keeps per-layer tensors the CUDA trace does not (+5% on
gpt2 bf16) and CPU autocast op lists differ from CUDA's (GPT-2 amp -10%).
"""

from __future__ import annotations

import contextlib
import time
import weakref
from typing import Any

BLOCK_BYTES = 512
"""c10/cuda/CUDACachingAllocator.cpp kMinBlockSize: memory_allocated counts rounded blocks."""


def _rounded(num_bytes: int) -> int:
    return -(-num_bytes // BLOCK_BYTES) * BLOCK_BYTES


def trace_step(
    config: dict[str, Any],
    *,
    micro_batch_size: int,
    seq_len: int,
    precision: str,
    recompute: str,
    attention: str,
    optimizer: str,
    fake: bool = True,
) -> dict[str, Any]:
    """One measured step: persistent bytes, activations, and per-phase peaks.

    `fake=False` runs the same step on real CPU tensors (small models only): bench/cpu_trace.py
    uses it to record reference steps.
    """
    try:
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten
        from torch.utils.weak import WeakIdKeyDictionary
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ValueError(
            f"trace: needs torch and transformers ({exc.name} missing); "
            "install them with: pip install 'trainmem[trace]'"
        ) from None
    if precision not in ("fp32", "bf16", "amp-bf16"):
        raise ValueError(f"precision: trace supports fp32, bf16, amp-bf16; got '{precision}'")
    if optimizer not in ("adamw", "adamw-fused", "sgd", "sgd-momentum"):
        raise ValueError(
            f"optimizer: trace supports adamw, adamw-fused, sgd, sgd-momentum; got '{optimizer}'"
        )

    live: Any = WeakIdKeyDictionary()
    state: dict[str, Any] = {"current": 0, "phase": "forward", "peaks": {}}

    def forget(size: int) -> None:
        state["current"] -= size

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if not isinstance(t, torch.Tensor):
                    continue
                storage = t.untyped_storage()
                if storage in live or storage.nbytes() == 0:
                    continue
                size = _rounded(storage.nbytes())
                live[storage] = size
                state["current"] += size
                weakref.finalize(storage, forget, size)
            phase = state["phase"]
            state["peaks"][phase] = max(state["peaks"].get(phase, 0), state["current"])
            return out

    fields = {k: v for k, v in config.items() if not k.startswith("_")}
    model_type = fields.pop("model_type", "llama")
    fields.pop("architectures", None)
    if attention == "flash":
        # The CPU flash kernel has no dropout; the CUDA one applies it in-kernel (philox state
        # only, no mask saved), so a zero attention dropout keeps the CPU on the same kernel.
        for key in ("attn_pdrop", "attention_dropout", "attention_probs_dropout_prob"):
            if key in fields or model_type in ("gpt2", "bert"):
                fields[key] = 0.0
    cfg = AutoConfig.for_model(model_type, **fields)
    cfg._attn_implementation = "sdpa" if attention == "flash" else "eager"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    started = time.perf_counter()

    # CUDA dropout is the fused native_dropout (a bool mask saved); the CPU path multiplies by a
    # mask in the input's dtype. Route dropout through native_dropout so the CPU saves the same.
    plain_dropout = torch.nn.functional.dropout

    def cuda_like_dropout(x: Any, p: float = 0.5, training: bool = True, inplace: bool = False):
        if not training or p == 0.0:
            return x
        return torch.native_dropout(x, p, True)[0]

    torch.nn.functional.dropout = cuda_like_dropout  # type: ignore[assignment]
    try:
        return _measure(
            torch, FakeTensorMode if fake else contextlib.nullcontext, Track,
            AutoModelForCausalLM, cfg, dtype, state, live,
            micro_batch_size=micro_batch_size, seq_len=seq_len, precision=precision,
            recompute=recompute, optimizer=optimizer, started=started,
        )  # fmt: skip
    finally:
        torch.nn.functional.dropout = plain_dropout  # type: ignore[assignment]


def _measure(
    torch: Any, FakeTensorMode: Any, Track: Any, AutoModelForCausalLM: Any, cfg: Any,
    dtype: Any, state: dict[str, Any], live: Any, *, micro_batch_size: int, seq_len: int,
    precision: str, recompute: str, optimizer: str, started: float,
) -> dict[str, Any]:  # fmt: skip
    """The warm-up and measured steps (see trace_step)."""
    with FakeTensorMode():
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        if recompute == "full":
            model.gradient_checkpointing_enable()
        model.train()
        params = list(model.parameters())
        if optimizer.startswith("adamw"):
            opt: Any = torch.optim.AdamW(
                params, foreach=optimizer == "adamw", fused=optimizer == "adamw-fused"
            )
        else:
            opt = torch.optim.SGD(
                params, lr=0.01, momentum=0.9 if optimizer == "sgd-momentum" else 0.0,
                foreach=True,
            )  # fmt: skip
        ids = torch.randint(0, cfg.vocab_size, (micro_batch_size, seq_len))
        amp = precision == "amp-bf16"

        def step() -> int:
            state["phase"] = "forward"
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                loss = model(input_ids=ids, labels=ids).loss
            end_of_forward = int(state["current"])
            state["phase"] = "backward"
            loss.backward()
            del loss
            state["phase"] = "optimizer_step"
            opt.step()
            opt.zero_grad(set_to_none=True)
            return end_of_forward

        step()  # warm-up: the optimizer states exist from here on

        def storages_bytes(tensors: Any) -> int:
            total = 0
            for t in tensors:
                storage = t.untyped_storage()
                if storage not in live:
                    live[storage] = 0  # known, not counted by the tracker
                    total += _rounded(storage.nbytes())
            return total

        parameters = storages_bytes(params)
        states = storages_bytes(
            v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()
        )
        storages_bytes([ids])
        with Track():
            activations = step()
    base = parameters + states
    peaks = {phase: base + peak for phase, peak in state["peaks"].items()}
    return {
        "parameters_bytes": parameters,
        "optimizer_states_bytes": states,
        "gradients_bytes": parameters if precision != "amp-bf16" else parameters,
        "activations_bytes": activations,
        "phases": peaks,
        "peak_allocated_bytes": max(peaks.values()),
        "peak_phase": max(peaks, key=lambda k: peaks[k]),
        "elapsed_s": time.perf_counter() - started,
    }
