"""trainmem.engine: the vectorized per-device training-memory estimator.

Columns in (a grid: one numpy array per field), columns out. Pure: no I/O beyond reading the
shipped presets.
"""

from ._estimate import COMPONENTS, PHASES, REASONS, estimate, layout_reason, reason_text
from ._grid import (
    ATTENTION,
    DEFAULTS,
    FRAMEWORKS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    Grid,
    decode,
    make_grid,
)
from ._model import ModelSpec, model_from_hf_config
from ._overhead import Overheads, cublas_workspace_bytes_for
from ._presets import load_model, preset_names
from ._units import GIB

__all__ = [
    "ATTENTION",
    "COMPONENTS",
    "DEFAULTS",
    "FRAMEWORKS",
    "GIB",
    "OPTIMIZERS",
    "PHASES",
    "PRECISIONS",
    "REASONS",
    "RECOMPUTE",
    "Grid",
    "ModelSpec",
    "Overheads",
    "cublas_workspace_bytes_for",
    "decode",
    "estimate",
    "layout_reason",
    "load_model",
    "make_grid",
    "model_from_hf_config",
    "preset_names",
    "reason_text",
]
