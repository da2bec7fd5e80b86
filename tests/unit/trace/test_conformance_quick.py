"""The formulas against the trace on a few cheap cells of the conformance matrix.

bench/conformance.py runs the whole matrix (tiny models of every preset family x precision x
attention x recompute x length x micro-batch x FSDP2 world); this runs a few of its cells that
agree today and asserts its thresholds: 1% on parameters, gradients and optimizer states, 2% on
activations and peak allocated. Cells where the formulas and the trace disagree today are listed
in KNOWN_GAPS with the error measured, and not asserted on.

Needs torch and transformers (skipped without them, as the other trace tests).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="trainmem[trace] not installed: pip install 'trainmem[trace]'")
pytest.importorskip("transformers", reason="trainmem[trace] not installed")

from tests.conformance_families import family_config  # noqa: E402  (bench/conformance.py's)
from trainmem.report import estimate_report  # noqa: E402
from trainmem.trace._core import trace_step  # noqa: E402
from trainmem.trace._fake_cuda import fake_cuda_unavailable_reason  # noqa: E402
from trainmem.trace._report import _estimate_figures  # noqa: E402

PERSISTENT = ("parameters_bytes", "gradients_bytes", "optimizer_states_bytes")
TRANSIENT = ("activations_bytes", "peak_allocated_bytes")
# (family, precision, attention, recompute, seq_len, micro_batch_size, FSDP2 world)
CELLS = [
    ("llama", "amp-bf16", "flash", "none", 128, 2, 1),
    ("gpt2", "amp-bf16", "flash", "none", 128, 2, 1),
    ("mistral", "amp-bf16", "flash", "none", 256, 2, 1),  # past the 128-token window
    ("qwen3", "bf16", "eager", "full", 128, 1, 1),
    ("llama", "mixed-bf16", "flash", "none", 128, 2, 8),
    # fixed after the first full matrix: a tied embedding's gradient accumulated at its backward
    # (was -15.7%), FSDP2 gathering fp32 parameters in fp32 (was -11.8%)
    ("llama", "fp32", "flash", "none", 128, 1, 1),
    ("llama", "fp32", "flash", "none", 256, 1, 8),
    # FSDP2 over 64 ranks with fewer experts than ranks (padded expert weights gathered): the
    # root's gradients and the largest block's buffers at the backward peak
    ("mixtral", "bf16", "eager", "none", 256, 1, 64),
    ("deepseek-v2", "mixed-bf16", "eager", "full", 256, 1, 64),
    # issue 14's families: OLMo 2 (post-norms, full-width q/k norms), Granite (attention
    # dropout; fp32 + GQA runs SDPA's math fallback: was -8.0% before it was counted), StableLM
    # (LayerNorm, partial rotary), Phi-2 (one norm for parallel attention + MLP, dropout), Pythia
    ("olmo2", "amp-bf16", "flash", "none", 128, 2, 1),
    ("granite", "fp32", "flash", "none", 256, 1, 1),
    ("stablelm", "amp-bf16", "flash", "none", 128, 2, 1),
    ("phi2", "bf16", "eager", "none", 128, 2, 1),
    ("pythia", "amp-bf16", "flash", "none", 128, 2, 1),
    # Falcon: its SDPA path always passes a mask (Falcon-7B's one k/v head: the math fallback,
    # was -4.0%; Falcon-40B's broadcast k/v: the efficient kernel, was +5.5% in fp32), a
    # one-head k/v copied per head by the matmuls for b > 1, ln_attn and ln_mlp sharing one
    # saved input (all now within 0.05%)
    ("falcon", "bf16", "flash", "none", 256, 2, 1),
    ("falcon", "amp-bf16", "eager", "none", 128, 2, 1),
    ("falcon-40b", "fp32", "flash", "none", 256, 1, 1),
    # fused q/k/v + rotary under eager: the fused output kept for one sequence, v copied for
    # more (GPT-NeoX and Phi-3; they were +14% of a layer at micro-batch 2)
    ("pythia", "fp32", "eager", "none", 256, 2, 1),
    ("phi3", "bf16", "eager", "none", 64, 1, 1),
    ("phi3", "fp32", "eager", "none", 64, 4, 1),
    # GPT-2 and BERT eager: softmax in the scores' dtype without autocast
    ("gpt2", "bf16", "eager", "none", 256, 1, 1),
    ("bert", "bf16", "eager", "none", 256, 2, 1),
    # Gemma 2 (sandwich post-norms, score and final-logit soft-capping, past its alternating
    # 128-token window; eager: transformers has no SDPA path for it) and Gemma's one k/v head,
    # which eager attention repeats as a view (was counted as a copy: +4% of a layer)
    ("gemma2", "bf16", "eager", "none", 256, 1, 1),
    ("gemma2", "amp-bf16", "eager", "full", 128, 2, 1),
    ("gemma", "bf16", "eager", "none", 128, 2, 1),
    # Gemma 3 (q/k norms, two rope tables; at its 128-token window SDPA masks the two sliding
    # layers, not the global one: was -1.3%; checkpointed eager blocks keep both masks)
    ("gemma3", "bf16", "flash", "none", 128, 1, 1),
    ("gemma3", "amp-bf16", "eager", "full", 256, 2, 1),
]
# peft LoRA (trace/_lora.py; skipped without peft): (cell, rank, targets). Fixed after the first
# LoRA matrix: a frozen base under autocast saves each matmul's 16-bit weight copy (the head's:
# was -33% of the activations), frozen RMSNorms and an unadapted o_proj save less (was +3.9%).
LORA_CELLS = [
    (("llama", "amp-bf16", "flash", "none", 256, 1, 1), 8, "all-linear"),
    (("qwen2.5", "bf16", "flash", "full", 256, 2, 1), 16, "q_proj,v_proj"),
    (("mistral", "fp32", "flash", "none", 256, 1, 1), 8, "q_proj,v_proj"),
    (("gemma2", "amp-bf16", "eager", "none", 256, 1, 1), 8, "all-linear"),
    (("gemma3", "bf16", "flash", "none", 256, 1, 1), 8, "all-linear"),  # frozen q/k norms
    (("llama", "fp32", "flash", "full", 256, 2, 8), 8, "all-linear"),
    # issue 26 item 9: under autocast with full recompute a frozen base's 16-bit casts live only
    # inside the checkpointed block (cached_cast caches trainable leaves only); they were
    # counted as autocast's cache of every layer (a 70B job on 8 GPUs: 134.5 GiB transient)
    (("llama", "amp-bf16", "flash", "full", 256, 2, 1), 8, "all-linear"),
    (("gemma2", "amp-bf16", "eager", "full", 128, 2, 1), 8, "q_proj,v_proj"),
]
KNOWN_GAPS: dict[str, dict[str, float]] = {
    # One cell per kind of disagreement that bench/conformance.py's full matrix finds (its cell
    # names; metric -> estimate / trace - 1, measured 2026-12-01, engine as of that day). Not
    # asserted on: a fix in the formulas moves these toward 0.
    # FSDP2 with fewer experts than ranks: the all-gathered expert weights, padded on dim 0,
    # are counted padded (they were -44.5%); the blocks' backward holds the root's parameters
    # and the head's gradient, not the untied embedding's (was +5.7% to +10.5%), and the
    # largest block's buffers (DeepSeek's MoE blocks, not its first dense one: was -2.7%).
    # Left: with full recompute and one sequence, about 5.5 MB (of 209 MB) high
    "mixtral bf16 eager rc=full s=256 mb=1 fsdp=64": {"peak": 0.0266},
    # recompute full, few tokens: about 3.2 MiB more in the traced backward
    "bert bf16 eager rc=full s=128 mb=1 fsdp=1": {"peak": -0.0301, "acts": -0.0082},
    "gpt2 bf16 eager rc=full s=128 mb=1 fsdp=1": {"peak": -0.0200},
    # (activations: Phi-3 eager fp32, +2.4%, and GPT-NeoX eager fp32, +2.5%, were a fused q/k/v
    # output counted where eager's matmuls copy v for b > 1: now within 0.7%; BERT eager bf16,
    # +2.0%, and GPT-2's, +1.7%, an fp32 softmax where theirs runs in bf16: now within 0.9%)
    # FSDP2 over 64 ranks: gradient shards of BERT and GPT-2 counted high (11776 and 7680 bytes)
    "bert bf16 sdpa-flash rc=none s=256 mb=1 fsdp=64": {"grads": 0.0390},
    "gpt2 bf16 sdpa-flash rc=none s=256 mb=1 fsdp=64": {"grads": 0.0166},
    # FSDP2 over 512 ranks (measured 2026-12-02; peaks all within 1.71%): per-tensor rounding of
    # tiny shards, gradients counted high by a few kB (108 of 180 cells over 1%), GPT-2's
    # parameter and state shards low
    "bert bf16 sdpa-flash rc=none s=256 mb=1 fsdp=512": {"grads": 0.2674},
    "gpt2 fp32 sdpa-flash rc=none s=256 mb=1 fsdp=512": {"params": -0.0154, "optim": -0.0154},
    # (peft LoRA under FSDP2 mixed-bf16, +2.2% to +9.2% on activations when the adapters were
    # counted in fp32: FSDP2's param_dtype casts them to bf16; now counted so, within 0.8%)
}
"""Also not compared (the trace cannot run them): MoE (mixtral, qwen3-moe, deepseek-v2) with fp32
weights (fp32, amp-bf16: transformers' grouped_mm experts reject fp32 inputs), DeepSeek-V2 bf16
under FSDP2 (its fp32 gate parameters: FSDP2's reduce-scatter needs one gradient dtype), Falcon
(falcon, falcon-40b) with recompute full (the checkpointed Falcon block allocates on the real
CUDA backend under the fake device: NotImplementedError aten::empty_strided)."""


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: "-".join(map(str, c)))
def test_formulas_agree_with_the_trace(cell: tuple[Any, ...], tmp_path: Path) -> None:
    _check_cell(cell, tmp_path, lora={})


@pytest.mark.parametrize(
    ("cell", "rank", "targets"),
    LORA_CELLS,
    ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else str(v),
)
def test_lora_formulas_agree_with_the_trace(
    cell: tuple[Any, ...], rank: int, targets: str, tmp_path: Path
) -> None:
    pytest.importorskip("peft", reason="peft not installed: the LoRA trace needs it")
    _check_cell(cell, tmp_path, lora={"lora_rank": rank, "lora_targets": targets})


def _check_cell(cell: tuple[Any, ...], tmp_path: Path, *, lora: dict[str, Any]) -> None:
    family, precision, attention, recompute, seq_len, mb, world = cell
    reason = fake_cuda_unavailable_reason()
    if reason:
        pytest.skip(f"no fake CUDA device here: {reason}")
    config = family_config(family)
    flags = {
        "micro_batch_size": mb,
        "seq_len": seq_len,
        "precision": precision,
        "recompute": recompute,
        "attention": attention,
        "optimizer": "adamw",
        **lora,
    }
    if world > 1:
        from trainmem.trace._dist import trace_parallel

        got = trace_parallel(config, num_gpus=world, zero=3, tp=1, sequence_parallel=False, **flags)
    else:
        got = trace_step(config, **flags)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    want = _estimate_figures(
        estimate_report(
            model=str(path),
            **flags,
            framework="hf",
            num_gpus=world,
            zero=3 if world > 1 else 0,
        )
    )
    for key in PERSISTENT:
        assert want[key] == pytest.approx(got[key], rel=0.01), key
    for key in TRANSIENT:
        assert want[key] == pytest.approx(got[key], rel=0.02), key
