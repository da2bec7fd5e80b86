"""GPU profiles: memory, dense peak FLOP/s, links and price per accelerator, loaded from TOML.

>>> from trainmem.hardware import get_gpu
>>> gpu = get_gpu("h100-sxm-80gb")
>>> round(gpu.usable_gib, 2)
79.19

Built-in profiles live in ``gpus/<name>.toml``; a folder passed as ``hardware_dir`` or named by
``$TRAINMEM_HARDWARE_DIR`` adds profiles or overrides built-ins of the same name. A GPU is named
by its profile name or an alias, in any case (``get_gpu("H100")``): `resolve_gpu_name` is the
one lookup. The fleet names (Fleet, FleetSource, Pool, parse_fleet) load their module when first
used.
"""

from typing import TYPE_CHECKING, Any

from ._gpu import GIB, GpuProfile
from ._loader import ENV_VAR, get_gpu, gpu_aliases, load_gpus, resolve_gpu_name

if TYPE_CHECKING:  # pragma: no cover
    from ._fleet import Fleet, FleetSource, Pool, parse_fleet

_FLEET_NAMES = ("Fleet", "FleetSource", "Pool", "parse_fleet")
"""Names of hardware/_fleet.py: only the searches (sweep, recommend) need them."""

__all__ = [
    "ENV_VAR",
    "GIB",
    "Fleet",
    "FleetSource",
    "GpuProfile",
    "Pool",
    "get_gpu",
    "gpu_aliases",
    "load_gpus",
    "parse_fleet",
    "resolve_gpu_name",
]


def __getattr__(name: str) -> Any:
    """The fleet names, imported from their module on first use.

    As engine/_lazy.py's lazy_names, which a leaf package cannot import.
    """
    if name not in _FLEET_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import _fleet

    value = getattr(_fleet, name)
    globals()[name] = value
    return value
