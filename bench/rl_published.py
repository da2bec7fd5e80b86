"""trainmem's RL phases against published verl / EasyR1 memory records.

Run: python -m bench.rl_published
Prints, per record of tests/data/published/rl_measurements.json that maps to a trainmem job
(tests/rl_published.py says how and why others are skipped), the per-phase device GiB, the
peak phase, the allocated-like peak against a measured max_memory_allocated, trainmem's fit
against a fits / oom outcome, and the advised gpu_memory_utilization against the recipe's.
"""

from __future__ import annotations

from tests.rl_published import cases, compare


def main() -> None:
    print(
        f"{'record':<52} {'rollout':>8} {'score':>7} {'train':>8}  peak     "
        f"alloc~  measured  error   fits/outcome  advised/recipe"
    )
    for record, fields, why in cases():
        if fields is None:
            print(f"{record['id']:<52} skipped: {why}")
            continue
        c = compare(record, fields)
        p = c["phases_gib"]
        rollout, score = p.get("rollout", float("nan")), p.get("score", float("nan"))
        measured = f"{c['measured_gib']:8.2f}  {c['error']:+6.1%}" if "error" in c else " " * 16
        print(
            f"{c['id']:<52} {rollout:8.2f} {score:7.2f}"
            f" {p['train']:8.2f}  {c['peak_phase']:<8} {c['allocated_like_gib']:6.2f}  {measured}"
            f"  {str(c['fits']):<5}/{c['outcome']:<7}  {c['advised']}/{c['recipe_util']}"
        )


if __name__ == "__main__":
    main()
