"""The step-time model against published throughput: the error table, and a refit.

Run: python -m bench.calibrate_time [--fit] [--update-readme]
Prints every published row next to the prediction (tests/step_time_table.py reads the rows,
with their sources, from tests/data/step_time_published.json). --fit searches the fitted
TimeParams fields on the "calibration" tables (least squares on log error, coordinate search) and
prints the values; "validation" tables are never fitted. --update-readme writes the summary table
into README.md.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from tests.step_time_table import BEGIN, END, README, Row, load_rows, markdown, predict
from trainmem.engine import TimeParams

FITTED = (
    "gemm_efficiency_max",
    "gemm_half_work",
    "attention_flops_per_hbm_byte",
    "pointwise_bytes_per_width",
    "eager_attention_bytes_per_score",
)
"""The TimeParams fields --fit searches (the others are cited or solved by hand)."""


def fit(rows: list[Row], start: TimeParams, rounds: int = 6) -> TimeParams:
    """Coordinate search on log(value) of the FITTED fields, minimizing mean squared log error."""
    calib = [r for r in rows if r.use == "calibration"]
    published = np.array([r.published for r in calib])

    def loss(p: TimeParams) -> float:
        return float(np.mean(np.log(predict(calib, p) / published) ** 2))

    best, best_loss = start, loss(start)
    for step in np.geomspace(1.5, 1.02, rounds):
        for name in FITTED:
            for factor in (step, 1.0 / step):
                while True:
                    try:
                        trial = replace(best, **{name: getattr(best, name) * factor})
                    except ValueError:  # outside TimeParams' bounds
                        break
                    trial_loss = loss(trial)
                    if trial_loss >= best_loss:
                        break
                    best, best_loss = trial, trial_loss
    return best


def update_readme(table: str) -> None:
    text = README.read_text()
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    README.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="refit the FITTED TimeParams fields")
    parser.add_argument("--update-readme", action="store_true", help="write the README table")
    args = parser.parse_args()
    rows = load_rows()
    params = TimeParams()
    if args.fit:
        params = fit(rows, params)
        print("fitted:", {name: float(f"{getattr(params, name):.3g}") for name in FITTED})
    predicted = predict(rows, params)
    for row, value in zip(rows, predicted, strict=True):
        print(
            f"{row.table:28s} {row.id:34s} published {row.published:11.4g} "
            f"predicted {value:11.4g}  {value / row.published - 1.0:+7.1%}"
        )
    table = markdown(rows, predicted)
    print(table)
    if args.update_readme:
        update_readme(table)


if __name__ == "__main__":
    main()
