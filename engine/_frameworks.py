"""What each training framework does with the same flags: per-framework semantics as data.

One `FrameworkSpec` per name in FRAMEWORKS, each field citing the framework file it follows.
The engine reads them through the per-code tables below (indexed by the framework's code), so a
formula never tests a framework by name for a behaviour declared here.

Behaviour shared by every framework is not in the table: model states shard over the data- and
context-parallel ranks together (see `state_shard_degree`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._codes import RECOMPUTE_SELECTIVE
from ._vocab import FRAMEWORKS, RECOMPUTE


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameworkSpec:
    """One framework's meaning of the shared flags."""

    selective: str
    """The recompute policy `--recompute selective` means in this framework (its own default
    selective mode): `selective` (Megatron's: the attention core), `selective-op` (per-op SAC)
    or `selective-layer` (every N-th block checkpointed)."""
    loss_parallel: bool
    """Under tensor parallelism the logits stay sharded over the vocabulary and the loss is
    computed on the shards (each rank holds [T, v/tp] logits and loss tensors)."""
    fsdp2: bool
    """ZeRO-3 is torch FSDP2 (`fully_shard`): fp32 sharded parameters as the master copy, fp32
    reduced gradients, per-block all-gathers (else DeepSpeed ZeRO-3 or Megatron-FSDP)."""
    adapters_in_param_dtype: bool
    """LoRA adapters (and so their gradients and Adam states) in the model's parameter dtype;
    False: fp32 adapters whatever the base dtype."""
    fused_rms_norm: bool
    """RMSNorm is torch's fused kernel (saves its input and rstd), not a Python RMSNorm that
    saves an fp32 copy and the normalised tensor."""
    fused_qkv: bool
    """The framework's models project q, k and v with one matrix (one matmul output)."""
    norm_input_fp32: bool = False
    """The fused RMSNorm runs on an fp32 copy of its input (`F.rms_norm(x.float())`), which it
    keeps for backward instead of the 16-bit input."""
    gqa_kv_expanded: bool = False
    """Grouped-query attention expands k and v to every query head before the attention
    kernel, which then keeps them at full width."""
    loss_parallel_fp32_tensors: float = 0.0
    """fp32 [T, v/tp] tensors the vocab-parallel loss allocates beyond a plain cross entropy's,
    in its forward and again in its backward."""
    fp8_weight_cache: bool = True
    """`--precision fp8-mixed` keeps fp8 copies of the weights from forward to backward
    (Transformer Engine); False: torchao's Float8Linear, which casts inside each linear and keeps
    its 16-bit input for backward (activations as bf16, no weight cache)."""
    logits_upcast_in_model: bool = False
    """The model itself returns fp32 logits (`output(h).float()`), so a compiled loss receives
    and keeps fp32 logits (unless the output is chunked)."""
    loss_softmax_in_place: bool = False
    """The cross entropy upcasts the logits once and normalises that fp32 copy in place into
    the softmax it saves for backward, whose backward writes the logits' gradient into the same
    tensor: beyond the saved fp32 [T, v] softmax, only the 16-bit logits in forward and the
    16-bit cast of the gradient in backward (else a plain cross entropy: logits.float(), then
    log_softmax saving its own fp32 output, and two fp32 gradients in backward)."""
    eager_softmax_fused: bool = False
    """With materialised attention scores (`--attention eager`) the masked softmax is a fused
    16-bit kernel wherever its shape limits allow: it keeps the 16-bit probabilities only (no
    fp32 copy, no causal mask); elsewhere, and under `--attention eager-unfused`, the softmax
    runs as torch ops on an fp32 copy of the scores."""
    fsdp2_embedding_unit: bool = False
    """FSDP2 wraps the token embedding as a unit of its own, resharded after forward, and the
    final norm + head as one kept unsharded until its backward; no block's gather is in flight
    at the loss (else the root holds embedding, norm and head unsharded from forward to the end
    of backward, and one block's gather is in flight)."""
    source: str


FRAMEWORK_SPECS: dict[str, FrameworkSpec] = {
    "hf": FrameworkSpec(
        selective="selective",
        loss_parallel=False,
        fsdp2=True,
        adapters_in_param_dtype=False,
        fused_rms_norm=False,
        fused_qkv=False,
        source="transformers Trainer + accelerate (FSDP2 fully_shard); transformers tp_plan "
        "gathers the logits (lm_head colwise with gather_output); peft LoraModel "
        "autocast_adapter_dtype=True keeps adapters fp32. HF has no selective mode of its own: "
        "`selective` is the attention-core rule.",
    ),
    "megatron": FrameworkSpec(
        selective="selective",
        loss_parallel=True,
        fsdp2=False,
        adapters_in_param_dtype=False,
        fused_rms_norm=False,
        fused_qkv=False,
        loss_softmax_in_place=True,
        eager_softmax_fused=True,
        source="megatron-core 0.16.1: transformer/transformer_config.py (recompute_granularity "
        "'selective' recomputes core_attn); models/gpt/gpt_model.py _postprocess -> "
        "models/common/language_module/language_module.py compute_language_model_loss "
        "(cross_entropy_loss_fusion off by default, model_parallel_config.py: "
        "tensor_parallel.vocab_parallel_cross_entropy; fp16_lm_cross_entropy is stored, never "
        "read); tensor_parallel/cross_entropy.py _VocabParallelCrossEntropy (one .float() "
        "copy, max-subtract, exp and divide in place, saved; backward writes the gradient "
        "into it); fusions/fused_softmax.py FusedScaleMaskSoftmax (the apex kernels under "
        "masked_softmax_fusion, which Megatron-LM's megatron/training/arguments.py turns on "
        "by default: --no-masked-softmax-fusion is a store_false; megatron-core's own "
        "TransformerConfig default is False, the torch path, `--attention eager-unfused`).",
    ),
    "deepspeed": FrameworkSpec(
        selective="selective",
        loss_parallel=False,
        fsdp2=False,
        adapters_in_param_dtype=False,
        fused_rms_norm=False,
        fused_qkv=False,
        source="deepspeed/runtime/activation_checkpointing/checkpointing.py (whole-module "
        "checkpoints only; `selective` is the attention-core rule); HF model heads.",
    ),
    "torchtitan": FrameworkSpec(
        selective="selective-op",
        loss_parallel=True,
        fsdp2=True,
        adapters_in_param_dtype=False,
        fused_rms_norm=True,
        fused_qkv=True,
        loss_parallel_fp32_tensors=1.0,
        fp8_weight_cache=False,
        fsdp2_embedding_unit=True,
        source="torchtitan 0.3.0: distributed/activation_checkpoint.py (SelectiveAC, per-op "
        "SAC, is the default `selective`); components/loss.py (_LossParallelCrossEntropy on "
        "vocab-sharded logits under TP: shifted logits, their exp and the log-probs in "
        "forward; zeros, exp(log_probs) and their sum in backward); "
        "distributed/parallel_dims.py (the fsdp mesh is "
        "dp_shard x cp); models/llama3 (one wqkv projection; nn.RMSNorm; apply_fsdp: "
        "tok_embeddings and [norm, output] units); components/quantization/float8.py "
        "(torchao Float8Linear). Traced: tests/data/framework_traces/"
        "torchtitan_llama3_ac.json, torchtitan_llama3_8b_fsdp.json.",
    ),
    "torchtune": FrameworkSpec(
        selective="selective-layer",
        loss_parallel=False,
        fsdp2=True,
        adapters_in_param_dtype=True,
        fused_rms_norm=True,
        fused_qkv=False,
        norm_input_fp32=True,
        gqa_kv_expanded=True,
        fp8_weight_cache=False,
        logits_upcast_in_model=True,
        source="torchtune 0.6.1 torchtune/training/activations.py (ac_mode 'selective' "
        "checkpoints every ac_option-th layer); recipes build the model under "
        "training.set_default_dtype(dtype): LoRA adapters in bf16; shard_model (FSDP2); "
        "modules/transformer.py TransformerDecoder (output(h).float() unless chunked); "
        "modules/rms_norm.py (F.rms_norm(x.float())); modules/attention.py (k, v expanded "
        "to the query heads before SDPA); modules/peft/lora.py (LoRALinear: bf16 lora_a, "
        "lora_b in the model dtype). Traced: tests/data/framework_traces/torchtune_lora.json; "
        "models/llama3/_parallelism.py gathers the logits (output colwise, Replicate).",
    ),
}
assert tuple(FRAMEWORK_SPECS) == FRAMEWORKS, "one spec per framework, in vocabulary order"


def _table(field: str) -> np.ndarray:
    return np.array([getattr(FRAMEWORK_SPECS[name], field) for name in FRAMEWORKS])


LOSS_PARALLEL = _table("loss_parallel")
"""Per framework code: the loss is vocab-parallel under tensor parallelism."""
FSDP2_FRAMEWORKS = _table("fsdp2")
"""Per framework code: ZeRO-3 is FSDP2."""
ADAPTERS_IN_PARAM_DTYPE = _table("adapters_in_param_dtype")
"""Per framework code: LoRA adapters in the parameter dtype."""
FUSED_RMS_NORM = _table("fused_rms_norm")
"""Per framework code: torch's fused RMSNorm kernel."""
FUSED_QKV = _table("fused_qkv")
"""Per framework code: one q/k/v projection."""
NORM_INPUT_FP32 = _table("norm_input_fp32")
"""Per framework code: its RMSNorm keeps an fp32 copy of the input."""
GQA_KV_EXPANDED = _table("gqa_kv_expanded")
"""Per framework code: k and v expanded to the query heads before attention."""
LOSS_PARALLEL_FP32_TENSORS = _table("loss_parallel_fp32_tensors")
"""Per framework code: extra fp32 [T, v/tp] tensors of its vocab-parallel loss."""
FP8_WEIGHT_CACHE = _table("fp8_weight_cache")
"""Per framework code: fp8 weight copies kept from forward to backward (Transformer Engine)."""
LOGITS_UPCAST_IN_MODEL = _table("logits_upcast_in_model")
"""Per framework code: the model returns fp32 logits."""
LOSS_SOFTMAX_IN_PLACE = _table("loss_softmax_in_place")
"""Per framework code: the cross entropy's softmax and gradient live in its one fp32 copy."""
EAGER_SOFTMAX_FUSED = _table("eager_softmax_fused")
"""Per framework code: eager attention's masked softmax is a fused 16-bit kernel."""
FSDP2_EMBEDDING_UNIT = _table("fsdp2_embedding_unit")
"""Per framework code: FSDP2 units as torchtitan wraps them (FrameworkSpec)."""
SELECTIVE_POLICY = np.array(
    [RECOMPUTE.index(FRAMEWORK_SPECS[name].selective) for name in FRAMEWORKS], dtype=np.int64
)
"""Per framework code: the recompute code `selective` resolves to."""


def recompute_policy(fw, rc) -> np.ndarray:
    """The recompute policy a row runs: `selective` becomes the framework's own selective mode
    (FrameworkSpec.selective); every other code is itself."""
    fw = np.asarray(fw, dtype=np.int64)
    rc = np.asarray(rc, dtype=np.int64)
    return np.where(rc == RECOMPUTE_SELECTIVE, SELECTIVE_POLICY[fw], rc)


def state_shard_degree(dp, cp, dp_shard=0) -> np.ndarray:
    """Ranks over which ZeRO / FSDP shard model states: data x context parallel, or under
    hybrid sharding (HSDP, `dp_shard` > 0) the shard group of dp_shard x cp ranks, the states
    being replicated over the dp / dp_shard groups.

    Context-parallel ranks hold the same weights and see different tokens, so every framework
    reduces gradients and shards states over dp x cp. Source (HSDP): torchtitan ParallelDims
    (dp_replicate x dp_shard; fully_shard on a 2-D mesh replicates over dp_replicate);
    DeepSpeed ZeRO++ hpZ and Megatron-FSDP's outer replication follow the same layout.
    Source: torchtitan ParallelDims (fully_shard on the `dp_shard_cp` mesh); Megatron-core
    parallel_state get_data_parallel_group(with_context_parallel=True) (DDP buffers and the
    distributed optimizer); accelerate ParallelismConfig (FSDP on `dp_shard_cp`).
    """
    dp = np.asarray(dp, dtype=np.float64)
    shard = np.asarray(dp_shard, dtype=np.float64)
    group = np.where(shard > 0, np.minimum(shard, dp), dp)
    return group * np.asarray(cp, dtype=np.float64)
