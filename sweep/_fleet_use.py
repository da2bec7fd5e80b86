"""How much of the fleet a search's answer uses, and the time to train a token budget on it
(`sweep` and `recommend` headers and JSON: `fleet_gpus`, `used_gpus`, `tokens`,
`time_to_train_s`, `cost_to_train_usd`)."""

from __future__ import annotations

import math
from typing import Any

from trainmem.hardware import Fleet

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0


def fleet_gpus(fleet: Fleet) -> int:
    """Every GPU of the fleet (all pools)."""
    return sum(p.num_gpus for p in fleet.pools)


def time_to_train_s(tokens: float, tokens_per_second: float) -> float:
    """Seconds to train `tokens` at the plan's throughput.

    Source: engine estimate_time's `time_to_train_s` (tokens / tokens_per_second).
    Assumes: every step as the estimated one (no warm-up, evaluation, checkpoints or restarts).
    """
    return tokens / tokens_per_second


def cost_to_train_usd(tokens: float, cost_per_million_tokens: float) -> float:
    """Dollars to train `tokens` at the plan's cost per million tokens.

    Source: engine estimate_time's `cost_to_train_usd` (GPUs x $/GPU-hour x hours), which is
    tokens / 1e6 x cost_per_million_tokens.
    """
    return tokens / 1e6 * cost_per_million_tokens


def _number(x: Any) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def fleet_use(
    fleet: Fleet,
    *,
    used_gpus: int | None,
    tokens: float | None,
    tokens_per_second: float | None,
    cost_per_million_tokens: float | None,
) -> dict[str, Any]:
    """The JSON keys: the fleet's GPUs, the answer's (None: nothing fits), the token budget and
    the time and cost to train it (None without --tokens or a timed answer)."""
    tps, cost = _number(tokens_per_second), _number(cost_per_million_tokens)
    timed = tokens is not None and used_gpus is not None and tps is not None and tps > 0
    return {
        "fleet_gpus": fleet_gpus(fleet),
        "used_gpus": used_gpus,
        "tokens": tokens,
        "time_to_train_s": time_to_train_s(tokens, tps) if timed else None,  # type: ignore[arg-type]
        "cost_to_train_usd": (
            cost_to_train_usd(tokens, cost) if timed and cost is not None else None  # type: ignore[arg-type]
        ),
    }


def duration_text(seconds: float) -> str:
    """``4.2 hours`` under two days, else ``12.5 days``."""
    if seconds < 2 * SECONDS_PER_DAY:
        return f"{seconds / SECONDS_PER_HOUR:,.3g} hours"
    return f"{seconds / SECONDS_PER_DAY:,.3g} days"


def fleet_use_text(use: dict[str, Any]) -> str:
    """``uses 32 of 128 GPUs; 1e+09 tokens in 4.2 hours ($1,234)``; ``uses 8 of 8 GPUs``."""
    if use["used_gpus"] is None:
        return f"uses none of {use['fleet_gpus']:,} GPUs"
    text = f"uses {use['used_gpus']:,} of {use['fleet_gpus']:,} GPUs"
    if use["time_to_train_s"] is not None:
        text += f"; {use['tokens']:.3g} tokens in {duration_text(use['time_to_train_s'])}"
        if use["cost_to_train_usd"] is not None:
            text += f" (${use['cost_to_train_usd']:,.0f})"
    return text
