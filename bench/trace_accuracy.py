"""`trainmem trace` against the ground-truth cases (tests/data/groundtruth).

Needs torch and transformers (the trace extra). For each single-GPU case, and with --multi-gpu
each FSDP2 one (rank 0 of N on a fake process group): the traced parameters, gradients,
optimizer states, activations and peak allocated bytes next to the ground truth, the relative
error of each, how many of the five agree to the byte, and the seconds the trace took.

Run: python -m bench.trace_accuracy [--case SUBSTRING ...] [--device cuda|cpu] [--multi-gpu]
     [--markdown]
"""

from __future__ import annotations

import argparse
import inspect
from typing import Any

from tests._groundtruth import load_cases
from trainmem.trace._core import trace_step

COLUMNS = (
    # (trace key, ground-truth key)
    ("parameters_bytes", "parameters"),
    ("gradients_bytes", "gradients"),
    ("optimizer_states_bytes", "optimizer_states"),
    ("activations_bytes", "activations"),
    ("peak_allocated_bytes", "peak_allocated"),
)


def traced_cases(filters: list[str], *, multi_gpu: bool) -> list[dict[str, Any]]:
    """Single-GPU cases, and with multi_gpu the FSDP2 ones (the layouts trace runs)."""
    cases = load_cases()
    cases = [
        c
        for c in cases
        if c["training"]["num_gpus"] == 1 or (multi_gpu and c["training"].get("zero") == 3)
    ]
    return [c for c in cases if not filters or any(f in c["id"] for f in filters)]


def trace_case(case: dict[str, Any], device: str) -> dict[str, Any]:
    t = case["training"]
    kwargs: dict[str, Any] = {
        "micro_batch_size": t["micro_batch_size"],
        "seq_len": t["seq_len"],
        "precision": t["precision"],
        "recompute": t["recompute"],
        "attention": t["attention"],
        "optimizer": t["optimizer"],
    }
    params = inspect.signature(trace_step).parameters
    if "device" in params:  # the fake-cuda trace; earlier versions ran on the CPU only
        kwargs["device"] = device
    if "sdpa_kernel" in params and t.get("sdpa_kernel"):
        kwargs["sdpa_kernel"] = t["sdpa_kernel"]
    if t["num_gpus"] > 1:
        from trainmem.trace._dist import trace_parallel

        got = trace_parallel(
            case["model_config"],
            num_gpus=t["num_gpus"],
            zero=t["zero"],
            tp=1,
            sequence_parallel=False,
            **kwargs,
        )
    else:
        got = trace_step(case["model_config"], **kwargs)
    row: dict[str, Any] = {"case": case["id"], "seconds": got["elapsed_s"], "exact": 0}
    for key, gt_key in COLUMNS:
        row[gt_key] = got.get(key, float("nan")) / case["bytes"][gt_key] - 1.0
        row["exact"] += got.get(key) == case["bytes"][gt_key]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", default=[], help="substring of a case id")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--multi-gpu", action="store_true", help="also the FSDP2 cases")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    names = [gt for _, gt in COLUMNS]
    if args.markdown:
        print("| case | " + " | ".join(names) + " | exact | seconds |")
        print("|---|" + "---:|" * (len(names) + 2))
    else:
        print(f"{'case':<46}" + "".join(f"{n[:12]:>13}" for n in names) + f"{'exact':>6}{'s':>7}")
    worst, exact, total = 0.0, 0, 0
    for case in traced_cases(args.case, multi_gpu=args.multi_gpu):
        row = trace_case(case, args.device)
        worst = max(worst, *(abs(row[n]) for n in names))
        exact, total = exact + row["exact"], total + len(names)
        if args.markdown:
            cells = " | ".join(f"{row[n]:+.2%}" for n in names)
            print(
                f"| {row['case']} | {cells} | {row['exact']}/5 | {row['seconds']:.1f} |", flush=True
            )
        else:
            cells = "".join(f"{row[n]:>+13.2%}" for n in names)
            print(f"{row['case']:<46}{cells}{row['exact']:>4}/5{row['seconds']:>7.1f}", flush=True)
    print(f"worst absolute error: {worst:.2%}; equal to the byte: {exact} of {total} figures")


if __name__ == "__main__":
    main()
