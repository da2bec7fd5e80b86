"""Regenerate real_size_traces.json: one rank's traced memory of real-size jobs on trainmem's fake
CUDA device (no GPU, no real memory), for issue 26's real-size cells.

Cells "fsdp70b-*": Llama-3-70B dims (catalog/presets/llama-3-70b.json: hidden 8192, 80 layers,
64 heads, 8 kv heads, ffn 28672, vocab 128256), Hugging Face LlamaForCausalLM as
trainmem.trace._dist.fsdp_job builds it: gradient checkpointing on every decoder layer (HF's
`gradient_checkpointing_enable`, `--recompute full`), then torch's fully_shard on each layer
and the root over a 1-D mesh of 64 fake ranks, MixedPrecisionPolicy(param bf16, reduce fp32),
AdamW (foreach), SDPA as flash, seq 4096 at micro-batch 1, 2, 4 and seq 8192 at 1, 2. All 80
layers are traced (about one minute a cell).
Cells "swa-*": sliding-window models at seq_len = their window, one GPU, amp-bf16, no
recompute, micro-batch 1, AdamW, all layers: Mistral-7B (window 4096), Phi-3-mini (2047),
Gemma-3-1B (512, five sliding layers to one global).

Per fsdp cell, besides trace_step's keys: live bytes by category at the backward peak
(live_at_backward_peak_by_category) and at the highest point once the blocks' backward began
(live_at_blocks_backward_peak_by_category): parameter shards; FSDP2's unsharded bf16 parameters
(each FSDPParam's all_gather_outputs and _unsharded_param storages, with the number of FSDP
groups that have any allocated); older than the measured step (optimizer states); made in the
forward inside blocks / outside; made in the backward by op (>= 64 MiB with shape and dtype).

Not run at test time (tests/golden/test_real_size_traces.py reads the JSON). One cell per
process (a fake process group per process):

    PYTHONPATH=<trainmem parent> python tests/data/make_real_size_traces.py CELL  # /tmp/rst/
    python tests/data/make_real_size_traces.py --merge                           # the JSON
    (CELL: a name in CELLS; about 1-2 minutes and 2 GB
    of host memory a cell)
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "framework_traces"))
from _trace_origins import TRACKERS  # noqa: E402, I001  (patches the Tracker: origins)

import torch  # noqa: E402
from torch.utils.weak import WeakIdKeyDictionary  # noqa: E402

import trainmem.trace._step as step  # noqa: E402

OUT = HERE / "real_size_traces.json"
SCRATCH = Path("/tmp/rst")
PRESETS = HERE.parents[1] / "catalog" / "presets"
CELLS = {  # name: (preset, world, micro-batch, seq, precision, recompute)
    "fsdp70b-mb1": ("llama-3-70b", 64, 1, 4096, "mixed-bf16", "full"),
    "fsdp70b-mb2": ("llama-3-70b", 64, 2, 4096, "mixed-bf16", "full"),
    "fsdp70b-mb4": ("llama-3-70b", 64, 4, 4096, "mixed-bf16", "full"),
    "fsdp70b-s8192-mb1": ("llama-3-70b", 64, 1, 8192, "mixed-bf16", "full"),
    "fsdp70b-s8192-mb2": ("llama-3-70b", 64, 2, 8192, "mixed-bf16", "full"),
    "swa-mistral7b": ("mistral-7b", 1, 1, 4096, "amp-bf16", "none"),
    "swa-phi3mini": ("phi-3-mini", 1, 1, 2047, "amp-bf16", "none"),
    "swa-gemma3-1b": ("gemma-3-1b", 1, 1, 512, "amp-bf16", "none"),
}


def preset(name: str) -> dict:
    config = json.loads((PRESETS / f"{name}.json").read_text())
    config.pop("_source", None)
    return config


def classify(tracker, marks: dict, unsharded) -> dict:
    """Live bytes by category, now (byte counts only: no storages kept)."""
    out: dict = {}
    start, fwd_end = marks.get("start", 0), marks.get("fwd_end", 1 << 62)
    groups: set = set()
    for storage, (cell, seq, owner) in list(tracker.live.items()):
        if storage in tracker.parameter_storages:
            key = "parameter shards (fp32)"
        elif storage in unsharded:
            key = "FSDP unsharded params (bf16, allocated)"
            if cell[0]:
                groups.add(unsharded[storage])
        elif seq <= start:
            key = "older than step (optimizer states, ...)"
        elif seq <= fwd_end:
            key = ("saved activations in blocks" if isinstance(owner, int) and owner >= 0
                   else "saved/forward tensors outside blocks")
        else:
            op, shape, dtype = tracker.origins.get(storage, ("?", [], "?"))
            key = "made in backward: " + op.removeprefix("aten.").removesuffix(".default")
            if cell[0] >= 1 << 26:
                key += f" {shape} {dtype}"
        out[key] = out.get(key, 0) + cell[0]
    out["FSDP groups unsharded (count)"] = len(groups)
    return out


def trace_fsdp(name: str) -> dict:
    from torch.distributed.fsdp import FSDPModule

    from trainmem.trace._core import step_contexts, unpacked_batches
    from trainmem.trace._dist import fake_fsdp_device_handle, fake_process_group, fsdp_job

    model_name, world, mb, seq, precision, recompute = CELLS[name]
    config = preset(model_name)
    plain_build = fsdp_job(config, num_gpus=world, micro_batch_size=mb, seq_len=seq,
                           precision=precision, recompute=recompute, attention="flash")
    info: dict = {}
    marks: dict = {}
    unsharded = WeakIdKeyDictionary()

    def build():
        job = plain_build()
        info["model"] = job.model
        last = step.find_blocks(job.model)[1][-1]

        def last_block_done(module, args, output):
            marks["blocks_bwd"] = False
            out = output[0] if isinstance(output, tuple) else output
            if out.requires_grad:
                out.register_hook(lambda g: marks.__setitem__("blocks_bwd", True))

        last.register_forward_hook(last_block_done)
        return job

    plain_note = step.Tracker._note_peak

    def note_peak(self):
        before = self.peaks.get(self.phase, -1)
        plain_note(self)
        if self.phase != "backward" or not marks.get("measured"):
            return
        if self.peaks["backward"] > before:
            marks["snap"] = (self.current_bytes, classify(self, marks, unsharded))
        if marks.get("blocks_bwd") and self.current_bytes > marks.get("bsnap", (0,))[0]:
            marks["bsnap"] = (self.current_bytes, classify(self, marks, unsharded))

    def on_phase_end(phase: str) -> None:
        tracker = TRACKERS[-1]
        if phase == "warm-up":
            marks["start"], marks["measured"] = tracker.sequence, True
            for index, m in enumerate(info["model"].modules()):
                if isinstance(m, FSDPModule):
                    group = m._get_fsdp_state()._fsdp_param_group
                    for fp in group.fsdp_params if group is not None else ():
                        for t in (getattr(fp, "_unsharded_param", None),
                                  *getattr(fp, "all_gather_outputs", [])):
                            if isinstance(t, torch.Tensor):
                                unsharded[step.local_tensor(t).untyped_storage()] = index
        elif phase == "forward":
            marks["fwd_end"] = tracker.sequence
            marks["at_end_of_forward"] = classify(tracker, marks, unsharded)
        elif phase == "backward":
            marks["measured"] = False

    device_type, contexts, note = step_contexts(device="cuda", fake=True, sdpa_kernel="flash")
    assert device_type == "cuda" and not note, note
    step.Tracker._note_peak = note_peak
    try:
        out = step.run_step(
            build, precision=precision, recompute="none", optimizer="adamw",
            device_type="cuda", on_phase_end=on_phase_end,
            contexts=[fake_process_group(world), fake_fsdp_device_handle(), *contexts,
                      unpacked_batches()])
    finally:
        step.Tracker._note_peak = plain_note
    snap_bytes, snap = marks.get("snap") or (0, {})
    bsnap_bytes, bsnap = marks.get("bsnap") or (0, {})
    out.update(live_at_end_of_forward_by_category=marks.get("at_end_of_forward"),
               live_at_backward_peak_by_category={"total": snap_bytes, **snap},
               peak_in_blocks_backward_bytes=bsnap_bytes,
               live_at_blocks_backward_peak_by_category={"total": bsnap_bytes, **bsnap})
    return out


def trace_one_gpu(name: str) -> dict:
    from trainmem.trace._core import trace_step

    model_name, _, mb, seq, precision, recompute = CELLS[name]
    return trace_step(preset(model_name), micro_batch_size=mb, seq_len=seq, precision=precision,
                      recompute=recompute, attention="flash", optimizer="adamw")


def trace(name: str) -> dict:
    model_name, world, mb, seq, precision, recompute = CELLS[name]
    out = trace_fsdp(name) if world > 1 else trace_one_gpu(name)
    out.pop("activations_by_layer_bytes", None)
    out["elapsed_s"] = round(out["elapsed_s"], 1)
    flags = {"model": model_name, "num_gpus": world, "zero": 3 if world > 1 else 0,
             "micro_batch_size": mb, "seq_len": seq, "precision": precision,
             "recompute": recompute, "attention": "flash", "optimizer": "adamw",
             "framework": "hf"}
    return {"cell": name, "flags": flags, "measured": out}


def merge() -> None:
    cells = [json.loads(p.read_text()) for p in sorted(SCRATCH.glob("cell_*.json"))]
    OUT.write_text(json.dumps({
        "provenance": {
            "script": "tests/data/make_real_size_traces.py",
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "date": datetime.date.today().isoformat(),
            "command": "for c in <every name in CELLS>; "
                       "PYTHONPATH=<trainmem parent> python tests/data/make_real_size_traces.py "
                       "$c; then ... --merge (one process per cell)",
            "device": "trainmem fake cuda (sm90), SDPA as flash; torch.distributed fake "
                      "backend, rank 0 of world; FSDP2 streams/events are no-ops (ops in "
                      "program order)",
            "notes": [" ".join(part.split()) for part in __doc__.split("\n\n")[1:4]],
        },
        "cells": cells,
    }, indent=1) + "\n")
    print(f"wrote {OUT} ({len(cells)} cells)")


if __name__ == "__main__":
    if sys.argv[1] == "--merge":
        merge()
    else:
        result = trace(sys.argv[1])
        SCRATCH.mkdir(exist_ok=True)
        (SCRATCH / f"cell_{sys.argv[1]}.json").write_text(json.dumps(result, indent=1) + "\n")
        m = result["measured"]
        print(json.dumps({k: m.get(k) for k in (
            "peak_allocated_bytes", "phases", "activations_bytes", "elapsed_s",
            "live_at_backward_peak_by_category", "live_at_blocks_backward_peak_by_category")},
            indent=1))
