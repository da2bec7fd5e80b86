"""Error bars from the evidence: a 90% interval of the device peak, and the probability it fits.

The model's error on a real GPU is the residual r = log(measured / predicted) of the project's
published real-GPU cases (tests/data/published/framework_cases.json, each in the metric its
source measured), per stack (`--framework`) and regime (full fine-tune, LoRA, QLoRA). The
residual of one answer is taken as normal in log space, N(mean_log, sigma_log^2), its
parameters fitted per stack and regime with a shrinkage toward the stack's and then the pooled
distribution (`fit_error_bars`), so that a group of two cases does not claim a narrow
interval. The fitted parameters ship in error_bars.json beside this file, with the cases they
came from; `python -m bench.error_bars --write` regenerates it and a test fails when it is stale.

Assumes: the relative error measured in a source's metric (reserved, allocated, active, device)
is the relative error of the device peak; the published cases stand for the jobs users ask about
(their stacks' common settings); recompute and parallel layout are not regimes of their own
(too few cases per split: they pool within a stack and regime).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from trainmem.engine import FRAMEWORKS, GIB

ERROR_BARS_FILE = Path(__file__).resolve().parent / "error_bars.json"
"""The shipped interval parameters (bench/error_bars.py writes it)."""
REGIMES = ("full", "lora", "qlora")
"""A job's regime: a full fine-tune, LoRA adapters on a trainable-free base, QLoRA (4-bit base)."""
Z90 = 1.6448536269514722
"""The standard normal's 95th percentile: mean +- Z90 sigma holds 90% of a normal."""
SHRINK_CASES = 5.0
"""Pseudo-cases of the parent distribution added to each group (stack, then stack and regime):
the group's mean and variance are weighted n : SHRINK_CASES against the parent's, and a group
mean away from the parent's widens the variance (the normal-inverse-gamma update)."""
ERROR_BAR_KEYS = ("peak_device_bytes_low", "peak_device_bytes_high", "fit_probability")
"""The keys every answer carries (issue 28's contract)."""
FLOOR_SOURCE = "traced"
"""The narrowest interval: the traced cases' own 90% range of residuals (the formulas' error
against the frameworks' code on the fake device, before a real GPU adds anything)."""


def regime_of(*, lora_rank: Any, qlora: Any) -> np.ndarray:
    """The regime code (index into REGIMES) of each row: QLoRA, LoRA (rank > 0), else full."""
    rank = np.asarray(lora_rank, dtype=np.float64)
    q = np.asarray(qlora, dtype=bool)
    return np.where(q & (rank > 0), 2, np.where(rank > 0, 1, 0)).astype(np.int64)


def shrunk_normal(
    x: np.ndarray, *, parent_mean: float, parent_var: float, k: float = SHRINK_CASES
) -> tuple[float, float]:
    """A group's log-residual mean and variance, shrunk toward its parent's.

    Source: the normal-inverse-gamma posterior of a normal's mean and variance with a prior of
    `k` pseudo-observations at the parent's values (Gelman et al., Bayesian Data Analysis, 3rd
    ed., sec. 3.3): mean = (n xbar + k m) / (n + k), var = (SS + k v + n k / (n + k)
    (xbar - m)^2) / (n + k). Ignores the prior's degrees of freedom (a normal, not a t).
    """
    n = len(x)
    if n == 0:
        return parent_mean, parent_var
    xbar = float(np.mean(x))
    ss = float(np.sum((x - xbar) ** 2))
    mean = (n * xbar + k * parent_mean) / (n + k)
    var = (ss + k * parent_var + n * k / (n + k) * (xbar - parent_mean) ** 2) / (n + k)
    return mean, var


def fit_error_bars(
    published: Iterable[Mapping[str, Any]], traced: Iterable[float]
) -> dict[str, Any]:
    """The interval parameters of every stack and regime, from residuals.

    `published`: rows with `stack`, `regime` and `residual` (log measured / predicted);
    `traced`: the traced cases' residuals (the floor). Returns `pooled` (every published case),
    `groups` ("stack/regime" for every FRAMEWORKS x REGIMES: mean_log, sigma_log, the cases
    behind it, and `level`: the finest level with cases of its own), `sigma_floor_log`.
    sigma_log is the predictive one: the variance times 1 + 1 / (n + k) for the mean's own
    uncertainty, and at least the floor.
    """
    rows = list(published)
    x = np.array([r["residual"] for r in rows], dtype=np.float64)
    t = np.array(list(traced), dtype=np.float64)
    floor = max(abs(float(np.quantile(t, 0.05))), abs(float(np.quantile(t, 0.95)))) / Z90
    mean0, var0 = float(np.mean(x)), float(np.var(x, ddof=1))
    groups = {}
    for stack in FRAMEWORKS:
        xs = np.array([r["residual"] for r in rows if r["stack"] == stack])
        mean_s, var_s = shrunk_normal(xs, parent_mean=mean0, parent_var=var0)
        for regime in REGIMES:
            xr = np.array(
                [r["residual"] for r in rows if (r["stack"], r["regime"]) == (stack, regime)]
            )
            mean, var = shrunk_normal(xr, parent_mean=mean_s, parent_var=var_s)
            n_eff = len(xr) + SHRINK_CASES
            level = "stack/regime" if len(xr) else ("stack" if len(xs) else "pooled")
            groups[f"{stack}/{regime}"] = {
                "mean_log": round(mean, 6),
                "sigma_log": round(max(math.sqrt(var * (1.0 + 1.0 / n_eff)), floor), 6),
                "num_cases": len(xr),
                "num_stack_cases": len(xs),
                "level": level,
            }
    return {
        "pooled": {
            "mean_log": round(mean0, 6),
            "sigma_log": round(max(math.sqrt(var0 * (1.0 + 1.0 / len(x))), floor), 6),
            "num_cases": len(x),
        },
        "groups": groups,
        "sigma_floor_log": round(floor, 6),
    }


@functools.cache
def load_error_bars(path: Path = ERROR_BARS_FILE) -> dict[str, Any]:
    """The shipped interval parameters (error_bars.json), read once."""
    return json.loads(path.read_text())


def group_of(stack: str, regime: str) -> dict[str, Any]:
    """The shipped parameters of `stack`/`regime`; a framework added after the fit (an
    extension's FrameworkSpec, which no evidence covers) takes the pooled ones."""
    shipped = load_error_bars()
    group = shipped["groups"].get(f"{stack}/{regime}")
    if group is not None:
        return group
    pooled = shipped["pooled"]
    return {**pooled, "level": "pooled", "num_stack_cases": 0}


@functools.cache
def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """mean_log, sigma_log and the interval's factors exp(mean_log -+ Z90 sigma_log) as
    [framework code, regime code] arrays (FRAMEWORKS x REGIMES); a framework added after the
    fit (an extension's FrameworkSpec) takes the pooled parameters."""
    mean = np.array([[group_of(f, r)["mean_log"] for r in REGIMES] for f in FRAMEWORKS])
    sigma = np.array([[group_of(f, r)["sigma_log"] for r in REGIMES] for f in FRAMEWORKS])
    return mean, sigma, np.exp(mean - Z90 * sigma), np.exp(mean + Z90 * sigma)


def normal_cdf(z: np.ndarray) -> np.ndarray:
    """The standard normal's CDF, vectorized (no scipy).

    Source: Abramowitz & Stegun, Handbook of Mathematical Functions, 7.1.26 (erf, absolute error
    <= 1.5e-7). Phi(z) = (1 + erf(z / sqrt 2)) / 2.
    """
    z = np.asarray(z, dtype=np.float64)
    x = np.abs(z) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    erf = 1.0 - poly * np.exp(-x * x)
    return np.where(z >= 0, 0.5 * (1.0 + erf), 0.5 * (1.0 - erf))


def error_bar_columns(
    peak_device_bytes: Any, limit_bytes: Any, *, framework: Any, regime: Any
) -> dict[str, np.ndarray]:
    """Per row: the 90% interval of the device peak and the probability that it fits.

    `framework`, `regime`: codes (FRAMEWORKS, REGIMES). The measured peak is taken as
    predicted x exp(r), r ~ N(mean_log, sigma_log^2) of the row's stack and regime:
    low/high = predicted x exp(mean_log -+ Z90 sigma_log); fit_probability = P(measured <=
    limit) = Phi((log(limit / predicted) - mean_log) / sigma_log) (0 where the limit is not
    positive; NaN where the prediction is not finite).
    """
    mean_t, sigma_t, low_t, high_t = _tables()
    fw, rg = np.asarray(framework, dtype=np.int64), np.asarray(regime, dtype=np.int64)
    mean, sigma = mean_t[fw, rg], sigma_t[fw, rg]
    peak = np.asarray(peak_device_bytes, dtype=np.float64)
    limit = np.asarray(limit_bytes, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratio = np.log(np.maximum(limit, 0.0) / peak)
        prob = normal_cdf((log_ratio - mean) / sigma)
    prob = np.where(limit <= 0, 0.0, np.where(peak <= 0, 1.0, prob))
    return {
        "peak_device_bytes_low": peak * low_t[fw, rg],
        "peak_device_bytes_high": peak * high_t[fw, rg],
        "fit_probability": np.where(np.isfinite(peak), prob, np.nan),
    }


def error_bar_report(
    peak_device_bytes: float,
    limit_bytes: float,
    config: Mapping[str, Any],
    *,
    fixed_bytes: float = 0.0,
) -> dict[str, Any]:
    """The error-bar keys of one answer (estimate, fit, HTTP): `peak_device_bytes_low`,
    `peak_device_bytes_high` (90% interval), `fit_probability` (the measured device peak within
    the GPU's usable memory less the headroom, the limit `fits` judges), and `error_bars`: the
    stack and regime, the distribution and the evidence behind it. `fixed_bytes`: a part of
    the peak that is a reservation, not a prediction (an RL rollout engine's budget, util x
    total): the distribution scales the rest only."""
    stack = str(config.get("framework", "hf"))
    rank = float(config.get("lora_rank", 0))
    regime = "qlora" if rank > 0 and config.get("qlora") else ("lora" if rank > 0 else "full")
    group = group_of(stack, regime)
    # One row in Python floats (error_bar_columns' formulas, math.erf for the CDF): ~3 us a
    # report against ~100 us through numpy; tests/test_error_bars.py holds the two equal.
    mean, sigma = group["mean_log"], group["sigma_log"]
    fixed = float(fixed_bytes)
    peak, limit = float(peak_device_bytes) - fixed, float(limit_bytes) - fixed
    if not math.isfinite(peak):
        prob = math.nan
    elif limit <= 0:
        prob = 0.0
    elif peak <= 0:
        prob = 1.0
    else:
        prob = 0.5 * (1.0 + math.erf((math.log(limit / peak) - mean) / (sigma * math.sqrt(2.0))))
    return {
        "peak_device_bytes_low": int(round(fixed + peak * math.exp(mean - Z90 * sigma))),
        "peak_device_bytes_high": int(round(fixed + peak * math.exp(mean + Z90 * sigma))),
        "fit_probability": prob,
        "error_bars": {
            "stack": stack,
            "regime": regime,
            "interval": 0.9,
            "distribution": "normal in log(measured / predicted)",
            "mean_log": group["mean_log"],
            "sigma_log": group["sigma_log"],
            "level": group["level"],
            "num_cases": group["num_cases"],
            "num_stack_cases": group["num_stack_cases"],
            "evidence": "published real-GPU peaks (tests/data/published); README, Error bars",
        },
    }


def error_bar_lines(report: Mapping[str, Any]) -> list[str]:
    """The human output's line: the 90% interval and the probability that the job fits."""
    if "peak_device_bytes_low" not in report:
        return []
    e = report["error_bars"]
    evidence = (
        f"{e['num_cases']} published case{'s' if e['num_cases'] != 1 else ''} of {e['stack']} "
        f"{e['regime']}"
        if e["level"] == "stack/regime"
        else f"no published {e['stack']} {e['regime']} case: from "
        + ("the stack's" if e["level"] == "stack" else "every stack's")
    )
    return [
        f"  90% interval of the device peak: {report['peak_device_bytes_low'] / GIB:.2f}-"
        f"{report['peak_device_bytes_high'] / GIB:.2f} GiB ({evidence}); "
        f"P(fits, {report['headroom']:.0%} headroom) {percent(report['fit_probability'])}"
    ]


def percent(p: float) -> str:
    """A probability for people: whole percents, and <0.1% / >99.9% at the ends."""
    if p > 0.999:
        return ">99.9%"
    if p < 0.001:
        return "<0.1%"
    return f"{p:.1%}" if p < 0.01 or p > 0.99 else f"{p:.0%}"
