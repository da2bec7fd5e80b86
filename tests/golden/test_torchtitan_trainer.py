"""`--framework torchtitan` with the flags a user writes against torchtitan 0.3.0's own Trainer
configuration: tests/data/framework_traces/torchtitan_trainer_defaults.json
(make_torchtitan_trainer_traces.py: the llama3 config registry's Trainer.Config,
update_from_config, parallelize_llama's FSDP path, the registry's ChunkedLossWrapper with 8
chunks; one rank of a fake process group on the fake CUDA device).

`--loss auto` (the default) resolves to the wrapper (`chunked-head`) for torchtitan, so these
rows give no --loss; the registry's one-piece variant (llama3_debugmodel_ce_loss) is `--loss
full`, the 2024-12 benchmark era's loss.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.framework_accuracy import estimate_one, small_llama_spec

DATA = Path(__file__).parents[1] / "data" / "framework_traces" / "torchtitan_trainer_defaults.json"
CASES = {c["case"]: c for c in json.loads(DATA.read_text())["cases"]}
PEAK_TOLERANCE = 0.01
"""The 8B cases' peaks agree within 0.02% (the loss phase's last-chunk reduce-scatter and the
backward's re-gathered [norm, lm_head] unit as wrapper_loss_bytes counts them); 1% leaves room for
the RoPE caches' and FSDP's small tensors, under 0.5% of these peaks."""
BACKWARD_TOLERANCE = 0.07
"""The backward phase (not the step's peak, which is the loss phase): +4.5% at 1 x 8192, +6.6% at
2 x 8192 since the top-block moment counts FSDP2's backward buffers and the block's unsharded
gradients (fsdp2_block_gradient_bytes, traced at real size under full recompute) under
selective-op recompute too; this trace holds less there (the engine was within 0.02% before).
A known gap, not tuned: the state terms that carry those buffers do not see the recompute
policy."""
DEBUG_BACKWARD_OVER = 0.10
"""The debug model (dim 256, 16 heads of 16, b 8 x 2048) peaks in backward, at the top block's
per-op SAC recompute; the engine's recompute moment is 9.7% above the trace there, as it is
with the one-piece loss (the debug-ce case peaks at the start of backward, which hides it).
Not the wrapper's: its loss phase agrees within 0.2%."""


def estimate_case(case: dict[str, Any], **flags: Any) -> dict[str, float]:
    """The engine for a traced case, with a user's flags (`flags`: e.g. loss="full")."""
    from trainmem.catalog import load_model

    spec = (
        load_model("llama-3.1-8b")
        if case["dims"]["layers"] == 32
        else small_llama_spec(case["dims"])
    )
    return estimate_one(
        spec,
        num_gpus=case["fsdp_world_size"],
        zero=3,
        micro_batch_size=case["local_batch_size"],
        seq_len=case["seq_len"],
        framework="torchtitan",
        precision="mixed-bf16",
        recompute="selective",
        optimizer="adamw-fused",
        **flags,
    )


@pytest.mark.parametrize("name", ["8b-fsdp8", "8b-fsdp8-b2"])
def test_llama3_8b_fsdp8_with_the_registry_defaults(name: str) -> None:
    case = CASES[name]
    got = estimate_case(case)  # no --loss: auto, the wrapper
    assert got["parameters"] == case["parameters_bytes"]
    assert got["optimizer_states"] == case["optimizer_states_bytes"]
    assert case["peak_phase"] == "forward"  # the wrapper's loss phase
    for phase, tolerance in (("forward", PEAK_TOLERANCE), ("backward", BACKWARD_TOLERANCE)):
        err = got[f"peak_{phase}_bytes"] / case[f"peak_{phase}_bytes"] - 1.0
        assert abs(err) <= tolerance, (phase, err)
    peak = got["peak_allocated_bytes"] / case["peak_allocated_bytes"] - 1.0
    # 2 x 8192: the engine's backward (BACKWARD_TOLERANCE) passes the traced loss-phase peak by
    # 1.1%; the bar for these traces is 3%.
    assert abs(peak) <= 0.015, peak


def test_auto_is_the_wrapper_and_full_is_the_old_one_piece_loss() -> None:
    case = CASES["8b-fsdp8"]
    auto, wrapper = estimate_case(case), estimate_case(case, loss="chunked-head")
    assert auto == wrapper
    full = estimate_case(case, loss="full")  # what --framework torchtitan said before: +21%
    assert full["peak_allocated_bytes"] > 1.2 * case["peak_allocated_bytes"]


def test_debug_model_single_device() -> None:
    case = CASES["debug"]
    got = estimate_case(case)
    assert got["parameters"] == case["parameters_bytes"]
    loss_phase = got["peak_forward_bytes"] / case["peak_forward_bytes"] - 1.0
    assert abs(loss_phase) <= PEAK_TOLERANCE, loss_phase
    over = got["peak_backward_bytes"] / case["peak_backward_bytes"] - 1.0
    assert 0.0 <= over <= DEBUG_BACKWARD_OVER, over


def test_debug_model_with_the_registrys_one_piece_loss() -> None:
    case = CASES["debug-ce"]
    got = estimate_case(case, loss="full")
    peak = got["peak_allocated_bytes"] / case["peak_allocated_bytes"] - 1.0
    assert abs(peak) <= PEAK_TOLERANCE, peak
