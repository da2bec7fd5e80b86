"""The load phase (engine/_load.py): what a rank holds while the model is built and the
checkpoint loaded, per load mode, and the fit judged with it.

Llama-2-7B (vocabulary 32,000, hidden 4,096, MLP 11,008, untied head) on 4 ranks, ZeRO-3 under
FSDP2 mixed precision (fp32 parameter shards): every figure below is the model's own arithmetic,
not a recorded output.
"""

from __future__ import annotations

import numpy as np
import pytest

from trainmem.catalog import load_model
from trainmem.engine import FRAMEWORK_SPECS, FRAMEWORKS, Overheads, estimate, make_grid
from trainmem.engine._fast._scalar import estimate_one

M = load_model("llama-2-7b")
JOB = {"num_gpus": 4, "zero": 3, "precision": "mixed-bf16", "recompute": "full"}
OUTSIDE = Overheads().cuda_context_bytes + Overheads().nccl_bytes_per_communicator  # dp only
EMBEDDING_BYTES = 4 * 32_000 * 4_096
"""The largest tensor (the token embedding, as large as the head) in fp32."""
BLOCK_BYTES = 4 * (4 * 4_096 * 4_096 + 3 * 4_096 * 11_008 + 2 * 4_096)
"""One decoder block in fp32: q, k, v, o; gate, up, down; two RMSNorm weights."""
TENSORS = 3 + 9 * 32
"""Tensors of the model (embedding, final norm, head; nine per block): each rounds to 512 B."""


def _load(mode: str, **fields) -> dict[str, float]:
    out = estimate(M, make_grid({**JOB, "load": mode, **fields}))
    return {k: float(v[0]) for k, v in out.items() if np.ndim(v)}


def _allocated(out: dict[str, float]) -> float:
    return out["peak_load_bytes"] - OUTSIDE


def test_full_state_dict_holds_the_whole_model_before_sharding() -> None:
    out = _load("full-state-dict")
    # The whole fp32 model, each tensor rounded up to the allocator's 512-byte block.
    assert 4 * M.num_parameters <= _allocated(out) <= 4 * M.num_parameters + 512 * TENSORS
    assert out["load_host_bytes"] == pytest.approx(_allocated(out))  # a CPU copy per rank


def test_streamed_loads_hold_the_shards_and_one_piece() -> None:
    shard = _load("sharded")["parameters"]  # the fp32 shard the step holds too
    assert shard == pytest.approx(4 * M.num_parameters / 4, rel=1e-4)
    assert _allocated(_load("cpu-full-state-dict")) - shard == BLOCK_BYTES
    assert _allocated(_load("meta-init")) - shard == EMBEDDING_BYTES
    assert _allocated(_load("sharded")) - shard == EMBEDDING_BYTES / 4
    assert _load("meta-init")["load_host_bytes"] == 0.0
    assert (
        _load("cpu-full-state-dict")["load_host_bytes"]
        == _load("full-state-dict")["load_host_bytes"]
    )


def test_unsharded_parameters_are_the_load() -> None:
    """ZeRO 0-2 hold the whole model anyway: a full state dict adds nothing on the GPU."""
    out = _load("full-state-dict", zero=2)
    assert _allocated(out) == out["parameters"]


def test_auto_is_the_frameworks_own() -> None:
    for name in FRAMEWORKS:
        mode = FRAMEWORK_SPECS[name].load
        assert _load("auto", framework=name)["peak_load_bytes"] == pytest.approx(
            _load(mode, framework=name)["peak_load_bytes"]
        ), name


def test_a_load_that_does_not_fit_fails_the_fit() -> None:
    """Offloaded parameters make the step small; a full state dict on the GPU does not fit a
    24 GiB card (the model is 25 GiB in fp32)."""
    fields = {"offload": "optimizer+params"}
    usable = 24 * 2**30
    full = estimate(M, make_grid({**JOB, **fields, "load": "full-state-dict"}), usable_bytes=usable)
    meta = estimate(M, make_grid({**JOB, **fields, "load": "meta-init"}), usable_bytes=usable)
    assert meta["fits"][0] and not full["fits"][0]
    assert full["peak_allocated_bytes"][0] == meta["peak_allocated_bytes"][0]  # the same step
    # ... whose reserve is the load's: the allocator keeps the whole model's freed blocks
    assert full["peak_device_bytes"][0] == full["peak_load_bytes"][0]
    limit = usable * 0.9
    assert full["headroom_bytes"][0] == pytest.approx(limit - full["peak_load_bytes"][0])


@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize("mode", ["full-state-dict", "cpu-full-state-dict", "meta-init", "sharded"])
def test_one_configuration_equals_the_grid(mode: str, pp: int) -> None:
    fields = {**JOB, "load": mode, "pp": pp, "num_gpus": 8, "global_batch_size": 16}
    grid = estimate(M, make_grid(fields), usable_bytes=80e9)
    one = estimate_one(M, fields, usable_bytes=80e9)
    for key in ("peak_load_bytes", "load_host_bytes", "fits", "headroom_bytes"):
        assert one[key] == grid[key][0], key
    for key in ("peak_reserved_bytes", "peak_device_bytes", "fragmentation"):
        assert one[key] == pytest.approx(grid[key][0], rel=1e-12), key


def test_the_steps_reserve_is_at_least_the_loads() -> None:
    """A load that peaks above the step leaves its freed blocks cached: torch's reserved memory
    and nvidia-smi stay at the load's peak through the step (engine/_load.py
    cached_load_reserve_bytes). The difference is allocator cache, in `fragmentation`, so the
    breakdown still sums to the device peak; the step's allocated peak is untouched."""
    fields = {"offload": "optimizer+params"}
    full = _load("full-state-dict", **fields)
    meta = _load("meta-init", **fields)
    assert meta["peak_load_bytes"] < meta["peak_device_bytes"]  # the step's own reserve
    kept = full["peak_load_bytes"] - meta["peak_device_bytes"]
    assert kept > 20 * 2**30  # the fp32 model (25 GiB) less the step's few GiB
    assert full["peak_device_bytes"] == full["peak_load_bytes"]
    assert full["peak_reserved_bytes"] == pytest.approx(meta["peak_reserved_bytes"] + kept)
    assert full["fragmentation"] == pytest.approx(meta["fragmentation"] + kept)
    parts = ("parameters", "master_weights", "gradients", "optimizer_states", "activations",
             "transient", "framework_overhead", "fragmentation")  # fmt: skip
    assert sum(full[k] for k in parts) == pytest.approx(full["peak_device_bytes"], rel=1e-12)


QLORA = {"lora_rank": 8, "lora_targets": "all-linear", "qlora": True, "precision": "bf16"}


def test_deepspeed_moves_a_quantised_model_whole_to_the_gpu() -> None:
    """transformers builds a QLoRA model outside zero.Init and DeepSpeed's engine moves it to
    the device whole before ZeRO-3 partitions it: `--load auto` under ZeRO-3 is
    full-state-dict, the whole 4-bit model on every rank (twice the shard on 2 ranks), while a
    16-bit model keeps DeepSpeed's zero.Init load and FSDP's QLoRA keeps its own."""
    job = {**QLORA, "num_gpus": 2, "framework": "deepspeed"}
    auto = _load("auto", **job)
    assert auto["peak_load_bytes"] == _load("full-state-dict", **job)["peak_load_bytes"]
    assert _allocated(auto) == pytest.approx(2 * auto["parameters"])
    assert FRAMEWORK_SPECS["deepspeed"].auto_load(sharded_qlora=True)[0] == "full-state-dict"
    lora = {**job, "qlora": False}
    assert (
        _load("auto", **lora)["peak_load_bytes"]
        == _load("cpu-full-state-dict", **lora)["peak_load_bytes"]
    )
    hf = {**job, "framework": "hf"}
    assert (
        _load("auto", **hf)["peak_load_bytes"]
        == _load(FRAMEWORK_SPECS["hf"].load, **hf)["peak_load_bytes"]
    )
