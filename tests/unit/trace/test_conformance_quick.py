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
    # issue 14's families: OLMo 2 (post-norms, full-width q/k norms), Granite (attention
    # dropout; fp32 + GQA runs SDPA's math fallback: was -8.0% before it was counted), StableLM
    # (LayerNorm, partial rotary), Phi-2 (one norm for parallel attention + MLP, dropout), Pythia
    ("olmo2", "amp-bf16", "flash", "none", 128, 2, 1),
    ("granite", "fp32", "flash", "none", 256, 1, 1),
    ("stablelm", "amp-bf16", "flash", "none", 128, 2, 1),
    ("phi2", "bf16", "eager", "none", 128, 2, 1),
    ("pythia", "amp-bf16", "flash", "none", 128, 2, 1),
    # Gemma 2 (sandwich post-norms, score and final-logit soft-capping, past its alternating
    # 128-token window; eager: transformers has no SDPA path for it) and Gemma's one k/v head,
    # which eager attention repeats as a view (was counted as a copy: +4% of a layer)
    ("gemma2", "bf16", "eager", "none", 256, 1, 1),
    ("gemma2", "amp-bf16", "eager", "full", 128, 2, 1),
    ("gemma", "bf16", "eager", "none", 128, 2, 1),
]
KNOWN_GAPS: dict[str, dict[str, float]] = {
    # One cell per kind of disagreement that bench/conformance.py's full matrix finds (its cell
    # names; metric -> estimate / trace - 1, measured 2026-12-01, engine as of that day). Not
    # asserted on: a fix in the formulas moves these toward 0.
    # FSDP2 with fewer experts than ranks: the all-gathered expert weights, padded on dim 0,
    # are now counted padded (they were -44.5%): a little high at 64 ranks
    "mixtral mixed-bf16 eager rc=full s=256 mb=1 fsdp=64": {"peak": 0.0794},
    "mixtral bf16 sdpa-flash rc=full s=256 mb=1 fsdp=64": {"peak": 0.0976},
    "deepseek-v2 mixed-bf16 eager rc=full s=256 mb=1 fsdp=64": {"peak": -0.0271},
    # recompute full, few tokens: about 3.2 MiB more in the traced backward
    "bert bf16 eager rc=full s=128 mb=1 fsdp=1": {"peak": -0.0301, "acts": -0.0082},
    "gpt2 bf16 eager rc=full s=128 mb=1 fsdp=1": {"peak": -0.0200},
    # activations: Phi-3 eager fp32 counted high, BERT eager bf16 counted high (Mistral fp32
    # below its window, -2.38%, was SDPA's math fallback for fp32 GQA: now counted, exact)
    "phi3 fp32 eager rc=none s=64 mb=4 fsdp=1": {"acts": 0.0240},
    "bert bf16 eager rc=none s=256 mb=1 fsdp=1": {"acts": 0.0201},
    # GPT-NeoX and Falcon (measured 2026-12-01): their readers' attention is approximate (fused
    # query_key_value kept whole, Falcon's own multi-query / grouped k/v handling); the new
    # families (olmo2, granite, stablelm, phi2) have no cell over a threshold
    "pythia fp32 eager rc=none s=256 mb=2 fsdp=1": {"acts": 0.0254},
    "falcon bf16 sdpa-flash rc=none s=256 mb=4 fsdp=1": {"acts": -0.0401, "peak": -0.0126},
    "falcon bf16 eager rc=none s=256 mb=4 fsdp=1": {"acts": 0.0339, "peak": 0.0105},
    "falcon-40b bf16 eager rc=none s=256 mb=4 fsdp=1": {"acts": 0.0656, "peak": 0.0205},
    "falcon-40b fp32 sdpa-flash rc=none s=256 mb=4 fsdp=1": {"acts": 0.0553, "peak": 0.0159},
    # FSDP2 over 64 ranks: gradient shards of BERT and GPT-2 counted high (11776 and 7680 bytes)
    "bert bf16 sdpa-flash rc=none s=256 mb=1 fsdp=64": {"grads": 0.0390},
    "gpt2 bf16 sdpa-flash rc=none s=256 mb=1 fsdp=64": {"grads": 0.0166},
}
"""Also not compared (the trace cannot run them): MoE (mixtral, qwen3-moe, deepseek-v2) with fp32
weights (fp32, amp-bf16: transformers' grouped_mm experts reject fp32 inputs), DeepSeek-V2 bf16
under FSDP2 (its fp32 gate parameters: FSDP2's reduce-scatter needs one gradient dtype), Falcon
(falcon, falcon-40b) with recompute full (the checkpointed Falcon block allocates on the real
CUDA backend under the fake device: NotImplementedError aten::empty_strided)."""


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: "-".join(map(str, c)))
def test_formulas_agree_with_the_trace(cell: tuple[Any, ...], tmp_path: Path) -> None:
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
