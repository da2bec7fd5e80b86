"""Published verl / EasyR1 memory records (tests/data/published/rl_measurements.json, copied
from the rlpub helper's branch, commit 4d66fee, with each record's URL, verbatim row and trust)
as trainmem RL jobs, and trainmem's answer for each.

`cases()` maps every record whose config names what trainmem needs (a preset of its model,
GRPO or PPO with vLLM, an integer micro-batch per GPU) to estimate() fields, as the recipe
states them: verl's FSDP actor (ZeRO-3, fp32 master + bf16 compute: mixed-bf16), gradient
checkpointing as full recompute, train_batch_size prompts per rollout, ppo_mini_batch_size x n
responses per optimizer step, param/optimizer offload as rl_trainer_offload, the reference
offloaded where ref_param_offload (shared-lora under LoRA, verl's adapter-disabled base).
Records without those are listed as skipped with the reason.

What is compared: the measured records' metric is torch max_memory_allocated of verl's
WorkerDict process over all phases (vLLM in-process in sync mode); trainmem's nearest figure
is allocated_counter_bytes (each phase's bytes in torch's allocator, the sleeping engine's pool
counted in the score and train phases). The outcome
records (fits / oom) are compared with `fits`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

RECORDS = Path(__file__).parent / "data" / "published" / "rl_measurements.json"

MODELS = {
    "Qwen/Qwen2.5-0.5B-Instruct": "qwen2.5-0.5b",
    "Qwen/Qwen2.5-7B-Instruct": "qwen2.5-7b",
    "Qwen/Qwen2.5-14B-Instruct": "qwen2.5-14b",
    "Qwen/Qwen2.5-32B-Instruct": "qwen2.5-32b",
    "Qwen/Qwen2.5-72B-Instruct": "qwen2.5-72b",
    "Qwen/Qwen2-7B-Instruct": "qwen2-7b",
    "Qwen/Qwen2-72B-Instruct": "qwen2-72b",
    "Qwen/Qwen2.5-32B": "qwen2.5-32b",
    "Qwen/Qwen2.5-1.5B-Instruct": "qwen2-1.5b",
    "Qwen/Qwen2.5-1.5B": "qwen2-1.5b",
    "Qwen/Qwen2.5-Coder-14B-Instruct": "qwen2.5-14b",
}
"""The records' models that are trainmem presets (their names as the records write them; a
record naming its model with a suffix, "(actor, ref, critic)", is matched on the first word).
A base model is its instruct model's architecture; Qwen2.5-1.5B has Qwen2-1.5B's config
(hidden 1536, 28 layers, 12/2 heads, intermediate 8960, vocab 151936, tied: 1,543,714,304
parameters) and Qwen2.5-Coder-14B Qwen2.5-14B's (hidden 5120, 48 layers, 40/8 heads,
intermediate 13824, vocab 152064)."""


def records() -> list[dict[str, Any]]:
    return json.loads(RECORDS.read_text())


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _per_gpu(value: Any) -> int | None:
    """A per-GPU micro-batch written as the older verl's global one, "64 global (=8 per GPU)"
    (verl divided the deprecated global ppo_micro_batch_size by the world size)."""
    found = re.search(r"\(=(\d+) per GPU", value) if isinstance(value, str) else None
    return int(found.group(1)) if found else None


def fields_of(record: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """(estimate() fields of a record, "") or (None, why it is skipped)."""
    c = record["config"]
    model = MODELS.get(str(record.get("model", "")).split(" ")[0])
    if model is None:
        return None, f"model {record.get('model')!r} is not a preset"
    algorithm = c.get("rl_algorithm")
    if algorithm not in ("grpo", "ppo"):
        return None, f"algorithm {algorithm!r}"
    if not str(c.get("rollout_engine", "")).startswith("vllm"):
        return None, f"rollout {c.get('rollout_engine')!r}"
    gpu = str(record.get("gpu", ""))
    if record.get("value_gib") and not re.search(r"80 ?GB|H100|H800", gpu):
        return None, "GPU not stated: gpu_memory_utilization x total is unknown"
    micro = _int(c.get("ppo_micro_batch_size_per_gpu")) or _per_gpu(c.get("ppo_micro_batch_size"))
    n, gpus = _int(c.get("n")), _int(record.get("num_gpus"))
    prompt, response = _int(c.get("max_prompt_length")), _int(c.get("max_response_length"))
    prompts, mini = _int(c.get("train_batch_size")), _int(c.get("ppo_mini_batch_size"))
    tp, util = _int(c.get("rollout_tp")), c.get("gpu_memory_utilization")
    needed = {"micro": micro, "n": n, "num_gpus": gpus, "prompt": prompt, "response": response}
    needed |= {"train_batch_size": prompts, "ppo_mini_batch_size": mini, "rollout_tp": tp}
    missing = [k for k, v in needed.items() if v is None]
    if missing or not isinstance(util, (int, float)):
        return None, "config lacks " + ", ".join(missing or ["gpu_memory_utilization"])
    assert micro and n and gpus and prompt and response and prompts and mini and tp
    lora = _int(c.get("lora_rank")) or 0
    offload = {(False, False): "none", (True, False): "params", (False, True): "optimizer"}
    both = (bool(c.get("param_offload")), bool(c.get("optimizer_offload")))
    ref = "shared-lora" if lora else ("offloaded" if c.get("ref_param_offload") else "separate")
    log_prob = (
        _int(c.get("log_prob_micro_batch_size_per_gpu"))
        or _per_gpu(c.get("log_prob_micro_batch_size"))
        or micro
    )
    # use_dynamic_bsz: micro-batches packed to ppo_max_token_len_per_gpu (verl's default 16384).
    packed = (_int(c.get("ppo_max_token_len_per_gpu")) or 16384) if c.get("use_dynamic_bsz") else 0
    # use_remove_padding with the real lengths the log printed (logged_lengths: the peak step's
    # tokens per rank over its sequences); without them, the padded bound prompt + response.
    logged = record.get("logged_lengths") or {}
    mean_len = 0
    if c.get("use_remove_padding") and not packed and logged.get("global_seqlen/mean"):
        mean_len = round(logged["global_seqlen/mean"] / logged["sequences_per_rank"])
    fields: dict[str, Any] = {
        "model": model,
        "gpu": "h100-sxm-80gb",
        "num_gpus": gpus,
        "zero": 3,
        "precision": "mixed-bf16",
        "recompute": "full" if c.get("gradient_checkpointing") else "none",
        "micro_batch_size": micro,
        "seq_len": prompt + response,
        "global_batch_size": mini * n,
        "lora_rank": lora,
        "rl": algorithm,
        "rollout": "vllm",
        "rollout_tp": tp,
        "rollout_gpu_memory_utilization": float(util),
        "rl_group_size": n,
        "response_len": response,
        "rollout_batch_size": prompts,
        "ref_model": ref,
        "rl_trainer_offload": offload.get(both, "params+optimizer"),
        "log_prob_micro_batch_size": log_prob,
        "rl_max_token_len_per_gpu": max(packed, prompt + response) if packed else 0,
        "rl_mean_seq_len": mean_len,
        "framework": "verl",
    }
    for key, name in (
        ("max_num_seqs", "rollout_max_num_seqs"),
        ("max_num_batched_tokens", "rollout_max_num_batched_tokens"),
    ):
        if _int(c.get(key)):
            fields[name] = c[key]
    return fields, ""


def cases() -> list[tuple[dict[str, Any], dict[str, Any] | None, str]]:
    """(record, fields or None, why skipped) of every record."""
    return [(r, *fields_of(r)) for r in records()]


def allocated_counter_bytes(report: dict[str, Any]) -> float:
    """The process's torch max_memory_allocated as verl logs it, from an RL report: every
    phase's bytes in torch's allocator (its device bytes less what sits outside: the trainer's
    CUDA context, NCCL and cuBLAS, the rollout engine's context and CUDA graphs), and in the
    score and train phases the sleeping engine's weights and KV cache too: vLLM's sleep mode
    allocates them from a torch MemPool (CuMemAllocator) and, asleep, releases their physical
    pages while the tensors stay allocated, so torch still counts them. Inferred, not stated by
    verl: the records' metric_semantics; 72B LoRA on 80 GB GPUs logs 81.9 GiB allocated, more
    than the device holds (verl-data-grpo-lora-qwen2.5-72b-math-8gpu).
    Source: vllm 0.8.x vllm/device_allocator/cumem.py CuMemAllocator (use_memory_pool, sleep:
    unmap_and_release per allocation)."""
    rl = report["rl"]
    outside = report["breakdown_at_peak"]["framework_overhead"] + rl["rollout_outside_budget_bytes"]
    pool = rl["rollout_weight_bytes"] + rl["kv_cache_available_bytes"]
    phases = rl["phases"]
    in_torch = [phases["rollout"] - outside] if "rollout" in phases else []
    in_torch += [phases[k] - outside + pool for k in ("score", "train") if k in phases]
    return max(in_torch)


def compare(record: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """trainmem's answer for one mapped record: the phases (GiB), the allocated-like peak, the
    error against a measured value, the fit against an outcome."""
    import trainmem

    r = trainmem.estimate(advice=False, **fields)
    rl = r["rl"]
    gib = 2.0**30
    allocated = allocated_counter_bytes(r) / gib
    out = {
        "id": record["id"],
        "phases_gib": {k: round(v / gib, 2) for k, v in rl["phases"].items()},
        "peak_phase": rl["peak_phase"],
        "allocated_like_gib": round(allocated, 2),
        "fits": r["fits"],
        "advised": r["advised_rollout_gpu_memory_utilization"],
        "recipe_util": fields["rollout_gpu_memory_utilization"],
        "outcome": record["outcome"],
    }
    if record.get("value_gib"):
        out["measured_gib"] = record["value_gib"]
        out["error"] = round(allocated / record["value_gib"] - 1.0, 3)
    return out
