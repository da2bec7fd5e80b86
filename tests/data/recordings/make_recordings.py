"""Record the `trainmem` CLI's outputs from a pristine checkout (test_recorded_outputs.py).

    python tests/data/recordings/make_recordings.py --source /path/to/pristine/checkout

The checkout's packages are imported from --source (never from an editable install of the
working tree): its pyproject's [tool.setuptools.package-dir] folders are linked as `trainmem.*`
under a temporary folder put first on sys.path, setuptools' editable finders are removed, and
every imported trainmem module is checked to come from --source. The cases are drawn from a
fixed seed, so two runs write the same bytes. Capture, environment and normalisation are the
test module's own functions (imported by path), so the replay sees exactly what was recorded.

Writes RECORDINGS/KIND.json for KIND in estimate, fit, recommend, heatmap, sweep, lists, readme:
{"format", "source", "seed", "cases": [{"id", "steps": [{"argv", "exit_code", "exception",
"warnings", "stdout_sha256", "stderr_sha256"[, "stdout"][, "stderr"]}][, "points"][, "inputs"]}]}
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
TEST_MODULE = HERE.parent.parent / "golden" / "test_recorded_outputs.py"
SEED = 20250101
FORMAT = 1
TMP_ARG = "{TMP}"
"""The case's temporary folder in an argv (the test module's TMP)."""

# ---- the vocabularies the cases draw from (the reference checkout's, written out) ---------------

PRESETS = (
    "bert-base-uncased",
    "bert-large-uncased",
    "deepseek-v2-lite",
    "deepseek-v3",
    "gemma-2b",
    "gemma-7b",
    "gpt2",
    "gpt2-large",
    "gpt2-medium",
    "gpt2-xl",
    "gpt3-175b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-2-7b",
    "llama-3-70b",
    "llama-3-8b",
    "llama-3.1-405b",
    "llama-3.1-70b",
    "llama-3.1-8b",
    "llama-3.2-1b",
    "llama-3.2-3b",
    "mistral-7b",
    "mixtral-8x22b",
    "mixtral-8x7b",
    "phi-3-mini",
    "qwen1.5-moe-a2.7b",
    "qwen2-1.5b",
    "qwen2-72b",
    "qwen2-7b",
    "qwen2.5-0.5b",
    "qwen2.5-14b",
    "qwen2.5-32b",
    "qwen2.5-72b",
    "qwen2.5-7b",
    "qwen3-30b-a3b",
    "tinyllama-1.1b",
)
MOE = (
    "mixtral-8x7b",
    "mixtral-8x22b",
    "qwen3-30b-a3b",
    "deepseek-v2-lite",
    "deepseek-v3",
    "qwen1.5-moe-a2.7b",
)
FAVOURITES = (
    "bert-base-uncased",
    "gpt2",
    "llama-3.1-8b",
    "phi-3-mini",
    "mistral-7b",
    "llama-3.2-1b",
    "qwen2.5-7b",
    "llama-3.1-70b",
)
SMALL = (
    "gpt2",
    "bert-base-uncased",
    "llama-3.2-1b",
    "qwen2.5-0.5b",
    "tinyllama-1.1b",
    "qwen2-1.5b",
    "gemma-2b",
    "phi-3-mini",
)
GPUS = (
    "a100-pcie-80gb",
    "a100-sxm-40gb",
    "a100-sxm-80gb",
    "a10g-24gb",
    "b200-180gb",
    "h100-pcie-80gb",
    "h100-sxm-80gb",
    "h200-sxm-141gb",
    "l4-24gb",
    "l40s-48gb",
    "mi300x-192gb",
    "mi325x-256gb",
    "rtx-3090-24gb",
    "rtx-4090-24gb",
    "rtx-5090-32gb",
    "rtx-a6000-48gb",
    "t4-16gb",
    "v100-sxm2-16gb",
    "v100-sxm2-32gb",
)
PRECISIONS = (
    "fp32",
    "bf16",
    "fp16",
    "amp-bf16",
    "amp-fp16",
    "mixed-bf16",
    "mixed-fp16",
    "fp8-mixed",
)
OPTIMIZERS = ("adamw", "adamw-fused", "adamw-8bit", "sgd", "sgd-momentum", "adafactor", "lion")
RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("flash", "eager")
FRAMEWORKS = ("hf", "megatron", "deepspeed", "torchtitan")
OFFLOADS = ("none", "optimizer", "optimizer+params")
LOSSES = ("full", "chunked")
OVERHEADS = {
    "cuda_context_bytes": ("0", "500000000", "804061184", "1.2e9"),
    "nccl_bytes_per_communicator": ("0", "268435456", "1e9"),
    "fragmentation_fraction": ("0", "0.05", "0.3"),
    "cublas_workspace_bytes": ("0", "8388608", "67108864"),
}
TIME_PARAMS = {
    "gemm_efficiency_max": ("0.5", "0.9"),
    "gemm_half_work": ("1e5", "2e6"),
    "flash_attention_efficiency": ("0.5", "0.9"),
    "attention_flops_per_hbm_byte": ("40", "120"),
    "causal_attention_fraction": ("0.5", "1"),
    "pointwise_bytes_per_width": ("20", "40"),
    "eager_attention_bytes_per_score": ("5", "10"),
    "memory_bandwidth_efficiency": ("0.6", "0.95"),
    "collective_bandwidth_efficiency": ("0.5", "0.9"),
    "ring_step_latency_s": ("1e-6", "2e-5"),
    "dp_overlap_fraction": ("0", "1"),
    "fsdp_overlap_fraction": ("0", "0.9"),
    "tp_overlap_fraction": ("0", "0.5"),
    "overlap_slowdown_fraction": ("0", "0.4"),
    "pcie_efficiency": ("0.5", "0.9"),
    "cpu_optimizer_params_per_s": ("5e8", "4e9"),
    "cp_overlap_fraction": ("0", "1"),
}
LORA_TARGETS = (
    "all-linear",
    "q_proj,v_proj",
    "q_proj,k_proj,v_proj,o_proj",
    "gate_proj,up_proj,down_proj",
    "c_attn",
    "query,value",
)


# ---- importing the reference checkout -----------------------------------------------------------


def use_source(source: Path, shim: Path) -> None:
    """Make `import trainmem.X` load --source's folders, and nothing else."""
    pyproject = tomllib.loads((source / "pyproject.toml").read_text())
    package_dir = pyproject["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(package_dir.items(), key=lambda item: item[0].count(".")):
        link = shim.joinpath(*package.split("."))
        link.parent.mkdir(parents=True, exist_ok=True)
        if package == "trainmem":  # the namespace root maps a folder too: link its files, so
            link.mkdir()  # that the subpackages' links land in the shim, not in that folder
            for item in (source / folder).resolve().iterdir():
                (link / item.name).symlink_to(item)
            continue
        link.symlink_to((source / folder).resolve(), target_is_directory=True)
    sys.meta_path[:] = [
        f
        for f in sys.meta_path
        if "editable" not in getattr(f, "__module__", "").lower()
        and "editable" not in getattr(f, "__name__", "").lower()
    ]
    for name in [m for m in sys.modules if m == "trainmem" or m.startswith("trainmem.")]:
        del sys.modules[name]
    sys.path.insert(0, str(shim))


def check_source(source: Path, shim: Path) -> None:
    src, lnk = str(source.resolve()), str(shim)
    for name, module in sorted(sys.modules.items()):
        if name == "trainmem" or name.startswith("trainmem."):
            path = getattr(module, "__file__", None)
            paths = [path] if path else list(getattr(module, "__path__", []))
            for p in paths:
                if not (p.startswith(lnk) or os.path.realpath(p).startswith(src)):
                    raise SystemExit(f"{name} was imported from {p}, not from {source}")


def load_test_module() -> Any:
    spec = importlib.util.spec_from_file_location("_recorded_outputs_shared", TEST_MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# ---- the cases ----------------------------------------------------------------------------------


def _pick(rng: random.Random, p: float) -> bool:
    return rng.random() < p


def _divisors(n: int) -> list[int]:
    return [d for d in (1, 2, 4, 8, 16, 32, 64) if d <= n and n % d == 0]


def estimate_flags(rng: random.Random, *, full: bool = True, bad: float = 1.0) -> list[list[str]]:
    """One random configuration as flag groups (each group stays together when shuffled).
    `bad` scales the chance of each deliberately invalid value (0: none; the layout can still
    be invalid, e.g. layers not divisible by pp)."""

    def err(p: float) -> bool:
        return rng.random() < p * bad

    g: list[list[str]] = []
    r = rng.random()
    if err(0.02):
        model = rng.choice(("llama-9b", "gpt5", "no/such/config.json"))
    elif r < 0.30:
        model = rng.choice(MOE)
    elif r < 0.60:
        model = rng.choice(FAVOURITES)
    else:
        model = rng.choice(PRESETS)
    moe = model in MOE
    if model != "llama-3.1-8b" or _pick(rng, 0.5):
        g.append(["--model", model])
    if _pick(rng, 0.7):
        g.append(["--gpu", "h100" if err(0.02) else rng.choice(GPUS)])
    # Layout: mostly consistent (num_gpus = tp*pp*cp*dp), sometimes anything.
    tp = rng.choice((1, 1, 1, 2, 4, 8))
    pp = rng.choice((1, 1, 1, 1, 2, 2, 4, 3))
    cp = rng.choice((1, 1, 1, 1, 2, 4))
    dp = rng.choice((1, 1, 2, 4, 8, 16))
    n = rng.choice((1, 3, 6, 8, 12, 24, 64, 0)) if err(0.1) else tp * pp * cp * dp
    if n != 1 or _pick(rng, 0.2):
        g.append(["--num-gpus", str(n)])
    for flag, v in (("--tp", tp), ("--pp", pp), ("--cp", cp)):
        if v != 1 or _pick(rng, 0.1):
            g.append([flag, str(v)])
    if pp > 1 and _pick(rng, 0.4):
        g.append(["--virtual-stages", str(rng.choice((1, 2, 2, 4, 3)))])
    elif err(0.02):
        g.append(["--virtual-stages", str(rng.choice((0, 2)))])
    if moe or err(0.08):
        if _pick(rng, 0.75):
            ep = rng.choice((3, 16)) if err(0.15) else rng.choice(_divisors(max(dp * cp, 1)))
            g.append(["--ep", str(ep)])
        if full and _pick(rng, 0.3):
            g.append(["--etp", "3" if err(0.1) else str(rng.choice((1, 2, 4)))])
        if full and _pick(rng, 0.35):
            g.append(
                ["--capacity-factor", "-1" if err(0.1) else rng.choice(("0", "1.0", "1.25", "2"))]
            )
    if _pick(rng, 0.5):
        seq = rng.choice((128, 512, 1024, 2048, 4096, 8192, 16384, 32768, 131072, 1000))
        g.append(["--seq-len", rng.choice(("0", "-8", "2k")) if err(0.03) else str(seq)])
    mbs = rng.choice((1, 1, 2, 4, 8, 16))
    if mbs != 1 or _pick(rng, 0.1):
        g.append(["--micro-batch-size", "0" if err(0.02) else str(mbs)])
    if _pick(rng, 0.25):
        gbs = rng.choice((0, 7)) if err(0.2) else mbs * max(dp, 1) * rng.choice((1, 2, 4, 8))
        g.append(["--global-batch-size", str(gbs)])
    for flag, vocab, p in (
        ("--precision", PRECISIONS, 0.6),
        ("--optimizer", OPTIMIZERS, 0.4),
        ("--recompute", RECOMPUTE, 0.5),
        ("--attention", ATTENTION, 0.25),
        ("--framework", FRAMEWORKS, 0.4),
        ("--loss", LOSSES, 0.3),
    ):
        if _pick(rng, p):
            g.append([flag, "bogus" if err(0.02) else rng.choice(vocab)])
    zero = 4 if err(0.02) else rng.choice((0, 1, 2, 3))
    if _pick(rng, 0.25):
        offload = "bogus" if err(0.02) else rng.choice(OFFLOADS)
        g.append(["--offload", offload])
        if offload != "none" and not err(0.15):  # the ZeRO stage it needs, mostly
            zero = 3 if offload == "optimizer+params" else rng.choice((1, 2, 3))
            g.append(["--zero", str(zero)])
        elif _pick(rng, 0.5):
            g.append(["--zero", str(zero)])
    elif _pick(rng, 0.5):
        g.append(["--zero", str(zero)])
    if _pick(rng, 0.25):
        g.append(["--sequence-parallel"])
    if _pick(rng, 0.2):
        rank = rng.choice((8, 16, 64, 32))
        g.append(["--lora-rank", "0" if err(0.2) else str(rank)])
        if _pick(rng, 0.5):
            g.append(["--lora-targets", rng.choice(LORA_TARGETS)])
        if _pick(rng, 0.4):
            g.append(["--qlora"])
    elif err(0.02):
        g.append(["--qlora"])  # needs --lora-rank: an error
    headrooms = ("0", "0.05", "0.2", "0.3", "0.5", "0.15", "0.25")
    if _pick(rng, 0.2):
        g.append(["--headroom", rng.choice(("1.5", "-0.1")) if err(0.2) else rng.choice(headrooms)])
    if not full:
        return g
    if _pick(rng, 0.15):
        g.append(["--activation-offload"])
    if _pick(rng, 0.2):
        g.append(["--tokens", rng.choice(("1e9", "2.5e10", "1e12", "1000000"))])
    if (pp > 1 and _pick(rng, 0.5)) or _pick(rng, 0.05):
        g.append(["--per-stage"])
    for _ in range(rng.choice((0, 0, 0, 1, 1, 2))):
        key = rng.choice(sorted(OVERHEADS))
        item = f"{key}={rng.choice(OVERHEADS[key])}"
        if err(0.06):
            item = rng.choice(("bogus_bytes=1", "cuda_context_bytes", "cuda_context_bytes=lots"))
        g.append(["--overhead", item])
    for _ in range(rng.choice((0, 0, 0, 1, 1, 2))):
        key = rng.choice(sorted(TIME_PARAMS))
        item = f"{key}={rng.choice(TIME_PARAMS[key])}"
        if err(0.06):
            item = rng.choice(("warp_speed=9", "gemm_efficiency_max", "pcie_efficiency=x"))
        g.append(["--time-param", item])
    if err(0.01):
        g.append(["--hardware-dir", "no-such-folder"])
    return g


def _flat(groups: list[list[str]]) -> list[str]:
    return [a for group in groups for a in group]


Probe = Callable[[list[str]], "int | None"]
"""Runs an argv on the reference checkout; its exit code (to draw cases that run)."""
VALID_SHARE = 0.6
"""Share of estimate/fit cases redrawn (up to MAX_DRAWS times) until they exit 0; the others
take whatever comes, deliberately invalid values included."""
MAX_DRAWS = 40


def _draw(
    rng: random.Random, probe: Probe, command: list[str], make: Callable[..., list[list[str]]]
) -> list[list[str]]:
    """`make(bad=...)`'s flag groups: valid ones (VALID_SHARE of the time), else anything."""
    if rng.random() >= VALID_SHARE:
        return make(bad=1.0)
    for _ in range(MAX_DRAWS):
        groups = make(bad=0.0)
        if probe([*command, *_flat(groups)]) == 0:
            break
    return groups


def estimate_cases(rng: random.Random, count: int, probe: Probe) -> list[dict[str, Any]]:
    cases = []
    for i in range(count):
        groups = _draw(rng, probe, ["estimate", "--json"], functools.partial(estimate_flags, rng))
        rng.shuffle(groups)
        if _pick(rng, 0.005):
            groups.insert(rng.randrange(len(groups) + 1), ["--tp", "two"])  # not an integer
        argv = ["estimate", *_flat(groups)]
        j = rng.randrange(len(groups) + 1)  # --json anywhere after the command
        with_json = ["estimate", *_flat([*groups[:j], ["--json"], *groups[j:]])]
        cases.append({"id": f"estimate-json-{i:03d}", "argv": with_json})
        if i % 5 == 0:
            cases.append({"id": f"estimate-text-{i:03d}", "argv": argv})
    return cases


def fit_flags(rng: random.Random, *, by_gpus: bool, bad: float) -> list[list[str]]:
    groups = estimate_flags(rng, full=False, bad=bad)
    if by_gpus:
        groups = [g for g in groups if g[0] != "--num-gpus"]
        groups.append(["--minimize", "num-gpus"])
        groups.append(["--max-num-gpus", str(rng.choice((8, 64, 512, 4096)))])
    else:
        if _pick(rng, 0.5):
            groups.append(["--minimize", "micro-batch-size"])
        groups.append(["--max-micro-batch-size", str(rng.choice((4, 16, 64, 256)))])
    if rng.random() < 0.03 * bad:
        groups.append(["--minimize", "cost"])  # unknown: an error
    return groups


def fit_cases(rng: random.Random, count: int, probe: Probe) -> list[dict[str, Any]]:
    cases = []
    for i in range(count):
        by_gpus = i % 2 == 1
        make = functools.partial(fit_flags, rng, by_gpus=by_gpus)
        groups = _draw(rng, probe, ["fit", "--json"], make)
        rng.shuffle(groups)
        as_json = i % 3 != 2
        argv = ["fit", *_flat(groups), *(["--json"] if as_json else [])]
        cases.append({"id": f"fit-{'json' if as_json else 'text'}-{i:03d}", "argv": argv})
    return cases


RECOMMEND = [
    [],
    ["--json"],
    ["--format", "json"],
    ["--format", "deepspeed"],
    ["--format", "torchrun"],
    ["--format", "slurm"],
    ["--format", "accelerate"],
    ["--format", "torchrun", "--framework", "deepspeed", "--script", "train.py"],
    [
        "--format",
        "slurm",
        "--framework",
        "megatron",
        "--job-name",
        "rec-7",
        "--time-limit",
        "2-00:00:00",
        "--script",
        "pretrain_gpt.py",
    ],
    ["--format", "slurm", "--framework", "deepspeed", "--objective", "time"],
    ["--format", "accelerate", "--framework", "hf", "--objective", "gpus"],
    ["--format", "deepspeed", "--framework", "deepspeed", "--num-alternatives", "0"],
    ["--json", "--objective", "time", "--num-alternatives", "2"],
    ["--objective", "gpus", "--framework", "hf"],
    ["--format", "accelerate", "--framework", "megatron"],  # not launchable: error
    ["--format", "yaml"],  # unknown format: error
    ["--json", "--objective", "cost,time"],  # one objective only: error
    ["--json", "--time-limit", "tomorrow"],  # bad time: error
    ["--json", "--job-name", "bad name!"],  # bad name: error
    ["--format", "torchrun", "--framework", "megatron", "--precision", "fp8-mixed"],
    ["--json", "--precision", "amp-bf16", "--framework", "torchtitan"],
    ["--format", "slurm"],  # nothing fits (model chosen below): exit 1
]


def recommend_cases(rng: random.Random) -> list[dict[str, Any]]:
    cases = []
    for i, extra in enumerate(RECOMMEND):
        model = rng.choice(SMALL + ("llama-3.1-8b", "mixtral-8x7b"))
        fleet = rng.choice(
            (
                "8xh100-sxm-80gb",
                "4xa100-sxm-80gb",
                "8xa100-sxm-40gb,4xh100-sxm-80gb",
                "16xl40s-48gb",
                "2xrtx-4090-24gb",
            )
        )
        if i == len(RECOMMEND) - 1:
            model, fleet = "llama-3.1-405b", "2xrtx-4090-24gb"
        argv = [
            "recommend",
            "--model",
            model,
            "--fleet",
            fleet,
            "--seq-len",
            str(rng.choice((1024, 2048, 4096))),
            "--global-batch-size",
            str(rng.choice((32, 64, 256))),
            "--max-pp",
            str(rng.choice((1, 2, 4))),
            "--max-cp",
            str(rng.choice((1, 2))),
            "--max-micro-batch-size",
            str(rng.choice((2, 4, 8))),
            *extra,
        ]
        cases.append({"id": f"recommend-{i:02d}", "argv": argv})
    return cases


HEATMAPS = [
    (
        [
            "--x",
            "micro_batch_size",
            "--y",
            "seq_len",
            "--x-values",
            "1,2,4,8",
            "--y-values",
            "1024,2048,4096",
        ],
        "{TMP}/hm.png",
    ),
    (
        [
            "--model",
            "mixtral-8x7b",
            "--gpu",
            "h200-sxm-141gb",
            "--num-gpus",
            "8",
            "--ep",
            "8",
            "--x",
            "zero",
            "--y",
            "recompute",
            "--precision",
            "mixed-bf16",
        ],
        "{TMP}/hm.svg",
    ),
    (["--model", "gpt2", "--gpu", "t4-16gb", "--x", "optimizer", "--y", "precision"], "hm.svg"),
    (
        [
            "--model",
            "llama-3.1-70b",
            "--num-gpus",
            "64",
            "--x",
            "tp",
            "--y",
            "pp",
            "--x-values",
            "1,2,4,8",
            "--y-values",
            "1,2,4,8",
            "--zero",
            "1",
        ],
        "{TMP}/out/tp-pp.svg",
    ),
    (
        [
            "--model",
            "llama-3.2-1b",
            "--gpu",
            "rtx-4090-24gb",
            "--x",
            "lora_rank",
            "--y",
            "qlora",
            "--x-values",
            "0,8,64",
            "--precision",
            "bf16",
        ],
        "{TMP}/lora.svg",
    ),
    (
        [
            "--model",
            "phi-3-mini",
            "--x",
            "attention",
            "--y",
            "seq_len",
            "--y-values",
            "2048,8192,32768",
            "--recompute",
            "full",
        ],
        "{TMP}/attn.svg",
    ),
    (
        [
            "--model",
            "qwen3-30b-a3b",
            "--num-gpus",
            "16",
            "--x",
            "num_gpus",
            "--y",
            "offload",
            "--x-values",
            "8,16,32",
            "--zero",
            "3",
            "--precision",
            "mixed-bf16",
        ],
        "{TMP}/n.svg",
    ),
    (
        [
            "--x",
            "cp",
            "--y",
            "sequence_parallel",
            "--x-values",
            "1,2,4",
            "--num-gpus",
            "8",
            "--tp",
            "2",
            "--headroom",
            "0.2",
        ],
        "{TMP}/cp.svg",
    ),
    (["--x", "loss", "--y", "activation_offload", "--micro-batch-size", "4"], "{TMP}/loss.svg"),
    (["--x", "bogus_axis", "--y", "seq_len"], "{TMP}/bad.svg"),  # unknown axis: error
    (["--x", "micro_batch_size", "--y", "seq_len"], "{TMP}/bad.jpg"),  # bad format: error
    (["--x", "micro_batch_size", "--y", "seq_len", "--where", "zero = 3"], "{TMP}/w.svg"),
]


def heatmap_cases() -> list[dict[str, Any]]:
    return [
        {"id": f"heatmap-{i:02d}", "argv": ["heatmap", *flags, "--out", out, "--json"]}
        for i, (flags, out) in enumerate(HEATMAPS)
    ]


SWEEPS = [
    (
        ["--model", "llama-3.2-1b", "--fleet", "8xa100-sxm-80gb", "--global-batch-size", "64"],
        "{TMP}/sw",
        [],
    ),
    (
        [
            "--model",
            "gpt2",
            "--fleet",
            "4xrtx-4090-24gb",
            "--seq-len",
            "1024",
            "--global-batch-size",
            "32",
            "--objective",
            "time",
        ],
        "sw",
        [],
    ),
    (
        [
            "--model",
            "mixtral-8x7b",
            "--fleet",
            "8xh100-sxm-80gb",
            "--global-batch-size",
            "32",
            "--seq-len",
            "2048",
        ],
        "{TMP}/moe",
        [],
    ),
    (
        [
            "--model",
            "llama-3.1-8b",
            "--fleet",
            "8xh100-sxm-80gb,8xa100-sxm-80gb",
            "--global-batch-size",
            "64",
            "--objective",
            "cost,time",
        ],
        "{TMP}/pareto",
        [],
    ),
    (
        [
            "--model",
            "qwen2.5-7b",
            "--fleet",
            "16xl40s-48gb",
            "--global-batch-size",
            "128",
            "--objective",
            "gpus",
            "--framework",
            "deepspeed",
            "--optimizer",
            "adamw-8bit",
        ],
        "{TMP}/ds",
        [],
    ),
    (
        ["--model", "llama-3.1-70b", "--fleet", "2xrtx-4090-24gb", "--global-batch-size", "16"],
        "{TMP}/none",
        [],
    ),  # nothing fits: "closest"
    (
        [
            "--model",
            "phi-3-mini",
            "--fleet",
            "8xh200-sxm-141gb",
            "--seq-len",
            "8192",
            "--global-batch-size",
            "64",
            "--precision",
            "bf16",
            "--headroom",
            "0.2",
            "--objective",
            "time,gpus",
        ],
        "{TMP}/phi",
        [],
    ),
    (
        [
            "--model",
            "llama-3.2-3b",
            "--fleet",
            "8xh100-sxm-80gb",
            "--global-batch-size",
            "64",
            "--study-name",
            "named-study",
        ],
        "{TMP}/named",
        ["rerun"],
    ),
    (
        [
            "--model",
            "deepseek-v2-lite",
            "--fleet",
            "8xb200-180gb",
            "--global-batch-size",
            "64",
            "--framework",
            "torchtitan",
        ],
        "{TMP}/ds2",
        [],
    ),
    (["--model", "gpt2", "--fleet", "8xh100-sxm-80gb", "--method", "grid"], "{TMP}/bad", []),
    (["--model", "gpt2", "--fleet", "8xh100-sxm-80gb", "--objective", "speed"], "{TMP}/bad", []),
]


def sweep_cases() -> list[dict[str, Any]]:
    cases = []
    for i, (flags, out, extra) in enumerate(SWEEPS):
        sweep = [
            "sweep",
            *flags,
            "--max-pp",
            "2",
            "--max-cp",
            "2",
            "--max-micro-batch-size",
            "4",
            "--out",
            out,
            "--json",
        ]
        steps = [sweep]
        if "rerun" in extra:
            steps.append(sweep)  # every chunk already on disk: chunks_skipped
        steps.append(
            [
                "points",
                out,
                "--where",
                "fits",
                "--sort",
                "peak_device_bytes",
                "--head",
                "3",
                "--json",
            ]
        )
        cases.append({"id": f"sweep-{i:02d}", "steps": steps, "points": True})
    return cases


def list_cases() -> list[dict[str, Any]]:
    return [
        {"id": f"list-{cmd}{'-json' if j else ''}", "argv": [cmd, *(["--json"] if j else [])]}
        for cmd in ("models", "gpus", "optimizers")
        for j in (True, False)
    ]


INPUT_FLAGS = ("--model", "--profile", "--optimizers-dir", "--models-dir", "--hardware-dir")


def readme_case(source: Path) -> dict[str, Any]:
    """Every `trainmem ...` line of the README (tests/test_readme.py's extraction), in order, in
    one folder (later ones read what earlier ones wrote); the tracked files they read, inlined."""
    readme = (source / "README.md").read_text()
    commands = []
    for block in re.findall(r"```(?:bash|console)\n(.*?)```", readme, flags=re.S):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("trainmem "):
                commands.append(line.split("#")[0].strip())
    steps, inputs = [], {}
    for command in commands:
        argv = shlex.split(command)[1:]
        argv = [TMP_ARG + a[len("/tmp") :] if a.startswith("/tmp/") else a for a in argv]
        for flag, value in zip(argv, argv[1:], strict=False):
            if flag in INPUT_FLAGS and not os.path.isabs(value):
                tracked = subprocess.run(
                    ["git", "-C", str(source), "ls-files", "--", value],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                for rel in tracked.split():
                    inputs[rel] = (source / rel).read_text(encoding="utf-8")
        steps.append({"command": command, "argv": argv})
    return {"id": "readme", "steps": steps, "inputs": dict(sorted(inputs.items()))}


# ---- recording ----------------------------------------------------------------------------------

FULL_TEXT = {
    "estimate": lambda cid, n: (
        (cid.startswith("estimate-json") and n % 17 == 0)
        or (cid.startswith("estimate-text") and n % 50 == 0)
    ),
    "fit": lambda cid, n: n % 5 == 0,
}
"""Which cases keep their full stdout (id, number): a few of the big kinds, all of the rest."""


def record(shared: Any, main: Any, case: dict[str, Any], work: Path) -> dict[str, Any]:
    kind = case["id"].split("-")[0]
    number = int(case["id"].rsplit("-", 1)[1]) if case["id"][-1].isdigit() else 0
    keep = FULL_TEXT.get(kind, lambda cid, n: True)(case["id"], number)
    steps = case.get("steps") or [case["argv"]]
    tmp = Path(tempfile.mkdtemp(prefix="case-", dir=work))
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        shared.write_inputs(case, tmp)
        out_steps = []
        with shared.SysCapture() as capture:
            for step in steps:
                extra = {}
                if isinstance(step, dict):
                    extra = {k: v for k, v in step.items() if k != "argv"}
                    step = step["argv"]
                got = shared.run_step(main, step, tmp, capture.readouterr)
                entry: dict[str, Any] = {
                    **extra,
                    "argv": step,
                    "exit_code": got["exit_code"],
                    "exception": got["exception"],
                    "warnings": got["warnings"],
                    "stdout_sha256": shared.sha256(got["stdout"]),
                    "stderr_sha256": shared.sha256(got["stderr"]),
                }
                if keep:
                    entry["stdout"] = got["stdout"]
                if len(got["stderr"]) <= 4000:
                    entry["stderr"] = got["stderr"]
                out_steps.append(entry)
        result: dict[str, Any] = {"id": case["id"], "steps": out_steps}
        if case.get("points"):
            result["points"] = shared.points_digest(tmp)
        if case.get("inputs"):
            result["inputs"] = case["inputs"]
        return result
    finally:
        os.chdir(cwd)
        shutil.rmtree(tmp)


def source_info(source: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(source), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--source", required=True, type=Path, help="pristine checkout whose behaviour is recorded"
    )
    parser.add_argument("--out", type=Path, default=HERE, help="folder of the KIND.json files")
    parser.add_argument(
        "--allow-dirty", action="store_true", help="record even if --source has uncommitted changes"
    )
    parser.add_argument(
        "--refresh",
        default="",
        help="KIND[,KIND]: re-record these kinds' existing cases (same argv) "
        "after a deliberate, reviewed output change",
    )
    args = parser.parse_args(argv)
    source = args.source.resolve()
    info = source_info(source)
    if info["dirty"] and not args.allow_dirty:
        raise SystemExit(f"{source} has uncommitted changes (--allow-dirty to record anyway)")
    work = Path(tempfile.mkdtemp(prefix="trainmem-recordings-"))
    cwd = os.getcwd()
    os.chdir(work)  # the probes run here; each recorded case in a folder of its own
    try:
        use_source(source, work / "shim")
        shared = load_test_module()
        shared.set_environment(os.environ)
        main_fn = shared.cli_main()
        check_source(source, work / "shim")

        def probe(argv: list[str]) -> int | None:
            with shared.SysCapture() as capture:
                return shared.run_step(main_fn, argv, work, capture.readouterr)["exit_code"]

        if args.refresh:
            refresh = [k.strip() for k in args.refresh.split(",") if k.strip()]
            kinds = {}
            for kind in refresh:
                old = json.loads((args.out / f"{kind}.json").read_text(encoding="utf-8"))
                kinds[kind] = [
                    {
                        "id": c["id"],
                        "steps": [
                            {k: s[k] for k in ("command", "argv") if k in s} for s in c["steps"]
                        ],
                        **({"points": True} if "points" in c else {}),
                        **({"inputs": c["inputs"]} if "inputs" in c else {}),
                    }
                    for c in old["cases"]
                ]
            info = {**info, "refreshed": refresh}
        else:
            kinds = {}
        rng = random.Random(SEED)
        kinds = kinds or {
            "estimate": estimate_cases(random.Random(rng.random()), 500, probe),
            "fit": fit_cases(random.Random(rng.random()), 60, probe),
            "recommend": recommend_cases(random.Random(rng.random())),
            "heatmap": heatmap_cases(),
            "sweep": sweep_cases(),
            "lists": list_cases(),
            "readme": [readme_case(source)],
        }
        assert (args.refresh or set(kinds) == set(shared.KINDS)) and shared.TMP == TMP_ARG
        args.out.mkdir(parents=True, exist_ok=True)
        for kind, cases in kinds.items():
            recorded = [record(shared, main_fn, case, work) for case in cases]
            check_source(source, work / "shim")
            payload = {"format": FORMAT, "source": info, "seed": SEED, "cases": recorded}
            text = json.dumps(payload, indent=1, ensure_ascii=False) + "\n"
            (args.out / f"{kind}.json").write_text(text, encoding="utf-8")
            codes: dict[Any, int] = {}
            for c in recorded:
                for s in c["steps"]:
                    codes[s["exit_code"]] = codes.get(s["exit_code"], 0) + 1
            print(
                f"{kind}: {len(recorded)} cases, exit codes {codes}, {len(text.encode()):,} bytes",
                file=sys.__stderr__,
            )
    finally:
        os.chdir(cwd)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
