"""One configuration at a time: estimate_one() (engine/_fast/_scalar.py) against estimate() on a
grid of one row, in the same run.

Run: python -m bench.single [--model NAME]
A user's loop over 384 configurations of one model (micro-batch x sequence x tp x ZeRO x
recompute on 8 GPUs): first pass cold (each new layout / micro-batch shape evaluates its per-key
terms once), then warm (terms cached: the HTTP service, advice neighbours and Optuna trials
revisit them). Then the public report (`trainmem.estimate`, with and without the advice's
search; without it the report is complete but for the `advice` key, which the API computes on
request: its memory through estimate_one, its step time through estimate_time_one,
engine/_fast/_time_row.py). The last line printed is `single_configurations_per_second=<warm
rate>`.
"""

from __future__ import annotations

import argparse
import itertools
import time

from trainmem.catalog import load_model
from trainmem.engine import RECOMPUTE, estimate, estimate_one, make_grid
from trainmem.engine._fast._scalar import _caches


def configurations() -> list[dict]:
    axes = itertools.product([1, 2, 4, 8], [2048, 4096, 8192], [1, 2, 4, 8], range(4), [0, 2])
    return [
        {
            "micro_batch_size": mb,
            "seq_len": seq,
            "num_gpus": 8,
            "tp": tp,
            "zero": zero,
            "precision": "mixed-bf16",
            "recompute": recompute,
        }
        for mb, seq, tp, zero, recompute in axes
    ]


def _seconds_per_call(call, configs: list[dict], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for config in configs:
            call(config)
        best = min(best, (time.perf_counter() - start) / len(configs))
    return best


def _public_report(model: str, configs: list[dict]) -> tuple[float, float]:
    """Seconds per `trainmem.estimate` report (the Python API, as a scheduler calls it): without
    the advice's search, on every configuration; with it, on the first 24 (best of 2)."""
    import trainmem

    def plain(config: dict) -> None:
        trainmem.estimate(config, model=model, gpu="h100-sxm-80gb", advice=False)

    def advised(config: dict) -> None:
        trainmem.estimate(config, model=model, gpu="h100-sxm-80gb")

    # The public API takes names where the engine takes codes (recompute 0 / 2 above).
    configs = [{**c, "recompute": RECOMPUTE[c["recompute"]]} for c in configs]
    plain(configs[0])  # imports and per-model caches
    return _seconds_per_call(plain, configs, 3), _seconds_per_call(advised, configs[:24], 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    m = load_model(args.model)
    configs = configurations()

    def one(config: dict) -> None:
        estimate_one(m, config, usable_bytes=80e9)

    _caches.clear()
    cold = _seconds_per_call(one, configs, 1)
    warm = _seconds_per_call(one, configs, args.repeats)
    grid = _seconds_per_call(
        lambda c: estimate(m, make_grid(c), usable_bytes=80e9), configs[:100], 2
    )
    report, report_advice = _public_report(args.model, configs)
    print(f"model={m.name}, {len(configs)} configurations, best of {args.repeats}")
    print(f"estimate() on a one-row grid: {grid * 1e6:8.1f} us  {1 / grid:>10,.0f}/s")
    print(f"estimate_one, cold caches:    {cold * 1e6:8.1f} us  {1 / cold:>10,.0f}/s")
    print(f"estimate_one, warm caches:    {warm * 1e6:8.1f} us  {1 / warm:>10,.0f}/s")
    print(f"ratio warm / one-row grid: {grid / warm:.0f}x")
    print(
        f"trainmem.estimate(advice=False): {report * 1e6:8.1f} us  {1 / report:>10,.0f}/s"
        "  (the public report: breakdown, peaks, fit, step time, top consumers)"
    )
    print(
        f"trainmem.estimate() with advice: {report_advice * 1e6:8.1f} us  "
        f"{1 / report_advice:>10,.0f}/s"
    )
    print("reference: llm-analysis 0.2.2 ~7,300/s called the same way (issue 17)")
    print(f"public_reports_per_second={1 / report:.0f}")
    print(f"single_configurations_per_second={1 / warm:.0f}")


if __name__ == "__main__":
    main()
