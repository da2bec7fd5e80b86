"""The engine's `--framework torchtitan` against exact traces of torchtitan's own training step.

tests/data/framework_traces/torchtitan_llama3_ac.json: torchtitan 0.3.0's Llama 3 (its own
model builder, fused wqkv, nn.RMSNorm, its cross-entropy loss) traced on the fake CUDA device
(make_torchtitan_traces.py says how), with no activation checkpointing, torchtitan's FullAC, its
per-op SelectiveAC (the default `selective`), and the layer-wise policy every second block
(torchtitan <= 0.2 and torchtune). Cases run with the CUDA build's fused RMSNorm ("fused" rows;
what `trainmem trace` now does, trace/_norm.py) are the ground truth; "composite" rows are what a
CPU build of torch saves, kept as provenance. No torch needed: the traced figures are data.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.framework_accuracy import (
    TRACE_POLICY,
    TRACED_LOSS,
    estimate_hf_qlora,
    estimate_megatron,
    estimate_one,
    estimate_torchtitan_ac,
    estimate_torchtitan_fsdp,
    estimate_torchtune,
    small_llama_spec,
)

DATA = Path(__file__).parents[1] / "data" / "framework_traces" / "torchtitan_llama3_ac.json"
TRACED = [c for c in json.loads(DATA.read_text())["cases"] if c["rms_norm"] == "fused"]
CASES = [c for c in TRACED if c["silu"] == "composite"]
"""Fake mode's own silu_backward (decomposed: sigmoid, 1 - sigmoid and their products), as the
HF ground truth (../shared/groundtruth) was traced."""
CUDA_SILU_CASES = [c for c in TRACED if c["silu"] == "fused"]
"""The same steps with silu_backward as one CUDA kernel (one output like its input), as a GPU
runs it and as the torchtitan 8B and Trainer traces were made."""
ACTIVATIONS_TOLERANCE = 0.002
"""torchtitan 0.3.0 keeps a complex64 RoPE cache in every block (FrameworkSpec
rope_cache_per_block, alive all run, in the trace's buffers) and the attention reads its slices:
no rotary tables among the activations. Within 0.06% on every case."""
PEAK_TOLERANCE = 0.001
"""Without recompute the peaks agree within 0.01% (the per-block caches counted in every
phase)."""
RECOMPUTE_PEAK_TOLERANCE = 0.02
"""Full and layer-wise recompute peak at the end of backward in layer 0 (engine/_rank_activations
.py temp_end: BACKWARD_MLP_TEMP_TF [T, f] gradients, read off the HF ground truth, whose
silu_backward is fake mode's decomposition as here): up to 1.5% more than traced."""
OP_SAC_DECOMPOSED_SILU_UNDER = 0.05
"""Per-op SAC peaks at the top block's gated-activation backward. op_sac_top_block_bytes counts
what a GPU holds there (silu_backward one kernel: exact on CUDA_SILU_CASES at 2x2048 and on
the Trainer traces); fake mode's decomposed silu_backward holds its sigmoid, 1 - sigmoid and
product temporaries on top: the engine is 2.3% (1x1024) and 4.6% (2x2048) under these rows."""


def _id(case: dict[str, Any]) -> str:
    return f"{case['policy']}-{case['micro_batch_size']}x{case['seq_len']}-{case['optimizer']}"


def test_the_ground_truth_covers_every_policy() -> None:
    assert {c["policy"] for c in CASES} == set(TRACE_POLICY)
    assert len(CASES) == 8
    assert [(c["policy"], c["tokens"]) for c in CUDA_SILU_CASES] == [
        (c["policy"], c["tokens"]) for c in CASES
    ]


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_model_states_to_the_byte(case: dict[str, Any]) -> None:
    got = estimate_torchtitan_ac(case)
    assert got["parameters"] == case["parameters_bytes"]
    assert got["gradients_total"] == case["gradients_bytes"]
    assert got["optimizer_states"] == case["optimizer_states_bytes"]


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_activations_and_peak(case: dict[str, Any]) -> None:
    got = estimate_torchtitan_ac(case)
    activations = got["activations_total"] / case["activations_bytes"] - 1.0
    peak = got["peak_allocated_bytes"] / case["peak_allocated_bytes"] - 1.0
    assert abs(activations) <= ACTIVATIONS_TOLERANCE, activations
    if case["policy"] == "selective_op":
        assert -OP_SAC_DECOMPOSED_SILU_UNDER <= peak <= 0.0, peak
    else:
        tolerance = PEAK_TOLERANCE if case["policy"] == "none" else RECOMPUTE_PEAK_TOLERANCE
        assert 0.0 <= peak <= tolerance or abs(peak) <= PEAK_TOLERANCE, peak
    assert got["peak_phase"] == 1  # backward, as traced


CUDA_SILU_OP_SAC_TOLERANCE = 0.02
"""Per-op SAC with a GPU's silu_backward: 0.00% at 2x2048 (the top block's moment,
op_sac_top_block_bytes); at 1x1024 the trace peaks in the optimizer step and the engine's end
of backward in layer 0 (BACKWARD_MLP_TEMP_TF) is 1.7% above it."""
CUDA_SILU_LAYER0_END_OVER = 0.17
"""Full and layer-wise recompute with a GPU's silu_backward: the engine is over, by 1.7% and
16.4% (full) and 6.5% and 10.0% (every second block): its end-of-backward moment in layer 0
counts BACKWARD_MLP_TEMP_TF = 7 [T, f] gradients, read off the HF ground truth whose
silu_backward is fake mode's decomposition; a GPU holds about three fewer there. A known gap,
bounded here so that a fix shows (the bound and the sign are asserted), not tuned to these
rows: the HF ground truth pins the constant until it is traced with the kernel's semantics."""


@pytest.mark.parametrize("case", CUDA_SILU_CASES, ids=_id)
def test_peaks_with_a_gpus_silu_backward(case: dict[str, Any]) -> None:
    got = estimate_torchtitan_ac(case)
    peak = got["peak_allocated_bytes"] / case["peak_allocated_bytes"] - 1.0
    if case["policy"] == "none":
        assert abs(peak) <= PEAK_TOLERANCE, peak
    elif case["policy"] == "selective_op":
        assert abs(peak) <= CUDA_SILU_OP_SAC_TOLERANCE, peak
    else:
        assert 0.0 <= peak <= CUDA_SILU_LAYER0_END_OVER, peak


def test_per_op_sac_keeps_what_torchtitan_saves() -> None:
    # Per block, in elements per token (bf16): the block input h, the wqkv output q + 2kv, the
    # flash output h and its fp32 logsumexp (2a), w1's output f, w2's output h; every second
    # matmul (wo, w3) and everything pointwise is recomputed. Plus 1 KiB of rng seed/offset.
    case = next(c for c in CASES if c["policy"] == "selective_op")
    d = case["dims"]
    h, q, kv, f, a = (
        d["hidden"],
        d["heads"] * d["head_dim"],
        d["kv_heads"] * d["head_dim"],
        (d["intermediate"]),
        d["heads"],
    )
    tokens = case["tokens"]
    per_block = 2 * tokens * (3 * h + q + 2 * kv + f + 2 * a) + 1024
    assert case["activations_by_layer_bytes"][0] == per_block
    assert estimate_torchtitan_ac(case)["activations_per_layer"] == per_block


FSDP_DATA = DATA.parent / "torchtitan_llama3_8b_fsdp.json"
FSDP_CASES = [
    c for c in json.loads(FSDP_DATA.read_text())["cases"] if c["silu_backward"] == "fused"
]
FSDP_PEAK_TOLERANCE = 0.001
"""torchtitan 0.3.0's per-block complex64 RoPE caches (0.125 GiB at 8192 tokens, 0.5 GiB at
32768) are counted (FrameworkSpec.rope_cache_per_block): within 0.01% on every case."""


@pytest.mark.parametrize("case", FSDP_CASES, ids=lambda c: c["case"])
def test_llama3_8b_under_fsdp2_at_full_size(case: dict[str, Any]) -> None:
    # torchtitan's Llama-3.1-8B, its own apply_fsdp (tok_embeddings and [norm, output] units,
    # bf16 params / fp32 reduce), fused AdamW, per-op SAC or full AC, on 8 and 128 fake ranks.
    got = estimate_torchtitan_fsdp(case)
    assert got["parameters"] == case["parameters_bytes"]
    assert got["optimizer_states"] == case["optimizer_states_bytes"]
    saved = got["activations_total"] / case["activations_bytes"] - 1.0
    assert abs(saved) <= 0.001, saved  # the same rotary tables on the activation side
    peak = got["peak_allocated_bytes"] / case["peak_allocated_bytes"] - 1.0
    assert abs(peak) <= FSDP_PEAK_TOLERANCE, peak


COMPILE_DATA = DATA.parent / "torchtitan_llama3_compile.json"
COMPILE_CASES = [
    c for c in json.loads(COMPILE_DATA.read_text())["cases"] if c["rms_norm"] == "fused"
]
COMPILE_PEAK_TOLERANCE = 0.02
"""The compiled backward was run op by op (inductor cannot generate kernels for the fake
device), so its transients are eager's: an upper bound the engine does not follow (it keeps
eager's backward transients, engine/_compile.py). Within 1.8% on every case (no AC compiled at
1024 tokens); per-op SAC compiled within 0.01% (the top block's moment,
op_sac_top_block_bytes). The eager per-op SAC rows are fake mode's decomposed silu_backward,
as CASES: OP_SAC_DECOMPOSED_SILU_UNDER."""


@pytest.mark.parametrize(
    "case",
    COMPILE_CASES,
    ids=lambda c: f"{c['policy']}-{'compiled' if c['compiled'] else 'eager'}-{c['seq_len']}",
)
def test_compiled_blocks_keep_what_the_partitioner_keeps(case: dict[str, Any]) -> None:
    # torchtitan's per-block torch.compile, inductor's decompositions and min-cut partition:
    # no AC keeps one [T, f] less (the SiLU output), per-op SAC one [T, h] less (w2's output),
    # full AC the same; the loss eager.
    dims = {"hidden": 512, "intermediate": 1792, "heads": 8, "kv_heads": 2, "layers": 4}
    got = estimate_one(
        small_llama_spec({**dims, "vocab": 2048}),
        micro_batch_size=case["micro_batch_size"],
        seq_len=case["seq_len"],
        precision="bf16",
        framework="torchtitan",
        loss=TRACED_LOSS,
        recompute=TRACE_POLICY[case["policy"]],
        compile="blocks" if case["compiled"] else "none",
        optimizer="adamw",
    )
    saved = got["activations_total"] / case["activations_bytes"] - 1.0
    peak = got["peak_allocated_bytes"] / case["peak_allocated_bytes"] - 1.0
    assert abs(saved) <= ACTIVATIONS_TOLERANCE, saved
    if case["policy"] == "selective_op" and not case["compiled"]:
        assert -OP_SAC_DECOMPOSED_SILU_UNDER <= peak <= 0.0, peak
    else:
        assert abs(peak) <= COMPILE_PEAK_TOLERANCE, peak


MEGATRON_DATA = DATA.parent / "megatron_gpt_local.json"
MEGATRON_CASES = json.loads(MEGATRON_DATA.read_text())["cases"]
MEGATRON_PEAK_TOLERANCE = 0.015
"""Within 0.8% on every case (0.1% without recompute, whose peak is the top layer's fp32
softmax backward); full recompute's layer backward uses the engine's generic transients, not
megatron-core's own sequence. The trace ran the unfused softmax (masked_softmax_fusion=False):
its cases are `--attention eager-unfused` (tests/framework_accuracy.py estimate_megatron)."""


@pytest.mark.parametrize(
    "case",
    MEGATRON_CASES,
    ids=lambda c: f"{c['recompute']}-tp{c['tp']}-b{c['micro_batch_size']}",
)
def test_megatron_core_step(case: dict[str, Any]) -> None:
    # megatron-core 0.16.1's GPTModel (local spec, unfused core attention with an fp32 softmax,
    # vocab_parallel_cross_entropy: one fp32 [T, v] softmax, the gradient in place),
    # its DDP (contiguous fp32 grad buffer) and distributed optimizer, on the fake device.
    got = estimate_megatron(case)
    assert got["parameters"] == case["parameters_bytes"]
    assert got["master_weights"] == case["main_params_fp32_bytes"]
    assert got["gradients_total"] == case["grad_buffer_bytes"]
    assert got["optimizer_states"] == case["adam_states_bytes"]
    saved = got["activations_total"] / case["activations_bytes"] - 1.0
    assert abs(saved) <= 0.002, saved  # the causal masks' rounding
    peak = got["peak_allocated_bytes"] / case["peak_allocated_bytes"] - 1.0
    assert abs(peak) <= MEGATRON_PEAK_TOLERANCE, peak
    opt = got["peak_optimizer_step_bytes"] / case["peak_optimizer_step_bytes"] - 1.0
    assert abs(opt) <= 0.001, opt


TORCHTUNE_DATA = DATA.parent / "torchtune_lora.json"
TORCHTUNE_CASES = json.loads(TORCHTUNE_DATA.read_text())["cases"]
TORCHTUNE_ACTIVATIONS_TOLERANCE = 0.07
"""Within 2.2% without offloading: layer 0's first norm keeps nothing in the trace (its input,
the frozen embedding's output, needs no gradient and its scale is frozen), which the engine
does not single out. With activation offloading -6.7%: on the fake device (no CUDA streams)
torchtune's OffloadActivations moved block 0's input only, the engine moves all but two
blocks' inputs."""
TORCHTUNE_PEAK_TOLERANCE = 0.05
"""Within 1.7% without checkpointing; -4.5% with it (the recomputed block's backward in
torchtune's layer order, which the engine models on layer 0's end-of-backward moment)."""


@pytest.mark.parametrize(
    "case",
    TORCHTUNE_CASES,
    ids=lambda c: f"ac{int(c['ac'])}-{c['loss']}-offload{int(c['offload'])}",
)
def test_torchtune_lora_step(case: dict[str, Any]) -> None:
    # torchtune 0.6.1's lora_llama3_2 under set_default_dtype(bf16): bf16 adapters on q, v,
    # output_proj and the MLP (rank 16), F.rms_norm on fp32 copies, k/v expanded to the query
    # heads, CEWithChunkedOutputLoss or output(h).float() + CE, fused AdamW on the adapters.
    got = estimate_torchtune(case)
    assert got["parameters"] == case["parameters_bytes"]
    assert got["gradients_total"] == case["gradients_bytes"]
    assert got["optimizer_states"] == case["optimizer_states_bytes"]
    saved = got["activations_total"] / case["activations_bytes"] - 1.0
    assert abs(saved) <= TORCHTUNE_ACTIVATIONS_TOLERANCE, saved
    peak = got["peak_allocated_bytes"] / case["peak_allocated_bytes"] - 1.0
    assert abs(peak) <= TORCHTUNE_PEAK_TOLERANCE, peak


HF_QLORA_DATA = DATA.parent / "hf_qlora.json"
HF_QLORA_CASES = json.loads(HF_QLORA_DATA.read_text())["cases"]
HF_QLORA_PARAMETERS_TOLERANCE = 0.002
"""The engine counts a 256-entry fp32 code and a 512-byte offset block per NF4 tensor
(engine/_lora.py NF4_STATE_BYTES_PER_TENSOR); quantising on load, bitsandbytes shares one code
(functional.py name2qmap["dynamic"]): +0.15% here (28 tensors of a 17 MB model)."""
HF_QLORA_ACTIVATIONS_TOLERANCE = 0.02
"""+1.6% without checkpointing: the engine's fp32 final-norm copy outside the layers (4 MiB) and
0.46 MiB per layer that it counts for plain LoRA under autocast too (the same cells traced with
peft LoRA on an fp32 base: 51.92 MiB a layer, the engine 52.38); within 0.5% otherwise."""
HF_QLORA_PEAK_TOLERANCE = {("amp-bf16", "none"): 0.01, ("amp-bf16", "full"): 0.06,
                           ("bf16", "none"): 0.15}  # fmt: skip
"""amp-bf16 without checkpointing: +0.05%. With full recompute -5.1%: the recomputed block's
backward (fp32 MLP gradients, a dequantised weight) modelled on layer 0's end-of-backward moment.
bf16 (an fp32 run after prepare_model_for_kbit_training, GQA on SDPA's math kernel): -13.5%, the
traced backward holds 189 MB of transients (among them the fp32 [1, 8, 2048, 2048] score
gradients) where the engine counts 35 MB; its saved activations match to 0.5%."""
HF_QLORA_PER_LAYER_BYTES = {("amp-bf16", "none"): 68_699_136, ("amp-bf16", "full"): 4_194_304,
                            ("bf16", "none"): 219_037_696}  # fmt: skip
"""The traced blocks 1-3 (block 0 saves less: its first norm's input is the frozen embedding's),
from hf_qlora.json."""
HF_QLORA_PER_LAYER_TOLERANCE = 0.007
"""The engine's block: +0.67% without checkpointing (its plain-LoRA offset above, 0.46 MiB),
exact with full recompute (the fp32 block input), +2 KiB in 209 MiB for bf16."""


def _qlora_id(case: dict[str, Any]) -> str:
    return f"{case['precision']}-recompute-{case['recompute']}"


@pytest.mark.parametrize("case", HF_QLORA_CASES, ids=_qlora_id)
def test_hf_qlora_step(case: dict[str, Any]) -> None:
    # bitsandbytes 0.50.2 Linear4bit (NF4, double quantisation, bf16 compute) on every block
    # linear, peft 0.21.2 prepare_model_for_kbit_training (fp32 embeddings, norms, head) and
    # rank-16 all-linear fp32 adapters, AdamW on the adapters; one 1 x 2048 micro-batch.
    got = estimate_hf_qlora(case)
    assert got["gradients_total"] == case["gradients_bytes"]
    assert got["optimizer_states"] == case["optimizer_states_bytes"]
    traced_parameters = case["parameters_bytes"] + case["quant_state_bytes"]
    parameters = got["parameters"] / traced_parameters - 1.0
    assert 0.0 <= parameters <= HF_QLORA_PARAMETERS_TOLERANCE, parameters
    saved = got["activations_total"] / case["activations_bytes"] - 1.0
    assert abs(saved) <= HF_QLORA_ACTIVATIONS_TOLERANCE, saved
    key = (case["precision"], case["recompute"])
    traced_layer = HF_QLORA_PER_LAYER_BYTES[key]
    assert case["activations_by_layer_bytes"][1:] == [traced_layer] * 3
    per_layer = got["activations_per_layer"] / traced_layer - 1.0
    assert 0.0 <= per_layer <= HF_QLORA_PER_LAYER_TOLERANCE, per_layer
    peak = got["peak_allocated_bytes"] / case["peak_allocated_bytes"] - 1.0
    assert abs(peak) <= HF_QLORA_PEAK_TOLERANCE[key], peak


HF_QLORA_OLD_BNB = json.loads((DATA.parent / "hf_qlora_old_bnb.json").read_text())["cases"]
"""The same three steps with bitsandbytes <= 0.43.1's MatMul4Bit, which keeps its input
(make_hf_qlora_traces.py --old-bnb)."""


@pytest.mark.parametrize(
    ("new", "old"), list(zip(HF_QLORA_CASES, HF_QLORA_OLD_BNB, strict=True)), ids=_qlora_id
)
def test_hf_qlora_legacy_bitsandbytes(new: dict[str, Any], old: dict[str, Any]) -> None:
    # `--bitsandbytes-version legacy` adds what the old MatMul4Bit keeps, to the byte: each
    # 4-bit linear's bf16 cast of its fp32 input (q, k, v, gate, up, down; o's input is the
    # attention output its adapter saves anyway under autocast), none of q/k/v's on block 0
    # (its input needs no gradient); alive to the end of backward, gone before the optimizer
    # step (the Trainer drops the graph).
    assert old["bnb_saves_input"] and (old["precision"], old["recompute"]) == (
        new["precision"],
        new["recompute"],
    )
    current, legacy = estimate_hf_qlora(new), estimate_hf_qlora(old)
    added = legacy["activations_total"] - current["activations_total"]
    traced = old["activations_bytes"] - new["activations_bytes"]
    if new["recompute"] == "full":
        # The engine pairs legacy bitsandbytes with the reentrant checkpoint of its time
        # (transformers < 5: use_reentrant=True; forward under no_grad keeps nothing). The trace
        # ran transformers 5.24, whose checkpoint is non-reentrant: its saved-tensor hooks do
        # not see ctx attributes, so every block keeps 2 B x T (3 h + o + 2 h + f) in forward.
        d, T = old["dims"], old["micro_batch_size"] * old["seq_len"]
        per_block = 2 * T * (3 * d["hidden"] + d["hidden"] + 2 * d["hidden"] + d["intermediate"])
        assert added == 0 and traced == d["layers"] * per_block
        return
    assert added == traced
    for phase in ("backward", "optimizer_step"):
        key = f"peak_{phase}_bytes"
        assert legacy[key] - current[key] == old[key] - new[key], phase
    # The peak (in backward) errs as the current trace's does.
    peak_old = legacy["peak_allocated_bytes"] / old["peak_allocated_bytes"] - 1.0
    peak_new = current["peak_allocated_bytes"] / new["peak_allocated_bytes"] - 1.0
    assert abs(peak_old) <= abs(peak_new) + 1e-9
