"""`GpuProfile`: one accelerator's memory, compute, links and price, as a frozen spec.

Units are in the field names: bytes, FLOP/s, bytes per second, USD per hour. GiB means 2**30 bytes;
vendors' "GB" on HBM parts is also binary in practice (an "80 GB" H100 has 80 GiB of HBM).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import Literal

GIB = 2**30
"""Bytes in one GiB."""

Vendor = Literal["nvidia", "amd"]
Dtype = Literal["bf16", "fp16", "fp8", "fp32", "fp4"]

VENDORS: tuple[Vendor, ...] = ("nvidia", "amd")
DTYPES: tuple[Dtype, ...] = ("bf16", "fp16", "fp8", "fp32", "fp4")

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]*\Z")
_ARCH_RE = re.compile(r"^(sm[0-9]{2,3}|cdna[0-9])\Z")
_DATE_RE = re.compile(r"^[0-9]{4}-(0[1-9]|1[0-2])(-(0[1-9]|[12][0-9]|3[01]))?\Z")

_FLOAT_FIELDS = (
    "bf16_flops",
    "fp16_flops",
    "fp8_flops",
    "fp32_flops",
    "fp4_flops",
    "hbm_bandwidth_bytes_per_s",
    "intra_node_bandwidth_bytes_per_s",
    "inter_node_bandwidth_bytes_per_s",
    "pcie_bandwidth_bytes_per_s",
    "price_per_hour_usd",
)
_INT_FIELDS = ("memory_bytes", "usable_bytes", "gpus_per_node")
_STR_FIELDS = ("name", "display_name", "vendor", "arch", "price_source", "price_date")

MAX_MEMORY_BYTES = 2**44
"""16 TiB: above any accelerator's memory (B200: 180 GiB) by far; more is a typo (1e23)."""
MAX_GPUS_PER_NODE = 1024
"""Above any scale-up domain (NVL72: 72 GPUs); more is a typo (1e9)."""
FLOPS_RANGE = (1e9, 1e18)
"""A rate that is not 0 lies in [1 GFLOP/s, 1 EFLOP/s] (B200 dense fp8: 4.5e15): a near-zero
rate makes every step time infinite (NaN in the outputs)."""
BANDWIDTH_RANGE = (1e6, 1e15)
"""[1 MB/s, 1 PB/s] for every link and memory bandwidth (B200 HBM3e: 8e12)."""
MAX_PRICE_PER_HOUR_USD = 1e4
"""USD per GPU-hour; more is a typo."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuProfile:
    """One GPU model as the memory planner and the cost search see it.

    Built from a TOML file by `load_gpus`; every field is validated when the object is made and
    all violated rules are reported together in one `ValueError`.
    """

    name: str
    """Identifier used on the command line and as the TOML file stem, e.g. ``"h100-sxm-80gb"``."""

    display_name: str
    """Human-readable model name, e.g. ``"NVIDIA H100 SXM5 80GB"``."""

    vendor: Vendor
    """``"nvidia"`` or ``"amd"``."""

    arch: str
    """Compute architecture: ``"sm70"`` … ``"sm120"`` (CUDA compute capability) or ``"cdna3"``."""

    memory_bytes: int
    """Marketed capacity in bytes (80 GB HBM -> 80 * 2**30)."""

    usable_bytes: int
    """What the framework can allocate: ``torch.cuda.get_device_properties(0).total_memory``
    (= ``cudaMemGetInfo`` total). Lower than `memory_bytes` by ECC and driver reservations."""

    bf16_flops: float
    """Dense BF16 tensor-core peak, FLOP/s (no 2:4 sparsity). 0 where the card has no BF16."""

    fp16_flops: float
    """Dense FP16 tensor-core peak with FP32 accumulate, FLOP/s."""

    fp8_flops: float
    """Dense FP8 tensor-core peak, FLOP/s. 0 before Ada/Hopper/CDNA3."""

    fp32_flops: float
    """Dense TF32 tensor-core peak where TF32 exists (sm80+, CDNA3), else plain FP32, FLOP/s."""

    hbm_bandwidth_bytes_per_s: float
    """Peak device-memory bandwidth (HBM or GDDR), bytes/s."""

    intra_node_bandwidth_bytes_per_s: float
    """Per-GPU unidirectional scale-up bandwidth collectives see (NVLink, Infinity Fabric, or
    PCIe when there is no GPU fabric), bytes/s."""

    inter_node_bandwidth_bytes_per_s: float
    """Per-GPU share of the scale-out network (InfiniBand/RoCE/Ethernet), bytes/s."""

    gpus_per_node: int
    """GPUs in one node of the typical deployment (8 for HGX / MI300X UBB)."""

    pcie_bandwidth_bytes_per_s: float
    """Host link, one direction, bytes/s; bounds CPU offload traffic."""

    price_per_hour_usd: float
    """On-demand price for one GPU for one hour, USD."""

    price_source: str
    """Where `price_per_hour_usd` came from."""

    price_date: str
    """When the price was observed: ``"YYYY-MM"`` or ``"YYYY-MM-DD"``."""

    sources: tuple[str, ...]
    """Where each spec number came from."""

    host_memory_bytes: int | None = None
    """Host (CPU) RAM of one node of the typical deployment, all its GPUs together, bytes: what
    the ranks of a node share for CPU-offloaded optimizer states, parameters and activations.
    None: not documented for this card (a user file may leave it out); nothing is checked."""

    cuda_context_bytes: int | None = None
    """Device memory outside PyTorch's allocator after a training step on this card (CUDA
    context, lazily loaded kernels, cuBLAS/cuDNN handles), bytes, where measured for it (cite
    the measurement in `sources`). None: the engine's default for `arch`
    (`trainmem.engine.cuda_context_bytes_for`). `--overhead cuda_context_bytes=` overrides both."""

    fp4_flops: float = 0.0
    """Dense FP4 tensor-core peak with block scaling (NVFP4 on Blackwell, MXFP4 on CDNA 4),
    FLOP/s (no 2:4 sparsity). 0 (or left out of the file): the card has no fp4 tensor cores."""

    path: str = ""
    """File the profile was loaded from; empty when built in code."""

    def __post_init__(self) -> None:
        errors = _violations(self)
        if errors:
            where = PurePath(self.path).name if self.path else repr(self.name)
            raise ValueError("\n".join(f"{where}: {error}" for error in errors))

    @property
    def memory_gib(self) -> float:
        """Marketed capacity in GiB."""
        return self.memory_bytes / GIB

    @property
    def host_memory_gib(self) -> float | None:
        """Host RAM of one node in GiB; None where unknown."""
        return None if self.host_memory_bytes is None else self.host_memory_bytes / GIB

    @property
    def usable_gib(self) -> float:
        """Allocatable capacity in GiB."""
        return self.usable_bytes / GIB

    def peak_flops(self, dtype: Dtype) -> float:
        """Dense peak FLOP/s for matmuls in `dtype`; 0.0 where the card lacks that format.

        >>> from trainmem.hardware import get_gpu
        >>> get_gpu("a100-sxm-80gb").peak_flops("bf16")
        312000000000000.0
        """
        if dtype == "bf16":
            return self.bf16_flops
        if dtype == "fp16":
            return self.fp16_flops
        if dtype == "fp8":
            return self.fp8_flops
        if dtype == "fp32":
            return self.fp32_flops
        if dtype == "fp4":
            return self.fp4_flops
        raise ValueError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPES)}")


def _violations(p: GpuProfile) -> list[str]:
    """Every rule `p` breaks, one message per rule, each naming its field."""
    # Types first: later rules compare values and would raise TypeError on bad types.
    errors, bad_type = _type_violations(p)
    errors += _optional_violations(p)
    errors += _value_violations(p, bad_type)
    return errors


def _type_violations(p: GpuProfile) -> tuple[list[str], set[str]]:
    """The type rules `p` breaks, and the fields of wrong type (their value rules are skipped)."""
    errors: list[str] = []
    bad_type: set[str] = set()
    for field in _STR_FIELDS:
        if not isinstance(getattr(p, field), str):
            errors.append(f"{field} must be a string")
            bad_type.add(field)
    for field in _INT_FIELDS:
        value = getattr(p, field)
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(f"{field} must be an integer")
            bad_type.add(field)
    for field in _FLOAT_FIELDS:
        value = getattr(p, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            errors.append(f"{field} must be a number")
            bad_type.add(field)
    if not isinstance(p.sources, tuple) or not all(isinstance(s, str) for s in p.sources):
        errors.append("sources must be a tuple of strings")
        bad_type.add("sources")
    if not isinstance(p.path, str):
        errors.append("path must be a string")
    return errors, bad_type


def _optional_violations(p: GpuProfile) -> list[str]:
    """The rules of the fields a profile may leave out (None: unknown or the default)."""
    errors: list[str] = []
    host = p.host_memory_bytes
    if host is not None and (isinstance(host, bool) or not isinstance(host, int) or host < 1):
        errors.append("host_memory_bytes must be an integer >= 1 (or left out: unknown)")
    context = p.cuda_context_bytes
    if context is not None and (
        isinstance(context, bool)
        or not isinstance(context, int)
        or context < 1
        or (isinstance(p.memory_bytes, int) and context >= p.memory_bytes)
    ):
        errors.append(
            "cuda_context_bytes must be an integer >= 1 and < memory_bytes "
            "(or left out: the architecture's default)"
        )
    return errors


def _value_violations(p: GpuProfile, bad_type: set[str]) -> list[str]:
    """The value rules `p` breaks, judging only fields of the right type (not in `bad_type`)."""
    errors: list[str] = []

    def ok(*fields: str) -> bool:
        return not bad_type.intersection(fields)

    if ok("name") and not _NAME_RE.match(p.name):
        errors.append("name must be lower-case letters, digits, '.' and '-'")
    if ok("display_name") and not p.display_name.strip():
        errors.append("display_name must not be empty")
    if ok("vendor") and p.vendor not in VENDORS:
        errors.append(f"vendor must be one of {', '.join(VENDORS)}")
    if ok("arch") and not _ARCH_RE.match(p.arch):
        errors.append("arch must look like 'sm90' or 'cdna3'")
    if ok("memory_bytes") and p.memory_bytes <= 0:
        errors.append("memory_bytes must be > 0")
    if ok("memory_bytes", "usable_bytes") and not 0 < p.usable_bytes <= p.memory_bytes:
        errors.append("usable_bytes must be > 0 and <= memory_bytes")
    if ok("memory_bytes") and p.memory_bytes > MAX_MEMORY_BYTES:
        errors.append(f"memory_bytes must be <= {MAX_MEMORY_BYTES} (16 TiB), got {p.memory_bytes}")
    errors += [_rate_violation(p, field) for field in _FLOAT_FIELDS if ok(field)]
    if ok("gpus_per_node") and not 1 <= p.gpus_per_node <= MAX_GPUS_PER_NODE:
        errors.append(f"gpus_per_node must be in [1, {MAX_GPUS_PER_NODE}], got {p.gpus_per_node}")
    errors = [e for e in errors if e]
    if ok("price_source") and not p.price_source.strip():
        errors.append("price_source must not be empty")
    if ok("price_date") and not _DATE_RE.match(p.price_date):
        errors.append("price_date must be 'YYYY-MM' or 'YYYY-MM-DD'")
    if ok("sources") and (not p.sources or not all(s.strip() for s in p.sources)):
        errors.append("sources must list at least one non-empty string")
    return errors


def _rate_violation(p: GpuProfile, field: str) -> str:
    """The rule a rate, bandwidth or price of `p` breaks ("" where none): finite, inside its
    range (FLOPS_RANGE, BANDWIDTH_RANGE, price > 0); bf16, fp8 and fp4 rates may be 0 (the
    card lacks the format)."""
    value = getattr(p, field)
    optional = field in ("bf16_flops", "fp8_flops", "fp4_flops")
    if field.endswith("_flops"):
        low, high = FLOPS_RANGE
    elif field.endswith("_bytes_per_s"):
        low, high = BANDWIDTH_RANGE
    else:
        low, high = 0.0, MAX_PRICE_PER_HOUR_USD
    if optional and value == 0:
        return ""
    if math.isfinite(value) and (low < value if low == 0 else low <= value) and value <= high:
        return ""
    zero = " or 0 (format not supported)" if optional else ""
    rule = f"> 0 and <= {high:g}" if low == 0 else f"in [{low:g}, {high:g}]"
    return f"{field} must be finite and {rule}{zero}, got {value}"
