"""Host RAM per node: the profile field, the fleet's override, and `--host-memory-gib`, which
sweep, recommend and fit hold CPU offload to (issue 16)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainmem.catalog import load_model
from trainmem.cli import main
from trainmem.hardware import ENV_VAR, GIB, get_gpu, load_gpus, parse_fleet
from trainmem.sweep import fit_report
from trainmem.sweep._space import EXCEEDS_HOST_MEMORY, make_space, reason_texts

ROOT = Path(__file__).resolve().parents[3]
H100_TOML = (ROOT / "hardware" / "gpus" / "h100-sxm-80gb.toml").read_text()
GPUS = load_gpus()
OFFLOAD_JOB = ["--model", "llama-3.1-8b", "--seq-len", "4096"]


@pytest.fixture(autouse=True)
def _no_user_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


def test_every_builtin_profile_documents_its_node_host_memory() -> None:
    assert get_gpu("h100-sxm-80gb").host_memory_bytes == 2048 * GIB  # DGX H100: 2 TB
    assert get_gpu("a100-sxm-40gb").host_memory_bytes == 1024 * GIB  # DGX A100 320GB: 1 TB
    for profile in GPUS.values():
        assert profile.host_memory_bytes is not None, profile.name
        assert any(s.startswith("host_memory_bytes:") for s in profile.sources), profile.name


def test_a_user_profile_without_host_memory_still_loads(tmp_path: Path) -> None:
    text = "\n".join(
        line.replace('"h100-sxm-80gb"', '"my-h100"')
        for line in H100_TOML.splitlines()
        if not line.startswith(("host_memory_bytes", '    "host_memory_bytes:'))
    )
    (tmp_path / "my-h100.toml").write_text(text + "\n")
    profile = load_gpus(tmp_path)["my-h100"]
    assert profile.host_memory_bytes is None and profile.host_memory_gib is None


def test_a_bad_host_memory_names_the_field(tmp_path: Path) -> None:
    (tmp_path / "h100-sxm-80gb.toml").write_text(
        H100_TOML.replace("host_memory_bytes = 2_199_023_255_552", "host_memory_bytes = 0")
    )
    with pytest.raises(ValueError, match="host_memory_bytes must be an integer >= 1"):
        load_gpus(tmp_path)


def test_a_fleet_pool_overrides_the_profile(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text('[[pool]]\ngpu = "h100-sxm-80gb"\nnodes = 2\nhost_memory_gib = 512\n')
    pool = parse_fleet(str(path), GPUS).pools[0]
    assert pool.host_memory_per_node_bytes(GPUS["h100-sxm-80gb"]) == 512 * GIB
    assert parse_fleet("8xh100", GPUS).pools[0].host_memory_per_node_bytes(
        GPUS["h100-sxm-80gb"]
    ) == (2048 * GIB)
    path.write_text('[[pool]]\ngpu = "h100-sxm-80gb"\nnodes = 2\nhost_memory_gib = -1\n')
    with pytest.raises(ValueError, match="pool 1: host_memory_gib must be a finite number > 0"):
        parse_fleet(str(path), GPUS)


def _offload_space(host_memory_bytes: int | None):
    return make_space(
        load_model("llama-3.1-8b"),
        parse_fleet("8xrtx-4090-24gb", GPUS),
        GPUS,
        seq_len=4096,
        global_batch_size=64,
        host_memory_bytes=host_memory_bytes,
    )


def test_sweep_marks_offload_beyond_the_node_host_memory() -> None:
    roomy, tight = _offload_space(None), _offload_space(16 * GIB)
    flat = np.arange(roomy.num_points)
    a, b = roomy.evaluate(flat), tight.evaluate(flat)
    assert not np.any(a["reason"] == EXCEEDS_HOST_MEMORY)
    marked = b["reason"] == EXCEEDS_HOST_MEMORY
    assert np.any(a["fits"] & marked)  # fitted the GPUs, not the node
    assert not np.any(b["fits"] & marked)
    need = b["host_bytes"] * np.minimum(b["num_gpus"], 8)
    assert np.all(need[marked] > 16 * GIB) and np.all(need[b["reason"] == 0] <= 16 * GIB)
    assert all(t.startswith("host memory:") for t in reason_texts(b["reason"][marked]))
    assert np.all(b["offload"][marked] > 0)  # only offload (or activation offload) needs host RAM


def _sweep(args: list[str], capsys: pytest.CaptureFixture[str], out: Path) -> dict | None:
    base = ["sweep", *OFFLOAD_JOB, "--fleet", "8xrtx-4090-24gb", "--global-batch-size", "64"]
    assert main([*base, "--out", str(out), "--json", *args]) == 0, capsys.readouterr().err
    best = json.loads(capsys.readouterr().out)["best"]
    return None if best is None else best["configuration"]


def test_sweep_winner_changes_when_the_node_has_less_host_memory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    roomy = _sweep([], capsys, tmp_path / "a")
    tight = _sweep(["--host-memory-gib", "16"], capsys, tmp_path / "b")
    assert roomy is not None and roomy["offload"] != "none"  # 256 GiB per node: it offloads
    assert tight is None  # 8 x 24 GB cannot hold an 8B model's states without offload


def test_fit_holds_the_largest_micro_batch_to_the_node_host_memory() -> None:
    job = {"model": "llama-3.1-8b", "num_gpus": 8, "zero": 2, "offload": "optimizer"}
    roomy = fit_report(**job)
    assert roomy["fits"] and roomy["host_fits"]
    assert roomy["host_memory_per_node_bytes"] == 2048 * GIB
    tight = fit_report(**job, host_memory_gib=8)
    assert tight["max_micro_batch_size"] is None and not tight["host_fits"]
    assert tight["reason"].startswith("host memory: the node's 8 ranks need")
    assert tight["node_host_bytes"] > 8 * GIB


@pytest.mark.parametrize("command", ["fit", "sweep", "recommend"])
@pytest.mark.parametrize("value", ["0", "-3", "abc"])
def test_a_bad_host_memory_flag_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], command: str, value: str, tmp_path: Path
) -> None:
    extra = ["--out", str(tmp_path / "o")] if command == "sweep" else []
    assert main([command, "--host-memory-gib", value, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert "host-memory-gib" in err.replace("_", "-") and len(err.splitlines()) == 1
