"""Activation bytes saved for backward, per layer and outside the layers.

Every function takes numpy columns (or scalars; they broadcast) and a ModelSpec, and returns bytes.
Symbols: T tokens per rank (b*s/cp), s sequence length, h hidden, f intermediate, a heads, t tensor
parallel degree, e compute-dtype bytes, r residual-stream bytes (fp32 under autocast).

The `hf` functions follow transformers' modeling code op by op (what autograd saves); they match
the traced ground truth (tests/data/groundtruth) to the allocator block. The `megatron` function is
Korthikanti et al. 2022.
"""

from __future__ import annotations

import numpy as np

from ._model import ModelSpec

SMALL_TENSOR_BYTES = 512
"""One allocator block: what a scalar or an rng seed/offset tensor occupies."""


def hf_norm_bytes(m: ModelSpec, *, T, e, r, amp, sp_div, num_consumers: int) -> np.ndarray:
    """Bytes one normalisation layer saves, including what its consuming linear(s) save.

    Source: transformers LlamaRMSNorm.forward (x.to(float32); x * rsqrt(mean(x^2)+eps);
    weight * x.to(input_dtype)), GemmaRMSNorm (x.float() ... * (1 + weight)), nn.LayerNorm
    (native_layer_norm saves input, mean and rstd). Under torch.autocast each consuming linear
    casts the fp32 norm output to bf16 itself (activations are not cached), so `num_consumers`
    copies are saved; without autocast the one output is shared.
    Assumes: with sequence parallelism the norm runs on T/t tokens and the consumers save the
    all-gathered full-sequence input.
    """
    h = m.hidden_size
    Th = T * h
    linear_in = np.where(amp, num_consumers * 2.0 * Th, e * Th)
    if m.norm == "layernorm":
        own = (r * Th + 8.0 * T) / sp_div  # input + mean, rstd (fp32 [T, 1])
    elif m.norm == "gemma_rms":
        own = (4.0 * Th + 4.0 * T + 4.0 * Th) / sp_div  # fp32 copy, rsqrt, normalised fp32
    else:
        own = (4.0 * Th + 4.0 * T + r * Th) / sp_div  # fp32 copy, rsqrt, normalised (input dtype)
    return own + linear_in


def hf_attention_bytes(m: ModelSpec, *, T, s, e, tp, eager) -> np.ndarray:
    """Bytes the attention block saves (projections' outputs, kernel saves), per layer.

    Source: transformers LlamaAttention / GPT2Attention with `sdpa_attention_forward` (SDPA flash
    saves q, k, v, out, an fp32 logsumexp [b, a, s] and philox seed/offset; GQA via enable_gqa,
    no repeat) or `eager_attention_forward` (repeat_kv copies; fp32 softmax output; its cast to
    the compute dtype saved by the second matmul; with attention dropout the bool mask and the
    dropout output instead; a contiguous copy of the output for o_proj).
    Assumes: rotary embeddings produce new q and k tensors; fused q/k/v projections (GPT-2 c_attn,
    Phi-3 qkv_proj) keep their whole output alive through the views of v (and of q, k without
    rotary). FlashAttention's logsumexp is unpadded.
    """
    a_r = m.num_attention_heads / tp
    qd_r = m.q_dim / tp
    kvd_r = m.kv_dim / tp
    gqa = m.num_key_value_heads < m.num_attention_heads
    kv_saved = np.where(eager & gqa, qd_r, kvd_r)  # repeat_kv copies in eager
    if m.fused_qkv:
        qkv = e * T * (qd_r + 2 * kvd_r)
        qkv = qkv + (e * T * (qd_r + kvd_r) if m.rotary else 0.0)
    else:
        qkv = e * T * (qd_r + 2 * kv_saved)
    if m.fused_qkv and m.rotary:
        qkv = np.where(eager & gqa, qkv + 2 * e * T * (qd_r - kvd_r), qkv)
    out = e * T * qd_r
    flash_extra = 4.0 * a_r * T + 2 * SMALL_TENSOR_BYTES
    scores_per_elem = np.where(
        m.attention_dropout > 0,
        4.0 + 1.0 + e,  # softmax fp32 + dropout mask + dropout output
        4.0 + np.where(e < 4, e, 0.0),  # softmax fp32 (+ its cast, saved by matmul)
    )
    eager_extra = scores_per_elem * a_r * s * T
    return qkv + out + np.where(eager, eager_extra, flash_extra)


def hf_mlp_bytes(m: ModelSpec, *, T, e, amp, tp) -> np.ndarray:
    """Bytes the MLP saves, per layer.

    Source: LlamaMLP (down(act(gate(x)) * up(x)): gate out, act out, up out, product);
    GPT2MLP with NewGELUActivation (transformers activations.py: the Python tanh formula saves
    x (an fp32 copy under autocast, pow being an fp32 autocast op), 0.5*x, tanh, 1+tanh, and the
    output's cast for c_proj); BERT/Gemma torch gelu (fc out, act out).
    """
    f_r = m.intermediate_size / tp
    Tf = T * f_r
    if m.gated_mlp:
        return 4.0 * e * Tf
    if m.mlp_act == "gelu_new":
        per_elem = np.where(amp, 4.0 + 2.0 + 4.0 + 4.0 + 2.0, 5.0 * e)
        return per_elem * Tf
    return 2.0 * e * Tf


def hf_layer_bytes(m: ModelSpec, *, T, s, e, r, amp, tp, sp, eager) -> np.ndarray:
    """Everything one transformer block saves for backward without recomputation."""
    sp_div = np.where(sp, tp, 1)
    num_qkv_linears = 1 if m.fused_qkv else 3
    num_up_linears = 1 if (m.fused_gate_up or not m.gated_mlp) else 2
    norms = hf_norm_bytes(m, T=T, e=e, r=r, amp=amp, sp_div=sp_div, num_consumers=num_qkv_linears)
    norms = norms + hf_norm_bytes(
        m, T=T, e=e, r=r, amp=amp, sp_div=sp_div, num_consumers=num_up_linears
    )
    dropout_masks = 2.0 * T * m.hidden_size / sp_div if m.dropout > 0 else 0.0
    return (
        norms
        + hf_attention_bytes(m, T=T, s=s, e=e, tp=tp, eager=eager)
        + hf_mlp_bytes(m, T=T, e=e, amp=amp, tp=tp)
        + dropout_masks
    )


def hf_checkpointed_layer_bytes(m: ModelSpec, *, T, r, tp, sp) -> np.ndarray:
    """Per-layer bytes kept with full recomputation: the checkpointed layer input only.

    Source: torch.utils.checkpoint (non-reentrant) as enabled by
    `model.gradient_checkpointing_enable()`: the block's input hidden states are saved; the rotary
    cos/sin are shared model-level tensors.
    """
    return r * T * m.hidden_size / np.where(sp, tp, 1)


def hf_outside_bytes(m: ModelSpec, *, T, s, e, r, amp, tp, sp, loss_tp_div) -> np.ndarray:
    """Bytes saved outside the blocks: embeddings, final norm, head, loss, rope tables, labels.

    Source: LlamaForCausalLM.forward + ForCausalLMLoss (logits.float(); cross_entropy =
    log_softmax, whose fp32 output is saved, + nll_loss); rotary cos/sin [1, s, head_dim] in the
    hidden dtype; shifted labels int64; GPT-2/BERT embedding dropout mask and position ids.
    Assumes: unpadded, unpacked batches; the logits are gathered on every TP rank (HF tp_plan,
    torchtitan loss_parallel off) unless `loss_tp_div` says otherwise.
    """
    h, v = m.hidden_size, m.vocab_size
    sp_div = np.where(sp, tp, 1)
    out = 4.0 * T * v / loss_tp_div  # log_softmax output, fp32
    out = out + 8.0 * T + 3 * SMALL_TENSOR_BYTES  # shifted labels, loss, weights
    if m.family == "bert":
        # MLM head transform: dense -> gelu -> LayerNorm -> decoder.
        out = out + 3.0 * e * T * h + 8.0 * T
    else:
        out = out + hf_norm_bytes(m, T=T, e=e, r=r, amp=amp, sp_div=sp_div, num_consumers=1)
    if m.rotary:
        out = out + 2.0 * s * m.head_dim * r
    if m.family in ("gpt2", "bert"):
        out = out + 8.0 * s  # position ids (int64)
        if m.dropout > 0:
            out = out + 1.0 * T * h  # embedding dropout mask
    return out


def hf_loss_forward_extra_bytes(m: ModelSpec, *, T, e, r, amp, loss_tp_div) -> np.ndarray:
    """Transient bytes at the forward peak (the loss): logits, their fp32 copy, head input.

    Source: ForCausalLMLoss: `logits = logits.float()` (a copy unless already fp32), while the
    16-bit logits are still referenced; under autocast the fp32 final-norm output is held by the
    model's forward frame.
    """
    Tv = T * m.vocab_size / loss_tp_div
    logits = e * Tv + np.where(e < 4, 4.0 * Tv, 0.0)
    return logits + np.where(amp, 4.0 * T * m.hidden_size, 0.0)


def megatron_layer_bytes(m: ModelSpec, *, s, b, tp, sp, recompute_code) -> np.ndarray:
    """Korthikanti et al. 2022 (arXiv 2205.05198) activation bytes per layer, 16-bit.

    Source: Sec. 4, Eq. 1-2 and Table 2: sbh(34 + 5as/h) with no parallelism; tensor parallel
    sbh(10 + 24/t + 5as/(ht)); + sequence parallel sbh(34/t + 5as/(ht)); selective recompute drops
    the 5as/h attention-core term; full recompute keeps 2sbh (the layer input).
    Terms: attention 11sbh + 5as^2b, MLP 19sbh, two LayerNorms 4sbh (dropout masks included).
    Assumes: GPT architecture (MLP 4h, MHA, dropout); generalised to gated MLPs and GQA by the
    ratios f/4h and kv/h on the matrix terms.
    """
    h, a = m.hidden_size, m.num_attention_heads
    sbh = s * b * h
    f_ratio = m.intermediate_size / (4 * h) * (2.0 if m.gated_mlp else 1.0)
    kv_ratio = m.kv_dim / m.hidden_size
    # Korthikanti Eq. 1 split: replicated (not divided by t without SP) 10sbh; divided 24sbh.
    divided = (24.0 - 16.0 + 16.0 * f_ratio) - (2.0 * (1.0 - kv_ratio) * 2.0)
    replicated = 10.0
    core = 5.0 * a * s / h
    per = np.where(sp, (replicated + divided) / tp, replicated + divided / tp)
    per = per + np.where(recompute_code == 1, 0.0, core / tp)
    full = 2.0 * sbh / np.where(sp, tp, 1)
    return np.where(recompute_code == 2, full, sbh * per)
