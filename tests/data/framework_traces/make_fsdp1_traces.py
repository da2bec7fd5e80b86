"""Regenerate fsdp1_llama.json: one rank's traced memory of torch FSDP1
(torch.distributed.fsdp.FullyShardedDataParallel) as LitGPT's multi-GPU full fine-tune runs it
through Lightning's FSDPStrategy, on trainmem's fake CUDA device and a fake process group of 4.

Pinned: torch 2.13.0+cpu, transformers 5.24.0 (the llama-shaped model). Not run at test time.
One case per process (a fake process group per process):

    python tests/data/framework_traces/make_fsdp1_traces.py CASE   # -> /tmp/fsdp1w/CASE.json
    python tests/data/framework_traces/make_fsdp1_traces.py --merge

What Lightning's FSDPStrategy does, reproduced (lightning 2.x fabric/strategies/fsdp.py:
FSDPStrategy.setup_module wraps with FullyShardedDataParallel(module, auto_wrap_policy=
ModuleWrapPolicy({Block}), mixed_precision=the precision plugin's, device_id, use_orig_params=
True by default, **kwargs), then _setup_activation_checkpointing: apply_activation_checkpointing
(checkpoint_wrapper NO_REENTRANT on each Block); litgpt 0.5.13 finetune/full.py passes
auto_wrap_policy={Block}, activation_checkpointing_policy={Block}, state_dict_type="full",
limit_all_gathers=True, cpu_offload=False). Sharding FULL_SHARD, backward_prefetch
BACKWARD_PRE (torch's default), forward_prefetch False. Precision: "bf16" = bf16-true (the
model built in bf16, MixedPrecision(param_dtype=reduce_dtype=buffer_dtype=bf16): parameters,
gradients and AdamW states bf16); "mixed-bf16" = an fp32 model with
MixedPrecision(param_dtype=bf16, reduce_dtype=fp32, buffer_dtype=bf16) (accelerate's and
llama-recipes' bf16 policy). The model is transformers' LlamaForCausalLM (a decoder layer is
the Block), untied head. AdamW foreach. Step: trainmem.trace._step.run_step with full_warm_up.

The fake device departs from a GPU: FSDP1's unshard / pre-unshard streams and events run in
program order (trace/_dist.py _Stream, _Event), so memory freed on one stream is reusable at
once (no record_stream delay): the allocated bytes are what the program holds; the rate
limiter's events are always complete, so at most the program-order in-flight all-gathers live.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import sys
from pathlib import Path

from torch.utils.weak import WeakIdKeyDictionary

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from _trace_origins import TRACKERS, saved_since  # noqa: E402

import trainmem.trace._step as step  # noqa: E402
from trainmem.trace._core import step_contexts, unpacked_batches  # noqa: E402
from trainmem.trace._dist import (  # noqa: E402
    FAKE_CUDA_HANDLE,
    fake_process_group,
    rank_base_job,
    wrapped_step,
)

OUT = HERE / "fsdp1_llama.json"
WORK = Path("/tmp/fsdp1w")
WORLD = 4
CONFIG = {
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "num_hidden_layers": 4,
    "vocab_size": 8192,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
CASES = {
    "A": {"precision": "bf16", "recompute": "full", "micro_batch_size": 2, "seq_len": 512},
    "B": {"precision": "bf16", "recompute": "none", "micro_batch_size": 2, "seq_len": 512},
    "C": {"precision": "mixed-bf16", "recompute": "full", "micro_batch_size": 2, "seq_len": 512},
    # Gradient accumulation as Lightning runs it (fabric.no_backward_sync -> FSDP1 no_sync on
    # every micro-batch but the last): one no_sync micro-step before the measured step, which is
    # the accumulation's last (synchronising) micro-step.
    "D": {
        "precision": "bf16",
        "recompute": "full",
        "micro_batch_size": 2,
        "seq_len": 512,
        "grad_accum_steps": 2,
    },
    "E": {
        "precision": "mixed-bf16",
        "recompute": "full",
        "micro_batch_size": 2,
        "seq_len": 512,
        "grad_accum_steps": 2,
    },
}


@contextlib.contextmanager
def fake_fsdp1_device_handle():
    """FSDP1's states take FAKE_CUDA_HANDLE as their device handle (streams, events), and its
    record_stream calls do nothing."""
    from torch.distributed.fsdp import _common_utils, _flat_param, _runtime_utils

    plain = _common_utils._FSDPDeviceHandle.from_device
    _common_utils._FSDPDeviceHandle.from_device = staticmethod(lambda device: FAKE_CUDA_HANDLE)
    modules = (_common_utils, _flat_param, _runtime_utils)
    saved = [m._no_dispatch_record_stream for m in modules]
    for m in modules:  # record_stream on a stand-in stream: nothing to delay on the fake device
        m._no_dispatch_record_stream = lambda tensor, stream: None
    try:
        yield
    finally:
        _common_utils._FSDPDeviceHandle.from_device = plain
        for m, f in zip(modules, saved, strict=True):
            m._no_dispatch_record_stream = f


def fsdp1_job(case: dict):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    plain = rank_base_job(
        CONFIG,
        micro_batch_size=case["micro_batch_size"],
        seq_len=case["seq_len"],
        precision=case["precision"],
        attention="flash",
    )
    bf16 = torch.bfloat16
    reduce = bf16 if case["precision"] == "bf16" else torch.float32
    policy = MixedPrecision(param_dtype=bf16, reduce_dtype=reduce, buffer_dtype=bf16)

    def build():
        job = plain()
        model = FSDP(
            job.model,
            auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}),
            mixed_precision=policy,
            sharding_strategy=ShardingStrategy.FULL_SHARD,
            device_id=torch.device("cuda", 0),
            use_orig_params=True,
            limit_all_gathers=True,
        )
        if case["recompute"] == "full":
            apply_activation_checkpointing(
                model,
                checkpoint_wrapper_fn=functools.partial(
                    checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT
                ),
                auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}),
            )
        MODEL[:] = [model]
        JOB[:] = [wrapped_step(job, model)]
        return JOB[0]

    return build


LABELS = WeakIdKeyDictionary()
"""FSDP1's own storages (unsharded padded flat parameters, low-precision shards, shards) by
the unit they belong to (root or block), found after the warm-up (FSDP1 makes the unsharded
buffers at its lazy init, in the first forward)."""
MODEL: list = []
JOB: list = []


def accumulation_micro_steps(count: int) -> None:
    """`count` micro-steps under FSDP1's no_sync (forward and backward, no optimizer step), as
    litgpt finetune/full.py runs the accumulating ones (fabric.no_backward_sync(model,
    enabled=is_accumulating) -> lightning FSDPStrategy _FSDPBackwardSyncControl ->
    FullyShardedDataParallel.no_sync): every unit's gradient stays unsharded on the rank."""
    model, job = MODEL[0], JOB[0]
    for _ in range(count):
        with model.no_sync():
            job.loss(model, job.batch).backward()


def label_fsdp_storages() -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    LABELS.clear()
    for unit in FSDP.fsdp_modules(MODEL[0]):
        flat = unit._handle.flat_param
        root = "root" if unit is MODEL[0] else "block"
        for attr in ("_full_param_padded", "_mp_shard", "_local_shard"):
            t = getattr(flat, attr, None)
            if t is not None:
                LABELS[t.untyped_storage()] = f"{root} {attr}"
        LABELS[flat.untyped_storage()] = f"{root} flat_param"


def live_by_category(tracker, start: int) -> dict:
    """The live storages, in bytes, per FSDP1 label, else 'older than the step' (optimizer
    states, gradient shards of the previous step's end) or the op, shape and dtype that made
    them in the step (grouped by op and dtype for small ones)."""
    out: dict = {}
    for storage, (cell, seq, _owner) in list(tracker.live.items()):
        if not cell[0]:
            continue
        label = LABELS.get(storage)
        if label is None and seq <= start:
            label = "older than the step"
        elif label is None:
            op, shape, dtype = tracker.origins.get(storage, ("?", [], "?"))
            op = op.removeprefix("aten.").removesuffix(".default")
            label = f"{op} {shape} {dtype}" if cell[0] >= 2**20 else f"{op} (small) {dtype}"
        out[label] = out.get(label, 0) + cell[0]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def trace(name: str) -> dict:
    case = CASES[name]
    device_type, contexts, note = step_contexts(device="cuda", fake=True, sdpa_kernel="flash")
    assert device_type == "cuda", note
    marks: dict = {}

    def on_phase_end(phase: str) -> None:
        tracker = TRACKERS[-1]
        if phase == "warm-up":
            accumulation_micro_steps(case.get("grad_accum_steps", 1) - 1)
            marks["start"] = tracker.sequence
            label_fsdp_storages()
        elif phase == "forward":
            marks["saved"] = saved_since(tracker, marks["start"])

    plain_note = step.Tracker._note_peak
    snaps: dict = {}

    def note_peak(self):  # classify at every new forward / backward peak of the measured step
        before = self.peaks.get(self.phase, -1)
        plain_note(self)
        if (
            "start" in marks
            and self.phase in ("forward", "backward")
            and (self.peaks[self.phase] > before)
        ):
            snaps[self.phase] = {
                "total": self.current_bytes,
                **live_by_category(self, marks["start"]),
            }

    step.Tracker._note_peak = note_peak
    try:
        out = step.run_step(
            fsdp1_job(case),
            precision=case["precision"],
            recompute="none",
            optimizer="adamw",
            device_type="cuda",
            contexts=[
                fake_process_group(WORLD),
                fake_fsdp1_device_handle(),
                *contexts,
                unpacked_batches(),
            ],
            on_phase_end=on_phase_end,
        )
    finally:
        step.Tracker._note_peak = plain_note
    keep = (
        "parameters_bytes",
        "gradients_bytes",
        "optimizer_states_bytes",
        "activations_bytes",
        "peak_allocated_bytes",
        "peak_phase",
        "phases",
        "gradients_at_peak_bytes",
        "num_parameters",
        "trainable_parameters",
    )
    return {
        "case": name,
        **case,
        "num_gpus": WORLD,
        "config": CONFIG,
        **{k: out[k] for k in keep if k in out},
        "live_at_forward_peak_by_category": snaps.get("forward"),
        "live_at_backward_peak_by_category": snaps.get("backward"),
        "saved_at_end_of_forward": marks.get("saved"),
    }


def main() -> None:
    if sys.argv[1] == "--merge":
        cases = [json.loads((WORK / f"{n}.json").read_text()) for n in CASES]
        OUT.write_text(
            json.dumps(
                {
                    "provenance": {
                        "torch": torch.__version__,
                        "transformers": "5.24.0",
                        "date": datetime.date.today().isoformat(),
                        "command": "python tests/data/framework_traces/"
                        "make_fsdp1_traces.py CASE; --merge",
                        "device": "trainmem fake cuda (sm90), SDPA as flash; FSDP1 "
                        "streams/events in program order (see the script's docstring)",
                    },
                    "cases": cases,
                },
                indent=1,
            )
            + "\n"
        )
        print(f"wrote {OUT}")
        return
    WORK.mkdir(exist_ok=True)
    result = trace(sys.argv[1])
    (WORK / f"{sys.argv[1]}.json").write_text(json.dumps(result, indent=1))
    print(
        json.dumps(
            {k: v for k, v in result.items() if k not in ("saved_at_end_of_forward", "config")},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
