"""Conformance matrix: the formulas (`estimate`) against the byte-exact trace over a grid.

Needs torch and transformers (the trace extra). Each cell is one training job of a tiny model
built from a preset family (2-3 layers, hidden 256, each family's structure kept: grouped-query
attention, qk biases, qk-norm, a 256 head dim, sliding windows, fused qkv, GPT-2, BERT, mixtures
of experts, MLA) at one setting of precision, attention (and SDPA kernel), recompute, sequence
length, micro-batch and FSDP2 world size. The cell's step is traced on the fake CUDA device
(trainmem.trace: one real HF step; rank 0 of an FSDP2 job on a fake process group for world > 1)
and estimated by the formulas (trainmem.report.estimate_report, the engine behind
`estimate --json`) for the same flags. Per cell: the relative error (estimate / trace - 1) of
parameters (+ master weights), gradients, optimizer states, activations and peak allocated.

Thresholds: 1% on the persistent bytes (parameters, gradients, optimizer states), 2% on
activations and the peak. Prints every cell sorted by its worst error, the worst cell per metric
and the number of cells over the thresholds.

Not in the grid: tensor parallelism (bench/conformance_tp.py), amp-bf16 under FSDP2 (its traced
analogue is mixed-bf16: bf16 all-gathered copies of fp32 shards), QLoRA (the trace refuses it:
bitsandbytes' NF4 kernels need CUDA).

Traces are cached as JSON keyed by a hash of the case (model config, flags, torch and
transformers versions, the trace package's source), so a rerun only re-estimates; the estimate
is never cached (the formulas are what is under test). Cells run in fresh worker processes
(the fake device must exist before autograd starts; see trace/_fake_cuda.py), each trace bounded
by $TRAINMEM_TRACE_TIMEOUT seconds (default here 300) and, if set, the worker's address space by
$TRAINMEM_TRACE_MAX_MEMORY_GB.

Grid: 3766 cells: 3058 as before, 160 per family, 90 for the eager-only gemma2, 204 for gemma3
(three lengths around its window; SDPA and eager) (one GPU: every
precision x attention x recompute x length x micro-batch 1, 2, 4; the efficient and cudnn SDPA
kernels at bf16 and amp-bf16; FSDP2 over 2, 8 and 64 ranks at micro-batch 1 and 2 and the
longest length); FSDP2 over 512 ranks for the 17 dense families (precision x recompute x
micro-batch 1, 2 at the longest length: 204 cells, about 8 minutes with --jobs 2); peft LoRA
(trace/_lora.py, needs peft) for llama, qwen2.5 (tied), mistral, gemma2 and gemma3: precision x
recompute x rank 8, 16 x targets all-linear, q_proj,v_proj x micro-batch 1, 2 on one GPU and
precision x recompute x micro-batch on 8 FSDP2 ranks (300 cells, about 1 minute). About 3
minutes per 4 families with --jobs 2 on two cores and 40 s from the cache; --quick: 43 cells,
about 20 s; --only lora|fsdp512 runs the new slices alone; --only odd a held-out slice off the
grid (odd lengths and FSDP2 worlds, micro-batch 3: 768 cells, about 6 minutes).

--real-size: the real-size cells instead (bench/conformance_real_size.py: 70B dims under FSDP2
over 64 ranks with full recompute, a sliding-window model at its window), from their stored
traces (tests/data/real_size_traces.json; seconds).

Run: python -m bench.conformance [--quick] [--jobs N] [--cache DIR] [--family NAME ...]
     [--only lora|fsdp512|odd] [--limit N] [--all-rows] [--json FILE] [--real-size]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conformance_families import FAMILIES, family_config

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = ROOT / "out" / "conformance-cache"
DEFAULT_TIMEOUT_S = 300.0
PERSISTENT_THRESHOLD = 0.01
TRANSIENT_THRESHOLD = 0.02
METRICS = (
    # (short name, trace key, threshold)
    ("params", "parameters_bytes", PERSISTENT_THRESHOLD),
    ("grads", "gradients_bytes", PERSISTENT_THRESHOLD),
    ("optim", "optimizer_states_bytes", PERSISTENT_THRESHOLD),
    ("acts", "activations_bytes", TRANSIENT_THRESHOLD),
    ("peak", "peak_allocated_bytes", TRANSIENT_THRESHOLD),
)
GPU = "h100-sxm-80gb"
OPTIMIZER = "adamw"

SEQ_LENS: dict[str, tuple[int, ...]] = {
    # below, at and above the window where the family has one
    "mistral": (64, 128, 256),
    "phi3": (64, 127, 256),
    "gemma2": (64, 128, 256),
    "gemma3": (64, 128, 256),
}
DEFAULT_SEQ_LENS = (128, 256)
EAGER_ONLY = ("gemma2",)
"""Families whose transformers model has no SDPA path (Gemma2ForCausalLM: _supports_sdpa is
False): eager cells only."""
PRECISIONS = ("fp32", "bf16", "amp-bf16")
WORLDS = (2, 8, 64)
WIDE_WORLD = 512
"""FSDP2's widest world: the dense families only, on a slice (wide_fsdp_cells)."""
MOE_FAMILIES = ("mixtral", "qwen3-moe", "deepseek-v2")
LORA_FAMILIES = ("llama", "qwen2.5", "mistral", "gemma2", "gemma3")
"""LoRA cells: GQA, a tied embedding with q/k/v biases (qwen2.5), a sliding window, the
eager-only Gemma 2 (sandwich norms, soft-capping), Gemma 3 (frozen q/k norms)."""
LORA_RANKS = (8, 16)
LORA_TARGETS = ("all-linear", "q_proj,v_proj")


def case_name(case: dict[str, Any]) -> str:
    kernel = case["attention"] if case["attention"] == "eager" else f"sdpa-{case['sdpa_kernel']}"
    lora = f" lora={case['lora_rank']}/{case['lora_targets']}" if case.get("lora_rank") else ""
    return (
        f"{case['family']} {case['precision']} {kernel} rc={case['recompute']}{lora} "
        f"s={case['seq_len']} mb={case['micro_batch_size']} fsdp={case['num_gpus']}"
    )


def _case(*fields: Any, lora: tuple[int, str] | None = None) -> dict[str, Any]:
    """A cell from (family, precision, attention, sdpa kernel, recompute, seq_len, micro-batch,
    world); `lora`: (rank, targets) of peft LoRA adapters (keys only LoRA cells have, so the
    other cells keep their cache keys)."""
    family, precision, attention, kernel, recompute, s, mb, world = fields
    if world > 1 and precision == "amp-bf16":
        precision = "mixed-bf16"  # FSDP2's mixed precision: the traced analogue of amp
    extra = {"lora_rank": lora[0], "lora_targets": lora[1]} if lora else {}
    return {
        "family": family,
        "precision": precision,
        "attention": attention,
        "sdpa_kernel": kernel,
        "recompute": recompute,
        "seq_len": s,
        "micro_batch_size": mb,
        "num_gpus": world,
        **extra,
    }


def lora_cells(names: list[str]) -> list[dict[str, Any]]:
    """peft LoRA on one GPU: precision x recompute x rank x targets x micro-batch at the longest
    length; FSDP2 over 8 ranks on a slice (all-linear, rank 8)."""
    cells = []
    for fam in (f for f in LORA_FAMILIES if f in names):
        s = SEQ_LENS.get(fam, DEFAULT_SEQ_LENS)[-1]
        a = "eager" if fam in EAGER_ONLY else "flash"
        for p, r, rank, targets, mb in itertools.product(
            PRECISIONS, ("none", "full"), LORA_RANKS, LORA_TARGETS, (1, 2)
        ):
            cells.append(_case(fam, p, a, "flash", r, s, mb, 1, lora=(rank, targets)))
        for p, r, mb in itertools.product(PRECISIONS, ("none", "full"), (1, 2)):
            cells.append(_case(fam, p, a, "flash", r, s, mb, 8, lora=(8, "all-linear")))
    return cells


def wide_fsdp_cells(names: list[str]) -> list[dict[str, Any]]:
    """FSDP2 over WIDE_WORLD ranks: dense families, precision x recompute x micro-batch 1, 2 at
    the longest length."""
    cells = []
    for fam in (f for f in names if f not in MOE_FAMILIES):
        s = SEQ_LENS.get(fam, DEFAULT_SEQ_LENS)[-1]
        a = "eager" if fam in EAGER_ONLY else "flash"
        for p, r, mb in itertools.product(PRECISIONS, ("none", "full"), (1, 2)):
            cells.append(_case(fam, p, a, "flash", r, s, mb, WIDE_WORLD))
    return cells


ODD_LENGTHS = (100, 129, 200, 257)
"""--only odd: lengths off the grid's powers of two (not multiples of 16: the masks' padding;
one past a 128-token window; 2^k + 1)."""
ODD_WORLDS = (16, 24, 48)
"""--only odd: FSDP2 worlds between the grid's (24 and 48 are not powers of two)."""
ODD_FAMILIES = ("mistral", "phi3", "gemma2", "gemma3", "qwen3", "llama", "gpt2")
ODD_FSDP_FAMILIES = ("llama", "qwen2.5", "mistral", "gemma3", "qwen3-moe", "phi3")


def odd_cells(names: list[str]) -> list[dict[str, Any]]:
    """A held-out slice, off the default grid (`--only odd`): one GPU at ODD_LENGTHS x micro-batch
    1 and 3 (every precision, flash and eager, recompute none and full), and FSDP2 over
    ODD_WORLDS x micro-batch 1 and 3 (bf16 and mixed-bf16, recompute none and full, 256 tokens).
    Checked once when the matrix was last extended (2026-12-01: 768 cells, none over a
    threshold); rerun it after a formula change."""
    cells = []
    for fam in (f for f in ODD_FAMILIES if f in names):
        attentions = ("eager",) if fam in EAGER_ONLY else ("flash", "eager")
        for s, p, a, mb, r in itertools.product(
            ODD_LENGTHS, PRECISIONS, attentions, (1, 3), ("none", "full")
        ):
            cells.append(_case(fam, p, a, "flash", r, s, mb, 1))
    for fam in (f for f in ODD_FSDP_FAMILIES if f in names):
        for w, mb, r, p in itertools.product(
            ODD_WORLDS, (1, 3), ("none", "full"), ("bf16", "mixed-bf16")
        ):
            cells.append(_case(fam, p, "flash", "flash", r, 256, mb, w))
    return _unique(cells)


def grid(*, quick: bool, families: list[str] | None = None) -> list[dict[str, Any]]:
    """The cells: one GPU fully crossed; FSDP2 worlds and the other SDPA kernels on slices."""
    names = families or list(FAMILIES)
    cells: list[dict[str, Any]] = []
    if quick:
        for fam in names:
            s = SEQ_LENS.get(fam, DEFAULT_SEQ_LENS)[-1 if fam in SEQ_LENS else 0]
            quick_attention = "eager" if fam in EAGER_ONLY else "flash"
            cells.append(_case(fam, "amp-bf16", quick_attention, "flash", "none", s, 2, 1))
            cells.append(_case(fam, "bf16", "eager", "flash", "full", s, 1, 1))
        for fam in names[:3]:
            cells.append(_case(fam, "amp-bf16", "flash", "flash", "none", 128, 2, 8))
        return _unique(cells)
    for fam in names:
        lens = SEQ_LENS.get(fam, DEFAULT_SEQ_LENS)
        attentions = ("eager",) if fam in EAGER_ONLY else ("flash", "eager")
        # one GPU: every precision x attention x recompute x length x micro-batch
        for p, a, r, s, mb in itertools.product(
            PRECISIONS, attentions, ("none", "full"), lens, (1, 2, 4)
        ):
            cells.append(_case(fam, p, a, "flash", r, s, mb, 1))
        # the other SDPA kernels (the formulas have no kernel flag: they assume the GPU's pick)
        for k, p, r, s in itertools.product(
            ("efficient", "cudnn"), ("bf16", "amp-bf16"), ("none", "full"), lens
        ):
            if fam not in EAGER_ONLY:
                cells.append(_case(fam, p, "flash", k, r, s, 2, 1))
        # FSDP2: every world x precision x recompute x attention, one length, micro-batch 1, 2
        for w, p, r, a, mb in itertools.product(
            WORLDS, PRECISIONS, ("none", "full"), attentions, (1, 2)
        ):
            cells.append(_case(fam, p, a, "flash", r, lens[-1], mb, w))
    cells += wide_fsdp_cells(names) + lora_cells(names)
    return _unique(cells)


def _unique(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for c in cells:
        seen.setdefault(json.dumps(c, sort_keys=True), c)
    return list(seen.values())


def _trace_fingerprint() -> str:
    """torch and transformers versions and the trace package's source: a changed tracer misses
    the cache."""
    import importlib.metadata as md

    h = hashlib.sha256()
    for dist in ("torch", "transformers"):
        try:
            h.update(f"{dist}={md.version(dist)};".encode())
        except md.PackageNotFoundError:
            h.update(f"{dist}=none;".encode())
    for path in sorted((ROOT / "trace").glob("*.py")):
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


def job_key(config: dict[str, Any], case: dict[str, Any], fingerprint: str) -> str:
    """The cache key of a cell: the traced job (its config and flags), not the family's name."""
    what = {
        "config": config,
        **{k: v for k, v in case.items() if k != "family"},
        "optimizer": OPTIMIZER,
        "trace": fingerprint,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]


def case_key(case: dict[str, Any], fingerprint: str) -> str:
    """The cache key of a family cell (job_key)."""
    return job_key(family_config(case["family"]), case, fingerprint)


def read_cached(cache: Path, key: str) -> dict[str, Any] | None:
    """A cell's cached trace result, None when absent or unreadable (traced again)."""
    path = cache / f"{key}.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def write_cached(cache: Path, key: str, result: dict[str, Any]) -> None:
    """Cache a cell's trace result (atomically), unless it is transient (a timeout, a dead
    worker: traced again next time)."""
    if not result.get("transient"):
        tmp = cache / f"{key}.json.tmp"
        tmp.write_text(json.dumps(result))
        tmp.replace(cache / f"{key}.json")


# ---- worker side (a fresh process: the fake device exists before autograd starts) ----


class _Timeout(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout


def trace_case(case: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """{"measured": the trace} or {"error": one line} (with "transient": True for a timeout)."""
    config = family_config(case["family"])
    flags = {
        "micro_batch_size": case["micro_batch_size"],
        "seq_len": case["seq_len"],
        "precision": case["precision"],
        "recompute": case["recompute"],
        "attention": case["attention"],
        "optimizer": OPTIMIZER,
        "sdpa_kernel": case["sdpa_kernel"],
    }
    if case.get("lora_rank"):
        flags.update(lora_rank=case["lora_rank"], lora_targets=case["lora_targets"])

    def run() -> dict[str, Any]:
        if case["num_gpus"] > 1:
            from trainmem.trace._dist import trace_parallel

            return trace_parallel(
                config, num_gpus=case["num_gpus"], zero=3, tp=1, sequence_parallel=False, **flags
            )
        from trainmem.trace._core import trace_step

        return trace_step(config, **flags)

    return guarded_trace(run, timeout_s)


def guarded_trace(run: Callable[[], dict[str, Any]], timeout_s: float) -> dict[str, Any]:
    """{"measured": run()'s trace, "trace_s"} or {"error": one line} (with "transient": True
    for a timeout or an out-of-memory: traced again next time), within `timeout_s` (SIGALRM)."""
    start = time.time()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        measured = run()
    except _Timeout:
        return {"error": f"trace ran past {timeout_s:g} s", "transient": True}
    except MemoryError:
        return {"error": "trace ran out of memory", "transient": True}
    except Exception as exc:  # a cell the trace cannot run: recorded, not fatal
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        return {"error": f"{type(exc).__name__}: {first}"}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    for key in ("activations_by_layer_bytes",):  # keep cache files small
        measured.pop(key, None)
    return {"measured": measured, "trace_s": time.time() - start}


# ---- parent side ----


def config_file(family: str, folder: Path) -> str:
    """The family's tiny config.json (the estimate reads a path)."""
    return write_config(family_config(family), folder / f"{family}.json")


def write_config(config: dict[str, Any], path: Path) -> str:
    """`config` as a config.json at `path`, rewritten only when it changed; its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(config, indent=1, sort_keys=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return str(path)


def estimate_case(case: dict[str, Any], config_path: str) -> dict[str, Any]:
    """The formulas' comparable figures for the cell (as trace_report compares them)."""
    from trainmem.report import estimate_report
    from trainmem.trace._report import _estimate_figures

    world = case["num_gpus"]
    report = estimate_report(
        model=config_path,
        gpu=GPU,
        seq_len=case["seq_len"],
        micro_batch_size=case["micro_batch_size"],
        precision=case["precision"],
        optimizer=OPTIMIZER,
        recompute=case["recompute"],
        attention=case["attention"],
        framework="hf",
        num_gpus=world,
        zero=3 if world > 1 else 0,
        tp=1,
        sequence_parallel=False,
        lora_rank=case.get("lora_rank", 0),
        lora_targets=case.get("lora_targets", "all-linear"),
    )
    return _estimate_figures(report)


def compare(measured: dict[str, Any], predicted: dict[str, Any]) -> dict[str, Any]:
    """Per metric: relative error (estimate / trace - 1), exact or not, and the bytes."""
    out: dict[str, Any] = {}
    for name, key, _ in METRICS:
        got, want = measured.get(key), predicted.get(key)
        if got is None or want is None:
            out[name] = None
            continue
        err = 0.0 if got == want else (want / got - 1.0 if got else float("inf"))
        out[name] = {"error": err, "exact": got == want, "trace": got, "estimate": want}
    return out


WORKER_TASKS = 200
"""Cells a worker traces before the parent replaces it with a fresh one (bounds its memory)."""


class _Worker:
    """A trace worker: `python -m bench.conformance --worker`, one JSON case per stdin line, one
    JSON result per stdout line, in its own process group (stopped with it)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.conformance", "--worker"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None if os.environ.get("TRAINMEM_CONFORMANCE_STDERR") else subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.tasks = 0
        self.job: tuple[str, dict[str, Any]] | None = None
        self.since = 0.0

    def send(self, key: str, case: dict[str, Any], timeout_s: float) -> None:
        assert self.proc.stdin is not None
        self.job, self.since, self.tasks = (key, case), time.time(), self.tasks + 1
        self.proc.stdin.write(json.dumps({"case": case, "timeout_s": timeout_s}) + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            self.proc.kill()
        self.proc.wait()


def worker_main() -> None:
    """The worker's loop (see _Worker)."""
    from trainmem.trace._child import _cap_memory

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the workers
    _cap_memory()
    answers = os.fdopen(os.dup(1), "w")  # the protocol's channel; anything printed goes to stderr
    os.dup2(2, 1)
    for line in sys.stdin:
        request = json.loads(line)
        result = trace_case(request["case"], request["timeout_s"])
        answers.write(json.dumps(result) + "\n")
        answers.flush()


def run_traces(
    cases: list[dict[str, Any]], *, cache: Path, jobs: int, timeout_s: float
) -> dict[str, dict[str, Any]]:
    """Every cell's trace result (from the cache, else traced by the workers and cached)."""
    fingerprint = _trace_fingerprint()
    results: dict[str, dict[str, Any]] = {}
    todo: list[tuple[str, dict[str, Any]]] = []
    cache.mkdir(parents=True, exist_ok=True)
    for case in cases:
        key = case_key(case, fingerprint)
        cached = read_cached(cache, key)
        if cached is not None:
            results[key] = cached
        else:
            todo.append((key, case))
    print(f"{len(cases)} cells: {len(cases) - len(todo)} cached, {len(todo)} to trace", flush=True)
    if not todo:
        return results
    start = time.time()
    queue = list(reversed(todo))
    workers: list[_Worker] = []
    done = 0

    def record(key: str, case: dict[str, Any], result: dict[str, Any]) -> None:
        nonlocal done
        result["case"] = case
        results[key] = result
        write_cached(cache, key, result)
        done += 1
        if done % 25 == 0 or done == len(todo):
            print(f"  traced {done}/{len(todo)} in {time.time() - start:.0f} s", flush=True)

    try:
        while queue or any(w.job for w in workers):
            # keep `jobs` workers, each with a cell
            workers = [w for w in workers if w.proc.poll() is None or w.job]
            while queue and sum(1 for w in workers if not w.job) < 1 and len(workers) < jobs:
                workers.append(_Worker())
            for w in workers:
                if not w.job and queue:
                    w.send(*queue.pop(), timeout_s)
            busy = {w.proc.stdout: w for w in workers if w.job and w.proc.stdout}
            ready, _, _ = select.select(list(busy), [], [], 1.0)
            for stream in ready:
                w = busy[stream]
                line = stream.readline()
                key, case = w.job  # type: ignore[misc]
                w.job = None
                if line:
                    record(key, case, json.loads(line))
                else:  # the worker died (killed, out of memory)
                    code = w.proc.wait()
                    record(key, case, {"error": f"worker exit {code}", "transient": True})
                    w.stop()
                if w.tasks >= WORKER_TASKS:
                    w.stop()
                    workers.remove(w)
            for w in list(workers):  # a worker stuck past its own alarm
                if w.job and time.time() - w.since > timeout_s + 60:
                    key, case = w.job
                    w.job = None
                    w.stop()
                    workers.remove(w)
                    record(key, case, {"error": "worker stuck; killed", "transient": True})
            workers = [w for w in workers if w.proc.poll() is None]
    finally:
        for w in workers:  # our own workers, by process group: none left behind
            w.stop()
    return results


def evaluate(
    cases: list[dict[str, Any]], results: dict[str, dict[str, Any]], config_dir: Path
) -> list[dict[str, Any]]:
    """One row per cell: its errors (or why there are none)."""
    return scored_rows(
        cases,
        results,
        name=case_name,
        key=case_key,
        predict=lambda case: estimate_case(case, config_file(case["family"], config_dir)),
    )


def scored_rows(
    cases: list[dict[str, Any]],
    results: dict[str, dict[str, Any]],
    *,
    name: Callable[[dict[str, Any]], str],
    key: Callable[[dict[str, Any], str], str],
    predict: Callable[[dict[str, Any]], dict[str, Any]],
) -> list[dict[str, Any]]:
    """scored_row of every cell: its `name`, its traced result (by `key` with the trace's
    fingerprint) and the estimate `predict` makes of it."""
    fingerprint = _trace_fingerprint()
    return [
        scored_row(
            case,
            name(case),
            results.get(key(case, fingerprint)),
            lambda case=case: predict(case),
        )
        for case in cases
    ]


def scored_row(
    case: dict[str, Any],
    name: str,
    result: dict[str, Any] | None,
    predict: Callable[[], dict[str, Any]],
) -> dict[str, Any]:
    """A cell's row: the trace `result` against `predict()`'s figures, per metric (compare),
    the worst error in thresholds and the metrics over theirs; or why there is none (not
    traced, the trace's error, the estimate's error). bench/conformance_tp.py scores its cells
    with it too."""
    row: dict[str, Any] = {"case": case, "name": name}
    if result is None or "measured" not in result:
        row["error"] = (result or {}).get("error", "not traced")
        return row
    try:
        predicted = predict()
    except Exception as exc:
        row["error"] = f"estimate: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return row
    row["metrics"] = compare(result["measured"], predicted)
    row["worst"] = max(
        (abs(m["error"]) / thr for (n, _, thr), m in
         ((x, row["metrics"][x[0]]) for x in METRICS) if m),
        default=0.0,
    )  # fmt: skip
    row["over"] = [
        n for n, _, thr in METRICS if row["metrics"][n] and abs(row["metrics"][n]["error"]) > thr
    ]
    return row


def _cell(m: dict[str, Any] | None) -> str:
    if m is None:
        return f"{'-':>9}"
    if m["exact"]:
        return f"{'exact':>9}"
    return f"{m['error']:>+9.2%}"


def print_report(rows: list[dict[str, Any]], *, all_rows: bool) -> None:
    ok = [r for r in rows if "metrics" in r]
    ok.sort(key=lambda r: -r["worst"])
    names = [n for n, _, _ in METRICS]
    print()
    print(f"{'cell':<58}" + "".join(f"{n:>9}" for n in names))
    shown = ok if all_rows else [r for r in ok if r["over"]] + [r for r in ok if not r["over"]][:20]
    for r in shown:
        print(f"{r['name']:<58}" + "".join(_cell(r["metrics"][n]) for n in names))
    if not all_rows and len(shown) < len(ok):
        print(f"... {len(ok) - len(shown)} more cells within the thresholds (--all-rows)")
    failed = [r for r in rows if "metrics" not in r]
    if failed:
        print(f"\n{len(failed)} cells without a comparison:")
        for r in failed:
            print(f"  {r['name']}: {r['error']}")
    print("\nworst cell per metric:")
    for n, _, thr in METRICS:
        have = [r for r in ok if r["metrics"][n]]
        if not have:
            continue
        worst = max(have, key=lambda r: abs(r["metrics"][n]["error"]))
        over = sum(abs(r["metrics"][n]["error"]) > thr for r in have)
        exact = sum(r["metrics"][n]["exact"] for r in have)
        m = worst["metrics"][n]
        print(
            f"  {n:<7}{m['error']:>+9.3%}  {worst['name']}  ({over} of {len(have)} cells over "
            f"{thr:.0%}; {exact} exact)"
        )
    print("\ncells over a threshold, grouped (all lengths and micro-batches of a setting):")
    for n, _, thr in METRICS:
        groups: dict[str, list[tuple[float, str]]] = {}
        for r in ok:
            m = r["metrics"][n]
            if m and abs(m["error"]) > thr:
                c = r["case"]
                head = r["name"].rsplit(" s=", 1)[0] + f" fsdp={c['num_gpus']}"
                where = f"s={c['seq_len']}/mb={c['micro_batch_size']}"
                groups.setdefault(head, []).append((m["error"], where))
        for head, items in sorted(groups.items(), key=lambda kv: -max(abs(e) for e, _ in kv[1])):
            errs = [e for e, _ in items]
            print(
                f"  {n:<7}{head:<48}{min(errs):>+9.2%} ..{max(errs):>+8.2%}  "
                + " ".join(w for _, w in sorted(items, key=lambda x: x[1]))
            )
    bad = [r for r in ok if r["over"]]
    persistent = sum(any(n in ("params", "grads", "optim") for n in r["over"]) for r in ok)
    transient = sum(any(n in ("acts", "peak") for n in r["over"]) for r in ok)
    print(
        f"\n{len(ok)} cells compared: {persistent} over {PERSISTENT_THRESHOLD:.0%} on persistent "
        f"bytes, {transient} over {TRANSIENT_THRESHOLD:.0%} on activations or peak, {len(bad)} "
        f"over a threshold in all; {len(failed)} not compared"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small subset (about 40 cells)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--cache", default=str(DEFAULT_CACHE), help="trace cache folder")
    parser.add_argument("--family", action="append", choices=list(FAMILIES), help="only these")
    parser.add_argument(
        "--only",
        choices=("lora", "fsdp512", "odd"),
        help="only the LoRA cells, the 512-rank ones, or the held-out odd lengths and worlds",
    )
    parser.add_argument("--limit", type=int, default=0, help="only the first N cells")
    parser.add_argument("--all-rows", action="store_true", help="print every cell's row")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument(
        "--real-size", action="store_true", help="the real-size cells, from their stored traces"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    if args.real_size:
        from bench.conformance_real_size import real_size_rows

        rows = real_size_rows()
        print_report(rows, all_rows=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
        return 0
    cases = grid(quick=args.quick, families=args.family)
    if args.only == "odd":
        cases = odd_cells(args.family or list(FAMILIES))
    elif args.only == "lora":
        cases = [c for c in cases if c.get("lora_rank")]
    elif args.only == "fsdp512":
        cases = [c for c in cases if c["num_gpus"] == WIDE_WORLD]
    if args.limit:
        cases = cases[: args.limit]
    raw_timeout = os.environ.get("TRAINMEM_TRACE_TIMEOUT", "").strip()
    timeout_s = float(raw_timeout) if raw_timeout else DEFAULT_TIMEOUT_S
    cache = Path(args.cache)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)  # `timeout` stops the pool too
    start = time.time()
    results = run_traces(cases, cache=cache, jobs=max(1, args.jobs), timeout_s=timeout_s)
    rows = evaluate(cases, results, cache / "configs")
    print_report(rows, all_rows=args.all_rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{time.time() - start:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
