"""Measured training-step time on one CUDA GPU next to the step-time model's prediction.

Measure (needs torch and transformers, not trainmem's dependencies, and a GPU; trainmem itself is
not imported): python bench/gpu_step_time.py measure --out FILE.json
Each case builds a Hugging Face Llama from a preset's config.json (random weights, sdpa
attention), runs warm-up steps, then times steps (loss = model(input_ids, labels=input_ids).loss;
backward; AdamW step; zero_grad) between torch.cuda.synchronize() calls.

Compare (here): python -m bench.gpu_step_time compare FILE.json --gpu h200-sxm-141gb
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

PRESETS = Path(__file__).resolve().parent.parent / "catalog" / "presets"
CASES = [
    # model, precision, recompute, micro-batch, sequence
    ("llama-3.2-1b", "bf16", "none", 4, 2048),
    ("llama-3.2-1b", "bf16", "full", 4, 2048),
    ("llama-3.2-1b", "bf16", "none", 1, 8192),
    ("llama-3.2-1b", "amp-bf16", "none", 4, 2048),
    ("llama-2-7b", "bf16", "full", 2, 4096),
]
WARMUP_STEPS, TIMED_STEPS = 2, 5


def measure_case(model_name: str, precision: str, recompute: str, mbs: int, seq: int) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = json.loads((PRESETS / f"{model_name}.json").read_text())
    config = AutoConfig.for_model(
        fields["model_type"], **{k: v for k, v in fields.items() if k != "model_type"}
    )
    config._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    if recompute == "full":
        model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, config.vocab_size, (mbs, seq), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "amp-bf16"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(WARMUP_STEPS):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(TIMED_STEPS):
        step()
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - start) / TIMED_STEPS
    result = {
        "model": model_name,
        "precision": precision,
        "recompute": recompute,
        "micro_batch_size": mbs,
        "seq_len": seq,
        "step_time_s": step_s,
        "tokens_per_second": mbs * seq / step_s,
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
    }
    return result


def compare(path: Path, gpu: str) -> None:
    from trainmem.catalog import load_model
    from trainmem.engine import estimate_time, make_grid, time_inputs
    from trainmem.hardware import get_gpu

    inputs = time_inputs(get_gpu(gpu))
    for r in json.loads(path.read_text())["cases"]:
        grid = make_grid(
            micro_batch_size=r["micro_batch_size"],
            seq_len=r["seq_len"],
            precision=r["precision"],
            recompute=r["recompute"],
            framework="hf",
        )
        out = estimate_time(load_model(r["model"]), grid, **inputs)
        predicted = float(out["tokens_per_second"][0])
        print(
            f"{r['model']:14s} {r['precision']:9s} {r['recompute']:5s} b{r['micro_batch_size']} "
            f"s{r['seq_len']:<5d} measured {r['tokens_per_second']:9.0f} tokens/s, predicted "
            f"{predicted:9.0f} ({predicted / r['tokens_per_second'] - 1:+.1%}), "
            f"MFU predicted {float(out['mfu'][0]):.1%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("compare")
    c.add_argument("file", type=Path)
    c.add_argument("--gpu", default="h200-sxm-141gb")
    args = parser.parse_args()
    if args.command == "compare":
        compare(args.file, args.gpu)
        return
    results = []
    for case in CASES:
        import torch

        results.append(measure_case(*case))
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        print(json.dumps(results[-1]), flush=True)
        args.out.write_text(json.dumps({"cases": results}, indent=1))


if __name__ == "__main__":
    main()
