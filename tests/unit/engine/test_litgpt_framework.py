"""`--framework litgpt` against `--framework hf` on one LoRA job, term by term.

The job: Llama-3.1-8B, LoRA rank 16 on every block linear (trainmem's default all-linear = LitGPT's
lora_query, lora_key, lora_value, lora_projection, lora_mlp), --precision bf16 (LitGPT's
bf16-true), micro-batch 1 x 2048 tokens, one GPU, no recompute (LitGPT's one-device default).
Expected numbers are derived by hand from LitGPT 0.5.13's code (engine/_frameworks.py litgpt) and
match the traced toy model layer for layer (tests/golden/test_litgpt_trace.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from trainmem.catalog import load_model
from trainmem.engine import estimate_one
from trainmem.engine._lora import lora_mask, lora_num_parameters
from trainmem.engine._loss import head_chunked_loss_bytes

T, H, F, Q, KV, V, A, R = 2048, 4096, 14336, 4096, 1024, 128256, 32, 16
"""Tokens, hidden, MLP width, q width, k/v width, vocabulary, heads, LoRA rank."""
SMALL_TENSOR_BYTES = 512
"""One allocator block (the flash kernel's philox seed and offset, a loss scalar)."""


@pytest.fixture(scope="module")
def job() -> dict[str, dict[str, float]]:
    m = load_model("llama-3.1-8b")
    fields = {"lora_rank": R, "precision": "bf16", "micro_batch_size": 1, "seq_len": T}
    return {
        fw: {k: float(v) for k, v in estimate_one(m, {**fields, "framework": fw}).items()}
        for fw in ("hf", "litgpt")
    }


def test_adapter_states_in_bf16(job) -> None:
    n = lora_num_parameters(load_model("llama-3.1-8b"), R, lora_mask("all-linear"))
    assert n == 32 * R * (2 * (H + Q) + 2 * (H + KV) + 3 * (H + F)) == 41_943_040
    hf, lit = job["hf"], job["litgpt"]
    # peft: fp32 adapters, gradients, 2 AdamW states; LitGPT: all in the model's bf16.
    assert hf["parameters"] - lit["parameters"] == (4 - 2) * n
    assert (hf["gradients_total"], lit["gradients_total"]) == (4 * n, 2 * n)
    assert (hf["optimizer_states"], lit["optimizer_states"]) == (8 * n, 4 * n)


def test_block_saves_no_fp32_input_copies(job) -> None:
    # LitGPT block, op by op (lora.py, model.py): RMSNorm keeps x.float() and rsqrt (frozen
    # scale: not the normalised tensor); each adapted module a bf16 dropout copy of its input,
    # a bool mask and lora_A's [T, r] output (qkv: one module, one lora_A over q, k, v); q and
    # k, v repeated to the query heads, SDPA's output and logsumexp; the MLP's fc_1, fc_2 and
    # silu outputs. No fp32 copy of any adapter input (peft makes one per adapted linear).
    norm = 4 * T * H + 4 * T
    qkv = 2 * T * H + T * H + 2 * T * 3 * R
    attention = 4 * (2 * T * Q) + 4 * A * T + 2 * SMALL_TENSOR_BYTES
    o_proj = 2 * T * Q + T * Q + 2 * T * R
    gate_up = 2 * (2 * T * H + T * H + 2 * T * R)
    mlp = 3 * 2 * T * F
    down = 2 * T * F + T * F + 2 * T * R
    layer = 2 * norm + qkv + attention + o_proj + gate_up + mlp + down
    assert job["litgpt"]["activations_per_layer"] == layer == 499_860_480
    assert job["hf"]["activations_per_layer"] == 605_176_832  # peft's fp32 copies among them


def test_loss_of_128_token_chunks(job) -> None:
    m = load_model("llama-3.1-8b")
    saved, held, forward, backward, block = head_chunked_loss_bytes(
        m, T=np.array([T]), b=np.array([1.0]), e=2.0, amp=np.array([False]), chunk_tokens=128,
        loss_tp_div=1.0,
    )  # fmt: skip
    chunk = 128 * V  # one chunk's [b x 128, v] elements
    # Saved: every chunk's bf16 log-softmax; held by fit: the bf16 logits; transients: one
    # chunk's nll and log-softmax gradients in backward, none in forward; no fp32 [T, v].
    assert (saved[0], held[0]) == (2 * T * V, 2 * T * V)
    assert (forward[0], backward[0], block[0]) == (0, 2 * 2 * chunk, 2 * chunk)
    # Outside the blocks: the final norm (x.float(), rsqrt), the log-probs (fp32: Fabric's
    # convert_output casts the chunks, FrameworkSpec.logits_cast_fp32), labels and loss
    # scalars; the fp32 rope buffers and the held logits are counted in every phase instead.
    outside = 4 * T * H + 4 * T + 4 * T * V + 8 * T + 3 * SMALL_TENSOR_BYTES
    assert job["litgpt"]["activations_outside_layers"] == outside
    # hf: the same fp32 log-softmax [T, v] among the saved tensors (logits + fp32 copy as
    # transients); litgpt's fp32 logits are held apart, in every phase.
    assert job["hf"]["activations_outside_layers"] > outside


def test_litgpt_below_hf_on_this_job(job) -> None:
    # Figures quoted in the brief's report (GiB of the device metric): hf 39.76, litgpt 33.89
    # then; 35.46 since the chunk logits are cast to fp32 (Fabric's convert_output).
    hf, lit = job["hf"]["peak_device_bytes"], job["litgpt"]["peak_device_bytes"]
    assert round(hf / 2**30, 2) == 39.76
    assert round(lit / 2**30, 2) == 35.46


def test_report_names_what_litgpt_keeps() -> None:
    import trainmem

    job = {"model": "llama-3.1-8b", "lora_rank": R, "precision": "bf16", "micro_batch_size": 1,
           "seq_len": T}  # fmt: skip
    lit = {c["what"]: c["bytes"] for c in trainmem.estimate(**job, framework="litgpt")[
        "top_consumers"]}  # fmt: skip
    # bf16 AdamW states of the bf16 adapters (4 bytes per adapter parameter), and no "fp32 loss
    # gradients" item: LitGPT's chunked loss has none.
    assert lit["optimizer states (adamw, 2 16-bit states per parameter)"] == 4 * 41_943_040
    assert not any("fp32 loss gradients" in what for what in lit)
    hf = [c["what"] for c in trainmem.estimate(**job, framework="hf")["top_consumers"]]
    assert "optimizer states (adamw, 2 fp32 states per parameter)" in hf
