"""How close `trainmem explain`'s attribution comes to the tracer's own categories: each case
traced on fake tensors (trainmem.trace) with its memory snapshot written (trace/_snapshot.py),
the snapshot attributed from its frames and lifetimes (report/_attribute.py), and the relative
error of each component against the tracer's category printed, with the largest over all.

Run: python -m bench.explain_attribution [--quick]   (needs the trace extra: torch, transformers)
Prints one line per case and a summary line (the README-free figure docs/explain.md quotes).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from trainmem.report._attribute import attribute
from trainmem.report._snapshot import load_snapshot, replay
from trainmem.trace._core import trace_step

GROUNDTRUTH = Path(__file__).resolve().parents[1] / "tests" / "data" / "groundtruth"
TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}
TINY_GPT2 = {"model_type": "gpt2", "n_embd": 128, "n_layer": 2, "n_head": 4, "vocab_size": 1000}
CASES = [
    (name, config, prec, rec, opt)
    for name, config in (("tiny-llama", TINY_LLAMA), ("tiny-gpt2", TINY_GPT2))
    for prec, rec in (("amp-bf16", "none"), ("bf16", "full"), ("fp32", "none"))
    for opt in ("adamw", "adamw-fused", "sgd-momentum")
]
GROUNDTRUTH_CASES = ("llama-3.2-1b_amp_s2048_mb2", "tinyllama-1.1b_bf16_s2048_mb8_ckpt")
CATEGORIES = {
    "parameters": "parameters_bytes",
    "gradients": "gradients_bytes",
    "optimizer_states": "optimizer_states_bytes",
    "activations": "activations_bytes",
}


def case_errors(config: dict, **flags: object) -> dict[str, float]:
    """Each component's relative error (explain vs the tracer) of one traced step, and the
    allocated peak's."""
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "step.pickle")
        traced = trace_step(config, attention="flash", snapshot=path, **flags)  # type: ignore[arg-type]
        got = attribute(replay(load_snapshot(path)))
    errors = {
        c: (got["measured"][c] - traced[k]) / max(traced[k], 1) for c, k in CATEGORIES.items()
    }
    errors["peak_allocated"] = (
        got["peak_allocated_bytes"] - traced["peak_allocated_bytes"]
    ) / traced["peak_allocated_bytes"]
    return errors


def main() -> None:
    quick = "--quick" in sys.argv
    worst = 0.0
    runs = [
        (
            f"{n} {p} recompute={r} {o}",
            c,
            {"precision": p, "recompute": r, "optimizer": o, "micro_batch_size": 2, "seq_len": 64},
        )
        for n, c, p, r, o in CASES
    ]
    if not quick:
        for name in GROUNDTRUTH_CASES:
            case = json.loads((GROUNDTRUTH / f"{name}.json").read_text())
            t = case["training"]
            flags = {k: t[k] for k in ("precision", "recompute", "micro_batch_size", "seq_len")}
            runs.append((name, case["model_config"], {**flags, "optimizer": "adamw"}))
    for label, config, flags in runs:
        errors = case_errors(config, **flags)
        worst = max(worst, *(abs(e) for e in errors.values()))
        shown = " ".join(f"{k}={v:+.4%}" for k, v in errors.items())
        print(f"{label}: {shown}", flush=True)
    print(f"largest |error| over {len(runs)} cases: {worst:.4%}")


if __name__ == "__main__":
    main()
