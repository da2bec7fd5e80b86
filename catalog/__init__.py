"""trainmem.catalog: what a job names, read from files.

Model presets and Hugging Face config.json files, user optimizers (TOML) and traced activation
profiles (JSON). The engine is pure (specs in, bytes out); this package turns names and paths
into its specs. Imports engine only.
"""

from ._optimizer_files import load_optimizers, optimizer_columns, read_optimizer_file
from ._presets import load_model, model_config_dict, model_presets, preset_names
from ._profiles import builtin_profiles, load_profile

__all__ = [
    "builtin_profiles",
    "load_model",
    "load_optimizers",
    "load_profile",
    "model_config_dict",
    "model_presets",
    "optimizer_columns",
    "preset_names",
    "read_optimizer_file",
]
