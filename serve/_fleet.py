"""Fleets over HTTP: inline text or JSON pools, never a path.

The CLI's `--fleet` also takes a TOML file; over HTTP a fleet is only

    "64xh100-sxm-80gb,2xa100-sxm-80gb"                  COUNTxGPU[,COUNTxGPU...]
    {"gpu": "h100-sxm-80gb", "num_nodes": 2}            one pool, or a list of up to 64:
    [{"gpu": "a100-sxm-80gb", "count": 12, "gpus_per_node": 4, "price_per_hour_usd": 1.9}]

(`num_nodes` or `count`; `gpus_per_node` defaults to the profile's; `count` without it follows the
text form: fewer GPUs than a node make one partial node, more must fill whole nodes). Anything else
(a path, a file name) is a 422 that says what is accepted and nothing about the server's files.

A GPU is named as on the CLI: a profile name or an alias, in any case (``8xH100``,
``{"gpu": "h100"}``), resolved by trainmem.hardware's `resolve_gpu_name`. The schema's enum
lists the profile names; `canonical_gpu` maps the other spellings onto them before the enum
is checked.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from trainmem.hardware import resolve_gpu_name
from trainmem.hardware._fleet import MAX_GPUS_PER_NODE, MAX_POOL_GPUS, MAX_POOLS

MAX_PRICE_PER_HOUR_USD = 1e6

_TOKEN_RE = re.compile(r"^(?P<count>[0-9]{1,7})x(?P<gpu>[a-z0-9][a-z0-9.-]{0,63})$", re.IGNORECASE)
ACCEPTED = (
    "fleet: expected COUNTxGPU[,COUNTxGPU...] (e.g. 64xh100-sxm-80gb) or pools as JSON objects "
    "({gpu, num_nodes or count, gpus_per_node, price_per_hour_usd}); server paths are not accepted"
)


def canonical_gpu(gpu_names: tuple[str, ...]) -> Callable[[Any], Any]:
    """A pydantic before-validator for a `gpu` field: an alias or a name in any case becomes
    its profile name (`resolve_gpu_name`); anything else passes on unchanged, for the enum
    check to refuse it naming the field and listing the profile names. The schema keeps the
    enum of profile names (a before-validator does not change it)."""
    names = dict.fromkeys(gpu_names)

    def canonical(value: Any) -> Any:
        if isinstance(value, str):
            return resolve_gpu_name(value, names) or value
        return value

    return canonical


def pool_model(gpu_names: tuple[str, ...]) -> Any:
    """The pydantic model of one inline pool (GPU names as an enum, aliases and any case
    accepted: `canonical_gpu`)."""
    from typing import Annotated, Literal

    from pydantic import BeforeValidator, ConfigDict, Field, create_model

    def bounded(kind: type, **kwargs: Any) -> Any:
        return (Annotated[kind | None, Field(**kwargs)], None)

    name_type: Any = Annotated[
        Literal[gpu_names],  # type: ignore[valid-type]
        BeforeValidator(canonical_gpu(gpu_names)),
    ]
    return create_model(
        "FleetPool",
        __config__=ConfigDict(extra="forbid"),
        gpu=(name_type, Field(description="GPU profile name (GET /v1/gpus).")),
        num_nodes=bounded(int, ge=1, le=MAX_POOL_GPUS, description="Nodes in the pool."),
        count=bounded(int, ge=1, le=MAX_POOL_GPUS, description="GPUs in the pool."),
        gpus_per_node=bounded(
            int, ge=1, le=MAX_GPUS_PER_NODE, description="Default: the profile's."
        ),
        price_per_hour_usd=bounded(
            float,
            ge=0,
            le=MAX_PRICE_PER_HOUR_USD,
            allow_inf_nan=False,
            description="Price of one GPU-hour; default: the profile's on-demand price.",
        ),
    )


def inline_pools(fleet: Any, per_node: Mapping[str, int]) -> tuple[list[dict[str, Any]], str]:
    """The pools of a request's `fleet` ({gpu, nodes, gpus_per_node, price_per_hour_usd}) and
    its label for the answer; ValueError (one line, no echo of long input) when invalid.

    `fleet` is a string or pydantic pool objects; `per_node` maps each GPU to its profile's
    `gpus_per_node`.
    """
    if isinstance(fleet, str):
        text = fleet.strip()
        if not text:
            raise ValueError(ACCEPTED)
        tokens = [token.strip() for token in text.split(",")]
        if len(tokens) > MAX_POOLS:
            raise ValueError(f"fleet: at most {MAX_POOLS} pools")
        pools = [_token_pool(token, per_node) for token in tokens]
        return pools, text
    items = fleet if isinstance(fleet, list) else [fleet]
    if not items:
        raise ValueError("fleet: needs at least one pool")
    pools = [_object_pool(i, item, per_node) for i, item in enumerate(items)]
    return pools, ",".join(_label(pool, per_node) for pool in pools)


def _token_pool(token: str, per_node: Mapping[str, int]) -> dict[str, Any]:
    match = _TOKEN_RE.match(token)
    if not match:
        raise ValueError(ACCEPTED)
    gpu = resolve_gpu_name(match["gpu"], per_node)
    if gpu is None:
        raise ValueError(f"fleet: unknown gpu '{match['gpu']}'; the accepted names: GET /v1/gpus")
    return _counted(gpu, int(match["count"]), None, per_node, where=f"fleet: pool '{token}'")


def _object_pool(index: int, item: Any, per_node: Mapping[str, int]) -> dict[str, Any]:
    where = f"fleet.{index}"
    gpu, nodes, count = item.gpu, item.num_nodes, item.count
    if (nodes is None) == (count is None):
        raise ValueError(f"{where}: give exactly one of num_nodes and count")
    if nodes is not None:
        size = item.gpus_per_node or per_node[gpu]
        if nodes * size > MAX_POOL_GPUS:
            raise ValueError(f"{where}: at most {MAX_POOL_GPUS:,} GPUs per pool")
        pool = {"gpu": gpu, "nodes": nodes, "gpus_per_node": size}
    else:
        pool = _counted(gpu, count, item.gpus_per_node, per_node, where=where)
    return {**pool, "price_per_hour_usd": item.price_per_hour_usd}


def _counted(
    gpu: str, count: int, size: int | None, per_node: Mapping[str, int], *, where: str
) -> dict[str, Any]:
    """COUNT GPUs as nodes: hardware/_fleet.py's rule for the text form."""
    if not 1 <= count <= MAX_POOL_GPUS:
        raise ValueError(f"{where}: COUNT must be 1 to {MAX_POOL_GPUS:,}")
    node = size or per_node[gpu]
    if size is None and count < node:
        return {"gpu": gpu, "nodes": 1, "gpus_per_node": count}
    if count % node:
        raise ValueError(f"{where}: {count} GPUs do not fill whole nodes of {node}")
    return {"gpu": gpu, "nodes": count // node, "gpus_per_node": node}


def _label(pool: Mapping[str, Any], per_node: Mapping[str, int]) -> str:
    """COUNTxGPU where the text form says the same, else NODESxPER_NODExGPU; @PRICE/h."""
    gpu, nodes, size = pool["gpu"], pool["nodes"], pool["gpus_per_node"]
    text = f"{nodes * size}x{gpu}"
    if size != per_node[gpu] and not (nodes == 1 and size < per_node[gpu]):
        text = f"{nodes}x{size}x{gpu}"
    price = pool.get("price_per_hour_usd")
    return text if price is None else f"{text}@{price:g}/h"
