"""Megatron-core's vocab-parallel cross entropy and fused masked softmax, to the byte.

Source: megatron-core 0.16.1 megatron/core/tensor_parallel/cross_entropy.py
(_VocabParallelCrossEntropy: one `.float()` copy of the [T, v/tp] logits, normalised in place
into the saved softmax; backward writes the gradient into it) and fusions/fused_softmax.py
(FusedScaleMaskSoftmax.is_kernel_available).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from trainmem.catalog import load_model
from trainmem.engine import model_from_hf_config
from trainmem.engine._activations import hf_outside_bytes, megatron_fused_softmax_runs
from trainmem.engine._loss import loss_forward_extra_bytes, loss_gradient_bytes

TRACE = Path(__file__).parents[2] / "data" / "framework_traces" / "megatron_gpt_local.json"

# gpt2 (v 50257, h 768) under Megatron, micro-batch 8 x 1024 tokens, tp 2: the rank's logits
# are [T, v/tp] = [8192, 25128.5] (the engine does not pad the vocabulary).
T, V, TP = 8192.0, 50257.0, 2.0
TV = T * V / TP  # 205,852,672 elements


def _loss_terms(softmax_in_place: bool) -> tuple[float, float]:
    m = load_model("gpt2")
    one = np.array([1.0])
    common = {
        "T": one * T,
        "e": one * 2.0,
        "pp": one,
        "last": np.array([True]),
        "chunked": np.array([False]),
        "chunked_output": np.array([False]),
        "loss_tp_div": one * TP,
        "zero_col": one * 0.0,
        "softmax_in_place": np.array([softmax_in_place]),
    }
    fwd = loss_forward_extra_bytes(
        m,
        **common,
        r=one * 2.0,
        amp=np.array([False]),
        logits_held=one * 0.0,
        chunk_transient=one * 0.0,
    )
    bwd = loss_gradient_bytes(m, **common, sp_div=one)
    return float(fwd[0]), float(bwd[0])


def test_megatron_loss_tensors_to_the_byte() -> None:
    # Forward peak, beyond the saved fp32 softmax (4 T v/tp, in the stored activations): the
    # bf16 logits GPTModel._postprocess still holds, 2 T v/tp. Backward start: the softmax is
    # the fp32 gradient (no new tensor), plus its bf16 cast for the output layer, 2 T v/tp.
    fwd, bwd = _loss_terms(softmax_in_place=True)
    assert TV == 205_852_672
    assert fwd == 2 * TV == 411_705_344
    assert bwd == 2 * TV == 411_705_344
    # A plain cross entropy (transformers ForCausalLMLoss): bf16 logits + their fp32 copy in
    # forward, two fp32 gradients in backward.
    fwd_plain, bwd_plain = _loss_terms(softmax_in_place=False)
    assert fwd_plain == 6 * TV
    assert bwd_plain == 8 * TV


def test_megatron_saves_one_fp32_logits_tensor() -> None:
    # The trace: outside the layers megatron-core saved exactly one [T, v] tensor, the fp32
    # `.float()` copy (`_to_copy`), which is the softmax (no log-softmax of its own); the
    # engine's outside term (that 4 T v once, the final norm, labels, the embedding dropout)
    # is the traced total within 0.1% (the tracker rounds each small tensor to 512 bytes).
    data = TRACE.parent
    m = model_from_hf_config(
        json.loads((data / "megatron_gpt_local_config.json").read_text()), name="traced"
    )
    case = json.loads(TRACE.read_text())["cases"][0]
    t, v = case["tokens"], case["dims"]["vocab"]
    saved = case["saved_at_end_of_forward"]["outside"]
    big = [x for x in saved if x.split(" ")[-3] == f"{v}]"]
    assert big == [f"_to_copy [{t}, 1, {v}] float32 {4 * t * v}"]
    one = np.array([1.0])
    outside = hf_outside_bytes(
        m,
        T=one * t,
        s=one * t,
        e=2.0,
        r=2.0,
        amp=np.array([False]),
        tp=one,
        sp=np.array([False]),
        loss_tp_div=one,
    )
    traced = case["activations_outside_layers_bytes"]
    assert abs(float(outside[0]) / traced - 1.0) < 1e-3


def test_fused_softmax_kernel_limits() -> None:
    # FusedScaleMaskSoftmax.is_kernel_available: 16 < sk <= 4096, sq, sk and b x np divisible
    # by 4; causal: b x np divisible by apex's get_batch_per_block (8 rows when next_pow2(sk)
    # <= 128, else 4); 16-bit scores only.
    s = np.array([2048, 4096, 8192, 2048, 128, 128, 16, 2048, 1000, 1026])
    b = np.array([1, 1, 1, 1, 1, 2, 1, 1, 1, 1])
    heads = np.array([8, 8, 8, 6, 4, 4, 8, 8, 8, 8])
    sixteen = np.array([True] * 7 + [False, True, True])
    got = megatron_fused_softmax_runs(s=s, b=b, heads_per_rank=heads, sixteen_bit=sixteen)
    expected = [True, True, False, False, False, True, False, False, True, False]
    assert got.tolist() == expected


def test_vocab_parallel_loss_runs_megatrons_cross_entropy_under_any_stack() -> None:
    # `--loss vocab-parallel` (Megatron-LM under DeepSpeed: its GPT2Model calls
    # mpu.vocab_parallel_cross_entropy(output.float(), labels)): the in-place softmax of
    # `--framework megatron`, split over tp, under the deepspeed and hf stacks; `full` keeps
    # their own cross entropy (two fp32 [T, v] gradients, the logits gathered over tp).
    from trainmem.engine import estimate, make_grid

    m = load_model("gpt2")
    rows = {
        "framework": ["deepspeed", "deepspeed", "hf", "megatron"],
        "loss": ["vocab-parallel", "full", "vocab-parallel", "auto"],
        "tp": 2,
        "num_gpus": 2,
        "micro_batch_size": 8,
        "seq_len": 1024,
        "precision": "mixed-bf16",
    }
    transient = estimate(m, make_grid(rows), columns=["transient"])["transient"]
    # At the start of backward (the transient peak): megatron's bf16 gradient cast of [T, v/tp]
    # under every stack that runs its loss ...
    assert transient[0] == transient[2] == transient[3]
    # ... against the stack's own two fp32 [T, v] gradients: 8 T v - 2 T v/2 = 7 T v more.
    assert transient[1] - transient[0] == 7 * T * V == 2_881_937_408


def test_vocab_parallel_keeps_the_older_loss_codes() -> None:
    from trainmem.engine import LOSSES

    assert LOSSES.index("auto") == 4  # stored in points tables: appended names only
    assert LOSSES[-1] == "vocab-parallel"


def test_top_consumers_name_the_in_place_loss_gradient() -> None:
    # The advice's consumers name Megatron's loss gradient with the engine's own bytes (written
    # into the fp32 softmax saved since forward, then cast to bf16 for the output layer: 2 bytes
    # per [T, v/tp] element, here 8,192 x 50,257), not the eager loss's two fp32 tensors; and
    # only at a peak that can be the loss's moment (the transients at least that large).
    import trainmem

    common = dict(model="gpt2", framework="megatron", precision="mixed-bf16", advice=False)
    r = trainmem.estimate(**common, micro_batch_size=8, seq_len=1024, recompute="full")
    named = [c for c in r["top_consumers"] if "loss gradient" in c["what"]]
    assert r["peak_phase"] == "backward"
    assert len(named) == 1 and "in-place cross entropy" in named[0]["what"], named
    assert named[0]["bytes"] == 2 * 8192 * 50257 <= r["breakdown_at_peak"]["transient"]
    # A backward peak whose transients are smaller than the loss gradient is a later moment
    # (a block's backward): nothing of it is named the loss's.
    from trainmem.engine._advice import PHASES, _transient_items

    values = {"peak_phase": float(PHASES.index("backward")), "pp_stage": 0.0}
    config = {**r["config"]}
    at_small = {**values, "transient": 2 * 8192 * 50257 - 1.0}
    items = _transient_items(load_model("gpt2"), config, at_small.__getitem__)
    assert [what for what, _ in items] == ["other transient buffers at the backward peak"]
