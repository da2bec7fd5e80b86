"""Optimizers as data: the built-ins (described from the _states.py tables) and user TOML files.

A user optimizer is one ``<name>.toml`` in a folder given as `optimizers_dir` or named by
``$TRAINMEM_OPTIMIZERS_DIR``. It becomes grid columns through `optimizer_columns`: the grid's
`optimizer` code stays "adamw" (no special path) and `optimizer_custom` switches the state
counts, dtype and step temporaries to the file's values (see _rank_states.state_terms).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from . import _states as st
from ._grid import OPTIMIZERS
from ._time import OPTIMIZER_STEP_BYTES_PER_PARAMETER

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ENV_VAR = "TRAINMEM_OPTIMIZERS_DIR"
"""Environment variable naming a folder of user ``<name>.toml`` optimizer files."""
BUILTIN = "built-in"


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerSpec:
    """What an optimizer keeps per trainable parameter and what its step allocates."""

    name: str
    description: str
    num_states: float
    """Full-size state tensors per trainable parameter (AdamW 2: exp_avg, exp_avg_sq)."""
    state_bytes: float
    """Bytes per state element; 0 = the dtype of the parameters the optimizer steps (fp32 under
    amp and mixed precision, 16-bit for pure bf16/fp16, fp32 for LoRA adapters)."""
    step_temp_states: float
    """Full-size temporaries of one step, in units of one state tensor (foreach AdamW: 1)."""
    eight_bit_blockwise: bool
    """States stored like bitsandbytes' 8-bit blockwise ones: 1 B + an fp32 absmax per 256
    elements, fp32 for tensors under 4096 elements (`state_bytes` is then ignored)."""
    step_bytes_per_parameter: float
    """HBM bytes the update reads and writes per local parameter (the step-time model)."""
    sources: tuple[str, ...] = ()
    path: str = BUILTIN
    """Where it came from: "built-in" or the TOML file's path."""

    def __post_init__(self) -> None:
        errors = []
        if self.name in OPTIMIZERS and self.path != BUILTIN:
            errors.append(f"name {self.name!r} is a built-in optimizer; choose another name")
        for key in ("num_states", "state_bytes", "step_temp_states", "step_bytes_per_parameter"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and value >= 0 and value == value):
                errors.append(f"{key} must be a number >= 0")
        if not isinstance(self.eight_bit_blockwise, bool):
            errors.append("eight_bit_blockwise must be true or false")
        if errors:
            raise ValueError(f"optimizer {self.name}: {'; '.join(errors)}")


_KEYS = frozenset(f.name for f in fields(OptimizerSpec)) - {"path"}
_REQUIRED = _KEYS - {"sources", "description"}

_BUILTIN_DESCRIPTIONS = {
    "adamw": "torch.optim.AdamW, foreach (the default implementation)",
    "adamw-fused": "torch.optim.AdamW(fused=True): no step temporaries, device step counters",
    "adamw-8bit": "bitsandbytes AdamW8bit: two 8-bit blockwise states",
    "sgd": "torch.optim.SGD without momentum",
    "sgd-momentum": "torch.optim.SGD with a momentum buffer",
    "adafactor": "transformers Adafactor (beta1=None): factored second moment (rows + columns)",
    "lion": "lion-pytorch Lion: one momentum state, one temporary",
}


def builtin_optimizers() -> dict[str, OptimizerSpec]:
    """The built-in optimizers as the engine's tables define them (read-only description)."""
    return {
        name: OptimizerSpec(
            name=name,
            description=_BUILTIN_DESCRIPTIONS.get(name, ""),
            num_states=float(st.NUM_STATES[code]),
            state_bytes=0.0,
            step_temp_states=float(st.STEP_TEMP_STATES[code]),
            eight_bit_blockwise=name == "adamw-8bit",
            step_bytes_per_parameter=OPTIMIZER_STEP_BYTES_PER_PARAMETER[code],
            sources=("engine/_states.py",),
        )
        for code, name in enumerate(OPTIMIZERS)
    }


def _user_dir(optimizers_dir: str | os.PathLike[str] | None) -> Path | None:
    chosen = optimizers_dir if optimizers_dir is not None else os.environ.get(ENV_VAR) or None
    if chosen is None:
        return None
    folder = Path(chosen)
    if not folder.is_dir():
        raise ValueError(f"optimizers dir {str(folder)!r} is not a directory")
    return folder


def load_optimizers(
    optimizers_dir: str | os.PathLike[str] | None = None,
) -> dict[str, OptimizerSpec]:
    """Every optimizer by name: the built-ins, then each ``*.toml`` of the user folder.

    Raises ValueError naming the file for unreadable TOML, missing or unknown keys, a ``name``
    that differs from the file stem or that is a built-in's, or values that break a rule.
    """
    found = builtin_optimizers()
    folder = _user_dir(optimizers_dir)
    if folder is not None:
        for file in sorted(folder.glob("*.toml")):
            spec = read_optimizer_file(os.fspath(file))
            found[spec.name] = spec
    return found


def read_optimizer_file(path: str) -> OptimizerSpec:
    """One user optimizer file, validated."""
    file = Path(path)
    label = file.name
    try:
        table = tomllib.loads(file.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as error:
        raise ValueError(f"{label}: invalid TOML: {error}") from None
    problems = []
    missing = sorted(_REQUIRED - table.keys())
    unknown = sorted(table.keys() - _KEYS)
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if unknown:
        problems.append(f"unknown keys: {', '.join(unknown)}")
    stem = label.removesuffix(".toml")
    if "name" in table and table["name"] != stem:
        problems.append(f"name {table['name']!r} must equal the file stem {stem!r}")
    if problems:
        raise ValueError(f"{label}: {'; '.join(problems)}")
    values: dict[str, Any] = dict(table)
    for key in ("num_states", "state_bytes", "step_temp_states", "step_bytes_per_parameter"):
        if isinstance(values[key], int) and not isinstance(values[key], bool):
            values[key] = float(values[key])
    values["sources"] = tuple(values.get("sources", ()))
    values.setdefault("description", "")
    try:
        return OptimizerSpec(**values, path=path)
    except ValueError as error:
        raise ValueError(f"{label}: {error}") from None


def optimizer_columns(
    name: str, optimizers_dir: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """The grid fields that select optimizer `name` (a built-in or a user file's name)."""
    if name in OPTIMIZERS:
        return {"optimizer": name}
    found = load_optimizers(optimizers_dir)
    if name not in found:
        raise ValueError(f"optimizer: unknown value '{name}'; allowed: {', '.join(found)}")
    spec = found[name]
    return {
        "optimizer": "adamw",
        "optimizer_custom": True,
        "optimizer_num_states": spec.num_states,
        "optimizer_state_bytes": spec.state_bytes,
        "optimizer_temp_states": spec.step_temp_states,
        "optimizer_eight_bit": spec.eight_bit_blockwise,
        "optimizer_step_bytes": spec.step_bytes_per_parameter,
    }
