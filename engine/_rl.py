"""RL post-training with the rollout engine colocated: the per-GPU memory of the three phases of
one RL step (rollout, score, train) on top of the trainer's own step peak.

Columns in, columns out: `rl_phases` takes the grid and the trainer's estimate() columns (the
train step of the actor, as the engine computes it for any job) and adds what the RL loop keeps
beside it. numpy only, no Python branch on a row's value; rows with rl none get NaN phases.

The phases, per GPU (device bytes, as nvidia-smi counts them):
- rollout: the larger of the weight sync (the trainer's params on the GPU beside the engine's
  woken weights, before its KV cache resumes) and the generation: the trainer's resident
  states (verl keeps the sharded params and optimizer states on the GPU unless param_offload
  / optimizer_offload; gradients are freed after the step), the
  reference and critic shards, the trainer process's CUDA context and NCCL buffers, then the
  rollout engine: its budget gpu_memory_utilization x total memory (weights, profile-run
  activations, non-torch memory, the KV cache taking the rest), its own CUDA context and its
  CUDA graphs (captured after the KV cache is sized, outside the budget).
- score: forward-only log-probs (old policy, reference; values for the PPO critic) on
  log_prob_micro_batch_size sequences: the trainer's parameters (loaded back where they are
  offloaded between phases: verl b178a3c fsdp_workers.py compute_log_prob,
  load_fsdp_model_to_gpu under param_offload), its optimizer states unless offloaded, the
  other models' resident states and the logits; the rollout engine asleep (its residual).
  Ignores: one block's forward working set (no grad), small beside the logits.
- train: the trainer's step peak (estimate's peak_device_bytes) and what stays resident from
  the other models and the sleeping rollout engine.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._config import parallel_layout
from ._model import ModelSpec
from ._units import GIB
from ._vocab import REF_MODELS, RL_ALGORITHMS, RL_TRAINER_OFFLOADS, ROLLOUTS

RL_NONE, RL_GRPO, RL_PPO, RL_DPO = (RL_ALGORITHMS.index(k) for k in ("none", "grpo", "ppo", "dpo"))
ROLLOUT_AUTO, ROLLOUT_VLLM, ROLLOUT_SGLANG, ROLLOUT_HF = (
    ROLLOUTS.index(k) for k in ("auto", "vllm", "sglang", "hf")
)
REF_AUTO, REF_SEPARATE, REF_SHARED_LORA, REF_NONE, REF_OFFLOADED = (
    REF_MODELS.index(k) for k in ("auto", "separate", "shared-lora", "none", "offloaded")
)
OFFLOAD_OPTIMIZER = RL_TRAINER_OFFLOADS.index("optimizer")
OFFLOAD_PARAMS = RL_TRAINER_OFFLOADS.index("params")
OFFLOAD_BOTH = RL_TRAINER_OFFLOADS.index("params+optimizer")

RL_PHASES = ("rollout", "score", "train")

KV_BLOCK_SIZE = 16
"""Tokens per KV-cache block. Source: vllm 0.33.0 vllm/config/cache.py
CacheConfig.DEFAULT_BLOCK_SIZE = 16 (SGLang pages by token: a block of 1, ignored here)."""
ROLLOUT_DTYPE_BYTES = 2.0
"""The rollout engine's weights and KV cache in bf16. Source: verl 0.9.1
_generated_ppo_trainer.yaml rollout.dtype: bfloat16; vLLM kv_cache_dtype auto (the model's)."""
ROLLOUT_CUDA_GRAPH_BYTES = 0.5 * GIB
"""CUDA graphs of the rollout engine, captured after the KV cache is sized and so outside
gpu_memory_utilization. Source: vllm 0.33.0 vllm/v1/worker/gpu_worker.py
determine_available_memory (cudagraph_memory_estimate applied only with
VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS). Assumes: 0.5 GiB, an order of magnitude for a
7B-class model at max_num_seqs 256, not measured here; verl's default enforce_eager false
captures them. hf rollout: none."""
SAMPLER_FP32_COPIES = 2.0
"""vLLM's profile run samples max_num_seqs dummy rows: fp32 logits and their probabilities
(vllm/v1/worker/gpu_model_runner.py _dummy_sampler_run). Assumes two fp32 [seqs, vocab]."""
SCORE_LOGIT_BYTES = 6.0
"""Bytes per logit of a score forward (no grad): the bf16 logits (2), and the entropy's bf16
softmax and its product with the logits (2 + 2) while it runs; the log-probabilities are
flash-attn's cross entropy on the bf16 logits ([tokens] outputs only). Source: verl b178a3c
verl/workers/fsdp_workers.py compute_log_prob (calculate_entropy = not is_lora: the old
policy's forward computes the entropy), verl/utils/torch_functional.py logprobs_from_logits
(flash-attn cross_entropy_loss), entropy_from_logits (softmax(logits) in the logits' dtype,
then pd * logits). Assumes: padded sequences of seq_len unless packed (verl's
use_remove_padding without use_dynamic_bsz packs the real tokens: fewer)."""
ADVISED_UTIL_STEP = 0.05
"""advised_rollout_gpu_memory_utilization is a multiple of this: the largest that fits rounded
down, the one the rollout needs rounded up."""


def rl_rows(g: Any) -> dict[str, np.ndarray]:
    """The RL codes of the rows with `auto` resolved: rollout (auto: vllm for grpo/ppo; dpo has
    none, coded -1), ref_model (auto: shared-lora with a LoRA rank, else separate)."""
    rl = np.asarray(g["rl"])
    rollout = np.where(g["rollout"] == ROLLOUT_AUTO, ROLLOUT_VLLM, g["rollout"])
    rollout = np.where(rl == RL_DPO, -1, rollout)
    ref_auto = np.where(np.asarray(g["lora_rank"]) > 0, REF_SHARED_LORA, REF_SEPARATE)
    ref = np.where(g["ref_model"] == REF_AUTO, ref_auto, g["ref_model"])
    return {"rl": rl, "rollout": rollout, "ref_model": ref}


def dpo_pairs(g: Any) -> np.ndarray:
    """Sequences per micro-batch entry: 2 for a DPO row (chosen and rejected), else 1."""
    return np.where(np.asarray(g["rl"]) == RL_DPO, 2, 1)


def trainer_grid(g: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The grid the trainer's step is estimated on: a DPO micro-batch of pairs runs chosen and
    rejected responses concatenated, twice the sequences (micro_batch_size and the global batch
    doubled); an RL row packed by tokens or unpadded (packed_micro_batches) one row of
    rl_max_token_len_per_gpu, or micro_batch_size x rl_mean_seq_len, tokens; every other row
    as given.
    Source: trl 1.16.0 trl/trainer/dpo_trainer.py concatenated_forward (chosen and rejected
    concatenated along the batch)."""
    shortened = (np.asarray(g["rl"]) != RL_NONE) & (np.asarray(g["rl_mean_seq_len"]) > 0)
    if not np.any(g["rl"] == RL_DPO) and not np.any(_packed_rows(g) | shortened):
        return g
    pairs = dpo_pairs(g)
    doubled = {
        **g,
        "micro_batch_size": g["micro_batch_size"] * pairs,
        "global_batch_size": g["global_batch_size"] * pairs,
    }
    return {**doubled, **packed_micro_batches(doubled)}


def trainer_time_columns(g: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The columns an RL row's trainer step is timed on: DPO's pairs (twice the sequences),
    each sequence of unpadded_seq_len tokens (the work of its real tokens: packed_micro_batches'
    nominal micro-batches bound the memory, not the FLOPs), and a packed row's micro-batch as
    many sequences as rl_max_token_len_per_gpu holds (the GEMMs' size). Rows without RL as
    given. No branch on a row's value, so that the
    step-time formulas that read them trace (engine/_fast/_time_row.py)."""
    pairs = dpo_pairs(g)
    seq = unpadded_seq_len(g)
    micro = g["micro_batch_size"] * pairs
    layout = parallel_layout(g)
    per_rank = np.ceil(layout["global_batch_size"] * pairs / layout["dp"])
    fill = np.floor(np.asarray(g["rl_max_token_len_per_gpu"]) / np.maximum(seq, 1))
    packed = np.clip(fill, 1, np.maximum(per_rank, 1)).astype(np.asarray(micro).dtype)
    return {
        **g,
        "micro_batch_size": np.where(_packed_rows(g), packed, micro),
        "global_batch_size": g["global_batch_size"] * pairs,
        "seq_len": seq,
    }


def _packed_rows(g: Any) -> np.ndarray:
    """RL rows whose train and score micro-batches are packed by tokens
    (rl_max_token_len_per_gpu > 0)."""
    return (np.asarray(g["rl"]) != RL_NONE) & (np.asarray(g["rl_max_token_len_per_gpu"]) > 0)


def unpadded_seq_len(g: Any) -> np.ndarray:
    """Tokens per sequence of an RL row's train and score micro-batches: rl_mean_seq_len where
    given (padding removed: verl's use_remove_padding concatenates the real tokens of a
    micro-batch's sequences into one row, flash-attn varlen), else seq_len (the bound).
    Source: verl b178a3c workers/actor/dp_actor.py _forward_micro_batch (unpad_input, then
    one [1, total_nnz] row)."""
    mean = np.asarray(g["rl_mean_seq_len"])
    rl = np.asarray(g["rl"]) != RL_NONE
    return np.where(rl & (mean > 0), mean, np.asarray(g["seq_len"]))


def packed_micro_batches(g: Any) -> dict[str, np.ndarray]:
    """micro_batch_size, seq_len and global_batch_size of the trainer's step where the RL
    trainer removes padding: a micro-batch is one row of its sequences' real tokens. Packed by
    tokens (rl_max_token_len_per_gpu), one row of that many tokens, and per optimizer step as
    many packed micro-batches per rank as the step's sequences fill (at least one); else
    micro_batch_size sequences of unpadded_seq_len tokens each, as one row. Rows without RL,
    or whose sequences are not shortened, as given.
    Source: verl b178a3c (0.8.0.dev) verl/utils/seqlen_balancing.py rearrange_micro_batches
    (num_micro_batches = ceil(sum of the sequences' lengths / max_token_len), the sequences
    balanced between them; `assert max_token_len >= max_seq_len`), workers/actor/dp_actor.py
    update_policy and compute_log_prob (prepare_dynamic_batch under use_dynamic_bsz);
    flash-attn varlen keeps attention per sequence, so a row of packed sequences holds what
    one row of that many tokens does.
    Assumes: every packed micro-batch holds max_token_len tokens (the nominal size: a balanced
    partition can exceed it by less than one sequence, and real lengths fill it less).
    Ignores: Ulysses sequence parallelism (max_token_len x ulysses size, split over the group)."""
    packed = _packed_rows(g)
    tokens = np.asarray(g["rl_max_token_len_per_gpu"])
    seq = unpadded_seq_len(g)
    layout = parallel_layout(g)
    dp, responses = layout["dp"], layout["global_batch_size"]
    steps = np.ceil(np.ceil(responses / dp) * seq / np.maximum(tokens, 1))
    steps = np.maximum(steps, 1).astype(np.int64)
    micro = np.asarray(g["micro_batch_size"])
    unpadded = ~packed & (seq < np.asarray(g["seq_len"]))
    return {
        "micro_batch_size": np.where(packed | unpadded, 1, micro),
        "seq_len": np.select([packed, unpadded], [tokens, micro * seq], g["seq_len"]),
        "global_batch_size": np.select(
            [packed, unpadded],
            [steps * dp, responses // np.maximum(micro, 1)],
            g["global_batch_size"],
        ),
    }


def kv_bytes_per_token(m: ModelSpec, rollout_tp: Any) -> np.ndarray:
    """KV-cache bytes per token on one rollout rank, all layers: per layer K and V of
    num_kv_heads / tp heads (at least one: vLLM replicates a KV head when tp exceeds them) of
    head_dim, in the rollout dtype; an MLA model caches one latent of kv_lora_rank +
    qk_rope_head_dim per token, not split by tp.
    Source: vllm 0.33.0 vllm/v1/kv_cache_interface.py AttentionSpec.real_page_size_bytes
    (2 x block_size x num_kv_heads x head_size x dtype bytes), MLAAttentionSpec
    (block_size x 1 x head_size x dtype bytes); vllm/config/model.py get_num_kv_heads
    (max(1, total_num_kv_heads // tp)).
    Ignores: sliding-window layers' smaller cache (vLLM's hybrid allocator), fp8 KV caches."""
    tp = np.asarray(rollout_tp, dtype=np.float64)
    L = m.num_hidden_layers
    if m.is_mla:
        per_layer = (m.kv_lora_rank + m.qk_rope_head_dim) * ROLLOUT_DTYPE_BYTES + 0.0 * tp
    else:
        heads = np.maximum(1.0, np.floor(m.num_key_value_heads / tp))
        per_layer = 2.0 * heads * m.head_dim * ROLLOUT_DTYPE_BYTES
    return per_layer * L


def kv_cache_bytes(per_token: Any, seq_tokens: Any, num_seqs: Any) -> np.ndarray:
    """KV-cache bytes of `num_seqs` sequences of `seq_tokens` tokens, each in whole blocks.
    Source: vllm 0.33.0 vllm/v1/kv_cache_interface.py FullAttentionSpec.max_memory_usage_bytes
    (cdiv(max_model_len, block_size) x page_size_bytes); vllm/v1/core/kv_cache_planning.py
    get_kv_cache_config_from_groups (num_blocks = available_memory // bytes_per_block)."""
    blocks = np.ceil(np.asarray(seq_tokens, dtype=np.float64) / KV_BLOCK_SIZE)
    return np.asarray(num_seqs, dtype=np.float64) * blocks * KV_BLOCK_SIZE * per_token


def rollout_weight_bytes(m: ModelSpec, rollout_tp: Any) -> np.ndarray:
    """The rollout engine's weights on one rank: the full model in bf16 over its TP group (one
    full copy per rollout TP group). Source: vLLM tensor-parallel linear layers
    (vllm/model_executor/layers/linear.py); verl rollout.dtype bfloat16.
    Ignores: the replicated embedding-free parts (norms, biases) being whole on every rank."""
    return m.num_parameters * ROLLOUT_DTYPE_BYTES / np.asarray(rollout_tp, dtype=np.float64)


def rollout_activation_bytes(m: ModelSpec, g: Any) -> np.ndarray:
    """The peak of vLLM's profile run above its weights: one layer's forward working set on
    max_num_batched_tokens tokens (the gated MLP's up/gate output and its product, 3 x
    intermediate / tp, and four hidden-sized buffers: residual, normed input, attention output,
    QKV), or the sampler's fp32 logits of max_num_seqs rows, whichever is larger.
    Source: vllm 0.33.0 vllm/v1/worker/gpu_model_runner.py profile_run (_dummy_run of
    max_num_batched_tokens, then _dummy_sampler_run of max_num_seqs).
    Assumes: no activation is kept across layers (inference)."""
    s = np.asarray(g["rollout_max_num_batched_tokens"], dtype=np.float64)
    seqs = np.asarray(g["rollout_max_num_seqs"], dtype=np.float64)
    tp = np.asarray(g["rollout_tp"], dtype=np.float64)
    h, i, v = m.hidden_size, m.intermediate_size, m.vocab_size
    forward = s * (3.0 * i / tp + 4.0 * h) * ROLLOUT_DTYPE_BYTES  # MLP 3i/t, buffers 4h
    sampler = seqs * v * 4.0 * SAMPLER_FP32_COPIES  # fp32 logits and probabilities
    return np.maximum(forward, sampler)


def rollout_prompts(g: Any) -> np.ndarray:
    """Prompts per rollout step over all GPUs: rollout_batch_size, or (0) the trainer's global
    batch / group (one optimizer step's responses)."""
    group = np.asarray(g["rl_group_size"], dtype=np.float64)
    given = np.asarray(g["rollout_batch_size"], dtype=np.float64)
    global_batch = parallel_layout(g)["global_batch_size"].astype(np.float64)
    return np.where(given > 0, given, np.ceil(global_batch / group))


def sequences_per_engine(g: Any) -> np.ndarray:
    """One rollout engine's share of a rollout step's responses: prompts x group over
    num_gpus / rollout_tp engines."""
    group = np.asarray(g["rl_group_size"], dtype=np.float64)
    engines = np.maximum(np.asarray(g["num_gpus"]) // np.asarray(g["rollout_tp"]), 1)
    return np.ceil(rollout_prompts(g) * group / engines)


def rollout_sequences(g: Any) -> np.ndarray:
    """Sequences one rollout engine holds at once: its share of the step's responses
    (sequences_per_engine), at most max_num_seqs.
    Source: vllm 0.33.0 vllm/config/scheduler.py SchedulerConfig.max_num_seqs."""
    per_engine = sequences_per_engine(g)
    return np.minimum(per_engine, np.asarray(g["rollout_max_num_seqs"], dtype=np.float64))


def _kept_optimizer_bytes(step: dict[str, np.ndarray], offload: Any) -> np.ndarray:
    """The trainer's optimizer states on the GPU unless they are offloaded (verl
    optimizer_offload)."""
    keep = (offload != OFFLOAD_OPTIMIZER) & (offload != OFFLOAD_BOTH)
    return np.where(keep, step["optimizer_states"], 0.0)


def trainer_resident_bytes(step: dict[str, np.ndarray], offload: Any) -> np.ndarray:
    """A trainer's states that stay on the GPU while the rollout engine runs: its parameters
    (and fp32 master copy) unless params are offloaded, its optimizer states unless the
    optimizer is; gradients are freed after the step (zero_grad(set_to_none)).
    Source: verl 0.9.1 verl/workers/engine_workers.py update_weights (after the weight sync,
    `engine.to("cpu", model=True)` where param offload is enabled; the optimizer moves with
    optimizer_offload after the update)."""
    params = step["parameters"] + step["master_weights"]
    keep_params = (offload != OFFLOAD_PARAMS) & (offload != OFFLOAD_BOTH)
    return np.where(keep_params, params, 0.0) + _kept_optimizer_bytes(step, offload)


def weight_sync_bytes(step: dict[str, np.ndarray], offload: Any, *, others: Any) -> np.ndarray:
    """What the trainer holds while it copies its weights into the woken rollout engine: its
    parameters (and master copy) whether or not they are offloaded afterwards, its optimizer
    states unless offloaded, and `others` (reference, critic, the trainer's context and NCCL);
    the engine's KV cache is not resumed yet.
    Source: verl 0.9.1 verl/workers/engine_workers.py update_weights (1. resume the rollout's
    weights, 2.-3. sync them, 3. offload the model to CPU, 4. resume the KV cache).
    Ignores: the one gathered tensor in flight (per-tensor sync)."""
    optimizer = _kept_optimizer_bytes(step, offload)
    return step["parameters"] + step["master_weights"] + optimizer + others


def reference_bytes(m: ModelSpec, g: Any, ref: Any) -> np.ndarray:
    """A separate reference model's 16-bit weights on one GPU: sharded over all GPUs under
    ZeRO-3 / FSDP full shard (verl's ref is an FSDP module like the actor), else whole over the
    trainer's tp x pp. shared-lora (the base with adapters disabled), none and offloaded
    (verl ref.fsdp_config.param_offload: on CPU, a layer streamed in at a time): 0.
    Source: verl 0.9.1 _generated_ppo_trainer.yaml (ref.fsdp_config: the ref is an FSDP engine
    like the actor, without an optimizer); trl 1.16.0 trl/trainer/dpo_trainer.py (ref_model
    None under PEFT: the adapters disabled)."""
    zero3 = np.asarray(g["zero"]) == 3
    shard = np.where(zero3, np.asarray(g["num_gpus"]), np.asarray(g["tp"]) * np.asarray(g["pp"]))
    weights = m.num_parameters * ROLLOUT_DTYPE_BYTES / np.maximum(shard, 1)
    return np.where(ref == REF_SEPARATE, weights, 0.0)


def score_logits_bytes(m: ModelSpec, g: Any) -> np.ndarray:
    """The logits of one score forward: log_prob_micro_batch_size (0: micro_batch_size)
    sequences x unpadded_seq_len, or a packed row of rl_max_token_len_per_gpu tokens (verl's
    log_prob_max_token_len_per_gpu defaults to ppo_max_token_len_per_gpu), x vocab / tp,
    SCORE_LOGIT_BYTES each (a DPO micro-batch: chosen and rejected, twice the sequences).
    Source: SCORE_LOGIT_BYTES; packed_micro_batches."""
    mb = np.where(
        g["log_prob_micro_batch_size"] > 0, g["log_prob_micro_batch_size"], g["micro_batch_size"]
    )
    mb = mb * dpo_pairs(g)
    tokens = mb.astype(np.float64) * unpadded_seq_len(g).astype(np.float64)
    tokens = np.where(_packed_rows(g), np.asarray(g["rl_max_token_len_per_gpu"]), tokens)
    return tokens * m.vocab_size / np.asarray(g["tp"], dtype=np.float64) * SCORE_LOGIT_BYTES


def needed_utilization(engine_bytes: Any, total_bytes: Any) -> np.ndarray:
    """The smallest gpu_memory_utilization, rounded UP to ADVISED_UTIL_STEP, whose budget holds
    `engine_bytes`: the engine's weights, profile-run activations, non-torch memory and the KV
    cache of every sequence it runs at once (rollout_sequences x max length), so that it never
    preempts. More budget only grows a KV cache the scheduler cannot fill (max_num_seqs caps
    the sequences in flight), and leaves the trainer less.
    Source: vllm 0.33.0 vllm/v1/core/sched/scheduler.py (preemption when no KV block is free),
    vllm/config/scheduler.py max_num_seqs."""
    ratio = np.asarray(engine_bytes, dtype=np.float64) / np.asarray(total_bytes, dtype=np.float64)
    return np.round(np.ceil(ratio / ADVISED_UTIL_STEP - 1e-9) * ADVISED_UTIL_STEP, 2)


def advised_utilization(
    *, other_bytes: Any, total_bytes: Any, limit_bytes: Any, engine_min_bytes: Any
) -> np.ndarray:
    """The largest gpu_memory_utilization, rounded DOWN to ADVISED_UTIL_STEP, whose rollout
    phase fits: other_bytes (everything on the GPU besides the engine's budget) + util x total
    <= limit (usable memory less the headroom), and at most 1; NaN where it leaves the engine
    less than engine_min_bytes (its weights, profile-run activations, non-torch memory and one
    max-length sequence's KV cache: vLLM refuses to start below it).
    Source: vllm 0.33.0 vllm/v1/worker/utils.py request_memory (requested = ceil(total x
    util), refused when free memory is less), vllm/v1/core/kv_cache_planning.py
    _check_enough_kv_cache_memory (one max_model_len request must fit)."""
    total = np.asarray(total_bytes, dtype=np.float64)
    room = (np.asarray(limit_bytes, dtype=np.float64) - other_bytes) / total
    steps = np.floor(np.minimum(room, 1.0) / ADVISED_UTIL_STEP + 1e-9)
    util = np.round(steps * ADVISED_UTIL_STEP, 2)
    return np.where((util > 0) & (util * total >= engine_min_bytes), util, np.nan)


RL_OUTPUTS = (
    "peak_rollout_bytes",
    "peak_score_bytes",
    "peak_train_bytes",
    "rl_peak_bytes",
    "rl_peak_phase",
    "trainer_resident_bytes",
    "reference_bytes",
    "critic_resident_bytes",
    "rollout_weight_bytes",
    "rollout_activation_bytes",
    "rollout_non_torch_bytes",
    "rollout_budget_bytes",
    "rollout_outside_budget_bytes",
    "kv_cache_available_bytes",
    "kv_cache_needed_bytes",
    "kv_cache_min_bytes",
    "rollout_sequences",
    "rollout_sleep_residual_bytes",
    "score_logits_bytes",
    "rollout_starts",
    "advised_rollout_gpu_memory_utilization",
    "max_rollout_gpu_memory_utilization",
    "rl_fits",
)
"""What rl_phases returns (bytes per GPU unless said; rl_peak_phase indexes RL_PHASES; NaN
where a phase does not run: no score without a log-prob forward, no rollout for dpo)."""


def rl_phases(
    m: ModelSpec,
    g: dict[str, np.ndarray],
    step: dict[str, np.ndarray],
    *,
    total_bytes: Any,
    limit_bytes: Any,
    cuda_context_bytes: float,
    nccl_bytes_per_communicator: float,
    cublas_workspace_bytes: float,
) -> dict[str, np.ndarray]:
    """The RL phases of every row (RL_OUTPUTS) from the grid and the trainer's step columns
    (estimate() on trainer_grid(g): parameters, master_weights, optimizer_states,
    framework_overhead, peak_device_bytes). `total_bytes`: the GPU's total as CUDA reports it
    (what vLLM's gpu_memory_utilization multiplies); `limit_bytes`: usable memory less the
    headroom; the overheads: the rollout engine's own CUDA context, its TP group's NCCL
    buffers and its cuBLAS workspace (engine/_overhead.py Overheads).

    PPO's critic is a second trainable model of the same architecture and configuration,
    trained before the actor (verl update_critic then update_actor): its resident states count
    in every phase of the actor (and the actor's in the critic's step, the same size).
    Ignores: the critic's value head in place of the LM head; the hf rollout's activations and
    logits (its KV cache, grown as HF generate goes, is counted as the needed KV); SGLang's own
    split (mem_fraction_static holds weights and the KV pool, its activations sit outside: read
    here as vLLM's budget); a rollout TP group spanning more GPUs than the job has."""
    r = rl_rows(g)
    total = np.broadcast_to(np.asarray(total_bytes, dtype=np.float64), r["rl"].shape)
    limit = np.broadcast_to(np.asarray(limit_bytes, dtype=np.float64), r["rl"].shape)
    held = _held_bytes(m, g, step, r)
    eng = rollout_engine_bytes(
        m,
        g,
        r,
        total_bytes=total,
        cuda_context_bytes=cuda_context_bytes,
        nccl_bytes_per_communicator=nccl_bytes_per_communicator,
        cublas_workspace_bytes=cublas_workspace_bytes,
    )
    peaks = _phase_peaks(m, g, step, r, held, eng, total=total, limit=limit)
    merged = {**held, **eng, **peaks}
    return {k: merged[k] for k in RL_OUTPUTS}


def _held_bytes(
    m: ModelSpec, g: Any, step: dict[str, np.ndarray], r: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """What the trainer and the other models keep on the GPU between their own steps: the
    trainer's resident states (trainer_resident_bytes), the PPO critic's (the same), the
    reference's shard (reference_bytes)."""
    resident = trainer_resident_bytes(step, np.asarray(g["rl_trainer_offload"]))
    return {
        "trainer_resident_bytes": resident,
        "reference_bytes": reference_bytes(m, g, r["ref_model"]),
        "critic_resident_bytes": np.where(r["rl"] == RL_PPO, resident, 0.0),
    }


def rollout_engine_bytes(
    m: ModelSpec,
    g: Any,
    r: dict[str, np.ndarray],
    *,
    total_bytes: np.ndarray,
    cuda_context_bytes: float,
    nccl_bytes_per_communicator: float,
    cublas_workspace_bytes: float,
) -> dict[str, np.ndarray]:
    """The rollout engine on one GPU: its budget (util x total) and what is inside it (bf16
    weights over the rollout TP group, the profile run's activations, non-torch memory: cuBLAS
    and the TP group's NCCL), the KV cache taking the rest, what it needs (rollout_sequences
    of seq_len tokens) and its minimum (one max_model_len sequence), and what sits outside the
    budget (its CUDA context and graphs). hf: no engine, its KV cache exactly what it needs.
    Source: vllm 0.33.0 vllm/v1/worker/gpu_worker.py determine_available_memory
    (available_kv_cache_memory_bytes = requested_memory - non_kv_cache_memory)."""
    generates = (r["rl"] != RL_NONE) & (r["rl"] != RL_DPO)
    engine = generates & (r["rollout"] != ROLLOUT_HF)
    rtp = np.asarray(g["rollout_tp"])
    util = np.asarray(g["rollout_gpu_memory_utilization"], dtype=np.float64)
    weights = np.where(engine, rollout_weight_bytes(m, rtp), 0.0)  # hf: the trainer's own
    act = np.where(engine, rollout_activation_bytes(m, g), 0.0)
    nccl = np.where(rtp > 1, nccl_bytes_per_communicator, 0.0)
    non_torch = np.where(engine, cublas_workspace_bytes + nccl, 0.0)
    budget = np.where(engine, util * total_bytes, 0.0)
    per_token = kv_bytes_per_token(m, rtp)
    seqs = np.where(generates, rollout_sequences(g), 0.0)
    needed = np.where(generates, kv_cache_bytes(per_token, g["seq_len"], seqs), 0.0)
    return {
        "generates": generates,
        "engine": engine,
        "rollout_weight_bytes": weights,
        "rollout_activation_bytes": act,
        "rollout_non_torch_bytes": non_torch,
        "rollout_budget_bytes": budget,
        "rollout_outside_budget_bytes": np.where(
            engine, cuda_context_bytes + ROLLOUT_CUDA_GRAPH_BYTES, 0.0
        ),
        "kv_cache_available_bytes": np.where(engine, budget - weights - act - non_torch, needed),
        "kv_cache_needed_bytes": needed,
        "kv_cache_min_bytes": np.where(generates, kv_cache_bytes(per_token, g["seq_len"], 1), 0.0),
        "rollout_sequences": seqs,
    }


def _phase_peaks(
    m: ModelSpec,
    g: Any,
    step: dict[str, np.ndarray],
    r: dict[str, np.ndarray],
    held: dict[str, np.ndarray],
    eng: dict[str, np.ndarray],
    *,
    total: np.ndarray,
    limit: np.ndarray,
) -> dict[str, np.ndarray]:
    """The three phases' peaks, the largest and its phase, whether the engine starts, the
    advised utilization and the fit (module docstring: what each phase holds)."""
    is_rl, engine = r["rl"] != RL_NONE, eng["engine"]
    critic, reference = held["critic_resident_bytes"], held["reference_bytes"]
    budget, outside = eng["rollout_budget_bytes"], eng["rollout_outside_budget_bytes"]
    # Beside the engine: the models' resident states and the trainer's context, NCCL, cuBLAS.
    beside_trainer = critic + reference + step["framework_overhead"]
    others = held["trainer_resident_bytes"] + beside_trainer
    hf_kv = np.where(eng["generates"] & ~engine, eng["kv_cache_needed_bytes"], 0.0)
    offload = np.asarray(g["rl_trainer_offload"])
    # The trainer's parameters are on the GPU to sync the weights and to score (verl loads
    # offloaded ones back for both), its optimizer states unless offloaded.
    loaded = weight_sync_bytes(step, offload, others=beside_trainer)
    sync = loaded + outside + eng["rollout_weight_bytes"]
    rollout = np.where(
        eng["generates"], np.maximum(others + outside + budget + hf_kv, sync), np.nan
    )
    # vLLM's start check: the free memory at its init must cover util x total.
    fits_kv = eng["kv_cache_available_bytes"] >= eng["kv_cache_min_bytes"]
    starts = ~engine | ((total - others - outside >= budget) & fits_kv)
    sleep = np.asarray(g["rollout_sleep_level"])
    # Asleep (level 1 or 2) the engine keeps its context and CUDA graphs; awake (level 0) all.
    residual = np.where(engine, np.where(sleep > 0, outside, outside + budget), 0.0)
    logits = score_logits_bytes(m, g)
    scores = is_rl & ((r["rl"] != RL_DPO) | (r["ref_model"] != REF_NONE))
    score = np.where(scores, loaded + residual + logits, np.nan)
    train = np.where(is_rl, step["peak_device_bytes"] + critic + reference + residual, np.nan)
    phases = np.stack([np.nan_to_num(x, nan=-np.inf) for x in (rollout, score, train)])
    peak = np.where(is_rl, np.max(phases, axis=0), np.nan)
    advised, largest = _advised(
        step, held, eng, others=others, score_bytes=loaded + logits, sleep=sleep, sync=sync,
        total=total, limit=limit,
    )  # fmt: skip
    return {
        "peak_rollout_bytes": rollout,
        "peak_score_bytes": score,
        "peak_train_bytes": train,
        "rl_peak_bytes": peak,
        "rl_peak_phase": np.argmax(phases, axis=0).astype(np.int8),
        "rollout_sleep_residual_bytes": residual,
        "score_logits_bytes": np.where(scores, logits, 0.0),
        "rollout_starts": starts,
        "advised_rollout_gpu_memory_utilization": advised,
        "max_rollout_gpu_memory_utilization": largest,
        "rl_fits": is_rl & starts & (peak <= limit),
    }


def _advised(
    step: dict[str, np.ndarray],
    held: dict[str, np.ndarray],
    eng: dict[str, np.ndarray],
    *,
    others: np.ndarray,
    score_bytes: np.ndarray,
    sleep: np.ndarray,
    sync: np.ndarray,
    total: np.ndarray,
    limit: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(advised, largest) utilization of rows. largest: advised_utilization with, beside the
    engine's budget, what the rollout holds (`others`: the models' states, the trainer's
    context) and, awake (sleep level 0), the score's and train's peaks too; NaN where the
    weight sync alone, which no utilization changes, is over the limit, and where there is no
    engine (hf, dpo); `score_bytes`: the score phase without the engine. advised:
    needed_utilization of the engine's fixed bytes and the KV cache
    of its sequences in flight, at most largest."""
    critic, reference = held["critic_resident_bytes"], held["reference_bytes"]
    awake = np.where(
        sleep == 0, np.maximum(step["peak_device_bytes"] + critic + reference, score_bytes), 0.0
    )
    engine_fixed = (
        eng["rollout_weight_bytes"]
        + eng["rollout_activation_bytes"]
        + eng["rollout_non_torch_bytes"]
    )
    largest = advised_utilization(
        other_bytes=np.maximum(others, awake) + eng["rollout_outside_budget_bytes"],
        total_bytes=total,
        limit_bytes=limit,
        engine_min_bytes=engine_fixed + eng["kv_cache_min_bytes"],
    )
    largest = np.where(eng["engine"] & (sync <= limit), largest, np.nan)
    # The advice is the smallest utilization that runs the rollout without preemption, at
    # most the largest that fits (where even that is short, the largest: the engine preempts).
    need = needed_utilization(engine_fixed + eng["kv_cache_needed_bytes"], total)
    return np.minimum(largest, need), largest
