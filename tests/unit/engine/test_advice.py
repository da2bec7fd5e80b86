"""engine advice: every neighbour row equals `estimate` on its own configuration."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from trainmem.catalog import load_model
from trainmem.engine import DEFAULTS, estimate, make_grid
from trainmem.engine._advice import GpuChoice, advise, neighbours

GPU = GpuChoice(name="small", usable_bytes=80 * 2**30, cublas_workspace_bytes=64 * 2**20)
BIG = GpuChoice(name="big", usable_bytes=192 * 2**30, cublas_workspace_bytes=76 * 2**20)


def _config(**changes: Any) -> dict[str, Any]:
    return {**DEFAULTS, **changes}


@pytest.mark.parametrize(
    "config",
    [
        _config(num_gpus=8, pp=2, global_batch_size=16, micro_batch_size=2, zero=1),
        _config(num_gpus=8, tp=2, precision="mixed-bf16", recompute="selective"),
        _config(micro_batch_size=4, seq_len=4096, lora_rank=8, lora_targets="q_proj,v_proj"),
    ],
)
def test_each_neighbour_equals_estimate_of_its_configuration(config: dict[str, Any]) -> None:
    m = load_model("llama-3.2-1b")
    result = advise(m, config, gpu=GPU, catalogue=[GPU, BIG], headroom=0.1)
    assert result["advice"]
    for item in result["advice"]:
        gpu = BIG if item["gpu"] == "big" else GPU
        out = estimate(m, make_grid(item["config"]), usable_bytes=gpu.usable_bytes)
        device = out["peak_device_bytes"][0] + gpu.cublas_workspace_bytes - 64 * 2**20
        assert item["peak_device_bytes"] == int(round(device)), item["change"]
        assert item["fits"] == bool(device <= 0.9 * gpu.usable_bytes), item["change"]


def test_no_zero_change_on_one_data_parallel_rank() -> None:
    knobs = {n.knob for n in neighbours(_config(), gpu="small")}
    assert "zero" not in knobs and "tp" not in knobs
    assert {"recompute", "offload", "loss", "optimizer", "lora", "qlora"} <= knobs


def test_ranked_fitting_first_then_least_slowdown() -> None:
    m = load_model("llama-3-8b")
    config = _config(micro_batch_size=2, seq_len=4096)
    gpu = GpuChoice(
        name="small",
        usable_bytes=80 * 2**30,
        cublas_workspace_bytes=64 * 2**20,
        time_kwargs={
            "peak_flops": 989e12,
            "fp32_peak_flops": 67e12,
            "hbm_bytes_per_s": 3.35e12,
            "intra_node_bytes_per_s": 450e9,
            "inter_node_bytes_per_s": 50e9,
            "gpus_per_node": 8.0,
            "pcie_bytes_per_s": 55e9,
            "price_per_gpu_hour_usd": 3.0,
        },
    )
    advice = advise(m, config, gpu=gpu)["advice"]
    keys = [(not a["fits"], a["step_time_ratio"]) for a in advice]
    assert keys == sorted(keys)
    assert all(np.isfinite(a["step_time_ratio"]) for a in advice)
