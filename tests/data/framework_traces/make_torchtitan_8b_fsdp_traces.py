"""Regenerate torchtitan_llama3_8b_fsdp.json: one rank's traced memory of torchtitan 0.3.0's
Llama-3.1-8B under FSDP2 on a fake process group, on trainmem's fake CUDA device (no GPU, no
real memory), at the real size of published torchtitan runs.

Pinned as make_torchtitan_traces.py: torchtitan 0.3.0 source + tyro 1.0.17, docstring-parser
0.18.0, typeguard 4.6.1, spmd_types 0.2.3, einops 0.8.2 on PYTHONPATH; torch 2.13.0+cpu.
Not run at test time. One case per process (a fake process group per process):

    PYTHONPATH=<trainmem parent>:<torchtitan src>:<deps> \
        python make_torchtitan_8b_fsdp_traces.py CASE [LAYERS [SILU]]   # -> /tmp/tt8/case_*.json
    python make_torchtitan_8b_fsdp_traces.py --merge                    # -> the JSON file
    (CASE A-D, LAYERS 32, SILU fused|composite; about 10 s and 0.4 GB of host memory a case)

Model: as make_torchtitan_traces.py (llama3._build_llama3_layers, fused wqkv, ComplexRoPE with
max_seq_len = seq_len, ScaledDotProductAttention run as flash by the fake device, fused RMSNorm
emulated as the CUDA kernel saves it; silu "fused": aten::silu_backward allocating what the CUDA
kernel does, "composite": the CPU build's math decomposition the fake device otherwise runs),
built fp32 (the FSDP2 master weights), untied output.
Parallelism: what parallelize_llama does for an FSDP-only job without compile: the AC policy's
.apply(model) (torchtitan's SelectiveAC / FullAC), then torchtitan's own
torchtitan.distributed.fsdp.apply_fsdp_to_decoder(model, mesh["fsdp"], param_dtype=bf16,
reduce_dtype=fp32, pp_enabled=False) on a 1-D fake DeviceMesh: tok_embeddings its own unit
(reshard after forward), [norm, lm_head] one unit NOT resharded after forward, each block a unit
(resharded), fully_shard(model) as root, gradient divide factor 1. Optimizer: torch AdamW
fused=True (torchtitan's default implementation "fused"). Loss: torchtitan CrossEntropyLoss on
the full logits (no ChunkedLossWrapper). Gradient clipping (max_norm 1.0) not traced (its norms
are scalars per parameter). Step: trainmem.trace._step.run_step with full_warm_up.

Categories (live_at_*_by_category): storages that are parameter shards; FSDP2's unsharded
parameter storages (found after the warm-up from each FSDPParam's _unsharded_param and
all_gather_outputs; "FSDP groups unsharded" counts groups with any of them allocated); older
than the measured step (optimizer states, rope caches); made in the forward (inside blocks /
outside); made in the backward, by the op that made them (>= 64 MiB with shape and dtype: FSDP2's
all-gather outputs, reduce-scatter inputs and outputs are the empty.memory_format ones).
live_at_backward_peak: at the backward phase's peak; live_at_blocks_backward_peak: at the highest
point once the gradient reached the last block's output (the blocks' backward).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# make_torchtitan_traces first: it stubs minimal_async_ep and patches the tracker (origins)
import make_torchtitan_traces as base  # noqa: E402, I001

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.weak import WeakIdKeyDictionary  # noqa: E402

import trainmem.trace._step as step  # noqa: E402
from trainmem.trace._core import step_contexts  # noqa: E402
from trainmem.trace._dist import fake_fsdp_device_handle, fake_process_group  # noqa: E402

OUT = HERE / "torchtitan_llama3_8b_fsdp.json"
SCRATCH = Path("/tmp/tt8")
DIMS_8B = {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "vocab_size": 128256,
           "multiple_of": 1024, "ffn_dim_multiplier": 1.3}
CASES = {  # name: (world, local batch, seq, policy)
    "A": (8, 2, 8192, "selective_op"),
    "B": (8, 1, 8192, "selective_op"),
    "C": (8, 1, 32768, "full"),
    "D": (128, 2, 8192, "selective_op"),
}


class _FusedSiLU(torch.autograd.Function):
    """F.silu as a CUDA build runs it: saves the input; backward is aten::silu_backward, one
    kernel with one output of the input's shape. On this CPU build the fake device runs
    silu_backward's CompositeImplicitAutograd math (sigmoid, 1 - sigmoid, products: several
    [tokens, ffn] temporaries alive at once), which a GPU does not allocate. The backward here
    allocates what the CUDA kernel allocates (one tensor like the input; values are not
    computed on fake tensors)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.ops.aten.silu(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return torch.empty_like(x)


@contextlib.contextmanager
def silu_as(kind: str):
    plain = F.silu
    if kind == "fused":
        F.silu = lambda x, inplace=False: _FusedSiLU.apply(x)
    try:
        yield
    finally:
        F.silu = plain


def trace(name: str, layers: int, silu: str = "fused") -> dict:
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.components.loss import IGNORE_INDEX, CrossEntropyLoss
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    world, micro_batch, seq_len, policy = CASES[name]
    base.DIMS = dict(DIMS_8B, n_layers=layers)
    d = base.DIMS
    loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config(global_vocab_size=d["vocab_size"]))
    info: dict = {}
    unsharded = WeakIdKeyDictionary()  # FSDP2's unsharded (all-gathered) parameter storages

    def build():
        model, info["hidden"] = base.build_model(seq_len, fuse_qkv=True)
        base.apply_policy(model, policy)  # before FSDP, as parallelize_llama
        with unset_fake_temporarily():
            mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("fsdp",))
        apply_fsdp_to_decoder(model, mesh, param_dtype=torch.bfloat16,
                              reduce_dtype=torch.float32, pp_enabled=False)
        info["model"] = model

        def last_block_done(module, args, output):  # its output's gradient: blocks' backward
            marks["blocks_bwd"] = False
            if output.requires_grad:
                output.register_hook(lambda g: marks.__setitem__("blocks_bwd", True))

        list(model.layers.values())[-1].register_forward_hook(last_block_done)
        tokens = torch.randint(0, d["vocab_size"], (micro_batch, seq_len))
        labels = torch.randint(0, d["vocab_size"], (micro_batch, seq_len))

        def loss(m, batch):
            pred = m(batch[0])
            return loss_fn(pred, batch[1], (batch[1] != IGNORE_INDEX).sum())[0]

        return step.StepJob(model=base.Traced(model), batch=(tokens, labels), loss=loss,
                            enable_recompute=lambda m: None, full_warm_up=True)

    marks: dict = {"snap": None}
    plain_note = step.Tracker._note_peak

    def classify(tracker) -> dict:
        """Live bytes by category, now."""
        out: dict = {}
        start, fwd_end = marks.get("start", 0), marks.get("fwd_end", 1 << 62)
        origins = getattr(tracker, "origins", {})
        groups: set = set()
        for storage, (cell, seq, owner) in list(tracker.live.items()):
            if storage in tracker.parameter_storages:
                key = "parameter shards (fp32)"
            elif storage in unsharded:
                key = "FSDP unsharded params (bf16, allocated)"
            elif seq <= start:
                key = "older than step (optimizer states, rope caches, ...)"
            elif seq <= fwd_end:
                key = ("saved activations in blocks" if isinstance(owner, int) and owner >= 0
                       else "saved/forward tensors outside blocks")
            else:
                op, shape, dtype = origins.get(storage, ("?", [], "?"))
                key = "made in backward: " + op.removeprefix("aten.").removesuffix(".default")
                if cell[0] >= 1 << 26:  # >= 64 MiB: with its shape and dtype
                    key += f" {shape} {dtype}"
            out[key] = out.get(key, 0) + cell[0]
            if key.startswith("FSDP unsharded") and cell[0]:
                groups.add(unsharded[storage])
        out["FSDP groups unsharded (count)"] = len(groups)
        return out

    # Classify at every new backward peak (byte counts only: no references to storages kept),
    # and separately at every new high once the blocks' backward has begun (after the loss's
    # and lm_head's backward), for the per-block backward peak.
    def note_peak_eager(self):
        before = self.peaks.get(self.phase, -1)
        plain_note(self)
        if self.phase != "backward" or not marks.get("measured"):
            return
        if self.peaks["backward"] > before:
            marks["snap"] = (self.current_bytes, classify(self))
        if marks.get("blocks_bwd") and self.current_bytes > marks.get("bsnap", (0,))[0]:
            marks["bsnap"] = (self.current_bytes, classify(self))

    step.Tracker._note_peak = note_peak_eager

    def on_phase_end(phase: str) -> None:
        tracker = base.TRACKERS[-1]
        if phase == "warm-up":
            marks["start"] = tracker.sequence
            marks["measured"] = True
            # FSDP2 unsharded parameter storages (made at lazy init, resized to 0 / full)
            for index, m in enumerate(info["model"].modules()):
                if isinstance(m, FSDPModule):
                    state = m._get_fsdp_state()
                    group = state._fsdp_param_group
                    if group is None:
                        continue
                    for fp in group.fsdp_params:
                        for t in (getattr(fp, "_unsharded_param", None),
                                  *getattr(fp, "all_gather_outputs", [])):
                            if isinstance(t, torch.Tensor):
                                unsharded[step.local_tensor(t).untyped_storage()] = index
        elif phase == "forward":
            marks["fwd_end"] = tracker.sequence
            marks["at_end_of_forward"] = classify(tracker)
        elif phase == "backward":
            marks["measured"] = False

    device_type, contexts, note = step_contexts(device="cuda", fake=True, sdpa_kernel="flash")
    assert device_type == "cuda" and not note, note
    contexts = [fake_process_group(world), fake_fsdp_device_handle(), *contexts,
                base.rms_norm_as("fused"), silu_as(silu)]
    out = step.run_step(build, precision="mixed-bf16", recompute="none",
                        optimizer="adamw-fused", device_type=device_type, contexts=contexts,
                        on_phase_end=on_phase_end)
    step.Tracker._note_peak = plain_note
    tokens = micro_batch * seq_len
    head_dim = d["dim"] // d["n_heads"]
    rope_cache = step.rounded(seq_len * head_dim // 2 * 8)
    snap_bytes, snap = marks["snap"] or (0, {})
    bsnap_bytes, bsnap = marks.get("bsnap", (0, {}))
    return {
        "case": name, "fsdp_world_size": world, "policy": policy,
        "local_batch_size": micro_batch, "seq_len": seq_len, "tokens_per_rank": tokens,
        "layers_traced": layers, "rms_norm": "fused", "silu_backward": silu,
        "dims": {"hidden": d["dim"], "intermediate": info["hidden"], "heads": d["n_heads"],
                 "kv_heads": d["n_kv_heads"], "head_dim": head_dim, "vocab": d["vocab_size"]},
        "num_parameters": out["num_parameters"],
        "parameters_per_layer": out["parameters_per_layer"],
        "parameters_outside_layers": out["parameters_outside_layers"],
        "parameters_bytes": out["parameters_bytes"],
        "gradients_bytes": out["gradients_bytes"],
        "optimizer_states_bytes": out["optimizer_states_bytes"],
        "rope_cache_buffers_bytes": rope_cache * layers,
        "activations_bytes": out["activations_bytes"],
        "activations_by_layer_bytes": out["activations_by_layer_bytes"],
        "activations_outside_layers_bytes": out["activations_outside_layers_bytes"],
        "unsharded_parameters_at_end_of_forward_bytes":
            out["unsharded_parameters_at_end_of_forward_bytes"],
        "live_at_end_of_forward_by_category": marks.get("at_end_of_forward"),
        "peak_forward_bytes": out["phases"].get("forward"),
        "peak_backward_bytes": out["phases"].get("backward"),
        "peak_optimizer_step_bytes": out["phases"].get("optimizer_step"),
        "peak_allocated_bytes": out["peak_allocated_bytes"],
        "peak_phase": out["peak_phase"],
        "gradients_at_backward_peak_bytes": out["gradients_at_peak_bytes"],
        "live_at_backward_peak_by_category": {"total": snap_bytes, **snap},
        "peak_in_blocks_backward_bytes": bsnap_bytes,
        "live_at_blocks_backward_peak_by_category": {"total": bsnap_bytes, **bsnap},
        "elapsed_s": round(out["elapsed_s"], 1),
    }


def merge() -> None:
    cases = [json.loads(p.read_text()) for p in sorted(SCRATCH.glob("case_*.json"))]
    OUT.write_text(json.dumps({
        "provenance": {
            "torchtitan": "0.3.0", "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": "for c in A B C D; for s in fused composite: PYTHONPATH=<trainmem "
                       "parent>:<torchtitan-0.3.0 src>:<deps> python tests/data/"
                       "framework_traces/make_torchtitan_8b_fsdp_traces.py $c 32 $s; then "
                       "... --merge (one process per case: one fake process group each)",
            "deps": "as make_torchtitan_traces.py (tyro 1.0.17, docstring-parser 0.18.0, "
                    "typeguard 4.6.1, spmd_types 0.2.3, einops 0.8.2; minimal_async_ep stubbed)",
            "device": "trainmem fake cuda (sm90), SDPA as flash (GQA native); torch.distributed "
                      "fake backend, rank 0 of world; FSDP2 streams/events are no-ops (ops in "
                      "program order)",
            "notes": [" ".join(part.split()) for part in __doc__.split("\n\n")[3:]] + [
                "activations_by_layer_bytes: storages made inside block k alive at the end of "
                "forward (under FullAC a block's kept input is the previous block's output, "
                "counted in block k-1; block 0's outside)",
                "unsharded_parameters_at_end_of_forward_bytes: the [norm, lm_head] group's bf16 "
                "parameters, which apply_fsdp_to_decoder does not reshard after forward",
                "rope_cache_buffers_bytes: complex64 ComplexRoPE caches (one per layer, "
                "max_seq_len = seq_len), computed, inside every peak",
            ],
        },
        "cases": cases,
    }, indent=1) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases)")


if __name__ == "__main__":
    if sys.argv[1] == "--merge":
        merge()
    else:
        name, layers = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 32
        silu = sys.argv[3] if len(sys.argv) > 3 else "fused"
        result = trace(name, layers, silu)
        SCRATCH.mkdir(exist_ok=True)
        path = SCRATCH / f"case_{name}_{layers}_{silu}.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: v for k, v in result.items()
                          if k not in ("activations_by_layer_bytes",)}, indent=1))
