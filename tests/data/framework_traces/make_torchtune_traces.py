"""Regenerate torchtune_lora.json: traced memory of torchtune 0.6.1's own LoRA fine-tuning step
(recipes/lora_finetune_single_device.py) on trainmem's fake CUDA device.

Pinned: torchtune 0.6.1 source (torchtune/ and recipes/) on PYTHONPATH, omegaconf 2.4.0 and
antlr4-python3-runtime 4.9.3, torchao 0.18.0 (pip --no-deps; its compiled extensions do not
load, unused), torch 2.13.0+cpu. Not run at test time.

    PYTHONPATH=/path/to/torchtune-src:/path/to/deps \
        python tests/data/framework_traces/make_torchtune_traces.py

Import shims (nothing the traced step runs): torchao 0.18 moved torchao.dtypes.nf4tensor to
torchao.quantization.quantize_.workflows.nf4.nf4_tensor (aliased); torchtune.training.quantization
(QAT quantizers, imports names torchao 0.18 dropped) is stubbed; the data/tokenizer deps
(datasets, sentencepiece, tiktoken, torchvision, psutil, kagglehub, PIL) are stubbed.

Model: torchtune.models.llama3_2.lora_llama3_2 (TiedLinear output, Llama3ScaledRoPE with one
shared cache, torchtune RMSNorm = F.rms_norm(x.float(), ...).to(dtype)), built under
training.set_default_dtype(bf16) on the device as the recipe does (adapters bf16; the rope cache
fp32); only adapter parameters trainable (get_adapter_params / set_trainable_params);
torch.optim.AdamW(fused=True) on them. run_step gets precision "fp32" so that it casts nothing
(the recipe's dtypes stay as built). max_seq_len = training seq_len (the real config's 131072
would make the fp32 rope cache 32 MiB, bigger than this toy model's activations).
Llama3ScaledRoPE.apply_scaling (a Python loop over the frequencies' values, data-dependent on
fake tensors) returns the unscaled frequencies: same buffers (theta [head_dim/2] and cache
[seq, head_dim/2, 2], fp32).
Loss: CEWithChunkedOutputLoss (model.set_num_output_chunks(8)) or plain cross-entropy on
output(h).float() (num_output_chunks 0), labels shifted as _loss_step does (hstack with an
ignore-index column), logits dropped before backward. AC: training.set_activation_checkpointing
(auto_wrap_policy={TransformerSelfAttentionLayer}). The fake device's F.rms_norm saves what the
CUDA fused kernel saves (trace/_norm.py): torchtune calls it on x.float(), so it saves the fp32
input and rstd.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import importlib.abc
import importlib.machinery
import json
import sys
import types
from pathlib import Path

# --- import shims: nothing here runs in the traced step ---
_STUB_ROOTS = ("datasets", "sentencepiece", "tiktoken", "torchvision", "psutil", "kagglehub", "PIL")
_STUB_EXACT = ("torchtune.training.quantization",)


class _StubModule(types.ModuleType):
    __path__: list = []

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (object,), {"__init__": lambda self, *a, **k: None,
                                      "__class_getitem__": classmethod(lambda c, i: c)})


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in _STUB_ROOTS or name in _STUB_EXACT:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Stubs())
sys.modules["torchao.dtypes.nf4tensor"] = importlib.import_module(
    "torchao.quantization.quantize_.workflows.nf4.nf4_tensor")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import trainmem.trace._step as step  # noqa: E402
from trainmem.trace._core import step_contexts  # noqa: E402
from _trace_origins import TRACKERS, saved_since  # noqa: E402  (patches the Tracker)

OUT = Path(__file__).with_name("torchtune_lora.json")
DIMS = {"hidden": 512, "intermediate": 1536, "heads": 8, "kv_heads": 2, "layers": 4,
        "vocab": 2048}
LORA = {"lora_attn_modules": ["q_proj", "v_proj", "output_proj"], "apply_lora_to_mlp": True,
        "lora_rank": 16, "lora_alpha": 32}
IGNORE_INDEX = -100


class _Event:
    def synchronize(self):
        pass


class _Stream:
    """torch.cuda streams for OffloadActivations on the fake device (a CPU torch build has none):
    waits and events do nothing, so every copy is complete when issued; the memory follows the
    references OffloadActivations keeps (its forward stash of max_fwd_stash_size tensors, the
    tensors brought back in backward until the next autograd node)."""

    def wait_event(self, *a):
        pass

    def wait_stream(self, *a):
        pass

    def record_event(self, *a):
        return _Event()

    def synchronize(self):
        pass


@contextlib.contextmanager
def fake_cuda_streams():
    names = ("default_stream", "current_stream", "Stream", "stream", "Event")
    plain = {n: getattr(torch.cuda, n) for n in names}
    torch.cuda.default_stream = torch.cuda.current_stream = lambda *a, **k: _Stream()
    torch.cuda.Stream = lambda *a, **k: _Stream()
    torch.cuda.Event = lambda *a, **k: _Event()
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    plain_record = torch.Tensor.record_stream
    torch.Tensor.record_stream = lambda self, s: None
    try:
        yield
    finally:
        for n, f in plain.items():
            setattr(torch.cuda, n, f)
        torch.Tensor.record_stream = plain_record



def build_model(seq_len: int):
    from torchtune import training
    from torchtune.models.llama3_2 import lora_llama3_2
    from torchtune.modules.peft import get_adapter_params, set_trainable_params

    from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE

    # apply_scaling loops over the frequencies' values (data-dependent on fake tensors): the
    # unscaled frequencies instead, same shape and dtype (the buffers' memory is unchanged).
    Llama3ScaledRoPE.apply_scaling = lambda self, freqs, *args: freqs.clone()
    d = DIMS
    with training.set_default_dtype(torch.bfloat16):
        model = lora_llama3_2(
            **LORA, vocab_size=d["vocab"], num_layers=d["layers"], num_heads=d["heads"],
            num_kv_heads=d["kv_heads"], embed_dim=d["hidden"], max_seq_len=seq_len,
            intermediate_dim=d["intermediate"], tie_word_embeddings=True)
    set_trainable_params(model, get_adapter_params(model))
    return model


def trace(ac: bool, loss_kind: str, micro_batch: int = 2, seq_len: int = 1024,
          offload: bool = False):
    from torchtune import modules, training
    from torchtune.modules.loss import CEWithChunkedOutputLoss

    chunked = CEWithChunkedOutputLoss(num_output_chunks=8, ignore_index=IGNORE_INDEX)
    info: dict = {}

    def build():
        model = build_model(seq_len)
        model.set_num_output_chunks(8 if loss_kind == "chunked" else 0)
        tokens = torch.randint(0, DIMS["vocab"], (micro_batch, seq_len))
        labels = torch.randint(0, DIMS["vocab"], (micro_batch, seq_len))
        ignore = torch.full((micro_batch, 1), IGNORE_INDEX, dtype=labels.dtype)
        if offload:  # pinned host memory needs a CUDA build; no device bytes either way
            import functools

            from torchtune.training import _activation_offloading as ao
            plain = ao.OffloadActivations
            ao.OffloadActivations = functools.partial(plain, use_pin_memory=False)
            try:
                ctx = training.get_act_offloading_ctx_manager(model, True)
            finally:
                ao.OffloadActivations = plain
        else:
            ctx = contextlib.nullcontext()
        info["rope_cache_bytes"] = sum(step.rounded(b.untyped_storage().nbytes())
                                       for b in {id(b): b for b in model.buffers()}.values())

        def loss(m, batch):  # the recipe's _loss_step
            with ctx:
                logits = m(batch[0])
            lab = torch.hstack((batch[1][..., 1:], ignore[:micro_batch]))
            if not isinstance(logits, list):
                lab = lab.reshape(-1)
                logits = logits.reshape(-1, logits.size(-1))
                out = F.cross_entropy(logits, lab, ignore_index=IGNORE_INDEX)
            else:
                out = chunked(logits, lab)
            del logits
            return out

        return step.StepJob(
            model=model, batch=(tokens, labels), loss=loss,
            enable_recompute=lambda m: training.set_activation_checkpointing(
                m, auto_wrap_policy={modules.TransformerSelfAttentionLayer}))

    marks: dict = {}

    def on_phase_end(name: str) -> None:
        tracker = TRACKERS[-1]
        if name == "warm-up":
            marks["start"] = tracker.sequence
        elif name == "forward":
            marks["saved"] = saved_since(tracker, marks["start"])

    device_type, contexts, note = step_contexts(device="cuda", fake=True, sdpa_kernel="flash")
    assert device_type == "cuda" and not note, note
    if offload:
        contexts = [*contexts, fake_cuda_streams()]
    out = step.run_step(build, precision="fp32", recompute="full" if ac else "none",
                        optimizer="adamw-fused", device_type=device_type, contexts=contexts,
                        on_phase_end=on_phase_end)
    tokens = micro_batch * seq_len
    return {
        "ac": ac, "loss": loss_kind, "offload": offload, "micro_batch_size": micro_batch,
        "seq_len": seq_len, "tokens": tokens, "optimizer": "adamw-fused",
        "dims": DIMS, "lora": LORA,
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
    cases = [trace(ac, loss) for ac in (False, True) for loss in ("chunked", "full")]
    cases.append(trace(True, "chunked", offload=True))  # the recipe allows it only with AC
    OUT.write_text(json.dumps({
        "provenance": {
            "torchtune": "0.6.1", "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": "PYTHONPATH=<torchtune-0.6.1 src>:<deps> python "
                       "tests/data/framework_traces/make_torchtune_traces.py",
            "deps": "omegaconf 2.4.0, antlr4-python3-runtime 4.9.3, torchao 0.18.0 "
                    "(pip --no-deps); import shims as the script's docstring says",
            "device": "trainmem fake cuda (sm90), SDPA as flash (GQA native), fused rms_norm",
            "notes": [
                "activations_by_layer_bytes: storages made inside block k alive at the end of "
                "forward; under checkpointing a block's kept input is the previous block's "
                "output, so it is counted in block k-1 (block 0's, the embedding output: "
                "outside)",
                "layer 0 saves less: the frozen embedding's output needs no gradient, so its "
                "first RMSNorm (frozen scale) saves nothing of its own",
                "rope_cache_buffers_bytes: the shared fp32 theta and cache buffers, in every "
                "traced figure (parameters_bytes excludes them)",
                "offload: training.get_act_offloading_ctx_manager(model, True) with "
                "use_pin_memory False (pinning needs a CUDA build; no device bytes), streams "
                "and events as no-ops (every copy complete when issued); the stash logic is "
                "torchtune's own",
            ],
        },
        "cases": cases,
    }, indent=1) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
