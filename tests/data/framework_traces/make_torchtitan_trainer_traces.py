"""Regenerate torchtitan_trainer_defaults.json: one rank's traced memory of a step as torchtitan
0.3.0's Trainer configures it from its own llama3 config registry (the defaults a user gets:
ChunkedLossWrapper with 8 chunks, per-op selective AC, RoPE caches sized to the training length,
FSDP2 with bf16 params / fp32 reduce even on one device), on trainmem's fake CUDA device.

Pinned as make_torchtitan_traces.py: torchtitan 0.3.0 + tyro 1.0.17, docstring-parser 0.18.0,
typeguard 4.6.1, spmd_types 0.2.3, einops 0.8.2; torch 2.13.0+cpu. Not run at test time. One case
per process (a fake process group per process):

    python make_torchtitan_trainer_traces.py CASE      # -> /tmp/tt3/case_*.json
    python make_torchtitan_trainer_traces.py --merge   # -> the JSON file
    (CASE debug | debug-ce | 8b-fsdp8 | 8b-fsdp8-b2; 5-30 s and up to 1 GB of host memory)

Configuration path (as torchtitan/trainer.py Trainer.__init__ runs it, no pipeline, no TP):
torchtitan.models.llama3.config_registry.llama3_debugmodel() / llama3_8b() gives the
Trainer.Config; its model_spec.model.update_from_config(config=trainer_config) resizes every
block's ComplexRoPE cache to training.seq_len (models/common/decoder.py); the model is built
(fp32, the FSDP2 master copy); parallelize_llama's FSDP-only path: the registry's
activation_checkpoint (SelectiveAC.Config()).build().apply(model), then
apply_fsdp_to_decoder(model, mesh["fsdp"], param_dtype=bfloat16, reduce_dtype=float32 (the
TrainingConfig defaults), pp_enabled=False) on a 1-D fake DeviceMesh (world 1 on one device:
parallelize_llama always runs it); the registry's loss (ChunkedLossWrapper.Config(num_chunks=8,
loss_fn=CrossEntropyLoss)) built, set_lm_head(model.lm_head) and model._skip_lm_head = True as
the Trainer does; optimizer torch AdamW fused (default_adamw).

Departures, forced by the fake device: the registry's attention is FlexAttention (attn_backend
"flex", always compiled by torchtitan); inductor cannot generate kernels for a fake device and
eager flex would materialise the scores, so the blocks run torchtitan's
ScaledDotProductAttention, which the fake device runs as flash: a compiled flex kernel keeps what
flash keeps (its output and an fp32 logsumexp per query; the block mask's [b, h, s/128, s/128]
int32 indices are under 0.01% of these peaks and not traced). fused RMSNorm and silu_backward as a
CUDA build runs them (make_torchtitan_8b_fsdp_traces.py). Gradient clipping not traced.

phase_marks: the tracker's live bytes when the model forward returned the hidden states (before
the wrapper) and the highest point inside the wrapper (lm_head + cross entropy + their backward
per chunk, all in the forward phase of the step).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_torchtitan_8b_fsdp_traces as t8  # noqa: E402, I001  (stubs, patches the tracker)
import make_torchtitan_traces as base  # noqa: E402

import torch  # noqa: E402

import trainmem.trace._step as step  # noqa: E402
from trainmem.trace._core import step_contexts  # noqa: E402
from trainmem.trace._dist import fake_fsdp_device_handle, fake_process_group  # noqa: E402

OUT = HERE / "torchtitan_trainer_defaults.json"
SCRATCH = Path("/tmp/tt3")
CASES = {  # name: (registry function, fsdp world, local batch or None: the registry's)
    "debug": ("llama3_debugmodel", 1, None),
    "debug-ce": ("llama3_debugmodel_ce_loss", 1, None),  # the registry's one-piece loss
    "8b-fsdp8": ("llama3_8b", 8, None),
    "8b-fsdp8-b2": ("llama3_8b", 8, 2),
    "debug-tp4": ("llama3_debugmodel", 1, None),
    "debug-cp2": ("llama3_debugmodel", 1, None),
    "8b-tp4-fsdp2": ("llama3_8b", 2, None),
    "8b-cp2-fsdp4": ("llama3_8b", 4, None),
    "8b-fsdp128": ("llama3_8b", 128, None),
}
MODEL_PARALLEL = {  # name: (tp, cp) where > 1: parallelize_llama's own path (module docstring)
    "debug-tp4": (4, 1),
    "debug-cp2": (1, 2),
    "8b-tp4-fsdp2": (4, 1),
    "8b-cp2-fsdp4": (1, 2),
}


def _stub_unused_imports() -> None:
    """The registry module imports the Trainer's logging and data stack (tensorboard,
    datasets): stubbed where absent (every name a placeholder class), as none of it runs here."""
    import importlib
    import types

    class _Stub(types.ModuleType):
        def __getattr__(self, attr: str):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return type(attr, (), {})

    for mod in ("torch.utils.tensorboard", "datasets", "datasets.distributed"):
        try:
            importlib.import_module(mod)
        except ImportError:
            stub = _Stub(mod)
            stub.__path__ = []  # a package: its submodules are stubs too
            sys.modules[mod] = stub
    # update_from_config asks the MoE all-to-all package (stubbed by make_torchtitan_traces)
    # to update its config: nothing to update for a dense Llama.
    api = types.ModuleType("torchtitan.distributed.minimal_async_ep.api")
    api.maybe_update_minimal_async_ep_config = lambda *args, **kwargs: None
    sys.modules[api.__name__] = api


def trainer_config(name: str):
    _stub_unused_imports()
    from torchtitan.models.llama3 import config_registry

    registry_fn, fsdp, batch = CASES[name]
    cfg = getattr(config_registry, registry_fn)()
    if batch is not None:
        cfg.training.local_batch_size = batch
    tp, cp = MODEL_PARALLEL.get(name, (1, 1))
    cfg.parallelism.tensor_parallel_degree = tp
    cfg.parallelism.context_parallel_degree = cp
    cfg.parallelism.data_parallel_shard_degree = fsdp
    if tp * cp > 1:  # torch 2.13's fully_shard does not read spmd_types' annotations
        cfg.parallelism.spmd_backend = "partial_dtensor"
    cfg.model_spec.model.update_from_config(config=cfg)
    return cfg


def build_registry_model(cfg):
    from torchtitan.models.common.attention import ScaledDotProductAttention

    model_cfg = cfg.model_spec.model
    for layer in model_cfg.layers:  # flex -> SDPA (module docstring)
        layer.attention = dataclasses.replace(
            layer.attention, inner_attention=ScaledDotProductAttention.Config())
    return model_cfg.build(), model_cfg


def _mesh_ops_outside_fake_mode() -> None:
    """FSDP2 over TP DTensors concatenates the dp and tp meshes at fully_shard time; a mesh's
    rank tensor is host bookkeeping, made outside fake mode (as the meshes themselves are)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    plain = DeviceMesh._concatenate

    def concatenate(*args, **kwargs):
        with unset_fake_temporarily():
            return plain(*args, **kwargs)

    DeviceMesh._concatenate = staticmethod(concatenate)


def trace(name: str) -> dict:
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.components.loss import IGNORE_INDEX, ChunkedLossWrapper
    from torchtitan.distributed.activation_checkpoint import SelectiveAC
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    _, fsdp_world, _ = CASES[name]
    _mesh_ops_outside_fake_mode()
    tp, cp = MODEL_PARALLEL.get(name, (1, 1))
    world = fsdp_world * tp * cp
    cfg = trainer_config(name)
    dims = None
    micro_batch, seq_len = cfg.training.local_batch_size, cfg.training.seq_len
    wrapped = isinstance(cfg.loss, ChunkedLossWrapper.Config)
    assert isinstance(cfg.activation_checkpoint, SelectiveAC.Config), cfg.activation_checkpoint
    assert not cfg.compile.enable
    loss_fn = cfg.loss.build(compile_config=cfg.compile)
    info: dict = {}
    marks: dict = {}

    def build():
        model, model_cfg = build_registry_model(cfg)
        info["model_cfg"] = model_cfg
        info["intermediate"] = int(model.layers["0"].feed_forward.w1.weight.shape[0])
        if dims is None:
            cfg.activation_checkpoint.build(dump_folder="/tmp/tt3").apply(model)
            with unset_fake_temporarily():
                mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("fsdp",))
            apply_fsdp_to_decoder(model, mesh, param_dtype=torch.bfloat16,
                                  reduce_dtype=torch.float32, pp_enabled=False)
        else:  # parallelize_llama itself: CP, TP (spmd_types), AC, FSDP2
            model = cfg.model_spec.parallelize_fn(
                model, parallel_dims=dims, training=cfg.training,
                parallelism=cfg.parallelism, compile_config=cfg.compile,
                ac_config=cfg.activation_checkpoint, dump_folder="/tmp/tt3")
        if wrapped:  # as Trainer.__init__ does for a ChunkedLossWrapper
            loss_fn.set_lm_head(model.lm_head)
            model._skip_lm_head = True
        vocab = model_cfg.vocab_size
        tokens = torch.randint(0, vocab, (micro_batch, seq_len))
        labels = torch.randint(0, vocab, (micro_batch, seq_len))
        if cp > 1:  # Trainer.post_dataloading_process: this rank's sequence shard
            from torchtitan.distributed.context_parallel import prepare_context_parallel_input

            tokens, labels, _ = prepare_context_parallel_input(
                tokens, labels, {}, dims.get_mesh("cp"), tokens.device,
                cfg.parallelism.context_parallel_load_balancer,
                cfg.parallelism.context_parallel_ptrr_mask_key)

        def loss(m, batch):
            hidden = m(batch[0])
            tracker = base.TRACKERS[-1]
            if marks.get("measured"):
                marks["loss_start"] = tracker.sequence
                marks["head_unsharded_at_loss_start"] = not isinstance(
                    m.model.lm_head.weight, torch.distributed.tensor.DTensor)
                marks["before_loss"] = tracker.current_bytes
                marks["forward_peak_before_loss"] = tracker.peaks.get("forward", 0)
                tracker.peaks["forward"] = tracker.current_bytes  # the wrapper's own high
            out = loss_fn(hidden, batch[1], (batch[1] != IGNORE_INDEX).sum())[0]
            if marks.get("measured"):
                marks["loss_peak"] = tracker.peaks["forward"]
                marks["after_loss"] = tracker.current_bytes
                tracker.peaks["forward"] = max(marks["loss_peak"],
                                               marks["forward_peak_before_loss"])
            return out

        return step.StepJob(model=base.Traced(model), batch=(tokens, labels), loss=loss,
                            enable_recompute=lambda m: None, full_warm_up=True)

    plain_note = step.Tracker._note_peak

    def note_peak_in_loss(self):
        """At each new high inside the wrapper: what the wrapper made and still holds (the
        storages made since the model forward returned, >= 1 MiB, by op, shape and dtype)."""
        before = self.peaks.get(self.phase, -1)
        plain_note(self)
        if "loss_start" in marks and "loss_peak" not in marks and self.peaks[self.phase] > before:
            marks["loss_snap"] = [
                text for text in base.saved_since(self, marks["loss_start"]).get("outside", [])
                if int(text.rsplit(" ", 1)[1]) >= 1 << 20]
        if self.phase == "backward" and marks.get("in_backward") and self.peaks[self.phase] > before:
            marks["backward_snap"] = {
                owner: [text for text in texts if int(text.rsplit(" ", 1)[1]) >= 1 << 20]
                for owner, texts in base.saved_since(self, marks["forward_end"]).items()}

    step.Tracker._note_peak = note_peak_in_loss

    def on_phase_end(phase: str) -> None:
        if phase == "warm-up":
            marks["measured"] = True
        elif phase == "forward":
            marks["measured"] = False
            marks["forward_end"] = base.TRACKERS[-1].sequence
            marks["in_backward"] = True
        elif phase == "backward":
            marks["in_backward"] = False

    device_type, contexts, note = step_contexts(device="cuda", fake=True, sdpa_kernel="flash")
    assert device_type == "cuda" and not note, note
    @contextlib.contextmanager
    def spmd_context():
        """The Trainer's train_context (dist_utils.get_spmd_context) around the step, on a
        ParallelDims over the fake world (its meshes built outside fake mode)."""
        nonlocal dims
        if name not in MODEL_PARALLEL:
            yield
            return
        from torchtitan.distributed import ParallelDims
        from torchtitan.distributed import utils as dist_utils

        dist_utils.set_spmd_backend(cfg.parallelism.spmd_backend)  # as Trainer.__init__
        dims = ParallelDims.from_config(cfg.parallelism, world)
        dims.build_mesh()
        with dist_utils.get_spmd_context(parallel_dims=dims)():
            yield

    contexts = [fake_process_group(world), spmd_context(), fake_fsdp_device_handle(), *contexts,
                base.rms_norm_as("fused"), t8.silu_as("fused")]
    out = step.run_step(build, precision="mixed-bf16", recompute="none",
                        optimizer="adamw-fused", device_type=device_type, contexts=contexts,
                        on_phase_end=on_phase_end)
    step.Tracker._note_peak = plain_note
    mc = info["model_cfg"]
    attn = mc.layers[0].attention
    dim, heads = mc.dim, attn.n_heads
    head_dim = dim // heads
    rope_cache = step.rounded(seq_len * head_dim // 2 * 8)
    return {
        "case": name, "registry": CASES[name][0], "fsdp_world_size": fsdp_world,
        "tp": tp, "cp": cp, "world_size": world,
        "policy": "selective_op", "loss": f"ChunkedLossWrapper(num_chunks={cfg.loss.num_chunks})" if wrapped
        else "CrossEntropyLoss",
        "local_batch_size": micro_batch, "seq_len": seq_len,
        "tokens_per_rank": micro_batch * seq_len,
        "dims": {"hidden": dim, "layers": len(mc.layers), "heads": heads,
                 "kv_heads": attn.n_kv_heads or heads, "head_dim": head_dim,
                 "vocab": mc.vocab_size,
                 "intermediate": info["intermediate"]},
        "num_parameters": out["num_parameters"],
        "parameters_bytes": out["parameters_bytes"],
        "gradients_bytes": out["gradients_bytes"],
        "optimizer_states_bytes": out["optimizer_states_bytes"],
        "rope_cache_buffers_bytes": rope_cache * len(mc.layers),
        "activations_bytes": out["activations_bytes"],
        "activations_by_layer_bytes": out["activations_by_layer_bytes"],
        "activations_outside_layers_bytes": out["activations_outside_layers_bytes"],
        "phase_marks": {
            "live_when_model_forward_returned_bytes": marks.get("before_loss"),
            "peak_in_model_forward_bytes": marks.get("forward_peak_before_loss"),
            "peak_in_chunked_loss_bytes": marks.get("loss_peak"),
            "live_after_chunked_loss_bytes": marks.get("after_loss"),
            "made_in_loss_alive_at_its_peak": marks.get("loss_snap"),
            "made_in_backward_alive_at_its_peak": marks.get("backward_snap"),
            "lm_head_unsharded_when_model_forward_returned":
                marks.get("head_unsharded_at_loss_start"),
        },
        "peak_forward_bytes": out["phases"].get("forward"),
        "peak_backward_bytes": out["phases"].get("backward"),
        "peak_optimizer_step_bytes": out["phases"].get("optimizer_step"),
        "peak_allocated_bytes": out["peak_allocated_bytes"],
        "peak_phase": out["peak_phase"],
        "elapsed_s": round(out["elapsed_s"], 1),
    }


def merge() -> None:
    cases = [json.loads(p.read_text()) for p in sorted(SCRATCH.glob("case_*.json"))]
    OUT.write_text(json.dumps({
        "provenance": {
            "torchtitan": "0.3.0", "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": "for c in debug debug-ce 8b-fsdp8 8b-fsdp8-b2: python tests/data/framework_traces/"
                       "make_torchtitan_trainer_traces.py $c; then ... --merge (one process "
                       "per case: one fake process group each)",
            "deps": "as make_torchtitan_traces.py (tyro 1.0.17, docstring-parser 0.18.0, "
                    "typeguard 4.6.1, spmd_types 0.2.3, einops 0.8.2; minimal_async_ep stubbed)",
            "device": "trainmem fake cuda (sm90), SDPA as flash (GQA native) in place of the "
                      "registry's compiled FlexAttention; torch.distributed fake backend, rank "
                      "0 of world; FSDP2 streams/events are no-ops (ops in program order)",
            "notes": [" ".join(part.split()) for part in __doc__.split("\n\n")[2:]],
        },
        "cases": cases,
    }, indent=1) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases)")


if __name__ == "__main__":
    if sys.argv[1] == "--merge":
        merge()
    else:
        result = trace(sys.argv[1])
        SCRATCH.mkdir(exist_ok=True)
        (SCRATCH / f"case_{sys.argv[1]}.json").write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: v for k, v in result.items()
                          if k not in ("activations_by_layer_bytes",)}, indent=1))
