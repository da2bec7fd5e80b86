"""trainmem.engine: the vectorized per-device training-memory estimator.

Columns in (a grid: one numpy array per field), columns out. Pure: no I/O beyond reading the
shipped presets. The traced-profile names (ActivationProfile, derive_profile, profile_model,
validate_profile) load their module when first used.
"""

from typing import TYPE_CHECKING

from ._advice import GpuChoice, advise, neighbours, top_consumers
from ._config import (
    DEFAULTS_BY_FIELD,
    FIELD_NAMES,
    FIELDS,
    KNOBS,
    SWEEP_AXES,
    TYPES,
    Knob,
    TrainingConfig,
    bound_reason,
    check_fields,
    cross_field_reason,
    grid_columns,
    parallel_layout,
)
from ._estimate import (
    BLOCK_ROWS,
    COMPONENTS,
    OUTPUT_DTYPES,
    OUTPUTS,
    PHASES,
    estimate,
    layout_reason,
    reason_text,
)
from ._fast._kernel import preload as preload_kernel
from ._fast._scalar import encode_row, estimate_one, layout_reason_one
from ._fast._time_row import estimate_time_one
from ._flops import model_flops_per_token
from ._frameworks import FRAMEWORK_SPECS, FrameworkSpec, resolved_loss
from ._grid import (
    ATTENTION,
    DEFAULTS,
    FRAMEWORKS,
    LOSSES,
    OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    Grid,
    decode,
    make_grid,
)
from ._lazy import lazy_names
from ._lora import max_lora_rank
from ._model import ModelSpec
from ._model_readers import FAMILIES, model_from_hf_config
from ._mx import arch_runs as precision_arch_runs
from ._mx import archs_text as precision_archs_text
from ._offload import node_host_bytes, ranks_per_node
from ._optimizers import OptimizerSpec, builtin_optimizers, spec_columns
from ._overhead import (
    Overheads,
    cublas_workspace_bytes_for,
    cuda_context_bytes_for,
    overheads_for,
)
from ._precision import PRECISION_RATES
from ._rules import PROFILE_MISMATCH, REASONS
from ._states import LORA_TARGETS, lora_mask, lora_num_parameters
from ._time import TIME_COLUMNS, bubble_fraction, estimate_time
from ._time_params import TimeParams, time_inputs
from ._units import GIB

if TYPE_CHECKING:  # pragma: no cover
    from ._activation_profile import (
        ActivationProfile,
        derive_profile,
        profile_model,
        validate_profile,
    )

_PROFILE_NAMES = ("ActivationProfile", "derive_profile", "profile_model", "validate_profile")
"""Names of engine/_activation_profile.py: only `--profile` and `trace` need them."""

__all__ = [
    "FRAMEWORK_SPECS",
    "FrameworkSpec",
    "FAMILIES",
    "preload_kernel",
    "estimate_one",
    "encode_row",
    "layout_reason_one",
    "estimate_time_one",
    "builtin_optimizers",
    "spec_columns",
    "DEFAULTS_BY_FIELD",
    "FIELD_NAMES",
    "FIELDS",
    "KNOBS",
    "Knob",
    "SWEEP_AXES",
    "TYPES",
    "TrainingConfig",
    "bound_reason",
    "check_fields",
    "cross_field_reason",
    "grid_columns",
    "parallel_layout",
    "ATTENTION",
    "BLOCK_ROWS",
    "ActivationProfile",
    "COMPONENTS",
    "DEFAULTS",
    "FRAMEWORKS",
    "LOSSES",
    "OFFLOADS",
    "GIB",
    "LORA_TARGETS",
    "OPTIMIZERS",
    "OUTPUTS",
    "OUTPUT_DTYPES",
    "PHASES",
    "PRECISIONS",
    "PROFILE_MISMATCH",
    "REASONS",
    "RECOMPUTE",
    "GpuChoice",
    "Grid",
    "ModelSpec",
    "OptimizerSpec",
    "Overheads",
    "TIME_COLUMNS",
    "TimeParams",
    "advise",
    "bubble_fraction",
    "cublas_workspace_bytes_for",
    "cuda_context_bytes_for",
    "decode",
    "derive_profile",
    "estimate",
    "estimate_time",
    "layout_reason",
    "lora_mask",
    "max_lora_rank",
    "PRECISION_RATES",
    "precision_arch_runs",
    "precision_archs_text",
    "lora_num_parameters",
    "make_grid",
    "resolved_loss",
    "node_host_bytes",
    "ranks_per_node",
    "model_from_hf_config",
    "neighbours",
    "model_flops_per_token",
    "overheads_for",
    "profile_model",
    "reason_text",
    "time_inputs",
    "top_consumers",
    "validate_profile",
]


__getattr__ = lazy_names(__name__, dict.fromkeys(_PROFILE_NAMES, "._activation_profile"))
