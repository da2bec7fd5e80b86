"""The time an RL step spends beside the trainer's own step: the rollout engine's generation,
the score forwards, the weight sync and the offload traffic between phases (engine/_rl.py has
their memory). Columns in, columns out; rows with rl none get zeros.

Per rollout step (prompts x group responses), then per optimizer step (what `step_time_s`
counts: one rollout step carries prompts x group / global_batch_size optimizer steps):

- rollout: each of num_gpus / rollout_tp engines decodes its share of the responses in waves
  of at most max_num_seqs sequences, response_len decode steps per wave (the longest response
  bounds a wave); a decode step reads the engine's weights and its sequences' KV cache once
  (memory bound at these batch sizes), plus the engine's per-step overhead and, under rollout
  tp, two all-reduces per layer; the prompts' prefill is compute bound.
- score: forward passes over the step's sequences, each as long as the trainer's own forward:
  the old policy's log-probabilities (GRPO, PPO), the reference's (unless ref_model none), the
  critic's values (PPO).
- critic (PPO): the critic's update, a step like the actor's.
- sync: every GPU gathers the trained weights (16-bit) for its rollout engine; LoRA sends the
  adapters only.
- offload: verl's param_offload / optimizer_offload move the trainer's shards between host
  and GPU around each phase; an offloaded reference streams its weights in for its forward.

Assumes: every response runs to response_len (the bound: real responses stop earlier, so the
rollout's measured time is below this one), no preemption (the advised
gpu_memory_utilization sizes the KV cache for the sequences in flight), the reward is a
function (no reward model). Accuracy: bench/rl_time.py compares these terms with verl's own
`timing_s/*` logs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._config import parallel_layout
from ._model import ModelSpec
from ._precision import MASTER_BYTES, PARAM_BYTES
from ._rl import (
    OFFLOAD_BOTH,
    OFFLOAD_OPTIMIZER,
    OFFLOAD_PARAMS,
    REF_NONE,
    REF_OFFLOADED,
    RL_DPO,
    RL_NONE,
    RL_PPO,
    ROLLOUT_DTYPE_BYTES,
    kv_bytes_per_token,
    rl_rows,
    rollout_prompts,
    rollout_sequences,
    rollout_weight_bytes,
    sequences_per_engine,
)
from ._time_params import TimeParams

PARAM_OFFLOAD_TRANSFERS = 6.0
"""Host-device copies of the trainer's parameter shard per rollout step under param_offload:
loaded and offloaded around the weight sync, the old-policy log-probs and the update.
Source: verl b178a3c verl/workers/fsdp_workers.py rollout_mode, compute_log_prob,
update_actor (load_fsdp_model_to_gpu ... offload_fsdp_model_to_cpu in each)."""
OPTIMIZER_OFFLOAD_TRANSFERS = 2.0
"""Copies of the optimizer-state shard per rollout step under optimizer_offload: loaded before
the update, offloaded after. Source: verl b178a3c fsdp_workers.py update_actor
(load_fsdp_optimizer, offload_fsdp_optimizer)."""
RL_TIME_COLUMNS = ("rl_rollout_s", "rl_score_s", "rl_critic_s", "rl_sync_s", "rl_offload_s")
"""The RL terms of a step (estimate_time columns), seconds per optimizer step."""
OPTIMIZER_STATE_BYTES = 8.0
"""AdamW's two fp32 moments per trainable parameter (verl's actor optimizer)."""


def optimizer_steps_per_rollout(g: Any) -> np.ndarray:
    """Optimizer steps one rollout step's responses feed (verl: train_batch_size x n /
    (ppo_mini_batch_size x n)), at least one. Source: verl b178a3c
    verl/workers/actor/dp_actor.py update_policy (one optimizer step per mini-batch)."""
    sequences = rollout_prompts(g) * np.asarray(g["rl_group_size"], dtype=np.float64)
    global_batch = parallel_layout(g)["global_batch_size"].astype(np.float64)
    return np.maximum(sequences / np.maximum(global_batch, 1.0), 1.0)


def decode_step_s(
    m: ModelSpec, g: Any, *, in_flight: Any, hbm: Any, peak: Any, intra: Any, pr: TimeParams
) -> np.ndarray:
    """One decode step of one rollout engine with `in_flight` sequences: its weights and their
    KV cache (mean context: prompt + half the response, or rl_mean_seq_len where given) read
    from HBM or its FLOPs at the GEMM ceiling, whichever is longer, plus the engine's
    per-step overhead and, under rollout tp, two all-reduces per layer of [in_flight, hidden]
    16-bit activations.
    Source: the decode roofline (Pope et al. 2022, "Efficiently Scaling Transformer Inference"
    Sec. 2: small-batch decoding is bound by reading the weights and the KV cache); vLLM's row
    layers all-reduce after attention and MLP (vllm/model_executor/layers/linear.py
    RowParallelLinear). Ignores: the sampler, the attention kernel's own inefficiency."""
    tp = np.asarray(g["rollout_tp"], dtype=np.float64)
    response = np.asarray(g["response_len"], dtype=np.float64)
    bound = np.asarray(g["seq_len"], dtype=np.float64) - response / 2.0
    mean = np.asarray(g["rl_mean_seq_len"], dtype=np.float64)
    context = np.where(mean > 0, np.minimum(mean, bound), bound)
    seqs = np.asarray(in_flight, dtype=np.float64)
    read = rollout_weight_bytes(m, tp) + seqs * context * kv_bytes_per_token(m, tp)
    flops = 2.0 * m.num_parameters * seqs / tp
    roofline = np.maximum(read / hbm, flops / (peak * pr.gemm_efficiency_max))
    hops = 2.0 * (tp - 1.0)
    per_reduce = hops * pr.ring_step_latency_s + hops / tp * seqs * m.hidden_size * 2.0 / (
        intra * pr.collective_bandwidth_efficiency
    )
    return roofline + pr.rollout_step_overhead_s + 2.0 * m.num_hidden_layers * per_reduce


def rollout_s(
    m: ModelSpec, g: Any, *, hbm: Any, peak: Any, intra: Any, pr: TimeParams
) -> np.ndarray:
    """One rollout step's generation: each engine's share of the responses in waves of
    max_num_seqs, response_len decode steps each, and the prompts' prefill (2 FLOPs per
    parameter per prompt token over the engine's tp, at the GEMM ceiling).
    Source: engine/_rl.py sequences_per_engine, rollout_sequences (max_num_seqs in flight);
    decode_step_s."""
    tp = np.asarray(g["rollout_tp"], dtype=np.float64)
    per_engine, in_flight = sequences_per_engine(g), rollout_sequences(g)
    waves = np.ceil(per_engine / np.maximum(in_flight, 1.0))
    step = decode_step_s(m, g, in_flight=in_flight, hbm=hbm, peak=peak, intra=intra, pr=pr)
    response = np.asarray(g["response_len"], dtype=np.float64)
    prompt_tokens = per_engine * (np.asarray(g["seq_len"], dtype=np.float64) - response)
    prefill = 2.0 * m.num_parameters * prompt_tokens / tp / (peak * pr.gemm_efficiency_max)
    return waves * response * step + prefill


def score_forwards(g: Any) -> np.ndarray:
    """Forward passes over the step's sequences besides the update: the old policy's
    log-probabilities (GRPO, PPO), the reference's unless ref_model none, the critic's values
    (PPO). Source: verl b178a3c verl/trainer/ppo/ray_trainer.py fit (compute_log_prob,
    compute_ref_log_prob, compute_values); trl 1.16.0 dpo_trainer.py (the reference's
    log-probabilities each step unless precomputed)."""
    rl = np.asarray(g["rl"])
    policy = np.where((rl != RL_NONE) & (rl != RL_DPO), 1.0, 0.0)
    ref = np.where((rl != RL_NONE) & (rl_rows(g)["ref_model"] != REF_NONE), 1.0, 0.0)
    return policy + ref + np.where(rl == RL_PPO, 1.0, 0.0)


def score_s(g: Any, *, trainer_forward_s: Any) -> np.ndarray:
    """The score forwards per optimizer step on one GPU: each is the trainer's forward pass
    over the same sequences (the step's micro-batches, at their GEMM efficiency), no backward.
    Source: score_forwards; engine/_time.py _compute_s (fwd_share: the forward's share of a
    step's compute). Ignores: log-prob micro-batches of another size than the update's."""
    return score_forwards(g) * np.asarray(trainer_forward_s, dtype=np.float64)


def offload_s(m: ModelSpec, g: Any, *, trainable: Any, pcie: Any) -> np.ndarray:
    """The host-device traffic of one rollout step on one GPU: the trainer's parameter shard
    (parameters and master copy) PARAM_OFFLOAD_TRANSFERS times under param offload, its
    optimizer-state shard OPTIMIZER_OFFLOAD_TRANSFERS times under optimizer offload, an
    offloaded reference's 16-bit weights streamed in once (FSDP CPUOffload) for its forward;
    shards over every GPU (verl's FSDP full shard). Source: the transfer constants above;
    verl b178a3c fsdp_workers.py (the ref's fsdp_config.param_offload: CPUOffload)."""
    n = np.asarray(g["num_gpus"], dtype=np.float64)
    prec = np.asarray(g["precision"]).astype(int)
    params = m.num_parameters * (PARAM_BYTES[prec] + MASTER_BYTES[prec]) / n
    states = np.asarray(trainable, dtype=np.float64) * OPTIMIZER_STATE_BYTES / n
    off = np.asarray(g["rl_trainer_offload"])
    param_copies = np.where((off == OFFLOAD_PARAMS) | (off == OFFLOAD_BOTH), 1.0, 0.0)
    state_copies = np.where((off == OFFLOAD_OPTIMIZER) | (off == OFFLOAD_BOTH), 1.0, 0.0)
    ref = np.where(rl_rows(g)["ref_model"] == REF_OFFLOADED, 1.0, 0.0)
    moved = (
        param_copies * PARAM_OFFLOAD_TRANSFERS * params
        + state_copies * OPTIMIZER_OFFLOAD_TRANSFERS * states
        + ref * m.num_parameters * ROLLOUT_DTYPE_BYTES / n
    )
    return moved / pcie


def sync_s(m: ModelSpec, g: Any, *, adapters: Any, intra: Any, pr: TimeParams) -> np.ndarray:
    """The weight sync of one rollout step: every GPU gathers the whole model's 16-bit weights
    (adapters only under LoRA) from the trainer's shards. Source: verl b178a3c fsdp_workers.py
    rollout_mode (the full state dict gathered, then loaded into the engine; LoRA rows send
    the adapters, vLLM applying them at run time). Ignores: the engine's load_weights copy."""
    lora = np.asarray(g["lora_rank"]) > 0
    weights = np.where(lora, np.asarray(adapters, dtype=np.float64), float(m.num_parameters))
    return weights * ROLLOUT_DTYPE_BYTES / (intra * pr.collective_bandwidth_efficiency)


def rl_time_columns(
    m: ModelSpec,
    g: Any,
    *,
    trainer_step_s: Any,
    trainer_forward_s: Any,
    trainable: Any,
    adapters: Any,
    links: Any,
    hbm: Any,
    peak: Any,
    pr: TimeParams,
) -> dict[str, np.ndarray]:
    """Seconds per optimizer step of the RL terms (rl_rollout_s, rl_score_s, rl_critic_s,
    rl_sync_s, rl_offload_s): each rollout step's terms over optimizer_steps_per_rollout;
    zero for rows with rl none; DPO rows have no rollout, sync or critic.
    `trainer_step_s` / `trainer_forward_s`: the trainer's step and its forward passes.
    `trainable`: the trainer's trainable parameters; `adapters`: its LoRA adapters'."""
    rl = np.asarray(g["rl"])
    on = rl != RL_NONE
    gen = on & (rl != RL_DPO)
    intra = np.asarray(links.intra_node_bytes_per_s, dtype=np.float64)
    pcie = np.asarray(links.pcie_bytes_per_s, dtype=np.float64) * pr.pcie_efficiency
    steps = optimizer_steps_per_rollout(g)
    rollout = rollout_s(m, g, hbm=hbm, peak=peak, intra=intra, pr=pr)
    terms = {
        "rl_rollout_s": np.where(gen, rollout / steps, 0.0),
        "rl_score_s": np.where(on, score_s(g, trainer_forward_s=trainer_forward_s), 0.0),
        "rl_critic_s": np.where(rl == RL_PPO, np.asarray(trainer_step_s, np.float64), 0.0),
        "rl_sync_s": np.where(gen, sync_s(m, g, adapters=adapters, intra=intra, pr=pr), 0.0)
        / steps,
        "rl_offload_s": np.where(on, offload_s(m, g, trainable=trainable, pcie=pcie), 0.0) / steps,
    }
    return terms
