"""The loss: what the head and cross entropy keep and allocate, for the full loss (logits, their
fp32 copy and log-softmax), a fused chunked one (`--loss chunked`, Liger-Kernel), torchtune's
chunked-output cross entropy (`--loss chunked-output`), and either cross entropy compiled
(`--compile blocks+loss`: the upcast, log-softmax and nll fuse into kernels that keep the 16-bit
logits and a per-row logsumexp, and whose backward writes the 16-bit logits' gradient at once).

The loss runs on the last pipeline stage; the op-by-op tensors are in engine/_activations.py.
"""

from __future__ import annotations

import numpy as np

from ._activations import hf_loss_forward_extra_bytes, hf_outside_bytes
from ._model import ModelSpec

LOSS_GRADIENT_TENSORS = 2.0
"""Backward starts with the fp32 gradient of the log-softmax and of the logits: two fp32
[T, v] tensors (nll_loss_backward, then _log_softmax_backward_data)."""
OUTPUT_CHUNKS = 8.0
"""torchtune CEWithChunkedOutputLoss(num_output_chunks=8): the head runs per chunk of the
sequence, and each chunk's logits are cast to fp32 and go through cross entropy apart.
Source: torchtune 0.6.1 torchtune/modules/loss/ce_chunked_output_loss.py;
torchtune/modules/transformer.py TransformerDecoder.chunked_output."""
IN_PLACE_LOSS_GRADIENT_TENSORS = 0.0
"""fp32 [T, v/tp] tensors megatron's vocab-parallel cross entropy allocates for its gradient:
none, its backward writes the gradient into the saved softmax (grad_input = softmax;
grad_2d[arange, target] -= 1; grad_input.mul_(grad_output)). Source: megatron-core 0.16.1
megatron/core/tensor_parallel/cross_entropy.py _VocabParallelCrossEntropy.backward,
VocabParallelCrossEntropy.prepare_gradient_calculation_operands / calculate_gradients."""
PIPELINE_LOSS_INPUTS = 2.0
"""In a pipeline the schedule computes the loss apart (in its backward step); the last stage's
forward peaks just before the head writes the logits: two [T, h] tensors (ground truth, pp
rank 3)."""


LOOP_HELD_LOGITS = 1.0
"""LitGPT's fit keeps the list of 16-bit logit chunks in a local (`logits = model(...)`) until
the next iteration's forward returns: one [T, v] set of logits alive in every phase (with the
new one at the next forward's end, when the old is dropped). Source: litgpt 0.5.13
finetune/lora.py fit; traced: tests/data/framework_traces/litgpt_lora.json (the optimizer
step's peak holds them)."""
WRAPPER_CHUNKS = 8.0
"""torchtitan ChunkedLossWrapper.Config.num_chunks (the llama3 registry keeps the default).
Source: torchtitan 0.3.0 components/loss.py ChunkedLossWrapper.Config."""
WRAPPER_CHUNK_TENSORS = 3.0
"""fp32 [rows, v] tensors of one chunk at its log-softmax backward: the saved log-probs, the
nll gradient and the log-softmax gradient (beside the chunk's 16-bit logits). Source: torch
aten/src/ATen/native/LossNLL.cpp cross_entropy_loss (log_softmax + nll_loss),
nll_loss_backward, _log_softmax_backward_data; traced: torchtitan_trainer_defaults.json (debug
case's loss peak)."""


def wrapper_loss_bytes(
    m: ModelSpec, *, T, b, e, loss_tp_div, head_grad_e, dp, fsdp, head_trainable, lp_tensors
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(transient at the loss, largest block, extra at the start of backward) of torchtitan's
    ChunkedLossWrapper
    (`--loss chunked-head`): the model returns the final norm's output, the wrapper splits it
    into WRAPPER_CHUNKS along the (local) sequence and runs lm_head, cross entropy and their
    backward chunk by chunk inside the loss call, then hands the decoder the assembled [T, h]
    gradient (which replaces the head input among the saved tensors: same bytes).

    Held over the loop: GradAccumulator's fp32 [T, h] buffer (zeros_like, dtype float32); the
    chunks' .contiguous() copies ([T, h] when b > 1: a sequence split of a [b, s, h] tensor is
    not contiguous); the head's gradient from the first chunk's backward on (FSDP2 with
    gradient sync off accumulates the unsharded gradient in its fp32 reduce dtype:
    `head_grad_e`). Chunk moments, the larger counts: a chunk's log-softmax backward (its
    16-bit logits and WRAPPER_CHUNK_TENSORS fp32 tensors, a vocab-parallel loss's
    `lp_tensors` more), or under FSDP2 on dp > 1 ranks the last chunk's reduce-scatter: an
    fp32 copy of the unsharded head gradient and its fp32 shard beside the accumulated one,
    with the chunk's logits and input gradient.
    Start of backward: the head's gradient (its shard under FSDP2); under FSDP2 on dp > 1
    ranks the head's fp32 reduce-scatter input, which FSDP2 holds until the next
    reduce-scatter (the first block's), and the [norm, lm_head] unit gathered again for the
    final norm's backward: its 16-bit all-gather output beside the unsharded copy (the copy is
    FSDP's unsharded buffer, counted by the states).
    Source: torchtitan 0.3.0 components/loss.py ChunkedLossWrapper.__call__, GradAccumulator,
    _DecoderOutputGradientBackProp; torch distributed/fsdp/_fully_shard/_fsdp_param.py
    (unsharded_accumulated_grad in reduce_dtype), _fsdp_collectives.py foreach_reduce,
    _fsdp_param_group.py (reduce_scatter_state kept until the next reduce-scatter, pre_backward
    unshard).
    Traced: tests/data/framework_traces/torchtitan_trainer_defaults.json.
    Assumes: seq_len divisible by the chunks (the wrapper checks it); an untied head;
    16-bit gathers (mixed precision's param_dtype).
    """
    h, v = m.hidden_size, m.vocab_size / loss_tp_div
    T = np.asarray(T, dtype=np.float64)
    rows = T / WRAPPER_CHUNKS
    held = 4.0 * T * h + np.where(np.asarray(b) > 1, e * T * h, 0.0)
    head = np.where(head_trainable, v * h, 0.0)
    accumulated = head_grad_e * head
    chunk = (e + 4.0 * (WRAPPER_CHUNK_TENSORS + lp_tensors)) * rows * v
    scatter = np.where(fsdp & (dp > 1), 4.0 * head * (1.0 + 1.0 / dp), 0.0)
    last_chunk = np.where(fsdp & (dp > 1), scatter + e * rows * (v + h), 0.0)
    transient = held + accumulated + np.maximum(chunk, last_chunk)
    grad_kept = accumulated / np.where(fsdp, dp, 1.0)
    regathered = np.where(fsdp & (dp > 1), 4.0 * head + 2.0 * v * h, 0.0)
    return transient, 4.0 * rows * v, grad_kept + regathered


def head_chunk_rows(T, b, chunk_tokens) -> np.ndarray:
    """Tokens of one head chunk: b x min(chunk_tokens, s) (the model splits the sequence
    dimension, every micro-batch row in each chunk). Source: litgpt 0.5.13 model.py GPT.forward
    (x.split(lm_head_chunk_size, dim=1)). T: tokens per rank (b s / cp)."""
    T = np.asarray(T, dtype=np.float64)
    return np.minimum(T, np.asarray(b, dtype=np.float64) * np.asarray(chunk_tokens))


def head_chunked_loss_bytes(
    m: ModelSpec, *, T, b, e, amp, chunk_tokens, loss_tp_div, cast_fp32=False
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(saved, held, forward transient, backward transient, largest block) bytes of a head run
    over chunks with a cross entropy per chunk (FrameworkSpec.head_chunk_tokens, LitGPT).

    Saved: each chunk's log-softmax (F.cross_entropy = log_softmax + nll_loss; log_softmax
    keeps its output), in the logits' dtype without autocast (no fp32 copy: aten
    cross_entropy_loss runs log_softmax in the input's dtype), fp32 under autocast (its fp32
    op list upcasts each chunk apart). Held: the logits themselves (LOOP_HELD_LOGITS, counted
    in every phase by the caller). Forward transient: under autocast one chunk's fp32 copy.
    Backward: autograd runs every chunk's nll and log-softmax backward before any head matmul's
    (later nodes first), each chunk's log-prob gradient replacing its freed saved tensor, so
    what is in flight is one chunk's nll gradient and log-softmax gradient (and under autocast
    the cast back to 16 bits).
    Source: litgpt 0.5.13 utils.py chunked_cross_entropy, model.py GPT.forward; torch
    aten/src/ATen/native/LossNLL.cpp cross_entropy_loss; autograd's ready queue (higher
    sequence numbers first). Traced: tests/data/framework_traces/litgpt_lora.json.
    `cast_fp32` (FrameworkSpec logits_cast_fp32: Fabric's convert_output casts the returned
    chunks to fp32): the held logits and every log-softmax fp32; in forward the 16-bit chunks
    while they are cast, in backward each chunk's gradient cast back to 16 bits.
    Assumes: the logits are not soft-capped (Gemma 2's cap adds its own tensors per chunk).
    """
    v = m.vocab_size / loss_tp_div
    T = np.asarray(T, dtype=np.float64)
    rows = head_chunk_rows(T, b, chunk_tokens)
    cast = np.asarray(cast_fp32)
    upcast = np.asarray(amp) | cast
    lp_e = np.where(upcast, 4.0, e)  # log-probs: fp32 under autocast or cast, else 16-bit
    saved = lp_e * T * v
    held = LOOP_HELD_LOGITS * np.where(cast, 4.0, e) * T * v
    forward = np.where(cast, e * T, np.where(amp, 4.0, 0.0) * rows) * v
    backward = (2.0 * lp_e + np.where(upcast, e, 0.0)) * rows * v
    return saved, held, forward, backward, lp_e * rows * v


def loop_held_step_logits_bytes(m: ModelSpec, *, T, loss_tp_div) -> np.ndarray:
    """fp32 logits a training loop keeps from its loss through the optimizer step: a whole
    head's output cast to fp32 (FrameworkSpec.logits_cast_fp32) and held by the loop's local,
    released only when the next forward returns. The loss counts them in forward and backward
    (they are its input); this is what stays once backward is done.
    Source: litgpt 0.5.13 finetune/full.py fit (`logits = model(input_ids)`; Fabric's
    convert_output casts to fp32, lightning 2.6.6 fabric/wrappers.py _FabricModule.forward).
    Traced: a vocab-32768 variant of make_litgpt_full_traces.py (the optimizer step's peak
    exactly 4 [T, v] fp32 above the engine without it, forward and backward within 0.13 [T, v]).
    Ignores: the previous step's logits during the next forward (its traced peak, at the loss,
    comes after they are released)."""
    return 4.0 * np.asarray(T, dtype=np.float64) * m.vocab_size / loss_tp_div


def liger_chunk_rows(m: ModelSpec, T) -> np.ndarray:
    """Rows per chunk of a fused linear + cross-entropy loss: next_power_of_2(ceil(T / ceil(V /
    H))), at most T. Source: Liger-Kernel fused_linear_cross_entropy.py
    fused_linear_cross_entropy_forward (inc_factor, chunk_size)."""
    T = np.asarray(T, dtype=np.float64)
    rows = np.ceil(T / np.ceil(m.vocab_size / m.hidden_size))
    return np.minimum(T, 2.0 ** np.ceil(np.log2(np.maximum(rows, 1.0))))


def chunked_loss_bytes(m: ModelSpec, *, T, e, r, param_e, loss_tp_div, head_trainable) -> tuple:
    """(saved, transient) bytes of a fused linear + cross-entropy loss (`--loss chunked`).

    Source: Liger-Kernel LigerFusedLinearCrossEntropyFunction: the forward walks the tokens in
    chunks (liger_chunk_rows), computes each chunk's logits, loss and gradient at once, and
    keeps grad_input [T, h] and grad_weight [V, h] for backward; no [T, V] tensor outlives a
    chunk.
    """
    h, v = m.hidden_size, m.vocab_size
    T = np.asarray(T, dtype=np.float64)
    chunk = liger_chunk_rows(m, T)
    # grad_input in the hidden states' dtype; grad_weight = zeros_like(weight) (fp32 under amp).
    # grad_weight is the head's gradient, only earlier: it exists from the forward on.
    saved = r * T * h + np.where(head_trainable, param_e * v * h / loss_tp_div, 0.0)
    transient = (e + 4.0 + 4.0) * chunk * v / loss_tp_div
    return saved, transient


def outside_layers_bytes(
    m: ModelSpec,
    *,
    T,
    s,
    e,
    r,
    amp,
    tp,
    sp,
    loss_tp_div,
    chunked,
    param_e,
    head_trainable,
    fused_norm=False,
    compiled=False,
    fp32_logits_in=False,
    norm_fp32_input=False,
    norm_scale_fp32=False,
    head=None,
) -> tuple[np.ndarray, np.ndarray]:
    """(saved outside the blocks, the chunked loss's transient) on the stage holding the head.

    The full loss saves the fp32 log-softmax [T, v]; the chunked one replaces it with its saved
    gradients (chunked_loss_bytes); a compiled one its logits input (fp32 where the model
    upcasts them itself, `fp32_logits_in`); a head run over chunks its chunks' log-softmax
    (`head`: the terms of head_chunked_loss_bytes by name, the rows' `chunked` mask); rows
    `head["wrapped"]` (ChunkedLossWrapper) none: the decoder's [T, h] gradient takes the head
    input's place. Source: hf_outside_bytes, chunked_loss_bytes, compiled_loss_kept_bytes.
    """
    outside_all = hf_outside_bytes(
        m,
        T=T,
        s=s,
        e=e,
        r=r,
        amp=amp,
        tp=tp,
        sp=sp,
        loss_tp_div=loss_tp_div,
        fused_norm=fused_norm,
        norm_fp32_input=norm_fp32_input,
        head_trainable=head_trainable,
        norm_scale_fp32=norm_scale_fp32,
    )
    chunk_saved, chunk_transient = chunked_loss_bytes(
        m, T=T, e=e, r=r, param_e=param_e, loss_tp_div=loss_tp_div, head_trainable=head_trainable
    )
    log_softmax = 4.0 * T * m.vocab_size / loss_tp_div
    # Compiled: the 16-bit logits (and a [T] logsumexp) are kept instead of the fp32 log-softmax.
    kept_logits = compiled_loss_kept_bytes(
        m, T=T, e=np.where(fp32_logits_in, 4.0, e), loss_tp_div=loss_tp_div
    )
    outside_all = np.where(compiled, outside_all - log_softmax + kept_logits, outside_all)
    outside_all = np.where(chunked, outside_all - log_softmax + chunk_saved, outside_all)
    if head is not None:
        drop = np.where(head["chunked"], log_softmax - head["saved"], 0.0)
        outside_all = outside_all - np.where(head.get("wrapped", False), log_softmax, drop)
    return outside_all, chunk_transient


def compiled_loss_kept_bytes(m: ModelSpec, *, T, e, loss_tp_div) -> np.ndarray:
    """What a compiled cross entropy keeps for backward: its 16-bit logits input and an fp32
    logsumexp per token (in place of the fp32 log-softmax).
    Source: torchtitan 0.3.0 components/loss.py (_maybe_compile: torch.compile(loss) when
    "loss" is in compile.components, the default); torchtune training/_compile.py
    compile_loss; inductor's cross-entropy lowering (a fused logsumexp reduction, the
    softmax recomputed in backward).
    """
    return (e * m.vocab_size + 4.0) * T / loss_tp_div


def loss_forward_extra_bytes(
    m: ModelSpec,
    *,
    T,
    e,
    r,
    amp,
    pp,
    last,
    chunked,
    chunked_output,
    loss_tp_div,
    logits_held,
    chunk_transient,
    zero_col,
    compiled=False,
    fp32_logits_in=False,
    head=None,
    softmax_in_place=False,
) -> np.ndarray:
    """Transient bytes at the forward peak, at the loss (the last stage's only).

    Full loss: logits, their fp32 copy, the head input (hf_loss_forward_extra_bytes); chunked:
    one chunk's logits and gradients; chunked-output: every chunk's 16-bit logits (the list
    the recipe holds) and one chunk's fp32 copy; in a pipeline, PIPELINE_LOSS_INPUTS [T, h]
    tensors less the held logits (counted in the stored activations); a head run over chunks:
    its `head` terms' forward transient (head_chunked_loss_bytes; its logits are held apart);
    an in-place softmax: its 16-bit logits only (megatron_in_place_loss_forward_extra_bytes).
    """
    full_loss_extra = hf_loss_forward_extra_bytes(
        m, T=T, e=e, r=r, amp=amp, loss_tp_div=loss_tp_div
    )
    fp32_copy = np.where(e < 4, 4.0 * T * m.vocab_size / loss_tp_div, 0.0)
    full_loss_extra = np.where(
        chunked_output, full_loss_extra - fp32_copy * (1.0 - 1.0 / OUTPUT_CHUNKS), full_loss_extra
    )
    # Compiled: the logits are the kept tensor (counted with the stored activations), no fp32
    # copy; what is left is autocast's fp32 head input.
    head_input = np.where(amp, 4.0 * T * m.hidden_size, 0.0)
    full_loss_extra = np.where(compiled & ~fp32_logits_in, head_input, full_loss_extra)
    # A model that upcasts its logits itself frees the 16-bit ones inside its forward: the loss
    # meets the fp32 logits only (torchtune TransformerDecoder: output(h).float()).
    logits_16 = np.where(e < 4, e * T * m.vocab_size / loss_tp_div, 0.0)
    full_loss_extra = np.where(
        fp32_logits_in & ~compiled, full_loss_extra - logits_16, full_loss_extra
    )
    in_place_extra = megatron_in_place_loss_forward_extra_bytes(
        m, T=T, e=e, amp=amp, loss_tp_div=loss_tp_div
    )
    full_loss_extra = np.where(
        softmax_in_place & ~compiled & ~chunked_output, in_place_extra, full_loss_extra
    )
    loss_extra = np.where(
        pp > 1,
        PIPELINE_LOSS_INPUTS * e * T * m.hidden_size - logits_held,
        np.where(chunked, chunk_transient, full_loss_extra),
    )
    if head is not None:
        loss_extra = np.where(head["chunked"] & (pp <= 1), head["forward"], loss_extra)
    return np.where(last, loss_extra, zero_col)


def loss_gradient_bytes(
    m: ModelSpec,
    *,
    T,
    e,
    pp,
    last,
    chunked,
    chunked_output,
    loss_tp_div,
    sp_div,
    zero_col,
    compiled=False,
    fp32_logits_in=False,
    head=None,
    softmax_in_place=False,
    grad_in_place=False,
) -> np.ndarray:
    """Transient bytes at the start of backward: the loss gradients (LOSS_GRADIENT_TENSORS fp32
    [T, v]; one chunk's under chunked-output, whose chunks run backward one at a time; a fused
    chunked loss computed them in forward; a head run over chunks: its `head` terms' backward,
    head_chunked_loss_bytes; an in-place softmax, megatron_in_place_loss_gradient_bytes; a fused
    loss writing into its kept logits, `grad_in_place`: none) and, on a pipeline's last stage,
    the gradient sent to the previous stage ([T, h] in the compute dtype)."""
    per_chunk = np.where(chunked_output, 1.0 / OUTPUT_CHUNKS, 1.0)
    # Compiled: one fused backward kernel writes the 16-bit logits' gradient.
    # (fp32 logits in: their fp32 gradient, then its cast to the model's dtype).
    compiled_grad = np.where(fp32_logits_in, 4.0 + e, np.where(grad_in_place, 0.0, e))
    per_element = np.where(compiled, compiled_grad, LOSS_GRADIENT_TENSORS * 4.0)
    full_grads = per_element * T * m.vocab_size / loss_tp_div * per_chunk
    in_place = megatron_in_place_loss_gradient_bytes(m, T=T, e=e, loss_tp_div=loss_tp_div)
    full_grads = np.where(softmax_in_place & ~compiled & ~chunked_output, in_place, full_grads)
    loss_grads = np.where(last & ~chunked, full_grads, zero_col)
    if head is not None:
        loss_grads = np.where(last & head["chunked"], head["backward"], loss_grads)
    return loss_grads + np.where(last & (pp > 1), e * T * m.hidden_size / sp_div, 0.0)


def megatron_in_place_loss_forward_extra_bytes(
    m: ModelSpec, *, T, e, amp, loss_tp_div
) -> np.ndarray:
    """Bytes the vocab-parallel cross entropy holds at the forward peak beyond the fp32 softmax
    it saves (counted with the saved activations, hf_outside_bytes): the 16-bit logits, which
    GPTModel._postprocess still references while the loss runs (none when the logits are
    fp32: .float() then returns them and the softmax overwrites them), and autocast's fp32
    head input where there is one (as hf_loss_forward_extra_bytes).

    Source: megatron-core 0.16.1 megatron/core/tensor_parallel/cross_entropy.py
    VocabParallelCrossEntropy.calculate_logits_max (vocab_parallel_logits.float(), the only
    [T, v/tp] allocation), calculate_predicted_logits (`-=` and torch.exp(out=) in place),
    calculate_cross_entropy_loss (exp_logits.div_), _VocabParallelCrossEntropy.forward
    (ctx.save_for_backward(exp_logits, ...)); models/gpt/gpt_model.py _postprocess (`logits`
    alive across compute_language_model_loss).
    Assumes: label_smoothing 0 (else torch.log(exp_logits) adds one fp32 [T, v/tp] in
    forward) and cross_entropy_loss_fusion off (model_parallel_config.py's default).
    Ignores: the [T] tensors (max, sum, target mask, predicted logits), under 0.01% of [T, v].
    """
    Tv = T * m.vocab_size / loss_tp_div
    return np.where(e < 4, e * Tv, 0.0) + np.where(amp, 4.0 * T * m.hidden_size, 0.0)


def megatron_in_place_loss_gradient_bytes(m: ModelSpec, *, T, e, loss_tp_div) -> np.ndarray:
    """Bytes of the loss gradients at the start of backward beyond the saved fp32 softmax,
    which becomes the logits' fp32 gradient in place (IN_PLACE_LOSS_GRADIENT_TENSORS): the
    16-bit gradient the upcast's backward (ToCopyBackward of `.float()`) casts it to for the
    output layer (none with fp32 logits, which were not copied).

    Source: megatron-core 0.16.1 megatron/core/tensor_parallel/cross_entropy.py
    _VocabParallelCrossEntropy.backward (returns grad_input, the saved softmax storage);
    calculate_logits_max (.float(), autograd's copy back to the logits' dtype).
    """
    Tv = T * m.vocab_size / loss_tp_div
    return IN_PLACE_LOSS_GRADIENT_TENSORS * 4.0 * Tv + np.where(e < 4, e * Tv, 0.0)


def largest_loss_block_bytes(
    m: ModelSpec,
    *,
    T,
    e,
    last,
    chunked,
    chunked_output,
    compiled,
    fp32_logits_in,
    loss_tp_div,
    zero_col,
    head=None,
) -> np.ndarray:
    """The largest single tensor of the step: one [T, v] loss tensor at the start of backward
    (fp32; one chunk's under chunked-output; the 16-bit logits' gradient when compiled, fp32 if
    the model upcasts; a fused chunked loss's [chunk, v] block; a head chunk's log-softmax,
    the `head` terms' block). Its size drives the caching
    allocator's fragmentation (engine/_overhead.py fragmentation_largest_block_factor).
    """
    Tv = T * m.vocab_size / loss_tp_div
    full = np.where(compiled & ~fp32_logits_in, e, 4.0) * Tv
    full = np.where(chunked_output, full / OUTPUT_CHUNKS, full)
    liger = 4.0 * liger_chunk_rows(m, T) * m.vocab_size / loss_tp_div
    if head is not None:
        full = np.where(head["chunked"], head["block"], full)
    return np.where(last, np.where(chunked, liger, full), zero_col)
