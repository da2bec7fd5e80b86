"""Measure real training steps on a CUDA GPU, next to trainmem's prediction.

Needs torch and transformers (not trainmem's dependencies) and a GPU. For each case it runs, in a
fresh process: one warm-up step, then one measured step of a Hugging Face causal LM built from a
config (random weights, no hub), exactly as the ground truth was traced (loss = model(input_ids,
labels=input_ids).loss; backward; optimizer.step(); zero_grad(set_to_none=True)). It reports
torch.cuda.max_memory_allocated / max_memory_reserved, the device memory in use (NVML) at the
end, and the CUDA context (NVML used minus torch reserved right after CUDA initialises).

Run: python -m bench.gpu_calibrate [--out FILE.json] [--case NAME ...]
Use the figures to calibrate `--overhead cuda_context_bytes=...` and
`--overhead fragmentation_fraction=...` for your cluster.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CASES = {
    # name: (ground-truth file, precision, recompute)
    "llama-3.2-1b_amp_s2048_mb2": ("llama-3.2-1b_amp_s2048_mb2.json", "amp-bf16", "none"),
    "tinyllama-1.1b_bf16_s2048_mb8_ckpt": (
        "tinyllama-1.1b_bf16_s2048_mb8_ckpt.json",
        "bf16",
        "full",
    ),
    "llama-2-7b_bf16_s2048_mb1": ("llama-2-7b_bf16_s2048_mb1.json", "bf16", "none"),
}
GROUNDTRUTH = Path(__file__).resolve().parent.parent / "tests" / "data" / "groundtruth"


def _nvml_used_bytes() -> int:
    import pynvml  # nvidia-ml-py

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)


def run_case(name: str) -> dict[str, object]:
    """One case in this process (call in a fresh process: the context is measured here)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    gt_file, precision, recompute = CASES[name]
    case = json.loads((GROUNDTRUTH / gt_file).read_text())
    t = case["training"]
    baseline_used = _nvml_used_bytes()
    torch.zeros(1, device="cuda")
    context = _nvml_used_bytes() - baseline_used - torch.cuda.memory_reserved()
    cfg_fields = {k: v for k, v in case["model_config"].items() if k != "model_type"}
    config = AutoConfig.for_model(case["model_config"]["model_type"], **cfg_fields)
    config._attn_implementation = "sdpa" if t["attention"] == "flash" else "eager"
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    if recompute == "full":
        model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    ids = torch.randint(0, config.vocab_size, (t["micro_batch_size"], t["seq_len"]), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "amp-bf16"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return {
        "case": name,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "total_memory_bytes": torch.cuda.get_device_properties(0).total_memory,
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "nvml_used_bytes": _nvml_used_bytes() - baseline_used,
        "cuda_context_bytes": context,
        "groundtruth_peak_allocated": case["bytes"]["peak_allocated"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--out", default="")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_case(args.one)))
        return
    results = []
    for name in args.case or list(CASES):
        proc = subprocess.run(
            [sys.executable, "-m", "bench.gpu_calibrate", "--one", name],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            results.append({"case": name, "error": proc.stderr.strip().splitlines()[-1:]})
        else:
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
