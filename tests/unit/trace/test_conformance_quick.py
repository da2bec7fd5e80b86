"""The formulas against the trace on a few cheap cells of the conformance matrix.

bench/conformance.py runs the whole matrix (tiny models of every preset family x precision x
attention x recompute x length x micro-batch x FSDP2 world); this runs five of its cells that
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
    # activations: Phi-3 eager fp32 counted high, Mistral fp32 below its window counted low, BERT
    # eager bf16 counted high
    "phi3 fp32 eager rc=none s=64 mb=4 fsdp=1": {"acts": 0.0240},
    "mistral fp32 sdpa-flash rc=none s=64 mb=1 fsdp=1": {"acts": -0.0238},
    "bert bf16 eager rc=none s=256 mb=1 fsdp=1": {"acts": 0.0201},
    # FSDP2 over 64 ranks: gradient shards of BERT and GPT-2 counted high (11776 and 7680 bytes)
    "bert bf16 sdpa-flash rc=none s=256 mb=1 fsdp=64": {"grads": 0.0390},
    "gpt2 bf16 sdpa-flash rc=none s=256 mb=1 fsdp=64": {"grads": 0.0166},
}
"""Also not compared (the trace cannot run them): MoE (mixtral, qwen3-moe, deepseek-v2) with fp32
weights (fp32, amp-bf16: transformers' grouped_mm experts reject fp32 inputs), DeepSeek-V2 bf16
under FSDP2 (its fp32 gate parameters: FSDP2's reduce-scatter needs one gradient dtype)."""


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
