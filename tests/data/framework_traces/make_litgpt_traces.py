"""Regenerate litgpt_lora.json: traced memory of LitGPT 0.5.13's own LoRA fine-tuning step
(litgpt/finetune/lora.py fit) on trainmem's fake CUDA device.

Pinned: litgpt 0.5.13 source (`pip download --no-deps litgpt==0.5.13`, unzipped) on
PYTHONPATH, torch 2.13.0+cpu. Not run at test time.

    PYTHONPATH=/path/to/litgpt-0.5.13-src python tests/data/framework_traces/make_litgpt_traces.py

Import shims (nothing the traced step runs): the `litgpt` package's __init__ (it imports the
serving API) is bypassed by registering the package path only; lightning, psutil and
jsonargparse (imported by litgpt/utils.py and litgpt/scripts/convert_hf_checkpoint.py for
Fabric, loggers and the CLI) are stubbed. The step calls litgpt's own code only:
litgpt.lora.GPT / Config / mark_only_lora_as_trainable and litgpt.utils.chunked_cross_entropy.

What fit() and Fabric do, reproduced: `--precision bf16-true` (lightning HalfPrecision):
the model is built under torch's default dtype bf16 (fabric.init_module) and cast to bf16
(convert_module), so the LoRA adapters are bf16; then fit sets model.max_seq_length to the
training length, which rebuilds the RoPE cos/sin buffers in fp32 ([seq, rope_n_elem]).
mark_only_lora_as_trainable; torch.optim.AdamW (instantiate_torch_optimizer("AdamW"): foreach
on CUDA). Forward: model(input_ids, lm_head_chunk_size=128); logits[-1] = logits[-1][..., :-1, :];
chunked_cross_entropy(logits, targets[..., 1:]). fit keeps `logits` in a local variable until
the next iteration's forward returns: the loss closure holds the list the same way and the step
is warmed up by a whole step, so the measured step meets the previous logits as fit's second
iteration does. Fabric's _FabricModule.forward then casts the returned chunks to the default
dtype, fp32, outside the precision's forward context (lightning 2.6.6 fabric/wrappers.py,
plugins/precision/half.py and amp.py convert_output): fit holds, and chunked_cross_entropy
reads, fp32 logits. `--precision bf16-mixed` (lightning MixedPrecision, litgpt's default when none
is given: utils.py get_default_supported_precision(training=True)): an fp32 model under
torch.autocast(bf16) (run_step's amp-bf16). AC: the FSDP path's parallelize_fn wraps every Block in
checkpoint_wrapper(preserve_rng_state=False) (finetune/lora.py); traced on one device.
F.silu runs as a CUDA build runs it (_FusedSiLU, as make_torchtitan_8b_fsdp_traces.py: one
silu_backward output, not the CPU build's composite math with several [T, f] temporaries).
"""

from __future__ import annotations

import datetime
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path

# --- import shims: nothing here runs in the traced step ---
_STUB_ROOTS = ("lightning", "lightning_utilities", "psutil", "jsonargparse", "torchmetrics")


class _StubModule(types.ModuleType):
    __path__: list = []

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (object,), {"__init__": lambda self, *a, **k: None,
                                      "__class_getitem__": classmethod(lambda c, i: c)})


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in _STUB_ROOTS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Stubs())
_SRC = next(Path(p) / "litgpt" for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and (Path(p) / "litgpt" / "lora.py").exists())
_pkg = types.ModuleType("litgpt")
_pkg.__path__ = [str(_SRC)]
sys.modules["litgpt"] = _pkg

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import trainmem.trace._step as step  # noqa: E402
from trainmem.trace._core import step_contexts  # noqa: E402
from _trace_origins import TRACKERS, saved_since  # noqa: E402  (patches the Tracker)

OUT = Path(__file__).with_name("litgpt_lora.json")
DIMS = {"hidden": 512, "intermediate": 1536, "heads": 8, "kv_heads": 2, "layers": 4,
        "vocab": 2048}
LM_HEAD_CHUNK_SIZE = 128
"""finetune/lora.py fit: model(input_ids, lm_head_chunk_size=128)."""
DEFAULT_TARGETS = {"lora_query": True, "lora_key": False, "lora_value": True,
                   "lora_projection": False, "lora_mlp": False, "lora_head": False}
"""finetune/lora.py setup's defaults."""
ALL_TARGETS = {"lora_query": True, "lora_key": True, "lora_value": True,
               "lora_projection": True, "lora_mlp": True, "lora_head": False}


class _FusedSiLU(torch.autograd.Function):
    """F.silu as a CUDA build runs it: saves the input; backward is one silu_backward kernel
    with one output like the input (make_torchtitan_8b_fsdp_traces.py)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.ops.aten.silu(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return torch.empty_like(x)


def build_model(seq_len: int, targets: dict, dropout: float, precision: str):
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable

    d = DIMS
    config = Config(
        n_layer=d["layers"], n_embd=d["hidden"], n_head=d["heads"], n_query_groups=d["kv_heads"],
        intermediate_size=d["intermediate"], vocab_size=d["vocab"], padded_vocab_size=d["vocab"],
        block_size=4 * seq_len, bias=False, norm_class_name="RMSNorm", norm_eps=1e-5,
        mlp_class_name="LLaMAMLP", rotary_percentage=1.0, parallel_residual=False,
        rope_base=500000, lora_r=16, lora_alpha=32, lora_dropout=dropout, **targets)
    plain = torch.get_default_dtype()
    if precision == "bf16":  # bf16-true: fabric.init_module under torch's default dtype bf16
        torch.set_default_dtype(torch.bfloat16)
    try:
        model = GPT(config)
    finally:
        torch.set_default_dtype(plain)
    mark_only_lora_as_trainable(model)
    # HalfPrecision.convert_module (module.to(bf16)): the parameters are bf16 already; only the
    # rope buffers change, and fit rebuilds those next (Module.to cannot swap fake parameters).
    if precision == "bf16":
        model.cos, model.sin = model.cos.to(torch.bfloat16), model.sin.to(torch.bfloat16)
    model.max_seq_length = seq_len  # fit: rebuilds cos/sin (fp32, [seq_len, rope_n_elem])
    return model


def trace(ac: bool, targets: dict, *, dropout: float = 0.05, micro_batch: int = 2,
          seq_len: int = 1024, precision: str = "bf16"):
    from litgpt.utils import chunked_cross_entropy

    info: dict = {}
    held: dict = {}

    def build():
        model = build_model(seq_len, targets, dropout, precision)
        tokens = torch.randint(0, DIMS["vocab"], (micro_batch, seq_len))
        labels = torch.randint(0, DIMS["vocab"], (micro_batch, seq_len))
        info["rope_cache_bytes"] = sum(step.rounded(b.untyped_storage().nbytes())
                                       for b in model.buffers())

        def loss(m, batch):  # fit's forward: the list of logits stays bound until the next
            logits = m(batch[0], lm_head_chunk_size=LM_HEAD_CHUNK_SIZE)
            logits = [t.float() for t in logits]  # Fabric convert_output: the default dtype
            held["logits"] = logits  # forward returns (fit's `logits` local)
            logits[-1] = logits[-1][..., :-1, :]
            return chunked_cross_entropy(logits, batch[1][..., 1:])

        def checkpoint(m):  # finetune/lora.py parallelize_fn(activation_checkpointing=True)
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                checkpoint_wrapper)
            m.transformer.h = torch.nn.ModuleList(
                [checkpoint_wrapper(el, preserve_rng_state=False) for el in m.transformer.h])

        return step.StepJob(model=model, batch=(tokens, labels), loss=loss,
                            enable_recompute=checkpoint, full_warm_up=True, dtypes_set=True)

    marks: dict = {}

    def on_phase_end(name: str) -> None:
        tracker = TRACKERS[-1]
        if name == "warm-up":
            marks["start"] = tracker.sequence
        elif name == "forward":
            marks["saved"] = saved_since(tracker, marks["start"])

    device_type, contexts, note = step_contexts(device="cuda", fake=True, sdpa_kernel="flash")
    assert device_type == "cuda" and not note, note
    plain_silu = F.silu
    F.silu = lambda x, inplace=False: _FusedSiLU.apply(x)
    try:
        out = step.run_step(build, precision=precision, recompute="full" if ac else "none",
                            optimizer="adamw", device_type=device_type, contexts=contexts,
                            on_phase_end=on_phase_end)
    finally:
        F.silu = plain_silu
    tokens = micro_batch * seq_len
    return {
        "ac": ac, "targets": targets, "lora_dropout": dropout, "precision": precision,
        "micro_batch_size": micro_batch, "seq_len": seq_len, "tokens": tokens,
        "optimizer": "adamw", "dims": DIMS, "lora_rank": 16,
        "lm_head_chunk_size": LM_HEAD_CHUNK_SIZE,
        "parameters_bytes": out["parameters_bytes"],
        "gradients_bytes": out["gradients_bytes"],
        "optimizer_states_bytes": out["optimizer_states_bytes"],
        "rope_cache_buffers_bytes": info["rope_cache_bytes"],
        "activations_bytes": out["activations_bytes"],
        "activations_by_layer_bytes": out["activations_by_layer_bytes"],
        "activations_outside_layers_bytes": out["activations_outside_layers_bytes"],
        "peak_forward_bytes": out["phases"].get("forward"),
        "peak_backward_bytes": out["phases"].get("backward"),
        "peak_optimizer_step_bytes": out["phases"].get("optimizer_step"),
        "peak_allocated_bytes": out["peak_allocated_bytes"],
        "peak_phase": out["peak_phase"],
        "gradients_at_peak_bytes": out["gradients_at_peak_bytes"],
        "num_parameters": out["num_parameters"],
        "trainable_parameters": out["trainable_parameters"],
        "saved_at_end_of_forward": marks["saved"],
    }


def main() -> None:
    cases = [trace(ac, DEFAULT_TARGETS) for ac in (False, True)]
    cases.append(trace(False, ALL_TARGETS))
    cases.append(trace(False, DEFAULT_TARGETS, dropout=0.0))
    cases.append(trace(False, DEFAULT_TARGETS, precision="amp-bf16"))  # bf16-mixed, the default
    OUT.write_text(json.dumps({
        "provenance": {
            "litgpt": "0.5.13", "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": "PYTHONPATH=<litgpt-0.5.13 src> python "
                       "tests/data/framework_traces/make_litgpt_traces.py",
            "deps": "none beyond torch; lightning, psutil, jsonargparse stubbed (imported by "
                    "litgpt/utils.py for Fabric and loggers; nothing of theirs runs)",
            "device": "trainmem fake cuda (sm90), SDPA as flash, silu_backward fused",
            "notes": [
                "rope_cache_buffers_bytes: fp32 cos and sin [seq_len, head_size] as fit "
                "rebuilds them (model.max_seq_length = seq_len); parameters_bytes excludes them",
                "the previous step's logits (fit's `logits` local) are alive until the "
                "measured forward returns: the warm-up is a whole step",
                "the logits are cast to fp32 as Fabric's convert_output does (lightning "
                "2.6.6 fabric/wrappers.py _FabricModule.forward)",
            ],
        },
        "cases": cases,
    }, indent=1) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
