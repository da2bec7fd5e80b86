"""LoRA and QLoRA: fp32 adapters on a frozen base, the NF4-quantised base of QLoRA.

The adapter targets are a bitmask column of the grid (`lora_targets`, one bit per PEFT target
name); `lora_rank` > 0 switches a row to LoRA, `qlora` quantises the base's block linears.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ._codes import BF16, FP16, FP32
from ._model import BLOCK_GROUPS, ModelSpec, ParamTensor
from ._units import round_to_block

if TYPE_CHECKING:
    from ._states import LocalTensor

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

NF4_BLOCK = 64
"""bitsandbytes 4-bit blocksize for QLoRA weights (Linear4bit, quant_type="nf4")."""
NF4_NESTED_BLOCK = 256
"""Double quantisation: an fp32 absmax per block of 256 absmax values (compress_statistics)."""
NF4_STATE_BYTES_PER_TENSOR = 1024.0 + 512.0
"""Per quantised tensor: the nested QuantState's 256-entry fp32 code and its offset scalar.
Source: bitsandbytes/functional.py quantize_4bit(compress_statistics=True), QuantState."""
DEQUANT_BYTES = 2.0
"""QLoRA dequantises one linear weight at a time to 16 bits (forward and backward)."""
QLORA_DEQUANT_BYTES_PER_WEIGHT = 2.5
"""HBM bytes to dequantize one NF4 weight before each use: read 0.5 (4 bits), write 2 (bf16).
Source: bitsandbytes Linear4bit (dequantize_4bit, then a 16-bit matmul), forward and backward."""


LORA_ALL_LINEAR_BIT = 1 << len(LORA_TARGETS)
"""Set by `all-linear`: PEFT's shorthand takes every nn.Linear but the output head, the vision
tower's and projector's included (peft 0.21.2 tuners/tuners_utils.py
_maybe_include_all_linear_layers), which the canonical bits above cannot say."""
LORA_MODULE_NAMES = (
    *LORA_TARGETS, "out_proj", "qkv", "proj", "fc1", "fc2", "linear_1", "linear_2",
    "multi_modal_projector",
)  # fmt: skip
"""Module names matched literally, one bit each after LORA_ALL_LINEAR_BIT: PEFT matches a
listed name against a module's name suffix (`key.endswith("." + target)`), so a VLM tower's
linear is adapted when its own name is listed (CLIP / SigLIP out_proj, fc1, fc2; Qwen's fused
qkv and proj; the projectors' linear_1, linear_2, Mllama's multi_modal_projector). The
language model reads the canonical bits only; "out_proj", "qkv", "proj", "linear_1",
"linear_2" and "multi_modal_projector" adapt none of its linears."""


def lora_module_bit(name: str) -> int:
    """The literal bit of a module name in LORA_MODULE_NAMES."""
    return 1 << (len(LORA_TARGETS) + 1 + LORA_MODULE_NAMES.index(name))


@functools.lru_cache(maxsize=256)
def lora_mask(names: str) -> int:
    """Bitmask for a comma-separated list of PEFT target names (cached: a grid names the same
    few lists on every row): the canonical LORA_TARGETS bits the names expand to, `all-linear`'s
    bit, and each name's literal bit (LORA_MODULE_NAMES)."""
    mask = 0
    for raw in names.split(","):
        name = raw.strip()
        if not name:
            continue
        expanded = LORA_TARGET_ALIASES.get(name, (name,) if name in LORA_TARGETS else None)
        if expanded is None and name not in LORA_MODULE_NAMES:
            allowed = ", ".join(dict.fromkeys((*LORA_MODULE_NAMES, *LORA_TARGET_ALIASES)))
            raise ValueError(f"lora_targets: unknown target '{name}'; allowed: {allowed}")
        for target in expanded or ():
            mask |= 1 << LORA_TARGETS.index(target)
        if name == "all-linear":
            mask |= LORA_ALL_LINEAR_BIT
        if name in LORA_MODULE_NAMES:
            mask |= lora_module_bit(name)
    return mask


def target_bits(mask: np.ndarray) -> dict[str, np.ndarray]:
    """Per target name, the rows whose `lora_targets` mask adapts it."""
    return {name: (mask & (1 << i)) != 0 for i, name in enumerate(LORA_TARGETS)}


def lora_adapted(p: ParamTensor, mask: np.ndarray) -> np.ndarray:
    """Whether tensor `p` (a linear weight) gets an adapter under each row's target mask."""
    bits = sum(1 << LORA_TARGETS.index(t) for t in p.lora_targets)
    return (
        (np.asarray(mask) & bits) != 0
        if bits and len(p.shape) == 2
        else np.zeros(np.shape(mask), dtype=bool)
    )


def lora_num_parameters(
    m: ModelSpec, rank: int, mask: int, *, lora_scope: str = "auto", freeze_vision: bool = False
) -> int:
    """Trainable adapter parameters of the whole model, as PEFT counts them (r (d_in + d_out)
    per adapted linear weight): the language model's block linears and, for a VLM, its tower's
    and projector's that PEFT adapts (`lora_scope` auto, the tower not frozen:
    _vision_lora.tower_adapter_numel, unreached ones included: get_nb_trainable_parameters
    counts every adapter)."""
    total = 0
    for p in m.param_tensors():
        if p.is_block_linear and bool(lora_adapted(p, np.asarray(mask))):
            d_out, d_in = p.shape
            total += rank * (d_in + d_out) * m.group_count(p.group)
    if m.vision is not None:
        from ._vision_lora import tower_adapter_numel  # it reads this module's bits
        from ._vocab import LORA_SCOPES

        row = {
            "lora_rank": np.array([rank]),
            "lora_targets": np.array([mask], dtype=np.int64),
            "lora_scope": np.array([LORA_SCOPES.index(lora_scope)]),
            "freeze_vision": np.array([freeze_vision]),
        }
        total += int(sum(float(n[0]) for n in tower_adapter_numel(m.vision, row)))
    return total


def max_lora_rank(m: ModelSpec, mask: int) -> int | None:
    """The largest rank an adapter of the block linears under target `mask` can have: the
    smaller side of the smallest adapted weight (lora_B A of rank r is a d_out x d_in matrix
    of rank min(r, d_in, d_out): a larger r only adds parameters). None: nothing adapted.
    Source: Hu et al. 2021 (LoRA), Sec. 4.1 (r << min(d, k))."""
    sides = [
        min(p.shape)
        for p in m.param_tensors()
        if p.is_block_linear and bool(lora_adapted(p, np.asarray(mask)))
    ]
    return min(sides) if sides else None


def lora_width(m: ModelSpec, targets: np.ndarray) -> np.ndarray:
    """Sum of (d_in + d_out) over the adapted weight matrices of all blocks, per row's target
    mask: x lora_rank it is the trainable adapter count (PEFT's r (d_in + d_out) per weight).
    Source: lora_num_parameters, vectorized over the target masks."""
    mask = np.asarray(targets)
    width = np.zeros(mask.shape)
    for p in m.param_tensors():
        if p.group in BLOCK_GROUPS and len(p.shape) == 2:
            d_out, d_in = p.shape
            width = width + (d_in + d_out) * m.group_count(p.group) * lora_adapted(p, mask)
    return width


def nf4_bytes(numel: np.ndarray, double_quant=True) -> np.ndarray:
    """Bytes of one NF4-quantised weight, with double quantisation (QLoRA) or without it.

    Source: Dettmers et al. 2023 (QLoRA), Sec. 2 (NF4, block 64; double quantisation: 8-bit
    absmax, fp32 second-level absmax per 256 blocks) and bitsandbytes Linear4bit storage:
    packed uint8 weight (2 per byte), uint8 absmax, fp32 nested absmax, the nested code.
    Without double quantisation (bitsandbytes quantize_4bit(compress_statistics=False), Lightning's
    `bnb.nf4`): the packed weight and one fp32 absmax per block.
    """
    nested = (
        round_to_block(numel / NF4_BLOCK)
        + round_to_block(4.0 * numel / (NF4_BLOCK * NF4_NESTED_BLOCK))
        + NF4_STATE_BYTES_PER_TENSOR
    )
    plain = round_to_block(4.0 * numel / NF4_BLOCK)
    return round_to_block(numel / 2.0) + np.where(double_quant, nested, plain)


def qlora_quantised(p: ParamTensor, every_linear) -> np.ndarray:
    """Whether QLoRA quantises `p`: a block linear, or (`every_linear`, FrameworkSpec
    qlora_every_linear) also the untied head's weight."""
    head = p.group == "head" and len(p.shape) == 2
    return np.asarray(p.is_block_linear) | (np.asarray(every_linear) & head)


@dataclass(frozen=True, slots=True)
class Adapters:
    """LoRA adapter elements of one rank's blocks: all of them, and a data-parallel shard."""

    numel: np.ndarray
    numel_shard: np.ndarray
    """ceil(numel / dp): what ZeRO keeps of them on one rank."""

    def kept(self, sharded: np.ndarray) -> np.ndarray:
        """The elements one rank keeps: the shard where `sharded`, else all."""
        return np.where(sharded, self.numel_shard, self.numel)


def rank_adapters(
    full: Sequence[LocalTensor],
    *,
    rank: np.ndarray,
    mask: np.ndarray,
    dp: np.ndarray,
    sharded,
    extra=0.0,
) -> Adapters:
    """The adapters on the rank's block linears (r (d_in + d_out) each, PEFT's count) and
    `extra` elements (a VLM tower's: _vision_lora.tower_adapter_numel), and their ZeRO-1+ shard
    where `sharded`.

    Source: PEFT LoraLayer (lora_A [r, d_in], lora_B [d_out, r]).
    Assumes: adapters are replicated under tensor parallelism (full d_in, d_out per rank).
    """
    numel = np.zeros_like(dp) + extra
    for t in full:
        p = t.tensor
        if not p.is_block_linear:
            continue
        d_out, d_in = p.shape
        numel = numel + np.where(lora_adapted(p, mask), rank * (d_in + d_out), 0.0) * t.count
    return Adapters(numel, np.where(sharded, np.ceil(numel / dp), numel))


def nf4_base_bytes(
    full: Sequence[LocalTensor], *, dp: np.ndarray, sharded, every_linear=False, double_quant=True
) -> np.ndarray:
    """NF4 bytes of the rank's quantised linears (QLoRA: the block linears; `every_linear`: the
    head too), divided over dp where `sharded`.

    Source: nf4_bytes. ZeRO-3/FSDP shard the NF4 base too (bitsandbytes >= 0.43
    `bnb_4bit_quant_storage`, the "FSDP-QLoRA" recipe; older stacks kept it whole: xtuner #88).
    """
    quantised = np.zeros_like(dp)
    for t in full:
        on = qlora_quantised(t.tensor, every_linear)
        quantised = quantised + np.where(on, nf4_bytes(t.numel, double_quant), 0.0) * t.count
    return np.where(sharded, quantised / dp, quantised)


def qlora_stable_embedding_bytes(full: Sequence[LocalTensor], *, on, param_e) -> np.ndarray:
    """What LitGPT's QLoRA keeps beside its token embedding: the replaced embedding and the new
    StableEmbedding's gradient, [v, h] in the parameter dtype each, alive all run.

    Source: litgpt 0.5.13 finetune/lora.py main (under BitsandbytesPrecision, after
    instantiate_bnb_optimizer(model.parameters()): `old_embedding = model.transformer.wte`,
    wte = bnb StableEmbedding copied from it; the local and the optimizer's param group keep the
    old one; the new weight requires grad but is in no optimizer, so optimizer.zero_grad never
    frees its gradient). Traced: tests/data/framework_traces/litgpt_qlora.json.
    Ignores: StableEmbedding's LayerNorm (h weights; its saved input, [T, h]).
    """
    numel = np.zeros_like(np.asarray(param_e, dtype=np.float64))
    for t in full:
        if t.tensor.group == "embed" and t.tensor.name.endswith("embed_tokens.weight"):
            numel = numel + t.numel * t.count
    return np.where(on, 2.0 * param_e * numel, 0.0)


def lora_parameter_bytes(
    base: np.ndarray,
    base_linear: np.ndarray,
    nf4: np.ndarray,
    *,
    lora,
    qlora,
    adapters,
    adapter_e=LORA_ADAPTER_BYTES,
) -> np.ndarray:
    """Parameter bytes under LoRA: the frozen base (QLoRA: its block linears `base_linear`
    replaced by their NF4 bytes `nf4`) plus the adapters `adapters` (elements) at `adapter_e`
    bytes each (fp32 in peft; the model dtype in torchtune, FrameworkSpec)."""
    base = np.where(qlora, base - base_linear + nf4, base)
    return np.where(lora, base + adapter_e * adapters, base)


def qlora_dequant_bytes(
    full: Sequence[LocalTensor], *, qlora, dp: np.ndarray, every_linear=False
) -> np.ndarray:
    """The 16-bit copy of the largest dense linear weight QLoRA dequantises (a transient);
    `every_linear` (FrameworkSpec qlora_every_linear): the quantised head's too.

    Source: bitsandbytes Linear4bit.forward (dequantize_4bit, then the 16-bit matmul; the same
    in backward).
    Assumes: MoE experts are not quantised this way (grouped experts are 3-D tensors).
    """
    every = np.asarray(every_linear)
    max_linear = np.max(
        np.stack(
            [
                np.broadcast_to(t.numel, dp.shape)
                for t in full
                if len(t.tensor.shape) == 2 and t.tensor.group in ("layer", "mlp")
            ]
            + [
                np.broadcast_to(np.where(every & (t.count > 0), t.numel, 0.0), dp.shape)
                for t in full
                if len(t.tensor.shape) == 2 and t.tensor.group == "head"
            ]
            or [np.zeros_like(dp)]
        ),
        axis=0,
    )
    return np.where(qlora, DEQUANT_BYTES * max_linear, 0.0)


def lora_activation_delta_bytes(
    m: ModelSpec,
    *,
    T,
    e,
    amp,
    tp,
    rank,
    mask,
    adapted_bits,
    in_param_dtype=False,
    frozen_casts=3.0 + 2.0,
) -> np.ndarray:
    """Change of a block's saved bytes under LoRA (frozen base), per layer.

    Source: PEFT LoraLayer.forward (fp32 adapters): `x = self._cast_input_dtype(x,
    lora_A.weight.dtype)` (an fp32 copy of each adapted linear's input for a 16-bit base; under
    autocast a bf16 copy), lora_A's output [T, r] saved by lora_B; a frozen linear saves no input
    (autograd saves `self` of a matmul only when the weight needs a gradient). Adapters in the
    model's dtype (`in_param_dtype`, torchtune LoRALinear): no copy, lora_a keeps the input the
    base no longer needs, lora_b keeps lora_a's [T, r] output in the model's dtype (traced:
    tests/data/framework_traces/torchtune_lora.json).
    Assumes: lora_dropout 0 (Identity; LitGPT's dropout and fused q/k/v adapter:
    lora_module_extra_bytes); adapters replicated under tensor parallelism; the experts of an
    MoE block are not adapted.
    `adapted_bits`: "q_proj", ... to per-row booleans; `frozen_casts`: _vision_memory's."""
    h = m.hidden_size
    f_r = m.intermediate_size / tp if not m.is_moe else 0.0
    # Bytes per element of the adapter's input copy, and of lora_A's output.
    cast = np.where(amp, 2.0, np.where((e < 4) & ~np.asarray(in_param_dtype), 4.0, 0.0))
    a_out = np.where(in_param_dtype, e, 4.0)
    one = np.ones_like(np.asarray(T, dtype=np.float64))
    # What the frozen base no longer saves: the linear inputs of the two norms' consumers and
    # the down projection's input.
    removed = np.where(amp, frozen_casts * 2.0 * T * h, 2.0 * e * T * h) + e * T * f_r
    added = 0.0 * one
    widths = {
        "q_proj": h,
        "k_proj": h,
        "v_proj": h,
        "o_proj": m.o_dim / tp,
        "gate_proj": h,
        "up_proj": h,
        "down_proj": f_r,
    }
    any_attn_in = 0.0 * one
    any_mlp_in = 0.0 * one
    for name, width in widths.items():
        a = adapted_bits[name].astype(np.float64)
        added = added + a * (cast * T * width + a_out * T * rank)
        if name in ("q_proj", "k_proj", "v_proj"):
            any_attn_in = np.maximum(any_attn_in, a)
        if name in ("gate_proj", "up_proj"):
            any_mlp_in = np.maximum(any_mlp_in, a)
        if name == "down_proj":
            added = added + np.where(cast == 0, a * e * T * f_r, 0.0)
    # An fp32 base shares one input between the adapters of a norm's consumers.
    added = added + np.where(cast == 0, (any_attn_in + any_mlp_in) * e * T * h, 0.0)
    return added - removed


KBIT_UPCAST_BYTES = 4.0
"""peft prepare_model_for_kbit_training casts every fp16/bf16 parameter that is not a
bitsandbytes Params4bit to fp32 (`param.data = param.data.to(torch.float32)`).
Source: peft 0.21.2 peft/utils/other.py prepare_model_for_kbit_training."""
KBIT_MLP_FP32_TENSORS_GATED = 3.0
"""[T, f] tensors a gated MLP keeps for backward in the residual dtype when its frozen linears
return fp32: gate_proj's output (SiLU's input), SiLU's output and up_proj's output (the
product's operands). Traced: tests/data/framework_traces/hf_qlora.json (add.Tensor, silu)."""
KBIT_MLP_FP32_TENSORS_PLAIN = 1.0
"""The same for a plain MLP: the up projection's output, kept by the activation function."""


SHARDED_QLORA_ZERO = 3
"""The ZeRO stage at which QLoRA is "sharded QLoRA" (FSDP full shard, DeepSpeed ZeRO-3)."""


def kbit_prepared_rows(prepared_by_stack, *, zero) -> np.ndarray:
    """QLoRA rows whose model peft's prepare_model_for_kbit_training prepared (fp32 residual
    stream and non-quantised parameters, fp32 adapters): a stack that prepares it
    (FrameworkSpec.qlora_kbit_prepared), except sharded QLoRA (ZeRO-3 / FSDP), which TRL never
    prepares and whose adapters it keeps in the model's 16-bit dtype.
    Source: huggingface/trl trl/trainer/sft_trainer.py SFTTrainer._prepare_peft_model (0.12 to
    0.15) and trl/models/utils.py prepare_peft_model (0.16 on): `if is_qlora and not
    is_sharded_qlora: prepare_model_for_kbit_training(...)`, and get_peft_model(...,
    autocast_adapter_dtype=False) for sharded QLoRA (the 4-bit weights on cpu/meta under FSDP's
    cpu_ram_efficient_loading or zero.Init; "one should never call peft_module_casting_to_bf16
    or prepare_model_for_kbit_training when doing QLoRA + FSDP / DS-Zero3"); TRL at 00313f2
    (2026) prepares no QLoRA model and casts its adapters to bf16. peft's docs/source/accelerate
    fsdp.md and deepspeed.md run their QLoRA recipes through TRL's SFTTrainer.
    Ignores: a hand-written script calling prepare_model_for_kbit_training under ZeRO-3."""
    return np.asarray(prepared_by_stack) & (np.asarray(zero) != SHARDED_QLORA_ZERO)


def sharded_qlora_adapters_16bit(prepared_by_stack, *, qlora, zero) -> np.ndarray:
    """QLoRA rows of a PEFT stack whose adapters are in the model's 16-bit dtype because the
    job is sharded QLoRA (kbit_prepared_rows); other rows keep the stack's own adapter dtype."""
    return (
        np.asarray(prepared_by_stack) & np.asarray(qlora) & (np.asarray(zero) == SHARDED_QLORA_ZERO)
    )


def kbit_pure_16(prec, *, prepared) -> np.ndarray:
    """The k-bit-prepared QLoRA rows whose precision is pure 16-bit (bf16, fp16: parameters in
    16 bits, no autocast), where prepare_model_for_kbit_training's fp32 casts change what the
    precision alone would say. Under amp the parameters are fp32 already; under mixed-precision
    recipes the engine keeps its 16-bit working weights (DeepSpeed's bf16 engine casts the module
    back to 16 bits when it wraps it)."""
    prec = np.asarray(prec, dtype=np.int64)
    return np.asarray(prepared) & ((prec == BF16) | (prec == FP16))


def kbit_prepared_base_bytes(
    base: np.ndarray, base_linear: np.ndarray, *, param_e: np.ndarray, upcast
) -> np.ndarray:
    """Bytes of a QLoRA model's frozen base before its block linears are swapped for NF4: the
    non-quantised part (embeddings, norms, head: `base - base_linear`) at fp32 where `upcast`
    (kbit_pure_16), at `param_e` bytes otherwise.

    Source: peft 0.21.2 peft/utils/other.py prepare_model_for_kbit_training (KBIT_UPCAST_BYTES).
    Traced: tests/data/framework_traces/hf_qlora.json (bf16: fp32 embeddings, norms and head).
    Assumes: the head is not quantised (transformers' bitsandbytes integration keeps lm_head,
    get_keys_to_not_convert).
    """
    scale = np.where(upcast, KBIT_UPCAST_BYTES / param_e, 1.0)
    return base_linear + (base - base_linear) * scale


def kbit_activation_precision(prec, *, prepared) -> np.ndarray:
    """The precision code whose activation symbols a QLoRA row follows: a pure 16-bit row
    (bf16, fp16) on a k-bit-prepared model runs as an fp32 one, every other row as itself.

    Without autocast nothing casts back to 16 bits: the fp32 embedding starts an fp32 residual
    stream, the fp32 norms keep it, Linear4bit returns fp32 (`.to(inp_dtype)`) and peft's bnb
    LoRA layer casts its input to the fp32 adapters' dtype; the attention then gets fp32 q, k, v
    (no flash kernel). Source: peft 0.21.2 utils/other.py prepare_model_for_kbit_training,
    tuners/lora/bnb.py Linear4bit.forward; bitsandbytes 0.50.2 nn/modules.py Linear4bit.forward.
    Traced: tests/data/framework_traces/hf_qlora.json (Llama, bf16: the fp32 row's per-layer
    bytes to 2 KiB in 209 MiB).
    """
    return np.where(kbit_pure_16(prec, prepared=prepared), FP32, np.asarray(prec, np.int64))


def qlora_kbit_activation_delta_bytes(
    m: ModelSpec, *, T, tp, amp, o_adapted, prepared
) -> np.ndarray:
    """Change of a block's saved bytes (per layer) under QLoRA on a k-bit-prepared model
    with autocast, against the LoRA block lora_activation_delta_bytes describes.

    Source: bitsandbytes 0.50.2 nn/modules.py Linear4bit.forward (`x = x.to(self.compute_dtype)`
    then `bnb.matmul_4bit(...).to(inp_dtype)`: the output returns to the input's dtype, fp32 on
    the fp32 residual stream prepare_model_for_kbit_training leaves), autograd/_functions.py
    MatMul4Bit.forward (`ctx.tensors = (None, B)`: the input is not saved, as for a frozen
    linear); peft 0.21.2 tuners/lora/bnb.py Linear4bit.forward (`requires_conversion = not
    torch.is_autocast_enabled()`: under autocast lora_A gets its input uncast, so an adapted
    o_proj keeps the bf16 attention output the attention kernel keeps, no copy of its own).
    Traced: tests/data/framework_traces/hf_qlora.json (Llama, amp-bf16: +2 B x 3 T f for the
    fp32 MLP tensors, -2 B x T o_dim for o_proj's copy; exact).
    Terms: + (4 - 2) x KBIT_MLP_FP32_TENSORS x T f/tp; - 2 x T o_dim/tp where o_proj is adapted.
    Assumes: amp (the 16-bit compute dtype is 2 bytes); dense MLP (MoE experts are not
    Linear4bit); not `prepared` or not amp: no change (see qlora_kbit_symbols for non-amp).
    """
    f_r = m.intermediate_size / tp if not m.is_moe else 0.0
    tensors = KBIT_MLP_FP32_TENSORS_GATED if m.gated_mlp else KBIT_MLP_FP32_TENSORS_PLAIN
    mlp = (4.0 - 2.0) * tensors * T * f_r
    o_proj = np.where(o_adapted, 2.0 * T * m.o_dim / tp, 0.0)
    return np.where(np.asarray(prepared) & np.asarray(amp), mlp - o_proj, 0.0)


def bnb_kept_input_bytes(
    m: ModelSpec, *, T, e, tp, keeps, separate_qkv, per_linear_casts, o_aliased=False, qkv_grad=True
):
    """Bytes of one block's frozen 4-bit linears' inputs that bitsandbytes <= 0.43.1 keeps for
    backward (`--bitsandbytes-version legacy`), beyond what the block saves otherwise.

    MatMul4Bit.forward stores `ctx.tensors = (A, B)` when its input needs a gradient: A is
    Linear4bit's `x.to(compute_dtype)`, the layer's input itself where it is in the compute
    dtype (one tensor per distinct input: q/k/v's norm output, the attention output's
    [T, o_dim] copy, the MLP norm output, the MLP product [T, f]), a cast copy per linear where
    it is not (`per_linear_casts`: peft's prepare_model_for_kbit_training leaves an fp32
    residual stream, so q, k, v and gate, up each keep their own; `separate_qkv`: q, k, v are
    three linears, not one fused). ctx attributes are not saved tensors: backward does not
    free them, they go with the graph (engine/_rank_activations.py holds them to the end of
    backward, and past it where the loop keeps the logits and so the graph).

    Source: bitsandbytes 0.42.0 / 0.43.1 autograd/_functions.py MatMul4Bit.forward, nn/modules.py
    Linear4bit.forward; traced: tests/data/framework_traces/litgpt_qlora.json (the
    bnb_saves_input case: +2 B x T (3 h + f) per block, exact).
    `o_aliased`: o_proj's kept input is the attention output its adapter's lora_A saves anyway
    (peft under autocast feeds lora_A its input uncast, dropout off, a block not checkpointed);
    `qkv_grad` False: the block's input needs no gradient (the first block over a frozen
    embedding, no checkpointing to call enable_input_require_grads), so q/k/v keep nothing.
    Traced also: tests/data/framework_traces/hf_qlora_old_bnb.json (peft-prepared Llama: per
    block 2 B x T (3 h + o + 2 h + f), less o under amp, less 3 h on the first block without
    checkpointing; exact).
    Assumes: a checkpointed block keeps nothing in forward, as under the reentrant checkpoint
    of that bitsandbytes' stacks (forward under no_grad; engine/_rank_activations.py
    _bnb_stage_extra); no other kept input is a tensor the block saves anyway (LitGPT's
    lora_dropout feeds lora_A a dropout output; peft's prepared fp32 inputs are cast apart);
    column-parallel inputs whole, row-parallel ones split over tp.
    Ignores: a non-reentrant checkpoint (transformers 5's), whose saved-tensor hooks do not see
    ctx attributes, so every block would keep them in forward (hf_qlora_old_bnb.json's full
    case: 75.5 MB on the small Llama); MoE experts (not Linear4bit).
    """
    h = m.hidden_size
    f_r = 0.0 if m.is_moe else m.intermediate_size / tp
    casts = np.asarray(per_linear_casts)
    qkv_inputs = np.where(casts & np.asarray(separate_qkv), 3.0, 1.0)
    mlp_inputs = np.where(casts & m.gated_mlp, 2.0, 1.0)
    qkv = np.where(qkv_grad, qkv_inputs * h, 0.0)
    o_in = np.where(o_aliased, 0.0, m.o_dim / tp)
    kept = e * T * (qkv + o_in + mlp_inputs * h + f_r)
    return np.where(keeps, kept, 0.0)


def bnb_kept_head_input_bytes(m: ModelSpec, *, T, e, keeps, head_quantised, last) -> np.ndarray:
    """The 4-bit head's input (the final norm's [T, h] output, which every head chunk views)
    kept by bitsandbytes <= 0.43.1 on the last stage where the stack quantises the head
    (FrameworkSpec.qlora_every_linear). Source: bnb_kept_input_bytes; traced:
    tests/data/framework_traces/litgpt_qlora.json (outside the blocks: +2 B x T h)."""
    kept = e * T * m.hidden_size
    return np.where(np.asarray(keeps) & np.asarray(head_quantised) & np.asarray(last), kept, 0.0)


def qlora_head_copy_bytes(m: ModelSpec, *, amp, qlora, last, tp) -> np.ndarray:
    """The 16-bit autocast copy of the head's weight a QLoRA model keeps for backward: the
    head is left unquantised (an fp32 frozen linear under autocast), and its matmul saves the
    cast weight because its input (the adapted blocks' output) needs a gradient.

    Source: transformers integrations/bitsandbytes.py get_keys_to_not_convert (lm_head, or the
    tied embedding, stays a plain linear), aten/src/ATen/autocast_mode.cpp cached_cast (a frozen
    weight's cast is not cached: each matmul that needs it for backward saves its own copy);
    derivatives.yaml mm (`mat2` saved for `self`'s gradient). Traced:
    tests/data/framework_traces/hf_qlora.json (2 MiB = 2 B x 2048 x 512 on amp-bf16 cases).
    Assumes: the last pipeline stage holds the head (`last`), split over the vocabulary by tp.
    """
    numel = m.vocab_size * m.hidden_size / tp
    return np.where(np.asarray(amp) & np.asarray(qlora) & np.asarray(last), 2.0 * numel, 0.0)


def lora_module_extra_bytes(
    m: ModelSpec, *, T, e, tp, amp, adapted_bits, dropout, qkv_one_module, qkv_zero_pad, o_kept
) -> np.ndarray:
    """What LitGPT's adapter modules add to lora_activation_delta_bytes, per layer: dropout
    per adapted module (`dropout`, lora_dropout_extra_bytes) and the fused q/k/v adapter's
    zero padding (`qkv_zero_pad`, lora_qkv_zero_pad_bytes). Source: those functions."""
    dropout_extra = lora_dropout_extra_bytes(
        m,
        T=T,
        e=e,
        tp=tp,
        amp=amp,
        adapted_bits=adapted_bits,
        qkv_one_module=qkv_one_module,
        o_input_kept=o_kept,
    )
    pad = lora_qkv_zero_pad_bytes(m, T=T, e=e, tp=tp, adapted_bits=adapted_bits)
    return np.where(dropout, dropout_extra, 0.0) + np.where(qkv_zero_pad, pad, 0.0)


LORA_DROPOUT_MASK_BYTES = 1.0
"""native_dropout keeps a bool mask (one byte per element) for its backward."""


def lora_dropout_extra_bytes(
    m: ModelSpec, *, T, e, tp, amp, adapted_bits, qkv_one_module, o_input_kept=False
) -> np.ndarray:
    """What LoRA dropout adds to a block's saved bytes, per layer: every adapted module drops
    its input apart and dropout keeps a bool mask; lora_A keeps the dropped copy instead of the
    input (which its frozen base linear does not keep), so without autocast modules that share
    an input (the gate and up projections; q, k and v unless `qkv_one_module`) each keep their
    own copy where without dropout they shared one (under autocast each already keeps its own
    16-bit cast); an adapted o_proj whose input the attention kernel keeps anyway
    (`o_input_kept`, FrameworkSpec.o_proj_input_kept) adds its dropped copy on top.

    Source: litgpt 0.5.13 lora.py LoRALayer (nn.Dropout(p=lora_dropout) when > 0),
    LoRALinear.forward (`self.lora_dropout(x) @ self.lora_A.T @ ...`), LoRAQKVLinear.forward
    (one dropout and one lora_A for the enabled q, k, v: `qkv_one_module`); torch
    derivatives.yaml native_dropout (saves its mask). Traced: litgpt_lora.json.
    Ignores: layer 0's q/k/v dropout keeps no mask (its input, the frozen embedding's output,
    needs no gradient).
    """
    h = m.hidden_size
    f_r = m.intermediate_size / tp if not m.is_moe else 0.0
    a = {k: v.astype(np.float64) for k, v in adapted_bits.items()}
    qkv = [a["q_proj"], a["k_proj"], a["v_proj"]]
    any_qkv = np.maximum(np.maximum(qkv[0], qkv[1]), qkv[2])
    num_qkv = np.where(qkv_one_module, any_qkv, qkv[0] + qkv[1] + qkv[2])
    num_up = a["gate_proj"] + a["up_proj"]
    any_up = np.maximum(a["gate_proj"], a["up_proj"])
    masks = (
        LORA_DROPOUT_MASK_BYTES
        * T
        * ((num_qkv + num_up) * h + a["o_proj"] * m.o_dim / tp + a["down_proj"] * f_r)
    )
    unshared = np.where(amp, 0.0, e * T * h * ((num_qkv - any_qkv) + (num_up - any_up)))
    unshared = unshared + np.where(
        np.asarray(o_input_kept) & ~np.asarray(amp), a["o_proj"] * e * T * m.o_dim / tp, 0.0
    )
    return masks + unshared


LORA_INDEX_BYTES = 8.0
"""LoRAQKVLinear's lora_ind: an int64 index per padded output feature, cloned per call."""


def lora_qkv_zero_pad_bytes(m: ModelSpec, *, T, e, tp, adapted_bits) -> np.ndarray:
    """Bytes a fused q/k/v adapter keeps when some of q, k, v are not adapted: zero_pad scatters
    the update into a zeroed [T, q + 2 kv] tensor with index_copy_, which keeps the update
    ([T, adapted width], 16-bit) and the cloned int64 index; all three adapted, no padding.

    Source: litgpt 0.5.13 lora.py LoRAQKVLinear.zero_pad (`result.index_copy_(dim=-1,
    index=self.lora_ind, source=x)`), lora_ind (a clone per call). Traced: litgpt_lora.json
    (q and v adapted: cat [b, q + kv, s] and clone [q + kv] int64 kept per layer).
    """
    q = adapted_bits["q_proj"].astype(np.float64)
    k = adapted_bits["k_proj"].astype(np.float64)
    v = adapted_bits["v_proj"].astype(np.float64)
    width = (q * m.q_dim + (k + v) * m.kv_dim) / tp
    partial = (q + k + v > 0) & (q * k * v == 0)
    return np.where(partial, e * T * width + LORA_INDEX_BYTES * width, 0.0)


def qlora_dequant_traffic_bytes_per_weight(qlora, *, full) -> np.ndarray:
    """HBM bytes per NF4 weight and micro-batch: dequantised before the forward and backward
    use (and the recomputed forward, `full`). Source: QLORA_DEQUANT_BYTES_PER_WEIGHT."""
    return np.where(qlora, QLORA_DEQUANT_BYTES_PER_WEIGHT * (2.0 + full), 0.0)


def lora_first_layer_unsaved_copy_bytes(m: ModelSpec, *, frozen_amp, first, full, tp) -> np.ndarray:
    """The 16-bit copies of layer 0's q, k and v weights that a frozen LoRA base under autocast
    does not save: their input (the normed output of the frozen embedding) needs no gradient, so
    their matmuls keep no weight for backward (less than autocast_weight_copy_bytes counts).

    Source: tools/autograd/derivatives.yaml (mm: `self` gradient needs `mat2`, saved only when
    `self` requires grad), aten/src/ATen/autocast_mode.cpp cached_cast (a frozen weight's cast is
    not cached: each matmul saves its own copy while its input requires grad).
    Assumes: an attention projection (q, k or v) is adapted, so everything after layer 0's
    attention requires grad; no recompute (`full`: the layers' copies are not kept anyway).
    """
    qkv = sum(
        p.numel
        for p in m.param_tensors()
        if p.group == "layer" and len(p.shape) == 2 and p.lora_targets
        and set(p.lora_targets) <= {"q_proj", "k_proj", "v_proj"}
    )  # fmt: skip
    return np.where(frozen_amp & first & ~full, 2.0 * qkv / tp, 0.0)


def lora_frozen_norm_bytes(
    m: ModelSpec, *, T, r, fused_norm, num_norms, scale_fp32=False, sp_div=1.0
) -> np.ndarray:
    """Bytes a frozen Llama-style RMSNorm no longer saves, `num_norms` of them: the normalised
    [T, h] tensor its weight's gradient would need (`weight * x_normed`; a frozen weight needs
    none), in the residual dtype.

    Source: transformers/models/llama/modeling_llama.py LlamaRMSNorm.forward
    (`self.weight * hidden_states.to(input_dtype)`), tools/autograd/derivatives.yaml (mul: each
    operand saved only for the other's gradient); Gemma's RMSNorm (modeling_gemma3.py
    Gemma3RMSNorm: `output * (1.0 + self.weight.float())`) keeps the normalised fp32 tensor
    for its weight's gradient only. Traced: bench/conformance.py LoRA cells of gemma2, gemma3.
    `scale_fp32`: the scale multiplies the fp32 normalised tensor (litgpt 0.5.13 RMSNorm), which
    is what a frozen scale no longer saves (hf_norm_bytes).
    `sp_div`: with sequence parallelism the norms run on T / tp tokens (hf_norm_bytes' `own`),
    so that is what a frozen one no longer saves.
    Assumes: Python RMSNorms of the `rms` or `gemma_rms` kind (not fused; OLMo 2's left as they
    are).
    """
    if m.norm == "gemma_rms":
        return np.where(fused_norm, 0.0, num_norms * 4.0 * T * m.hidden_size / sp_div)
    if m.norm != "rms":
        return np.zeros_like(np.asarray(T, dtype=np.float64))
    normed_e = np.where(scale_fp32, 4.0, r)
    return np.where(fused_norm, 0.0, num_norms * normed_e * T * m.hidden_size / sp_div)


def lora_frozen_qk_norm_bytes(m: ModelSpec, *, T, tp) -> np.ndarray:
    """Bytes Gemma 3's frozen q_norm and k_norm no longer save: the normalised fp32 [T, q + kv]
    their weights' gradients would need (as lora_frozen_norm_bytes), per layer.

    Source: transformers modeling_gemma3.py Gemma3Attention (q_norm, k_norm: Gemma3RMSNorm over
    head_dim). Traced: bench/conformance.py LoRA cells of gemma3.
    Ignores: Qwen3's and OLMo 2's q/k norms (no LoRA cells trace them).
    """
    if not (m.qk_norm and m.norm == "gemma_rms"):
        return np.zeros_like(np.asarray(T, dtype=np.float64))
    return 4.0 * T * (m.q_dim + m.kv_dim) / tp


def lora_unadapted_o_proj_bytes(m: ModelSpec, *, T, e, tp, o_adapted) -> np.ndarray:
    """Bytes a frozen, unadapted o_proj no longer saves: its input, the attention output made
    contiguous ([T, o_dim / tp], compute dtype), which nothing else keeps.

    Source: transformers/integrations/sdpa_attention.py (`attn_output.transpose(1, 2)
    .contiguous()`), modeling_llama.py LlamaAttention.forward (reshape, then o_proj); a frozen
    linear saves no input (derivatives.yaml mm: `self` saved for `mat2`'s gradient only).
    """
    return np.where(o_adapted, 0.0, e * T * m.o_dim / tp)


def lora_zero3(zero, lora_rank) -> np.ndarray:
    """The activation key of LoRA under ZeRO-3/FSDP2 (`adapters_in_compute_dtype`'s only
    non-key input): False on every row without LoRA, so it adds no distinct key there."""
    return (np.asarray(zero) == 3) & (np.asarray(lora_rank) > 0)


def adapters_in_compute_dtype(fsdp2_casts, lora_zero3_col, mixed) -> np.ndarray:
    """Whether LoRA adapters run in the 16-bit compute dtype, not fp32: where the framework's
    FSDP2 casts them (`fsdp2_casts`: FrameworkSpec.fsdp2_casts_fp32_adapters, Hugging Face's
    accelerate), under ZeRO-3 with mixed precision MixedPrecisionPolicy(param_dtype=bf16)
    casts every all-gathered parameter, the fp32 adapters included, so peft makes no fp32 copy
    of an adapted input and lora_A's output is 16-bit (as torchtune's adapters in the model
    dtype).

    Source: torch/distributed/fsdp/_fully_shard/_fsdp_param.py (param_dtype cast of the
    unsharded parameter), peft tuners/lora/layer.py (_cast_input_dtype to lora_A's dtype).
    Traced: bench/conformance.py LoRA cells on 8 FSDP2 ranks, mixed-bf16 (were +2.2% to +9.2%
    on activations with fp32 adapters counted).
    """
    return np.asarray(fsdp2_casts) & np.asarray(lora_zero3_col) & np.asarray(mixed)
