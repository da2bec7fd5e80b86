"""GPU profiles: memory, dense peak FLOP/s, links and price per accelerator, loaded from TOML.

>>> from trainmem.hardware import get_gpu
>>> gpu = get_gpu("h100-sxm-80gb")
>>> round(gpu.usable_gib, 2)
79.19

Built-in profiles live in ``gpus/<name>.toml``; a folder passed as ``hardware_dir`` or named by
``$TRAINMEM_HARDWARE_DIR`` adds profiles or overrides built-ins of the same name.
"""

from ._fleet import Fleet, Pool, parse_fleet
from ._gpu import GIB, GpuProfile
from ._loader import ENV_VAR, get_gpu, gpu_aliases, load_gpus

__all__ = [
    "ENV_VAR",
    "GIB",
    "Fleet",
    "GpuProfile",
    "Pool",
    "get_gpu",
    "gpu_aliases",
    "load_gpus",
    "parse_fleet",
]
