"""Model states per rank: parameters, master weights, gradients, optimizer states.

Tables are indexed by the grid's integer codes (see _grid.py), so every lookup is one numpy
fancy-index over the whole column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._model import ModelSpec, ParamTensor
from ._units import ALLOCATOR_BLOCK_BYTES, round_to_block

# Per precision code: fp32, bf16, fp16, amp-bf16, amp-fp16, mixed-bf16, mixed-fp16, fp8-mixed.
PARAM_BYTES = np.array([4, 2, 2, 4, 4, 2, 2, 2], dtype=np.float64)
"""Working weights. amp keeps fp32 parameters (torch.autocast casts per op)."""
MASTER_BYTES = np.array([0, 0, 0, 0, 0, 4, 4, 4], dtype=np.float64)
"""fp32 master copy kept by mixed-precision frameworks (DeepSpeed, Megatron, TE recipes)."""
GRAD_BYTES = np.array([4, 2, 2, 4, 4, 2, 2, 2], dtype=np.float64)
"""Gradient dtype = parameter dtype, except where a framework keeps fp32 grads (see below)."""
STATE_BYTES = np.array([4, 2, 2, 4, 4, 4, 4, 4], dtype=np.float64)
"""Optimizer-state element bytes: the dtype of the parameters the optimizer steps."""
COMPUTE_BYTES = np.array([4, 2, 2, 2, 2, 2, 2, 2], dtype=np.float64)
"""Activation dtype of matmul outputs (fp8 recipes keep activations in bf16, see FP8_*)."""
RESIDUAL_BYTES = np.array([4, 2, 2, 4, 4, 2, 2, 2], dtype=np.float64)
"""Residual-stream dtype: fp32 under autocast (fp32 embedding output + bf16 branch = fp32)."""
IS_AMP = np.array([0, 0, 0, 1, 1, 0, 0, 0], dtype=bool)
IS_MIXED = np.array([0, 0, 0, 0, 0, 1, 1, 1], dtype=bool)
IS_FP8 = np.array([0, 0, 0, 0, 0, 0, 0, 1], dtype=bool)
FP8_WEIGHT_CACHE_BYTES = 2.0
"""fp8 copies of each linear weight kept from forward to backward: row-wise and column-wise
(transposed) fp8 on Hopper, 1 byte each. Source: Transformer Engine `Linear`
(transformer_engine/pytorch/module/linear.py: the fp8 weight workspace cached across
micro-batches; `columnwise` usage for the wgrad/dgrad GEMMs)."""
FP8_SCALING_BYTES_PER_LINEAR = 3 * 1024 * 4.0
"""Delayed-scaling state per fp8 GEMM operand: amax history (1024 entries, fp32) for input,
weight and grad. Source: transformer_engine/common/recipe: DelayedScaling(amax_history_len=1024)."""

# Per optimizer code: adamw, adamw-fused, adamw-8bit, sgd, sgd-momentum, adafactor, lion.
NUM_STATES = np.array([2, 2, 2, 0, 1, 0, 1], dtype=np.float64)
"""Full-size state tensors per parameter (Adafactor's factored moments are handled apart).

Source: torch/optim/adamw.py (exp_avg, exp_avg_sq), sgd.py (momentum_buffer), lion-pytorch
(exp_avg); bitsandbytes AdamW8bit (two uint8 states)."""
STEP_TEMP_STATES = np.array([1, 0, 0, 0, 0, 0, 1], dtype=np.float64)
"""Full-size temporaries of a foreach step, in state units.

Source: torch/optim/adamw.py `_multi_tensor_adamw`: `exp_avg_sq_sqrt = torch._foreach_sqrt(...)`
allocates one state-sized list per (device, dtype) group, the rest runs in place (ground truth:
+1x parameter bytes); fused and sgd allocate none (ground truth: 0)."""
EIGHT_BIT_STATE_BYTES = 1.0 + 4.0 / 256
"""bitsandbytes 8-bit blockwise state: 1 byte + an fp32 absmax per 256-element block.

Source: bitsandbytes/optim/optimizer.py (Optimizer8bit, block_wise=True, blocksize 256)."""
EIGHT_BIT_MIN_NUMEL = 4096
"""bitsandbytes keeps tensors under `min_8bit_size` = 4096 elements in 32-bit states."""
FUSED_STEP_TENSOR_BYTES = ALLOCATOR_BLOCK_BYTES
"""Fused AdamW keeps each parameter's `step` as a device fp32 scalar (one 512-byte block);
foreach keeps it on the CPU (torch/optim/adamw.py, `_get_scalar_dtype`, capturable/fused)."""

NF4_BLOCK = 64
"""bitsandbytes 4-bit blocksize for QLoRA weights (Linear4bit, quant_type="nf4")."""
NF4_NESTED_BLOCK = 256
"""Double quantisation: an fp32 absmax per block of 256 absmax values (compress_statistics)."""
NF4_STATE_BYTES_PER_TENSOR = 1024.0 + 512.0
"""Per quantised tensor: the nested QuantState's 256-entry fp32 code and its offset scalar.
Source: bitsandbytes/functional.py quantize_4bit(compress_statistics=True), QuantState."""

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Adapter target names, one bit each in the grid's `lora_targets` column (PEFT module names;
fused modules map to all the names they contain: Phi-3 qkv_proj, GPT-2 c_attn, ...)."""
LORA_TARGET_ALIASES = {
    "all-linear": LORA_TARGETS,
    "c_attn": ("q_proj", "k_proj", "v_proj"),
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "c_proj": ("o_proj", "down_proj"),
    "c_fc": ("up_proj",),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "query": ("q_proj",),
    "key": ("k_proj",),
    "value": ("v_proj",),
    "dense": ("o_proj", "up_proj", "down_proj"),
    "fc1": ("up_proj",),
    "fc2": ("down_proj",),
    "w1": ("gate_proj",),
    "w3": ("up_proj",),
    "w2": ("down_proj",),
}
LORA_ADAPTER_BYTES = 4.0
"""PEFT keeps adapters in fp32 (LoraConfig autocast_adapter_dtype=True upcasts bf16/fp16
adapters), so their gradients and optimizer states are fp32 too."""


def lora_mask(names: str) -> int:
    """Bitmask over LORA_TARGETS for a comma-separated list of PEFT target names."""
    mask = 0
    for raw in names.split(","):
        name = raw.strip()
        if not name:
            continue
        expanded = LORA_TARGET_ALIASES.get(name, (name,) if name in LORA_TARGETS else None)
        if expanded is None:
            allowed = ", ".join((*LORA_TARGETS, *LORA_TARGET_ALIASES))
            raise ValueError(f"lora_targets: unknown target '{name}'; allowed: {allowed}")
        for target in expanded:
            mask |= 1 << LORA_TARGETS.index(target)
    return mask


def lora_adapted(p: ParamTensor, mask: np.ndarray) -> np.ndarray:
    """Whether tensor `p` (a linear weight) gets an adapter under each row's target mask."""
    bits = sum(1 << LORA_TARGETS.index(t) for t in p.lora_targets)
    return (
        (np.asarray(mask) & bits) != 0
        if bits and len(p.shape) == 2
        else np.zeros(np.shape(mask), dtype=bool)
    )


def _split_numel(shape: tuple[int, ...], split: str, tp: np.ndarray) -> np.ndarray:
    """Elements of one tensor on one tensor-parallel rank (dim padded up, as DTensor shards)."""
    rest = 1
    for d in shape[1:]:
        rest *= d
    if split in ("col", "vocab"):
        return np.ceil(shape[0] / tp) * rest
    if split == "row" and len(shape) == 2:
        return shape[0] * np.ceil(shape[1] / tp)
    return np.full(np.shape(tp), float(np.prod(shape)))


@dataclass(frozen=True, slots=True)
class LocalTensor:
    """One parameter tensor kind on one rank: its local elements per occurrence and how many
    occurrences the rank holds (e.g. blocks on the pipeline stage), per row."""

    tensor: ParamTensor
    numel: np.ndarray
    count: np.ndarray


def local_tensors(
    m: ModelSpec,
    *,
    tp,
    ep,
    counts: dict[str, np.ndarray],
    shard,
    dp_shard,
    etp=1.0,
) -> list[LocalTensor]:
    """Every parameter tensor's elements on one rank (tensor, expert and ZeRO-3/FSDP sharding).

    `counts` gives each group's occurrences on this rank (0 where the stage does not hold it).
    Expert tensors [E, ...] are divided over `ep` ranks, then like every tensor their local dim 0
    is sharded over the data-parallel ranks (experts: dp / ep) when `shard`, padded up.
    Source: torch.distributed.fsdp.fully_shard (FSDP2: per-parameter dim-0 sharding, padded);
    Megatron-Core expert parallelism (experts split over the EP group, data-parallel over the
    rest).
    """
    out = []
    for p in m.param_tensors():
        n = _split_numel(p.shape, p.tp_split, tp)
        dim0 = p.shape[0] if p.shape else 1
        local_dim0 = (
            np.ceil(dim0 / tp)
            if p.tp_split in ("col", "vocab")
            else dim0 * np.ones_like(np.asarray(tp, dtype=np.float64))
        )
        group_dp = dp_shard
        if p.expert:
            # Expert parallelism splits the experts; expert tensor parallelism each expert's
            # intermediate dimension (Megatron-Core expert_tensor_parallel_size).
            local_dim0 = np.ceil(dim0 / ep) * np.ones_like(np.asarray(tp, dtype=np.float64))
            n = n / dim0 * local_dim0 / etp
            group_dp = np.maximum(dp_shard / ep, 1.0)
        per_row = n / local_dim0
        n = np.where(shard, np.ceil(local_dim0 / group_dp) * per_row, n)
        out.append(LocalTensor(p, n, counts[p.group]))
    return out


def group_numel(items: list[LocalTensor], group: str) -> np.ndarray:
    """Local elements of one occurrence of a group (e.g. one block's attention)."""
    return sum((t.numel for t in items if t.tensor.group == group), np.zeros(1))


def total_numel(items: list[LocalTensor]) -> np.ndarray:
    return sum((t.numel * t.count for t in items), np.zeros(1))


def rounded_bytes(items: list[LocalTensor], elem_bytes, *, where=None) -> np.ndarray:
    """Sum of per-tensor bytes, each rounded to the allocator block (what memory_allocated sees).

    `where(tensor)` (optional) returns a per-row mask of the tensors to include.
    """
    total: Any = 0.0
    for t in items:
        b = round_to_block(t.numel * elem_bytes) * t.count
        total = total + (b if where is None else np.where(where(t.tensor), b, 0.0))
    return np.asarray(total)


def nf4_bytes(numel: np.ndarray) -> np.ndarray:
    """Bytes of one NF4-quantised weight with double quantisation (QLoRA).

    Source: Dettmers et al. 2023 (QLoRA), Sec. 2 (NF4, block 64; double quantisation: 8-bit
    absmax, fp32 second-level absmax per 256 blocks) and bitsandbytes Linear4bit storage:
    packed uint8 weight (2 per byte), uint8 absmax, fp32 nested absmax, the nested code.
    """
    return (
        round_to_block(numel / 2.0)
        + round_to_block(numel / NF4_BLOCK)
        + round_to_block(4.0 * numel / (NF4_BLOCK * NF4_NESTED_BLOCK))
        + NF4_STATE_BYTES_PER_TENSOR
    )


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


def lora_num_parameters(m: ModelSpec, rank: int, mask: int) -> int:
    """Trainable adapter parameters of the whole model, as PEFT counts them (r (d_in + d_out)
    per adapted linear weight)."""
    total = 0
    for p in m.param_tensors():
        if (
            len(p.shape) == 2
            and p.group in ("layer", "mlp", "moe")
            and bool(lora_adapted(p, np.asarray(mask)))
        ):
            d_out, d_in = p.shape
            total += rank * (d_in + d_out) * m.group_count(p.group)
    return total
