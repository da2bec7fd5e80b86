"""Every shipped GPU profile loads, validates and matches the figures its sources cite."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainmem.hardware import GIB, GpuProfile, get_gpu, load_gpus

GPUS_DIR = Path(__file__).parents[3] / "hardware" / "gpus"

SHIPPED = {
    "a100-sxm-40gb",
    "a100-sxm-80gb",
    "a100-pcie-80gb",
    "h100-sxm-80gb",
    "h100-hbm2e-96gb",
    "h100-pcie-80gb",
    "h200-sxm-141gb",
    "b200-180gb",
    "mi300x-192gb",
    "mi325x-256gb",
    "l40s-48gb",
    "l4-24gb",
    "a10g-24gb",
    "t4-16gb",
    "v100-sxm2-16gb",
    "v100-sxm2-32gb",
    "rtx-3090-24gb",
    "rtx-4090-24gb",
    "rtx-5090-32gb",
    "rtx-a6000-48gb",
    "gb200-186gb",
    "gb300-288gb",
    "b300-288gb",
    "mi355x-288gb",
}


@pytest.fixture(autouse=True)
def _no_user_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINMEM_HARDWARE_DIR", raising=False)


def test_shipped_names_are_exactly_the_file_stems() -> None:
    stems = {p.stem for p in GPUS_DIR.glob("*.toml")}
    assert stems == SHIPPED
    assert set(load_gpus()) == SHIPPED


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_each_shipped_profile_is_consistent(name: str) -> None:
    gpu = get_gpu(name)
    assert gpu.name == name == Path(gpu.path).stem
    assert 0 < gpu.usable_bytes <= gpu.memory_bytes
    # Driver and ECC reservations take a few percent, never a quarter of the card.
    assert gpu.usable_bytes > 0.85 * gpu.memory_bytes
    assert gpu.memory_gib == gpu.memory_bytes / GIB
    assert gpu.usable_gib == gpu.usable_bytes / GIB
    assert gpu.sources and gpu.price_source
    # Dense tensor throughput: FP8 doubles FP16 where it exists; TF32 never beats FP16.
    assert gpu.fp8_flops in (0.0,) or gpu.fp8_flops >= gpu.fp16_flops
    assert gpu.fp32_flops <= gpu.fp16_flops
    assert gpu.bf16_flops in (0.0, gpu.fp16_flops)


# Dense BF16 tensor peaks against the cited spec sheets (reference.md section 7). Tolerance 0:
# the files store the published figure itself.
DENSE_BF16 = [
    ("a100-sxm-40gb", 312e12),  # NVIDIA A100 datasheet, 624 sparse
    ("a100-sxm-80gb", 312e12),
    ("h100-sxm-80gb", 989.4e12),  # H100 SXM datasheet, 1,979 sparse
    ("h200-sxm-141gb", 989.4e12),  # same GH100 compute
    ("b200-180gb", 2250e12),  # HGX B200 at 1,000 W (glennklockwood)
    ("mi300x-192gb", 1307.4e12),  # AMD MI300X data sheet, 2,614.9 sparse
    ("l40s-48gb", 362.05e12),  # L40S datasheet, 733 sparse
    ("gb200-186gb", 2500e12),  # GB200 at 1,200 W (glennklockwood)
    ("gb300-288gb", 2500e12),  # verda.com GB300 per-GPU table
    ("b300-288gb", 2250e12),  # HGX B300 (glennklockwood)
    ("mi355x-288gb", 2516.6e12),  # AMD MI355X data sheet, 5,033.2 sparse
]


@pytest.mark.parametrize(("name", "flops"), DENSE_BF16)
def test_dense_bf16_matches_cited_figure(name: str, flops: float) -> None:
    assert get_gpu(name).peak_flops("bf16") == flops


@pytest.mark.parametrize("name", ["t4-16gb", "v100-sxm2-16gb", "v100-sxm2-32gb"])
def test_pre_ampere_cards_have_no_bf16_or_fp8(name: str) -> None:
    gpu = get_gpu(name)
    assert gpu.peak_flops("bf16") == 0.0
    assert gpu.peak_flops("fp8") == 0.0
    assert gpu.peak_flops("fp16") > 0


def test_usable_bytes_of_measured_cards() -> None:
    # H200: measured torch total_memory; H100: 81,089 MiB (~470 MiB below nvidia-smi's 81,559).
    assert get_gpu("h200-sxm-141gb").usable_bytes == 150_109_880_320
    assert get_gpu("h100-sxm-80gb").usable_bytes == 81_089 * 2**20
    assert get_gpu("h100-sxm-80gb").usable_bytes < 85_520_809_984


def test_peak_flops_covers_each_dtype_and_rejects_others() -> None:
    gpu = get_gpu("h100-sxm-80gb")
    assert gpu.peak_flops("fp16") == gpu.fp16_flops
    assert gpu.peak_flops("fp8") == gpu.fp8_flops
    assert gpu.peak_flops("fp32") == gpu.fp32_flops
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        gpu.peak_flops("int8")  # type: ignore[arg-type]


def test_profile_is_frozen() -> None:
    gpu = get_gpu("a100-sxm-80gb")
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu.memory_bytes = 1  # type: ignore[misc]


def test_validation_reports_every_broken_rule_at_once() -> None:
    good = get_gpu("h100-sxm-80gb")
    with pytest.raises(ValueError) as info:
        dataclasses.replace(
            good,
            usable_bytes=good.memory_bytes + 1,
            fp16_flops=-1.0,
            vendor="intel",  # type: ignore[arg-type]
            price_date="March 2026",
            gpus_per_node=0,
        )
    message = str(info.value)
    lines = message.splitlines()
    assert len(lines) == 5
    assert all(line.startswith("h100-sxm-80gb.toml: ") for line in lines)
    for field in ("usable_bytes", "fp16_flops", "vendor", "price_date", "gpus_per_node"):
        assert field in message


def test_profile_built_in_code_names_itself_in_errors() -> None:
    fields = {f.name: getattr(get_gpu("l4-24gb"), f.name) for f in dataclasses.fields(GpuProfile)}
    fields.update(name="my-gpu", path="", memory_bytes="24GB")
    with pytest.raises(ValueError, match=r"^'my-gpu': memory_bytes must be an integer"):
        GpuProfile(**fields)


NEWEST_FAMILIES = ("gb200-", "gb300-", "b300-", "mi355x-")


@pytest.mark.parametrize("prefix", NEWEST_FAMILIES)
def test_newest_gpu_families_ship_with_sourced_finite_numbers(prefix: str) -> None:
    import math

    names = [n for n in load_gpus() if n.startswith(prefix)]
    assert names, prefix
    for gpu in (get_gpu(n) for n in names):
        numbers = [getattr(gpu, f.name) for f in dataclasses.fields(gpu)]
        rates = [v for v in numbers if isinstance(v, (int, float)) and not isinstance(v, bool)]
        assert all(math.isfinite(v) and v > 0 for v in rates), gpu.name
        assert len(gpu.sources) >= 3 and gpu.host_memory_bytes


@pytest.mark.parametrize("name", ["gb200-186gb", "gb300-288gb"])
def test_nvl72_node_is_the_72_gpu_nvlink_domain(name: str) -> None:
    gpu = get_gpu(name)
    assert gpu.gpus_per_node == 72
    assert gpu.intra_node_bandwidth_bytes_per_s == 900e9
