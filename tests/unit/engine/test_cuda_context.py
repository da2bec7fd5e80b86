"""The CUDA context per GPU: the architecture rule, a profile's own value, `--overhead`, and
every place that builds a GPU's Overheads (estimate, advice, fit, heatmap, sweep pools)."""

from __future__ import annotations

import numpy as np
import pytest

from trainmem.catalog import load_model
from trainmem.engine import (
    Overheads,
    cublas_workspace_bytes_for,
    cuda_context_bytes_for,
    estimate,
    make_grid,
    overheads_for,
)
from trainmem.hardware import get_gpu, load_gpus, parse_fleet
from trainmem.report import estimate_report, gpu_choice
from trainmem.sweep._space import AXES, make_space

MIB = 2**20
SM90_CONTEXT = 804_061_184  # measured on H200 (tests/data/gpu_calibration_h200.json)
SM70_CONTEXT = 1343 * MIB  # V100, eager loading (transformers model_memory_anatomy.md)
JOB = {"model": "llama-3.2-1b", "micro_batch_size": 1, "seq_len": 1024}


@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        ("sm90", SM90_CONTEXT),
        ("sm70", 1_408_237_568),  # 1,343 MiB
        ("sm89", 426 * MIB + (804_061_184 - 648_871_936)),  # 601,882,624: Ada init + step
        ("sm100", 612 * MIB + (804_061_184 - 648_871_936)),  # 796,917,760: B200 init + step
        ("sm80", SM90_CONTEXT),  # no Ampere measurement: the sm90 figure
        ("sm75", SM90_CONTEXT),
        ("sm120", SM90_CONTEXT),
        ("cdna3", SM90_CONTEXT),
    ],
)
def test_architecture_rule(arch: str, expected: int) -> None:
    assert cuda_context_bytes_for(arch) == expected


def test_sm90_keeps_the_measured_h200_context() -> None:
    # The H200 calibration golden tests read Overheads(); both H200 and H100 resolve to it.
    assert Overheads().cuda_context_bytes == SM90_CONTEXT
    for name in ("h200-sxm-141gb", "h100-sxm-80gb"):
        g = get_gpu(name)
        assert overheads_for(g.arch, cuda_context_bytes=g.cuda_context_bytes) == Overheads()


def test_overheads_for_takes_a_profile_value_over_the_rule() -> None:
    ov = overheads_for("sm70", cuda_context_bytes=123_456_789)
    assert ov.cuda_context_bytes == 123_456_789
    assert ov.cublas_workspace_bytes == cublas_workspace_bytes_for("sm70")  # 16.25 MiB
    assert overheads_for("sm70").cuda_context_bytes == SM70_CONTEXT


def test_context_is_additive_to_device_and_load_only() -> None:
    # Same job, same workspace: the context moves the device and load peaks and the framework
    # overhead by exactly its difference, and nothing torch's allocator counts.
    m = load_model("llama-3.2-1b")
    grid = make_grid(micro_batch_size=[1, 4], seq_len=1024)
    a = estimate(m, grid, usable_bytes=80 * 2**30, overheads=Overheads(cuda_context_bytes=5e8))
    b = estimate(m, grid, usable_bytes=80 * 2**30, overheads=Overheads(cuda_context_bytes=9e8))
    for key in ("peak_device_bytes", "peak_load_bytes", "framework_overhead"):
        np.testing.assert_array_equal(b[key] - a[key], [4e8, 4e8])
    for key in ("peak_allocated_bytes", "peak_reserved_bytes"):
        np.testing.assert_array_equal(b[key], a[key])


def _peak(gpu: str, *overhead: str, **kwargs) -> float:
    return float(
        estimate_report(gpu=gpu, overhead=list(overhead), **JOB, **kwargs)["peak_device_bytes"]
    )


def test_v100_device_peak_differs_from_sm90_by_the_context_difference() -> None:
    # The same job on a V100 and an H100, the cuBLAS workspace set equal on both: the device
    # peaks differ by 1,408,237,568 - 804,061,184 = 604,176,384 B, to the byte.
    ws = "cublas_workspace_bytes=67108864"
    diff = _peak("v100-sxm2-32gb", ws) - _peak("h100-sxm-80gb", ws)
    assert diff == SM70_CONTEXT - SM90_CONTEXT == 604_176_384
    # Without the override the workspaces differ too (64 MiB sm90, 16.25 MiB sm70).
    diff = _peak("v100-sxm2-32gb") - _peak("h100-sxm-80gb")
    assert diff == 604_176_384 - (64 * MIB - 2 * (8 * MIB + 128 * 1024)) == 554_106_880


def test_overhead_flag_wins_over_the_gpu_default() -> None:
    ws = "cublas_workspace_bytes=67108864"
    ctx = "cuda_context_bytes=1000000000"
    assert _peak("v100-sxm2-32gb", ws, ctx) == _peak("h100-sxm-80gb", ws, ctx)
    assert _peak("v100-sxm2-32gb", ctx) - _peak("v100-sxm2-32gb") == 1e9 - SM70_CONTEXT


def test_advice_uses_each_gpus_own_context_unless_overridden() -> None:
    v100 = get_gpu("v100-sxm2-32gb")
    assert gpu_choice(v100).cuda_context_bytes == SM70_CONTEXT
    assert gpu_choice(get_gpu("l40s-48gb")).cuda_context_bytes == 601_882_624
    assert gpu_choice(v100, context_override=5e8).cuda_context_bytes == 5e8
    # The GPU changes of the advice: each larger GPU's peak is a plain estimate there (its own
    # context and workspace), e.g. an H200 saves 554,106,880 B of a V100's overhead and an
    # L40S (sm89, 601,882,624 B context, 16.25 MiB workspace like sm70) 806,354,944 B.
    job = {"model": "llama-3.2-1b", "micro_batch_size": 4, "seq_len": 2048}
    report = estimate_report(gpu="v100-sxm2-16gb", **job)
    by_gpu = {a["gpu"]: a for a in report["advice"] if a["knob"] == "gpu"}
    for name, saved in (("h200-sxm-141gb", 554_106_880), ("l40s-48gb", 806_354_944)):
        there = estimate_report(gpu=name, **job)["peak_device_bytes"]
        assert by_gpu[name]["peak_device_bytes"] == there
        assert report["peak_device_bytes"] - there == saved


def test_a_fleet_uses_each_pools_own_context() -> None:
    gpus = load_gpus()
    fleet = parse_fleet("8xh100-sxm-80gb,8xv100-sxm2-32gb,8xl40s-48gb", gpus)
    model = load_model("llama-3.2-1b")  # mixed-fp16: a V100 has no bf16 (its points: invalid)
    space = make_space(
        model, fleet, gpus, seq_len=1024, global_batch_size=8, precision="mixed-fp16"
    )
    res = space.evaluate(np.arange(space.num_points))
    ok = np.flatnonzero(res["reason"] == 0)
    checked = set()
    for i in ok:
        pool = int(res["pool"][i])
        if pool in checked:
            continue
        profile = gpus[fleet.pools[pool].gpu]
        cols = space.columns(np.array([i]))
        row = make_grid({**space.fixed, **{a: cols[a] for a in AXES if a != "pool"}})
        alone = estimate(
            space.model,
            row,
            usable_bytes=profile.usable_bytes,
            headroom=space.headroom,
            overheads=overheads_for(profile.arch, cuda_context_bytes=profile.cuda_context_bytes),
        )
        assert res["peak_device_bytes"][i] == alone["peak_device_bytes"][0], profile.name
        checked.add(pool)
    assert checked == {0, 1, 2}
