"""`--bitsandbytes-version legacy`: bitsandbytes <= 0.43.1's MatMul4Bit keeps each frozen 4-bit
linear's input for backward (`ctx.tensors = (A, B)`), to the byte on real dimensions.

Source: bitsandbytes 0.42.0 / 0.43.1 autograd/_functions.py MatMul4Bit.forward (0.43.2 and
later keep `(None, B)`); engine/_lora.py bnb_kept_input_bytes.
"""

from __future__ import annotations

import pytest

from trainmem.catalog import load_model
from trainmem.engine import TrainingConfig, estimate_one

JOB = {"micro_batch_size": 2, "seq_len": 1024, "lora_rank": 16, "qlora": True}


def _one(name: str, **fields) -> dict:
    m = load_model(name)
    return estimate_one(m, {**TrainingConfig(**{**JOB, **fields}).grid_columns()})


def test_litgpt_keeps_one_input_per_distinct_tensor() -> None:
    # LitGPT (bf16-true, not kbit-prepared, one fused qkv): the qkv and MLP norm outputs, the
    # attention output's copy and the MLP product, 2 B each, on every block; the head is NF4
    # there, so the final norm's output too.
    m = load_model("llama-2-7b")
    T, h, f = 2 * 1024, m.hidden_size, m.intermediate_size
    new = _one("llama-2-7b", framework="litgpt", precision="bf16")
    old = _one("llama-2-7b", framework="litgpt", precision="bf16", bitsandbytes_version="legacy")
    per_layer = old["activations_per_layer"] - new["activations_per_layer"]
    assert per_layer == 2 * T * (3 * h + f) == 95_420_416
    outside = old["activations_outside_layers"] - new["activations_outside_layers"]
    assert outside == 2 * T * h
    # The graph (and so every kept input) is alive through the optimizer step: the loop holds
    # the logits.
    kept = per_layer * m.num_hidden_layers + outside
    assert old["peak_optimizer_step_bytes"] - new["peak_optimizer_step_bytes"] == kept


def test_peft_prepared_inputs_are_a_cast_copy_per_linear() -> None:
    # HF + peft's prepare_model_for_kbit_training: the residual stream is fp32, so each of q, k,
    # v and gate, up, down casts its own bf16 copy (Linear4bit: x.to(compute_dtype)); o_proj's
    # input is the attention output its adapter saves anyway (under autocast); block 0's q/k/v
    # input needs no gradient without checkpointing.
    m = load_model("llama-2-7b")
    T, h, f, L = 2 * 1024, m.hidden_size, m.intermediate_size, m.num_hidden_layers
    new = _one("llama-2-7b", framework="hf", precision="amp-bf16")
    old = _one("llama-2-7b", framework="hf", precision="amp-bf16", bitsandbytes_version="legacy")
    added = old["activations_total"] - new["activations_total"]
    assert added == 2 * T * (L * (3 * h + 2 * h + f) - 3 * h)
    # Under checkpointing nothing is kept in forward: the stacks of that bitsandbytes
    # checkpointed reentrantly (forward under no_grad); the recomputed block keeps its own.
    ckpt = {"framework": "hf", "precision": "amp-bf16", "recompute": "full"}
    new_c = _one("llama-2-7b", **ckpt)
    old_c = _one("llama-2-7b", **ckpt, bitsandbytes_version="legacy")
    assert old_c["activations_total"] == new_c["activations_total"]
    assert old_c["peak_backward_bytes"] - new_c["peak_backward_bytes"] == 2 * T * (5 * h + f)
    # The HF head is not quantised: nothing kept outside the blocks; the Trainer drops the graph
    # after backward, so the optimizer step is unchanged.
    assert old["activations_outside_layers"] == new["activations_outside_layers"]
    assert old["peak_optimizer_step_bytes"] == new["peak_optimizer_step_bytes"]


@pytest.mark.parametrize("fields", [{"qlora": False}, {"framework": "torchtune"}])
def test_no_change_without_bitsandbytes(fields: dict) -> None:
    # LoRA without QLoRA, and torchtune's torchao NF4 base: nothing is bitsandbytes.
    a = _one("llama-3.2-1b", **fields)
    b = _one("llama-3.2-1b", **fields, bitsandbytes_version="legacy")
    assert a == b


def test_bad_version_is_refused() -> None:
    with pytest.raises(ValueError, match="bitsandbytes_version"):
        TrainingConfig(bitsandbytes_version="0.41")
