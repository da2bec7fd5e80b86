"""The RL step's time terms (engine/_rl_time.py) against verl's own timing logs.

    python -m bench.rl_time

Per case of tests/data/published/rl_timing.json (tests/rl_timing.py): the estimate's rollout,
score, actor update and critic update per rollout step, verl's measured median and the ratio.
"""

from __future__ import annotations

from tests.rl_timing import rows


def main() -> None:
    print(f"{'case':44} {'term':13} {'estimate s':>10} {'measured s':>10} {'ratio':>6}")
    for r in rows():
        for term in ("gen", "score", "update_actor", "update_critic"):
            got, want = r["est"][term], r["measured"][term]
            if want == 0.0 and got == 0.0:
                continue
            ratio = got / want if want else float("inf")
            print(f"{r['id']:44} {term:13} {got:10.2f} {want:10.2f} {ratio:6.2f}")
        print(
            f"{'':44} {'gen at max':13} {r['gen_at_max']:10.2f} {r['measured']['gen']:10.2f} "
            f"{r['gen_at_max'] / r['measured']['gen']:6.2f}"
        )


if __name__ == "__main__":
    main()
