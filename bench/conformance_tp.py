"""Conformance matrix, tensor-parallel cells: the formulas against the byte-exact trace under TP.

Needs torch and transformers (the trace extra). Each cell is one training job of a tiny model of
tests/conformance_families.py (Llama, Qwen2.5, Mistral as they are; two Llama variants with 8
query heads, one with 8 key/value heads, one with 4, so that tp 4 and 8 split whole heads) at one
setting of tp (1, 2, 4, 8 where the heads allow), sequence parallelism (on/off), precision (fp32,
bf16, amp-bf16), recompute (none/full) and micro-batch (1/2). The step is traced on the fake
CUDA device (rank 0 of the job on a fake process group: trainmem.trace._tp, Hugging Face's tp_plan
layout, torchtitan's for
sequence parallelism) and estimated by the formulas (trainmem.report.estimate_report, framework
"hf", the same flags). Per cell: the relative error (estimate / trace - 1) of parameters,
gradients, optimizer states, activations and peak allocated.

Thresholds as bench/conformance.py: 1% on persistent bytes, 2% on activations and the peak.
Prints every cell (sorted by its worst error), the worst cell per metric and the cells over a
threshold. Traces are cached in the same folder and by the same convention as
bench/conformance.py (JSON keyed by a hash of the config, the flags, torch/transformers versions
and the trace package's source); the estimate is never cached.

Not in the grid: FSDP2 next to tp (not traced: fully_shard on a 2-D fake mesh fails under fake
tensors), MoE families (transformers' tp_plan shards experts with packed_colwise /
moe_tp_experts, which the TP trace does not lay out), fused-qkv families (Phi-3: gathers its
qkv output), tp not dividing the key/value heads (transformers cannot split them).

Grid: 252 cells, about 2.5 minutes with --jobs 2 on two cores, seconds from the cache.

Run: python -m bench.conformance_tp [--quick] [--jobs N] [--cache DIR] [--family NAME ...]
     [--all-rows] [--json FILE]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

from bench.conformance import (
    DEFAULT_CACHE,
    GPU,
    METRICS,
    OPTIMIZER,
    PERSISTENT_THRESHOLD,
    TRANSIENT_THRESHOLD,
    _cell,
    _trace_fingerprint,
    guarded_trace,
    job_key,
    read_cached,
    scored_rows,
    write_cached,
    write_config,
)
from tests.conformance_families import family_config

DEFAULT_TIMEOUT_S = 300.0
_WIDE = {"hidden_size": 256, "head_dim": 32, "num_attention_heads": 8, "tie_word_embeddings": False}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    # name -> (family of tests/conformance_families.py, overrides)
    "llama": ("llama", {}),
    "qwen2.5": ("qwen2.5", {}),
    "mistral": ("mistral", {}),
    "llama-mha8": ("llama", _WIDE | {"num_key_value_heads": 8}),
    "llama-gqa8": ("llama", _WIDE | {"num_key_value_heads": 4}),
}
SEQ_LEN = {"mistral": 256}  # past its 128-token window
DEFAULT_SEQ_LEN = 128
PRECISIONS = ("fp32", "bf16", "amp-bf16")


def variant_config(name: str) -> dict[str, Any]:
    """The tiny config.json dict of a grid family."""
    family, overrides = VARIANTS[name]
    return {**family_config(family), **overrides}


def tp_degrees(name: str) -> tuple[int, ...]:
    """tp 1, 2, 4, 8 where tp divides the query and key/value heads."""
    c = variant_config(name)
    heads, kv = c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
    return tuple(t for t in (1, 2, 4, 8) if heads % t == 0 and kv % t == 0)


def case_name(c: dict[str, Any]) -> str:
    dp = c["num_gpus"] // c["tp"]
    return (
        f"{c['family']} {c['precision']} rc={c['recompute']} mb={c['micro_batch_size']} "
        f"tp={c['tp']}{' sp' if c['sequence_parallel'] else ''}{f' fsdp={dp}' if dp > 1 else ''}"
    )


def _case(family: str, precision: str, recompute: str, mb: int, tp: int, sp: bool, dp: int = 1):
    return {
        "family": family,
        "precision": precision,
        "attention": "flash",
        "sdpa_kernel": "flash",
        "recompute": recompute,
        "seq_len": SEQ_LEN.get(family, DEFAULT_SEQ_LEN),
        "micro_batch_size": mb,
        "num_gpus": tp * dp,
        "tp": tp,
        "sequence_parallel": sp,
    }


def grid(*, quick: bool, families: list[str] | None = None) -> list[dict[str, Any]]:
    """Every family x tp x sp x precision x recompute x micro-batch."""
    names = families or list(VARIANTS)
    cells: list[dict[str, Any]] = []
    if quick:
        for fam in names:
            t = max(tp_degrees(fam))
            cells.append(_case(fam, "bf16", "none", 2, t, False))
            cells.append(_case(fam, "amp-bf16", "full", 1, t, True))
        return cells
    for fam in names:
        for t, p, r, mb in itertools.product(tp_degrees(fam), PRECISIONS, ("none", "full"), (1, 2)):
            for sp in (False, True) if t > 1 else (False,):
                cells.append(_case(fam, p, r, mb, t, sp))
    return cells


def case_key(case: dict[str, Any], fingerprint: str) -> str:
    """The cache key of a TP cell (bench/conformance.py job_key on the variant's config)."""
    return job_key(variant_config(case["family"]), case, fingerprint)


def trace_case(case: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """{"measured": the trace, "trace_s": seconds} or {"error": one line} (in a worker)."""
    config = variant_config(case["family"])
    flags = {
        k: case[k]
        for k in (
            "micro_batch_size",
            "seq_len",
            "precision",
            "recompute",
            "attention",
            "sdpa_kernel",
        )
    }

    def run() -> dict[str, Any]:
        if case["num_gpus"] > 1:
            from trainmem.trace._dist import trace_parallel

            tp, world = case["tp"], case["num_gpus"]
            return trace_parallel(
                config,
                num_gpus=world,
                zero=3 if world > tp else 0,
                tp=tp,
                sequence_parallel=case["sequence_parallel"],
                optimizer=OPTIMIZER,
                **flags,
            )
        from trainmem.trace._core import trace_step

        return trace_step(config, optimizer=OPTIMIZER, **flags)

    return guarded_trace(run, timeout_s)


def run_traces(
    cases: list[dict[str, Any]], *, cache: Path, jobs: int, timeout_s: float
) -> dict[str, dict[str, Any]]:
    """Every cell's trace (from the cache, else traced in fresh worker processes and cached)."""
    fingerprint = _trace_fingerprint()
    results: dict[str, dict[str, Any]] = {}
    todo: dict[str, dict[str, Any]] = {}
    cache.mkdir(parents=True, exist_ok=True)
    for case in cases:
        key = case_key(case, fingerprint)
        cached = read_cached(cache, key)
        if cached is not None:
            results[key] = cached
        else:
            todo[key] = case
    print(f"{len(cases)} cells: {len(cases) - len(todo)} cached, {len(todo)} to trace", flush=True)
    if not todo:
        return results
    start = time.time()
    context = multiprocessing.get_context("spawn")  # fresh: the fake device before autograd
    # no max_tasks_per_child: replacing a worker can hang the pool (CPython 3.11)
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        futures = {pool.submit(trace_case, case, timeout_s): key for key, case in todo.items()}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            key = futures[future]
            try:
                result = future.result()
            except Exception as exc:  # a worker died (killed, out of memory)
                result = {"error": f"worker: {type(exc).__name__}", "transient": True}
            result["case"] = todo[key]
            results[key] = result
            write_cached(cache, key, result)
            if done % 25 == 0 or done == len(todo):
                print(f"  traced {done}/{len(todo)} in {time.time() - start:.0f} s", flush=True)
    return results


def estimate_case(case: dict[str, Any], config_path: str) -> dict[str, Any]:
    """The formulas' comparable figures for the cell (framework hf, the cell's layout)."""
    from trainmem.report import estimate_report
    from trainmem.trace._report import _estimate_figures

    world, tp = case["num_gpus"], case["tp"]
    report = estimate_report(
        model=config_path,
        gpu=GPU,
        seq_len=case["seq_len"],
        micro_batch_size=case["micro_batch_size"],
        precision=case["precision"],
        optimizer=OPTIMIZER,
        recompute=case["recompute"],
        attention=case["attention"],
        framework="hf",
        num_gpus=world,
        zero=3 if world > tp else 0,
        tp=tp,
        sequence_parallel=case["sequence_parallel"],
    )
    return _estimate_figures(report)


def config_file(family: str, folder: Path) -> str:
    """The grid family's tiny config.json (the estimate reads a path)."""
    return write_config(variant_config(family), folder / f"tp-{family}.json")


def evaluate(
    cases: list[dict[str, Any]], results: dict[str, dict[str, Any]], config_dir: Path
) -> list[dict[str, Any]]:
    """One row per cell: its errors (or why there are none), scored as bench/conformance.py's."""
    return scored_rows(
        cases,
        results,
        name=case_name,
        key=case_key,
        predict=lambda case: estimate_case(case, config_file(case["family"], config_dir)),
    )


def print_report(rows: list[dict[str, Any]], *, all_rows: bool) -> None:
    """Every cell (or those over a threshold and 20 more), the worst per metric, the count."""
    ok = sorted((r for r in rows if "metrics" in r), key=lambda r: -r["worst"])
    names = [n for n, _, _ in METRICS]
    print(f"\n{'cell':<46}" + "".join(f"{n:>9}" for n in names))
    shown = ok if all_rows else [r for r in ok if r["over"]] + [r for r in ok if not r["over"]][:20]
    for r in shown:
        print(f"{r['name']:<46}" + "".join(_cell(r["metrics"][n]) for n in names))
    if len(shown) < len(ok):
        print(f"... {len(ok) - len(shown)} more cells within the thresholds (--all-rows)")
    failed = [r for r in rows if "metrics" not in r]
    if failed:
        print(f"\n{len(failed)} cells without a comparison:")
        for r in failed:
            print(f"  {r['name']}: {r['error']}")
    print("\nworst cell per metric:")
    for n, _, thr in METRICS:
        have = [r for r in ok if r["metrics"][n]]
        if have:
            worst = max(have, key=lambda r: abs(r["metrics"][n]["error"]))
            over = sum(abs(r["metrics"][n]["error"]) > thr for r in have)
            exact = sum(r["metrics"][n]["exact"] for r in have)
            print(
                f"  {n:<7}{worst['metrics'][n]['error']:>+9.3%}  {worst['name']}  ({over} of "
                f"{len(have)} cells over {thr:.0%}; {exact} exact)"
            )
    persistent = sum(any(n in ("params", "grads", "optim") for n in r["over"]) for r in ok)
    transient = sum(any(n in ("acts", "peak") for n in r["over"]) for r in ok)
    print(
        f"\n{len(ok)} cells compared: {persistent} over {PERSISTENT_THRESHOLD:.0%} on persistent "
        f"bytes, {transient} over {TRANSIENT_THRESHOLD:.0%} on activations or peak; "
        f"{len(failed)} not compared"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two cells per family")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--cache", default=str(DEFAULT_CACHE), help="trace cache folder")
    parser.add_argument("--family", action="append", choices=list(VARIANTS), help="only these")
    parser.add_argument("--all-rows", action="store_true", help="print every cell's row")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    start = time.time()
    cases = grid(quick=args.quick, families=args.family)
    cache = Path(args.cache)
    results = run_traces(cases, cache=cache, jobs=max(1, args.jobs), timeout_s=DEFAULT_TIMEOUT_S)
    rows = evaluate(cases, results, cache / "configs")
    print_report(rows, all_rows=args.all_rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{time.time() - start:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
