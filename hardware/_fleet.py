"""Fleets: the GPUs one may train on, as pools of identical nodes, parsed from text, TOML, or
the tables a TOML file parses to (in memory: the HTTP service's inline pools need no file).

>>> from trainmem.hardware import load_gpus, parse_fleet
>>> fleet = parse_fleet("64xh100-sxm-80gb,2xa100-sxm-80gb", load_gpus())
>>> [(p.gpu, p.num_nodes, p.gpus_per_node) for p in fleet.pools]
[('h100-sxm-80gb', 8, 8), ('a100-sxm-80gb', 1, 2)]
>>> parse_fleet([{"gpu": "h100-sxm-80gb", "nodes": 2}], load_gpus()).num_gpus
16
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._files import read_input_text
from ._gpu import GIB, GpuProfile
from ._loader import allowed_gpus_text, resolve_gpu_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

_SHORTHAND_RE = re.compile(r"^(?P<count>[0-9]+)x(?P<gpu>[a-z0-9][a-z0-9.-]*)$", re.IGNORECASE)
"""COUNTxGPU, in any case (``8xH100``, ``8XH100``): the name is `resolve_gpu_name`'s to match."""
_POOL_KEYS = ("gpu", "nodes", "gpus_per_node", "price_per_hour_usd", "host_memory_gib")
IN_MEMORY_LABEL = "fleet"
"""What errors about an in-memory fleet's tables name (a file's are named by the file)."""

MAX_POOLS = 64
"""Pools in one fleet at most (every search runs once per pool: 1,000 pools ran for minutes)."""
MAX_POOL_GPUS = 1_000_000
"""GPUs in one pool at most: far above any fleet, far below any overflow of int64 in the
engine's products (GPUs x bytes)."""
MAX_GPUS_PER_NODE = 1024
"""GPUs in one node at most (a DGX holds 8, an NVL72 rack 72)."""
MAX_HOST_MEMORY_GIB = 1 << 20
"""Host RAM of one node at most, GiB (1 PiB: no node holds a thousandth of it)."""

FleetSource = str | os.PathLike[str] | Mapping[str, Any] | Sequence[Mapping[str, Any]]
"""A fleet as `parse_fleet` takes it: shorthand text, a TOML path, or its tables in memory."""


def pool_size_problem(num_nodes: int, gpus_per_node: int) -> str | None:
    """What is too large in a pool of `num_nodes` x `gpus_per_node` GPUs (None: nothing)."""
    if gpus_per_node > MAX_GPUS_PER_NODE:
        return f"gpus_per_node must be <= {MAX_GPUS_PER_NODE}, got {gpus_per_node:,}"
    if num_nodes * gpus_per_node > MAX_POOL_GPUS:
        return (
            f"at most {MAX_POOL_GPUS:,} GPUs per pool, got {num_nodes:,} nodes of {gpus_per_node}"
        )
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Pool:
    """Identical nodes of one GPU type."""

    gpu: str
    """GPU profile name, e.g. ``"h100-sxm-80gb"`` (see `trainmem gpus`)."""
    num_nodes: int
    """Nodes in the pool."""
    gpus_per_node: int
    """GPUs in each node (the profile's `gpus_per_node` unless the fleet says otherwise)."""
    price_per_hour_usd: float | None = None
    """Price of one GPU for one hour, USD; None: the profile's on-demand price."""
    host_memory_bytes: int | None = None
    """Host RAM of one node, bytes (all its GPUs together); None: the profile's."""

    def __post_init__(self) -> None:
        errors = []
        if not isinstance(self.gpu, str) or not self.gpu:
            errors.append("gpu must be a GPU profile name")
        for field in ("num_nodes", "gpus_per_node"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                errors.append(f"{field} must be a whole number >= 1, got {value!r}")
        size = None if errors else pool_size_problem(self.num_nodes, self.gpus_per_node)
        if size:
            errors.append(size)
        price = self.price_per_hour_usd
        if price is not None and (
            isinstance(price, bool)
            or not isinstance(price, (int, float))
            or not (math.isfinite(price) and price >= 0)
        ):
            errors.append(f"price_per_hour_usd must be a finite number >= 0, got {price!r}")
        host = self.host_memory_bytes
        if host is not None and (isinstance(host, bool) or not isinstance(host, int) or host < 1):
            errors.append(f"host_memory_bytes must be a whole number >= 1, got {host!r}")
        if errors:
            raise ValueError(f"pool {self.gpu!r}: {'; '.join(errors)}")

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def price_per_gpu_hour(self, profile: GpuProfile) -> float:
        """This pool's price override, else the profile's on-demand price."""
        if self.price_per_hour_usd is not None:
            return float(self.price_per_hour_usd)
        return profile.price_per_hour_usd

    def host_memory_per_node_bytes(self, profile: GpuProfile) -> int | None:
        """This pool's host RAM per node, else the profile's; None where neither says."""
        if self.host_memory_bytes is not None:
            return self.host_memory_bytes
        return profile.host_memory_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Fleet:
    """The pools one may train on (several pools may hold the same GPU type)."""

    pools: tuple[Pool, ...]
    """At least one pool."""

    def __post_init__(self) -> None:
        if not isinstance(self.pools, tuple) or not self.pools:
            raise ValueError("fleet: needs at least one pool")
        if not all(isinstance(p, Pool) for p in self.pools):
            raise ValueError("fleet: pools must be Pool objects")
        if len(self.pools) > MAX_POOLS:
            raise ValueError(f"fleet: at most {MAX_POOLS} pools, got {len(self.pools)}")

    @property
    def num_gpus(self) -> int:
        return sum(p.num_gpus for p in self.pools)

    @property
    def gpu_names(self) -> tuple[str, ...]:
        """Distinct GPU types, in pool order."""
        return tuple(dict.fromkeys(p.gpu for p in self.pools))


def parse_fleet(fleet: FleetSource, gpus: Mapping[str, GpuProfile]) -> Fleet:
    """A fleet from shorthand, a TOML file or its tables; ValueError (one line, naming the
    token or field).

    Shorthand: ``COUNTxGPU`` pools, comma-separated (``64xh100-sxm-80gb,32xa100-sxm-80gb``).
    COUNT GPUs fill whole nodes of the profile's `gpus_per_node` (it must divide COUNT); fewer
    GPUs than a node holds make one partial node. TOML (a path ending in ``.toml`` or an
    existing file): ``[[pool]]`` tables with ``gpu``, ``nodes``, optional ``gpus_per_node`` and
    ``price_per_hour_usd``. In memory: what such a file parses to (``{"pool": [...]}``) or its
    list of pool tables, checked as the file's are. `gpus` is what `load_gpus()` returns.
    """
    if isinstance(fleet, Mapping):
        return fleet_from_tables(fleet, gpus, label=IN_MEMORY_LABEL)
    if isinstance(fleet, Sequence) and not isinstance(fleet, str):
        return fleet_from_tables({"pool": list(fleet)}, gpus, label=IN_MEMORY_LABEL)
    text = os.fspath(fleet).strip()
    if text.endswith(".toml") or _is_file(text):
        return _parse_toml(Path(text), gpus)
    if not text:
        raise ValueError("fleet: empty; expected COUNTxGPU[,COUNTxGPU...] or a TOML file")
    return Fleet(pools=tuple(_parse_token(token.strip(), gpus) for token in text.split(",")))


def _is_file(text: str) -> bool:
    """Whether `text` names an existing file (a long shorthand is no path: the OS may refuse
    to look it up, with ENAMETOOLONG)."""
    try:
        return Path(text).is_file()
    except OSError:
        return False


def _profile(name: str, gpus: Mapping[str, GpuProfile], where: str) -> GpuProfile:
    resolved = resolve_gpu_name(name, gpus)
    if resolved is None:
        raise ValueError(f"{where}: unknown gpu {name!r}; {allowed_gpus_text(name, gpus)}")
    return gpus[resolved]


def _parse_token(token: str, gpus: Mapping[str, GpuProfile]) -> Pool:
    match = _SHORTHAND_RE.match(token)
    if not match:
        raise ValueError(
            f"fleet: bad pool {token!r}; expected COUNTxGPU, e.g. 64xh100-sxm-80gb"
            " (several comma-separated)"
        )
    count = int(match["count"])
    profile = _profile(match["gpu"], gpus, f"fleet: pool {token!r}")
    if count < 1:
        raise ValueError(f"fleet: pool {token!r}: COUNT must be >= 1")
    if count > MAX_POOL_GPUS:
        raise ValueError(f"fleet: pool {token!r}: COUNT must be <= {MAX_POOL_GPUS:,}")
    per_node = profile.gpus_per_node
    if count < per_node:
        return Pool(gpu=profile.name, num_nodes=1, gpus_per_node=count)
    if count % per_node:
        raise ValueError(
            f"fleet: pool {token!r}: {count} GPUs do not fill whole nodes of {per_node}; "
            f"use a multiple of {per_node} (or a TOML file with gpus_per_node)"
        )
    return Pool(gpu=profile.name, num_nodes=count // per_node, gpus_per_node=per_node)


def _parse_toml(path: Path, gpus: Mapping[str, GpuProfile]) -> Fleet:
    label = f"fleet: {path.name}"  # the option, then the file (as read_input_text says)
    try:
        table = tomllib.loads(read_input_text(path, what="fleet"))
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{label}: invalid TOML: {error}") from None
    return fleet_from_tables(table, gpus, label=label)


def fleet_from_tables(
    table: Mapping[str, Any], gpus: Mapping[str, GpuProfile], *, label: str
) -> Fleet:
    """The fleet of a fleet file's tables (``{"pool": [{gpu, nodes, ...}, ...]}``), from a file
    or in memory; errors start with `label` (the file's name)."""
    unknown = sorted(set(table) - {"pool"})
    if unknown:
        raise ValueError(f"{label}: unknown key {unknown[0]!r}; allowed: [[pool]] tables")
    pools = table.get("pool")
    if not isinstance(pools, list) or not pools or not all(isinstance(p, dict) for p in pools):
        raise ValueError(f"{label}: expected one or more [[pool]] tables")
    return Fleet(
        pools=tuple(
            _pool_from_table(t, gpus, f"{label}: pool {i + 1}") for i, t in enumerate(pools)
        )
    )


def _pool_from_table(t: dict[str, Any], gpus: Mapping[str, GpuProfile], where: str) -> Pool:
    unknown = sorted(set(t) - set(_POOL_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(_POOL_KEYS)}")
    for key in ("gpu", "nodes"):
        if key not in t:
            raise ValueError(f"{where}: missing key {key!r}")
    if not isinstance(t["gpu"], str):
        raise ValueError(f"{where}: gpu must be a string")
    profile = _profile(t["gpu"], gpus, where)
    for key in ("nodes", "gpus_per_node"):
        value = t.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: {key} must be a whole number >= 1, got {value!r}")
    size = pool_size_problem(t["nodes"], t.get("gpus_per_node", profile.gpus_per_node))
    if size:
        raise ValueError(f"{where}: {size}")
    price = t.get("price_per_hour_usd")
    if price is not None and (
        isinstance(price, bool)
        or not isinstance(price, (int, float))
        or not (math.isfinite(price) and price >= 0)
    ):
        raise ValueError(f"{where}: price_per_hour_usd must be a finite number >= 0, got {price!r}")
    host_gib = t.get("host_memory_gib")
    if host_gib is not None and (
        isinstance(host_gib, bool)
        or not isinstance(host_gib, (int, float))
        or not (math.isfinite(host_gib) and 0 < host_gib <= MAX_HOST_MEMORY_GIB)
    ):
        raise ValueError(
            f"{where}: host_memory_gib must be a finite number > 0 and <= "
            f"{MAX_HOST_MEMORY_GIB:,}, got {host_gib!r}"
        )
    return Pool(
        gpu=profile.name,
        num_nodes=t["nodes"],
        gpus_per_node=t.get("gpus_per_node", profile.gpus_per_node),
        price_per_hour_usd=None if price is None else float(price),
        host_memory_bytes=None if host_gib is None else max(int(round(host_gib * GIB)), 1),
    )
