"""Optimizers as data: the built-in registry, user TOML files, and the bytes of their states.

Every built-in optimizer is one `OptimizerSpec` in `BUILTIN_OPTIMIZERS`; the vocabulary
(`OPTIMIZERS`, in registry order: an optimizer's grid code is its position) and every
per-optimizer table the formulas index with an optimizer column are derived from it. Adding a
built-in optimizer is adding one entry (at the end, so that earlier codes keep their meaning).

A user optimizer is one ``<name>.toml`` in a folder given as `optimizers_dir` or named by
``$TRAINMEM_OPTIMIZERS_DIR``. It becomes grid columns through `optimizer_columns`: the grid's
`optimizer` code stays "adamw" (no special path) and `optimizer_custom` switches the state
counts, dtype and step temporaries to the file's values (see `state_counts`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ._model import ModelSpec
from ._units import ALLOCATOR_BLOCK_BYTES, round_to_block

if TYPE_CHECKING:
    from ._states import LocalTensor

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover - exercised on 3.10 only
    pass

ENV_VAR = "TRAINMEM_OPTIMIZERS_DIR"
"""Environment variable naming a folder of user ``<name>.toml`` optimizer files."""
BUILTIN = "built-in"


_NUMBER_LIMITS = {
    "num_states": 64.0,
    "state_bytes": 16.0,
    "step_temp_states": 64.0,
    "step_bytes_per_parameter": 1e4,
}
"""Upper bounds of an optimizer's numbers (AdamW: 2 states of 4 bytes, 1 temporary, 28 step
bytes per parameter): far above any optimizer, below a typo's 1e300."""


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
    device_step_scalars: bool = False
    """Built-in only (not a TOML key): one fp32 `step` scalar per parameter tensor on the device
    (fused AdamW), see FUSED_STEP_TENSOR_BYTES."""
    factored_second_moment: bool = False
    """Built-in only (not a TOML key): Adafactor's factored second moment replaces the
    full-size states and step temporaries, see `adafactor_state_bytes`."""
    loop_temp_tensors: float = 0.0
    """Built-in only (not a TOML key): a per-parameter (single-tensor) step's temporaries, in
    units of the largest stepped tensor (torch.optim.AdamW(foreach=False): 2; transformers'
    own AdamW: 1), see LOOP_STEP_TEMP_SOURCE and `step_temporary_bytes`."""
    paged: bool = False
    """Built-in only (not a TOML key): bitsandbytes' paged optimizers keep the state buffers of
    tensors of PAGED_MIN_NUMEL elements or more in CUDA unified memory (cudaMallocManaged),
    outside torch's caching allocator, paged to host memory under pressure; see
    `paged_state_bytes`."""

    def __post_init__(self) -> None:
        errors = []
        if self.path != BUILTIN and self.name in OPTIMIZERS:  # built-ins define them
            errors.append(f"name {self.name!r} is a built-in optimizer; choose another name")
        for key, high in _NUMBER_LIMITS.items():
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and 0 <= value <= high):  # NaN fails
                errors.append(f"{key} must be a number in [0, {high:g}], got {value!r}")
        if isinstance(self.num_states, (int, float)) and self.num_states % 1:  # NaN: above
            errors.append(
                f"num_states must be a whole number of state tensors, got {self.num_states}"
            )
        if not isinstance(self.eight_bit_blockwise, bool):
            errors.append("eight_bit_blockwise must be true or false")
        if errors:
            raise ValueError(f"optimizer {self.name}: {'; '.join(errors)}")


_TORCH_ADAMW = "torch/optim/adamw.py (exp_avg, exp_avg_sq)"
_FOREACH_TEMP = (
    "torch/optim/adamw.py `_multi_tensor_adamw`: `exp_avg_sq_sqrt = torch._foreach_sqrt(...)` "
    "allocates one state-sized list per (device, dtype) group, the rest runs in place (ground "
    "truth: +1x parameter bytes); fused and sgd allocate none (ground truth: 0)"
)
_BNB_OPTIMIZER = (
    "bitsandbytes 0.50.2 optim/optimizer.py Optimizer2State.init_state: state1/state2 float32 "
    "when optim_bits == 32 whatever the parameter's dtype, uint8 (+ fp32 absmax per 256) for "
    "8-bit; the update is one fused kernel (no step temporaries); get_state_buffer pages the "
    "buffers of tensors of >= 1e5 elements when is_paged (F.get_paged: cudaMallocManaged)"
)
LOOP_STEP_TEMP_SOURCE = (
    "torch 2.13 torch/optim/adam.py `_single_tensor_adam` (AdamW(foreach=False)): per parameter "
    "`denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`, the sqrt and the quotient "
    "alive together (2 tensors of that parameter), freed before the next; transformers 4.27 "
    "optimization.py AdamW.step (Trainer's optim='adamw_hf'): `denom = exp_avg_sq.sqrt()"
    ".add_(eps)`, 1 tensor; the rest in place. The largest stepped tensor bounds the step. "
    "Trainer's default optim was adamw_hf until huggingface/transformers#25109 (merged "
    "2023-07-26, transformers 4.32: adamw_torch)"
)
_STEP_TRAFFIC = (
    "step bytes: the tensors each torch.optim update reads and writes: fp32 parameter read + "
    "write 8, gradient read 4, each fp32 state read + write 8 (8-bit AdamW: 2 per state; "
    "Adafactor: small factored statistics, two gradient-sized temporaries); no savings from "
    "fused kernels, no 16-bit weight copy refresh"
)

BUILTIN_OPTIMIZERS: dict[str, OptimizerSpec] = {
    spec.name: spec
    for spec in (
        OptimizerSpec(
            name="adamw",
            description="torch.optim.AdamW, foreach (the default implementation)",
            num_states=2.0, state_bytes=0.0, step_temp_states=1.0, eight_bit_blockwise=False,
            step_bytes_per_parameter=28.0, sources=(_TORCH_ADAMW, _FOREACH_TEMP, _STEP_TRAFFIC),
        ),
        OptimizerSpec(
            name="adamw-fused",
            description="torch.optim.AdamW(fused=True): no step temporaries, device step counters",
            num_states=2.0, state_bytes=0.0, step_temp_states=0.0, eight_bit_blockwise=False,
            step_bytes_per_parameter=28.0, device_step_scalars=True,
            sources=(_TORCH_ADAMW, _FOREACH_TEMP, _STEP_TRAFFIC),
        ),
        OptimizerSpec(
            name="adamw-8bit",
            description="bitsandbytes AdamW8bit: two 8-bit blockwise states",
            num_states=2.0, state_bytes=0.0, step_temp_states=0.0, eight_bit_blockwise=True,
            step_bytes_per_parameter=16.0,
            sources=("bitsandbytes AdamW8bit (two uint8 states)", _STEP_TRAFFIC),
        ),
        OptimizerSpec(
            name="sgd",
            description="torch.optim.SGD without momentum",
            num_states=0.0, state_bytes=0.0, step_temp_states=0.0, eight_bit_blockwise=False,
            step_bytes_per_parameter=12.0, sources=("torch/optim/sgd.py", _STEP_TRAFFIC),
        ),
        OptimizerSpec(
            name="sgd-momentum",
            description="torch.optim.SGD with a momentum buffer",
            num_states=1.0, state_bytes=0.0, step_temp_states=0.0, eight_bit_blockwise=False,
            step_bytes_per_parameter=20.0,
            sources=("torch/optim/sgd.py (momentum_buffer)", _STEP_TRAFFIC),
        ),
        OptimizerSpec(
            name="adafactor",
            description="transformers Adafactor (beta1=None): factored second moment (rows + "
            "columns)",
            num_states=0.0, state_bytes=0.0, step_temp_states=0.0, eight_bit_blockwise=False,
            step_bytes_per_parameter=24.0, factored_second_moment=True,
            sources=("Shazeer & Stern 2018, Sec. 3", _STEP_TRAFFIC),
        ),
        OptimizerSpec(
            name="lion",
            description="lion-pytorch Lion: one momentum state, one temporary",
            num_states=1.0, state_bytes=0.0, step_temp_states=1.0, eight_bit_blockwise=False,
            step_bytes_per_parameter=20.0, sources=("lion-pytorch (exp_avg)", _STEP_TRAFFIC),
        ),
        OptimizerSpec(
            name="paged-adamw",
            description="bitsandbytes PagedAdamW (32-bit): fp32 states, those of large tensors "
            "in unified memory (paged to the host under pressure)",
            num_states=2.0, state_bytes=4.0, step_temp_states=0.0, eight_bit_blockwise=False,
            step_bytes_per_parameter=28.0, paged=True, sources=(_BNB_OPTIMIZER, _STEP_TRAFFIC),
        ),
        OptimizerSpec(
            name="paged-adamw-8bit",
            description="bitsandbytes PagedAdamW8bit: two 8-bit blockwise states, those of large "
            "tensors in unified memory (paged to the host under pressure)",
            num_states=2.0, state_bytes=0.0, step_temp_states=0.0, eight_bit_blockwise=True,
            step_bytes_per_parameter=16.0, paged=True, sources=(_BNB_OPTIMIZER, _STEP_TRAFFIC),
        ),
        OptimizerSpec(
            name="adamw-loop",
            description="torch.optim.AdamW(foreach=False): one parameter at a time, two "
            "temporaries the size of the largest tensor",
            num_states=2.0, state_bytes=0.0, step_temp_states=0.0, eight_bit_blockwise=False,
            step_bytes_per_parameter=28.0, loop_temp_tensors=2.0,
            sources=(_TORCH_ADAMW, LOOP_STEP_TEMP_SOURCE, _STEP_TRAFFIC),
        ),
        OptimizerSpec(
            name="adamw-hf",
            description="transformers' own AdamW (Trainer optim='adamw_hf', its default to 4.31): "
            "one parameter at a time, one temporary the size of the largest tensor",
            num_states=2.0, state_bytes=0.0, step_temp_states=0.0, eight_bit_blockwise=False,
            step_bytes_per_parameter=28.0, loop_temp_tensors=1.0,
            sources=(_TORCH_ADAMW, LOOP_STEP_TEMP_SOURCE, _STEP_TRAFFIC),
        ),
    )
}  # fmt: skip
"""The built-in optimizers by name, in grid-code order."""

OPTIMIZERS: tuple[str, ...] = tuple(BUILTIN_OPTIMIZERS)
"""The optimizer vocabulary (engine/_vocab.py re-exports it): built-in names in code order."""


def _table(field: str, dtype: type = np.float64) -> np.ndarray:
    """One field of every built-in optimizer, indexed by optimizer code."""
    return np.array([getattr(BUILTIN_OPTIMIZERS[n], field) for n in OPTIMIZERS], dtype=dtype)


NUM_STATES = _table("num_states")
"""Full-size state tensors per parameter (Adafactor's factored moments are handled apart).

Source: torch/optim/adamw.py (exp_avg, exp_avg_sq), sgd.py (momentum_buffer), lion-pytorch
(exp_avg); bitsandbytes AdamW8bit (two uint8 states)."""
STEP_TEMP_STATES = _table("step_temp_states")
"""Full-size temporaries of a foreach step, in state units.

Source: torch/optim/adamw.py `_multi_tensor_adamw` (see _FOREACH_TEMP); fused and sgd allocate
none (ground truth: 0)."""
STEP_BYTES_PER_PARAMETER = _table("step_bytes_per_parameter")
"""HBM bytes the optimizer update moves per local parameter (the step-time model).

Source: the tensors each torch.optim update reads and writes (see _STEP_TRAFFIC). Assumes: no
savings from fused kernels, no 16-bit weight copy refresh."""
IS_EIGHT_BIT = _table("eight_bit_blockwise", bool)
IS_PAGED = _table("paged", bool)
BUILTIN_STATE_BYTES = _table("state_bytes")
"""A built-in's own state element bytes (bitsandbytes' 32-bit optimizers: fp32 whatever the
parameters' dtype); 0: the dtype of the parameters it steps. Source: _BNB_OPTIMIZER."""
HAS_DEVICE_STEP_SCALARS = _table("device_step_scalars", bool)
IS_FACTORED = _table("factored_second_moment", bool)
LOOP_TEMP_TENSORS = _table("loop_temp_tensors")
"""Per-parameter steps' temporaries in units of the largest stepped tensor (0: not a loop).
Source: LOOP_STEP_TEMP_SOURCE."""

EIGHT_BIT_STATE_BYTES = 1.0 + 4.0 / 256
"""bitsandbytes 8-bit blockwise state: 1 byte + an fp32 absmax per 256-element block.

Source: bitsandbytes/optim/optimizer.py (Optimizer8bit, block_wise=True, blocksize 256)."""
EIGHT_BIT_MIN_NUMEL = 4096
"""bitsandbytes keeps tensors under `min_8bit_size` = 4096 elements in 32-bit states."""
FUSED_STEP_TENSOR_BYTES = ALLOCATOR_BLOCK_BYTES
"""Fused AdamW keeps each parameter's `step` as a device fp32 scalar (one 512-byte block);
foreach keeps it on the CPU (torch/optim/adamw.py, `_get_scalar_dtype`, capturable/fused)."""
ADAFACTOR_STEP_TEMP_TENSORS = 2.0
"""Adafactor's step: two fp32 temporaries the size of the largest tensor.
Source: transformers.optimization.Adafactor.step (per parameter `update = grad**2 + eps` and
the approximated squared gradient, fp32). Assumes: parameters are stepped in turn, so the
largest tensor bounds them."""


PAGED_MIN_NUMEL = 1e5
"""bitsandbytes pages a state buffer only for a tensor of at least 1e5 elements; smaller ones
get torch.zeros_like on the device. Source: bitsandbytes 0.50.2 optim/optimizer.py
Optimizer8bit.get_state_buffer (`if not self.is_paged or p.numel() < 1e5`)."""


def paged_state_bytes(
    full: Sequence[LocalTensor],
    part: Sequence[LocalTensor],
    *,
    opt: np.ndarray,
    sharded: np.ndarray,
    lora: np.ndarray,
    lora_rank: np.ndarray,
    mask: np.ndarray,
    dp: np.ndarray | float = 1.0,
) -> np.ndarray:
    """Bytes of a paged optimizer's state buffers in unified memory on one rank: two states per
    trainable tensor of PAGED_MIN_NUMEL elements or more, 4 bytes each (32-bit) or 1 (8-bit:
    the fp32 absmax stays on the device); LoRA: each adapter matrix apart (lora_A [r, d_in],
    lora_B [d_out, r]) in the rank's tensor-parallel part of its linear, and its 1/dp share
    where the states are sharded (as the resident states are). 0 where the optimizer is not
    paged.

    Source: PAGED_MIN_NUMEL, _BNB_OPTIMIZER; PEFT LoraLayer (adapter shapes).
    Assumes: under ZeRO the optimizer sees each tensor's shard (`part`), as FSDP2 gives it.
    """
    from ._lora import lora_adapted  # _lora reads the vocabularies, which read this registry

    per_elem = np.where(IS_EIGHT_BIT[opt], 1.0, 4.0) * 2.0
    paged = np.zeros(np.shape(opt))
    for whole, shard in zip(full, part, strict=True):
        numel = np.where(sharded, shard.numel, whole.numel)
        dense = np.where(numel >= PAGED_MIN_NUMEL, numel, 0.0)
        p = whole.tensor
        if p.is_block_linear:
            d_out, d_in = p.shape
            # the rank's part: its tensor-parallel slice (as the local base linear) and, where
            # the states are sharded, its 1/dp share
            local = whole.numel / float(d_out * d_in)
            share = local * np.where(sharded, 1.0 / np.maximum(dp, 1.0), 1.0)
            matrices = (lora_rank * d_in * share, lora_rank * d_out * share)  # lora_A, lora_B
            adapter = sum(np.where(n >= PAGED_MIN_NUMEL, n, 0.0) for n in matrices)
            adapter = np.where(lora_adapted(p, mask), adapter, 0.0)
        else:
            adapter = np.zeros_like(dense)
        paged = paged + np.where(lora, adapter, dense) * whole.count
    return np.where(IS_PAGED[opt], per_elem * paged, 0.0)


def eight_bit_state_bytes(numel: np.ndarray) -> np.ndarray:
    """bitsandbytes AdamW8bit states of one tensor: 8-bit blockwise, fp32 when small."""
    per = np.where(numel >= EIGHT_BIT_MIN_NUMEL, EIGHT_BIT_STATE_BYTES, 4.0)
    return 2.0 * round_to_block(numel * per)


def adafactor_state_bytes(m: ModelSpec, *, numel_local) -> np.ndarray:
    """Adafactor (transformers.optimization.Adafactor, beta1=None): factored second moment.

    Source: Shazeer & Stern 2018, Sec. 3: a 2-D [r, c] parameter keeps r + c fp32 accumulators,
    a 1-D one its full size; no first moment by default.
    Assumes: sharding shrinks the row/column factors proportionally.
    """
    full = 0.0
    factored = 0.0
    for p in m.param_tensors():
        mult = m.group_count(p.group)
        if len(p.shape) == 2:
            factored += (p.shape[0] + p.shape[1]) * mult
        else:
            full += p.numel * mult
    frac = numel_local / max(m.num_parameters, 1)
    return 4.0 * (factored + full) * frac


def state_counts(c: dict[str, np.ndarray], opt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(full-size states, step temporaries in state units) per trainable parameter: the
    registry's for a built-in, the user's columns where `optimizer_custom`."""
    custom = c["optimizer_custom"]
    num_states = np.where(custom, c["optimizer_num_states"], NUM_STATES[opt])
    temp_states = np.where(custom, c["optimizer_temp_states"], STEP_TEMP_STATES[opt])
    return num_states, temp_states


def state_element_bytes(
    c: dict[str, np.ndarray],
    *,
    state_bytes: np.ndarray,
    lora: np.ndarray,
    adapter_bytes: Any,
    opt: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(bytes per state element over the model's parameters, over the trainable ones).

    A user optimizer's `state_bytes` > 0, or a built-in's own (BUILTIN_STATE_BYTES, `opt`),
    overrides the precision's; 0 keeps the dtype of the parameters it steps (LoRA adapters:
    `adapter_bytes`).
    """
    custom_e = np.where(c["optimizer_custom"], c["optimizer_state_bytes"], BUILTIN_STATE_BYTES[opt])
    own = custom_e > 0
    state_e = np.where(own, custom_e, state_bytes)
    return state_e, np.where(lora & ~own, adapter_bytes, state_e)


def optimizer_state_bytes(
    m: ModelSpec,
    full: Sequence[LocalTensor],
    *,
    c: dict[str, np.ndarray],
    opt: np.ndarray,
    num_states: np.ndarray,
    plain_states: np.ndarray,
    state_numel: np.ndarray,
    sharded: np.ndarray,
    dp: np.ndarray,
    lora: np.ndarray,
) -> np.ndarray:
    """Optimizer-state bytes on one rank: `num_states` x `plain_states` (one state's bytes),
    8-bit blockwise where the optimizer is, Adafactor's factored moments, fused AdamW's device
    step scalars.

    `full`: the rank's unsharded tensors; `sharded`: ZeRO-1+ rows (states over `dp` ranks);
    `state_numel`: the trainable elements whose states this rank keeps.
    Source: EIGHT_BIT_STATE_BYTES, adafactor_state_bytes, FUSED_STEP_TENSOR_BYTES (one per
    tensor as the framework builds the model: FrameworkSpec.fused_qkv).
    Assumes: LoRA adapters' 8-bit states are blockwise throughout (no small-tensor fp32, no
    per-tensor rounding).
    """
    optimizer_states = num_states * plain_states
    eight_bit = sum((eight_bit_state_bytes(t.numel) * t.count for t in full), np.zeros_like(dp))
    eight_bit = np.where(sharded, eight_bit / dp, eight_bit)
    eight_bit = np.where(lora, 2.0 * EIGHT_BIT_STATE_BYTES * state_numel, eight_bit)
    optimizer_states = np.where(IS_EIGHT_BIT[opt], eight_bit, optimizer_states)
    # eight_bit holds two states; a user 8-bit optimizer scales it to its own count.
    optimizer_states = np.where(
        c["optimizer_custom"] & c["optimizer_eight_bit"],
        eight_bit * num_states / 2.0,
        optimizer_states,
    )
    optimizer_states = np.where(
        IS_FACTORED[opt], adafactor_state_bytes(m, numel_local=state_numel), optimizer_states
    )
    num_tensors = sum((t.count for t in full), np.zeros_like(dp))
    # A framework that projects q, k, v with one matrix (torchtitan's wqkv) has one tensor for
    # three: k_proj's and v_proj's step scalars are not there. (Imported here: _frameworks
    # reads the vocabularies, which read this registry.)
    from ._frameworks import FUSED_QKV
    from ._lora import lora_adapted
    from ._vision_lora import tower_adapter_tensors

    merged = sum(
        (t.count for t in full if t.tensor.name.split(".")[-2:-1] in (["k_proj"], ["v_proj"])),
        np.zeros_like(dp),
    )
    num_tensors = num_tensors - np.where(FUSED_QKV[c["framework"].astype(np.int64)], merged, 0.0)
    # LoRA: the optimizer steps the adapters only, two tensors (A, B) per adapted linear.
    adapted = sum(
        (np.where(lora_adapted(t.tensor, c["lora_targets"]), 2.0, 0.0) * t.count for t in full),
        np.zeros_like(dp),
    ) + tower_adapter_tensors(m, full, c)
    num_tensors = np.where(lora, adapted, num_tensors)
    return optimizer_states + np.where(
        HAS_DEVICE_STEP_SCALARS[opt], FUSED_STEP_TENSOR_BYTES * num_tensors, 0.0
    )


def step_temporary_bytes(
    full: Sequence[LocalTensor],
    *,
    opt: np.ndarray,
    temp_states: np.ndarray,
    state_elem: np.ndarray,
    group_numel: np.ndarray,
    dp: np.ndarray,
    largest_stepped_numel: Any = np.inf,
) -> np.ndarray:
    """Bytes the optimizer step allocates beyond the states.

    foreach: `temp_states` state-sized lists of the largest (device, dtype) group
    (`group_numel` elements), groups in turn; a per-parameter loop (LOOP_TEMP_TENSORS):
    temporaries of the largest tensor it steps (`largest_stepped_numel`, at most the group);
    Adafactor: two fp32 temporaries of its largest tensor. Source: the registry's `sources`;
    ADAFACTOR_STEP_TEMP_TENSORS; LOOP_STEP_TEMP_SOURCE.
    """
    step_temp = temp_states * state_elem * group_numel
    max_tensor = np.max(np.stack([np.broadcast_to(t.numel, dp.shape) for t in full]), axis=0)
    loop = LOOP_TEMP_TENSORS[opt] * state_elem * np.minimum(largest_stepped_numel, group_numel)
    return np.where(
        IS_FACTORED[opt], ADAFACTOR_STEP_TEMP_TENSORS * 4.0 * max_tensor, step_temp + loop
    )


def optimizer_step_s(
    c: dict[str, np.ndarray], opt: np.ndarray, *, step_params, hbm, offloaded
) -> np.ndarray:
    """Time of the optimizer update on the device: `step_params` local parameters x the bytes
    the update moves per parameter (the registry's, or the user's `optimizer_step_bytes`) at
    the effective HBM bandwidth `hbm`; 0 where `offloaded` (the host steps).
    Source: the registry's `step_bytes_per_parameter` (_STEP_TRAFFIC)."""
    optimizer_bytes = np.where(
        c["optimizer_custom"], c["optimizer_step_bytes"], STEP_BYTES_PER_PARAMETER[opt]
    )
    return np.where(offloaded, 0.0, step_params * optimizer_bytes / hbm)


def builtin_optimizers() -> dict[str, OptimizerSpec]:
    """The built-in optimizers by name (a copy of the registry)."""
    return dict(BUILTIN_OPTIMIZERS)


def spec_columns(spec: OptimizerSpec) -> dict[str, Any]:
    """The grid fields that select optimizer `spec`: a built-in by name, a user optimizer by
    its numbers (the `optimizer_*` columns, on an adamw row)."""
    if spec.name in OPTIMIZERS and spec.path == BUILTIN:
        return {"optimizer": spec.name}
    return {
        "optimizer": "adamw",
        "optimizer_custom": True,
        "optimizer_num_states": spec.num_states,
        "optimizer_state_bytes": spec.state_bytes,
        "optimizer_temp_states": spec.step_temp_states,
        "optimizer_eight_bit": spec.eight_bit_blockwise,
        "optimizer_step_bytes": spec.step_bytes_per_parameter,
    }
