"""Regenerate litgpt_full.json: traced memory of LitGPT 0.5.13's own full fine-tuning step
(litgpt/finetune/full.py fit) on trainmem's fake CUDA device.

Pinned: litgpt 0.5.13 source (`pip download --no-deps litgpt==0.5.13`, unzipped) on
PYTHONPATH, torch 2.13.0+cpu. Not run at test time.

    PYTHONPATH=/path/to/litgpt-0.5.13-src python tests/data/framework_traces/make_litgpt_full_traces.py

Shims, precision and the fused silu_backward as make_litgpt_traces.py (imported from it). What
full.py's fit runs, reproduced: litgpt.model.GPT (every parameter trained), `--precision
bf16-true` (built under the default dtype bf16), torch.optim.AdamW (foreach). Forward:
`logits = model(input_ids)`: ONE head over the sequence (lora.py passes lm_head_chunk_size=128,
full.py does not); Fabric's convert_output casts the logits to fp32 (the default dtype) and fit
holds them in its `logits` local until the next iteration's forward returns; then
`chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])`: the fp32 logits sliced and
flattened (a copy where the micro-batch has more than one row), split into 128-row chunks, one
cross entropy per chunk (each log-softmax kept). AC: full.py's multi-GPU FSDPStrategy checkpoints
every Block (activation_checkpointing_policy={Block}); one GPU runs without (strategy "auto"):
both traced on one device. Two more rows at vocabulary BIG_VOCAB (seq 512, micro-batch 1).
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_litgpt_traces as base  # noqa: E402  (shims litgpt's imports; _FusedSiLU)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import trainmem.trace._step as step  # noqa: E402
from trainmem.trace._core import step_contexts  # noqa: E402

OUT = Path(__file__).with_name("litgpt_full.json")
DIMS = base.DIMS
BIG_VOCAB = 32768
"""The two big-vocabulary rows (seq 512, micro-batch 1): 4 [T, v] is 16% of their step, so the
loss's tensors and the loop's held fp32 logits are measured, not hidden by the blocks."""


def build_model(seq_len: int):
    from litgpt.model import GPT, Config

    d = DIMS
    config = Config(
        n_layer=d["layers"], n_embd=d["hidden"], n_head=d["heads"], n_query_groups=d["kv_heads"],
        intermediate_size=d["intermediate"], vocab_size=d["vocab"], padded_vocab_size=d["vocab"],
        block_size=4 * seq_len, bias=False, norm_class_name="RMSNorm", norm_eps=1e-5,
        mlp_class_name="LLaMAMLP", rotary_percentage=1.0, parallel_residual=False,
        rope_base=500000)
    plain = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # bf16-true: fabric.init_module
    try:
        model = GPT(config)
    finally:
        torch.set_default_dtype(plain)
    model.cos, model.sin = model.cos.to(torch.bfloat16), model.sin.to(torch.bfloat16)
    model.max_seq_length = seq_len  # fit: rebuilds cos/sin (fp32, [seq_len, rope_n_elem])
    return model


def trace(ac: bool, micro_batch: int, seq_len: int = 1024, vocab: int | None = None) -> dict:
    """One traced step; `vocab` replaces DIMS' vocabulary (the big-vocabulary rows, where the
    loss's [T, v] tensors outweigh the blocks)."""
    global DIMS
    plain_dims = DIMS
    DIMS = dict(plain_dims, vocab=vocab or plain_dims["vocab"])
    try:
        return _trace(ac, micro_batch, seq_len)
    finally:
        DIMS = plain_dims


def _trace(ac: bool, micro_batch: int, seq_len: int) -> dict:
    from litgpt.utils import chunked_cross_entropy

    info: dict = {}
    held: dict = {}

    def build():
        model = build_model(seq_len)
        tokens = torch.randint(0, DIMS["vocab"], (micro_batch, seq_len))
        labels = torch.randint(0, DIMS["vocab"], (micro_batch, seq_len))
        info["rope_cache_bytes"] = sum(step.rounded(b.untyped_storage().nbytes())
                                       for b in model.buffers())

        def loss(m, batch):  # full.py fit: logits = model(input_ids); chunked CE on them
            logits = m(batch[0]).float()  # Fabric convert_output: the default dtype
            held["logits"] = logits  # fit's `logits` local, alive until the next forward
            return chunked_cross_entropy(logits[..., :-1, :], batch[1][..., 1:])

        def checkpoint(m):  # FSDPStrategy(activation_checkpointing_policy={Block})
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                checkpoint_wrapper)
            m.transformer.h = torch.nn.ModuleList(
                [checkpoint_wrapper(el, preserve_rng_state=False) for el in m.transformer.h])

        return step.StepJob(model=model, batch=(tokens, labels), loss=loss,
                            enable_recompute=checkpoint, full_warm_up=True, dtypes_set=True)

    marks: dict = {}

    def on_phase_end(name: str) -> None:
        tracker = base.TRACKERS[-1]
        if name == "warm-up":
            marks["start"] = tracker.sequence
        elif name == "forward":
            marks["saved"] = base.saved_since(tracker, marks["start"])

    device_type, contexts, note = step_contexts(device="cuda", fake=True, sdpa_kernel="flash")
    assert device_type == "cuda" and not note, note
    plain_silu = F.silu
    F.silu = lambda x, inplace=False: base._FusedSiLU.apply(x)
    try:
        out = step.run_step(build, precision="bf16", recompute="full" if ac else "none",
                            optimizer="adamw", device_type=device_type, contexts=contexts,
                            on_phase_end=on_phase_end)
    finally:
        F.silu = plain_silu
    return {
        "ac": ac, "precision": "bf16", "micro_batch_size": micro_batch, "seq_len": seq_len,
        "tokens": micro_batch * seq_len, "optimizer": "adamw", "dims": DIMS,
        "parameters_bytes": out["parameters_bytes"],
        "gradients_bytes": out["gradients_bytes"],
        "optimizer_states_bytes": out["optimizer_states_bytes"],
        "rope_cache_buffers_bytes": info["rope_cache_bytes"],
        "activations_bytes": out["activations_bytes"],
        "activations_by_layer_bytes": out["activations_by_layer_bytes"],
        "activations_outside_layers_bytes": out["activations_outside_layers_bytes"],
        "peak_forward_bytes": out["phases"].get("forward"),
        "peak_backward_bytes": out["phases"].get("backward"),
        "peak_optimizer_step_bytes": out["phases"].get("optimizer_step"),
        "peak_allocated_bytes": out["peak_allocated_bytes"],
        "peak_phase": out["peak_phase"],
        "num_parameters": out["num_parameters"],
        "saved_at_end_of_forward": marks["saved"],
    }


def main() -> None:
    cases = [trace(ac, b) for ac in (False, True) for b in (1, 2)]
    cases += [trace(ac, 1, 512, vocab=BIG_VOCAB) for ac in (False, True)]
    OUT.write_text(json.dumps({
        "provenance": {
            "litgpt": "0.5.13", "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": "PYTHONPATH=<litgpt-0.5.13 src> python "
                       "tests/data/framework_traces/make_litgpt_full_traces.py",
            "deps": "as make_litgpt_traces.py (lightning, psutil, jsonargparse stubbed)",
            "device": "trainmem fake cuda (sm90), SDPA as flash, silu_backward fused",
            "notes": [" ".join(part.split()) for part in __doc__.split("\n\n")[2:]],
        },
        "cases": cases,
    }, indent=1) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
