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
BACKWARD_TOLERANCE = 0.05
"""The backward phase (not the step's peak, which is the loss phase): +2.7% at 1 x 8192, +4.2% at
2 x 8192. The top block's per-op SAC moment is counted op by op (op_sac_top_block_bytes, exact
on the debug model below); what is left is the top-block moment's FSDP2 backward buffers and
the block's unsharded gradients (fsdp2_block_gradient_bytes, traced at real size under full
recompute), which the state terms count under selective-op recompute too. A known gap, not
tuned: those state terms do not see the recompute policy."""
DEBUG_TOLERANCE = 0.01
"""The debug model (dim 256, 16 heads of 16, b 8 x 2048) peaks in backward, at the top block's
per-op SAC moment (its activation's backward one device; the down projection's under TP 4 with
sequence parallelism): both within 0.2% of the traces (op_sac_top_block_bytes was read off
them); 1% leaves room for the fake device's small tensors (the rng seeds, the [b, s] masks)."""


def estimate_case(case: dict[str, Any], **flags: Any) -> dict[str, float]:
    """The engine for a traced case, with a user's flags (`flags`: e.g. loss="full")."""
    from trainmem.catalog import load_model

    spec = (
        load_model("llama-3.1-8b")
        if case["dims"]["layers"] == 32
        else small_llama_spec(case["dims"])
    )
    fields = {
        "num_gpus": case["fsdp_world_size"],
        "zero": 3,
        "micro_batch_size": case["local_batch_size"],
        "seq_len": case["seq_len"],
        "framework": "torchtitan",
        "precision": "mixed-bf16",
        "recompute": "selective",
        "optimizer": "adamw-fused",
    }
    return estimate_one(spec, **{**fields, **flags})


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
    assert abs(peak) <= PEAK_TOLERANCE, peak


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
    for phase in ("forward", "backward", "allocated"):  # forward: the wrapper's loss phase
        err = got[f"peak_{phase}_bytes"] / case[f"peak_{phase}_bytes"] - 1.0
        assert abs(err) <= DEBUG_TOLERANCE, (phase, err)


def test_debug_model_tp4_with_loss_parallel_as_a_user_writes_it() -> None:
    """`--tp 4 --num-gpus 4` and nothing else about SP: torchtitan's TP is sequence-parallel by
    default (FrameworkSpec.tp_sequence_parallel; the trace ran parallelize_llama's own plan).
    Before that default the engine counted TP without SP: +16.4% at the peak."""
    case = CASES["debug-tp4"]
    assert (case["tp"], case["world_size"]) == (4, 4)
    got = estimate_case(case, tp=4, num_gpus=4)
    assert got["parameters"] == case["parameters_bytes"]
    assert got["optimizer_states"] == case["optimizer_states_bytes"]
    assert got["activations_per_layer"] == case["activations_by_layer_bytes"][1]
    for phase in ("forward", "backward", "allocated"):
        err = got[f"peak_{phase}_bytes"] / case[f"peak_{phase}_bytes"] - 1.0
        assert abs(err) <= DEBUG_TOLERANCE, (phase, err)
    assert got == estimate_case(case, tp=4, num_gpus=4, sequence_parallel=True)


def test_debug_model_with_the_registrys_one_piece_loss() -> None:
    case = CASES["debug-ce"]
    got = estimate_case(case, loss="full")
    peak = got["peak_allocated_bytes"] / case["peak_allocated_bytes"] - 1.0
    assert abs(peak) <= PEAK_TOLERANCE, peak
