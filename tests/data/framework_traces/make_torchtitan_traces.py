"""Regenerate torchtitan_llama3_ac.json: traced memory of torchtitan's own Llama 3 code under
its activation-checkpointing policies, on trainmem's fake CUDA device (no GPU, no real memory).

Pinned: torchtitan 0.3.0 (source on PYTHONPATH, with its small pure deps tyro 1.0.17,
docstring-parser 0.18.0, typeguard 4.6.1, spmd_types 0.2.3, einops 0.8.2), torch 2.13.0+cpu.
Not run at test time.

    PYTHONPATH=/path/to/torchtitan-src:/path/to/deps \
        python tests/data/framework_traces/make_torchtitan_traces.py

Model: torchtitan.models.llama3's own builder (Llama3TransformerBlock, fused wqkv as 0.3.0
builds it, ComplexRoPE with max_seq_len = training seq_len as the Trainer sets), bf16
parameters. Attention: torchtitan's ScaledDotProductAttention (is_causal) in place of the
registry's default FlexAttention (0.3.0 rejects "sdpa" for language models; eager flex on a fake
device would materialise the scores); the fake device runs SDPA as flash. Loss:
torchtitan.components.loss.CrossEntropyLoss (logits .float(), reduction "sum", divided by the
valid-token count) on the model's logits. Step: trainmem.trace._step.run_step (warm-up, then
forward, backward, optimizer step). Policies: none; FullAC; SelectiveAC (per-op, default save
ops); layer-wise selective AC as torchtitan <= 0.2 did it (selective_ac_option "2": a global
counter, every block whose count % 2 == 0 is wrapped in a full checkpoint_wrapper).

SiLU: rows with silu "fused" run F.silu as the CUDA kernel does in backward (one output);
the others keep fake mode's decomposition of silu_backward.

RMSNorm: on this CPU build of torch, aten::_fused_rms_norm is only its CompositeImplicitAutograd
decomposition, so the fake CUDA device saves x.float(), x * rstd (fp32), rstd and the bf16
output per norm; a CUDA build runs the fused kernel, whose autograd node saves only the input
and rstd (derivatives.yaml _fused_rms_norm -> _fused_rms_norm_backward). rms_norm "composite"
is what the fake device does; "fused" replaces F.rms_norm by an autograd.Function that saves
what the CUDA kernel saves (input, rstd, weight) and runs aten._fused_rms_norm_backward.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import sys
import types
from pathlib import Path

# torchtitan.models.common imports the MoE all-to-all kernels (triton); a dense Llama never
# calls them.
_stub = types.ModuleType("torchtitan.distributed.minimal_async_ep")
for _name in ("combine_op", "dispatch_op", "init_buffer", "MinimalAsyncEPDispatchMetadata",
              "maybe_update_minimal_async_ep_config"):
    setattr(_stub, _name, None)
sys.modules[_stub.__name__] = _stub

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import trainmem.trace._step as step  # noqa: E402
from trainmem.trace._core import step_contexts  # noqa: E402
from _trace_origins import TRACKERS, saved_since  # noqa: E402  (patches the Tracker)

OUT = Path(__file__).with_name("torchtitan_llama3_ac.json")
DIMS = {"dim": 512, "n_layers": 4, "n_heads": 8, "n_kv_heads": 2, "vocab_size": 2048,
        "multiple_of": 256, "ffn_dim_multiplier": 1.3}
SHAPES = [(1, 1024), (2, 2048)]
POLICIES = ["none", "full", "selective_op", "selective_layer_2"]



class _FusedRMSNorm(torch.autograd.Function):
    """F.rms_norm as a CUDA build runs it: saves (input, rstd fp32 [..., 1], weight)."""

    @staticmethod
    def forward(ctx, x, shape, weight, eps):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + (eps or 1e-6))
        ctx.shape = shape
        ctx.save_for_backward(x, rstd, weight)
        return ((xf * rstd) * weight).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        dx, dw = torch.ops.aten._fused_rms_norm_backward(
            grad, x, list(ctx.shape), rstd, weight, [True, True])
        return dx, None, dw, None


@contextlib.contextmanager
def rms_norm_as(kind: str):
    plain = F.rms_norm
    if kind == "fused":
        F.rms_norm = lambda x, shape, weight=None, eps=None: _FusedRMSNorm.apply(
            x, shape, weight, eps)
    try:
        yield
    finally:
        F.rms_norm = plain


def norm_contexts(contexts: list, kind: str) -> list:
    """The step's contexts for rms_norm `kind`. trainmem's fake device runs rms_norm as the CUDA
    kernel does (trace/_norm.py gpu_rms_norm, saves input and rstd) where step_contexts has it;
    "composite" takes it out (the CPU build's decomposition), "fused" adds this script's
    emulation where the tracer lacks it."""
    is_norm = [getattr(c, "func", None) is not None and c.func.__name__ == "gpu_rms_norm"
               for c in contexts]
    if kind == "composite":
        return [c for c, n in zip(contexts, is_norm) if not n]
    return contexts if any(is_norm) else [*contexts, rms_norm_as("fused")]


def build_model(seq_len: int, fuse_qkv: bool):
    import dataclasses

    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.feed_forward import compute_ffn_hidden_dim
    from torchtitan.models.llama3 import (
        _EMBEDDING_INIT,
        _NORM_INIT,
        Llama3Model,
        _build_llama3_layers,
        _output_linear_init,
    )

    d = DIMS
    dim, vocab = d["dim"], d["vocab_size"]
    hidden = compute_ffn_hidden_dim(dim, multiple_of=d["multiple_of"],
                                    ffn_dim_multiplier=d["ffn_dim_multiplier"])
    layers = _build_llama3_layers(
        fuse_qkv=fuse_qkv, n_layers=d["n_layers"], dim=dim, n_heads=d["n_heads"],
        n_kv_heads=d["n_kv_heads"], hidden_dim=hidden, attn_backend="flex",
        rope=ComplexRoPE.Config(dim=dim // d["n_heads"], max_seq_len=seq_len, theta=500000,
                                scaling="llama"))
    for layer in layers:
        layer.attention = dataclasses.replace(
            layer.attention, inner_attention=ScaledDotProductAttention.Config())
    config = Llama3Model.Config(
        dim=dim, vocab_size=vocab,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim,
                                        param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab,
                              param_init=_output_linear_init(dim)),
        layers=layers)
    return config.build(), hidden


def apply_policy(model: torch.nn.Module, policy: str) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    if policy == "full":
        FullAC(FullAC.Config()).apply(model)
    elif policy == "selective_op":
        SelectiveAC(SelectiveAC.Config()).apply(model)
    elif policy.startswith("selective_layer_"):  # torchtitan <= 0.2, selective_ac_option "N"
        freq = int(policy.rsplit("_", 1)[1])
        layers = model.get_submodule("layers")
        for count, (layer_id, block) in enumerate(list(layers.named_children()), start=1):
            if count % freq == 0:
                layers.register_module(
                    layer_id, checkpoint_wrapper(block, preserve_rng_state=False))


class Traced(torch.nn.Module):
    """The torchtitan model, plus its blocks as an nn.ModuleList (trainmem's tracer finds the
    repeated blocks there; torchtitan keeps them in a ModuleDict)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.blocks = torch.nn.ModuleList(list(model.layers.values()))

    def forward(self, tokens):
        return self.model(tokens)


def trace(policy: str, micro_batch: int, seq_len: int, optimizer: str, fuse_qkv: bool = True,
          rms_norm: str = "composite", silu: str = "composite"):
    from torchtitan.components.loss import IGNORE_INDEX, CrossEntropyLoss

    loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config(global_vocab_size=DIMS["vocab_size"]))
    info: dict = {}

    def build():
        model, info["hidden"] = build_model(seq_len, fuse_qkv)
        tokens = torch.randint(0, DIMS["vocab_size"], (micro_batch, seq_len))
        labels = torch.randint(0, DIMS["vocab_size"], (micro_batch, seq_len))

        def loss(m, batch):
            pred = m(batch[0])
            return loss_fn(pred, batch[1], (batch[1] != IGNORE_INDEX).sum())[0]

        return step.StepJob(model=Traced(model), batch=(tokens, labels), loss=loss,
                            enable_recompute=lambda traced: apply_policy(traced.model, policy))

    marks: dict = {}

    def on_phase_end(name: str) -> None:
        tracker = TRACKERS[-1]
        if name == "warm-up":
            marks["start"] = tracker.sequence
        elif name == "forward":  # what the forward leaves alive: its saved tensors
            marks["saved"] = saved_since(tracker, marks["start"])

    device_type, contexts, note = step_contexts(device="cuda", fake=True, sdpa_kernel="flash")
    assert device_type == "cuda" and not note, note
    contexts = norm_contexts(contexts, rms_norm)
    if silu == "fused":  # aten::silu_backward as one CUDA kernel (no decomposed temporaries)
        import make_torchtitan_8b_fsdp_traces as t8

        contexts = [*contexts, t8.silu_as("fused")]
    out = step.run_step(build, precision="bf16",
                        recompute="none" if policy == "none" else "full",
                        optimizer=optimizer, device_type=device_type, contexts=contexts,
                        on_phase_end=on_phase_end)
    d, tokens = DIMS, micro_batch * seq_len
    head_dim = d["dim"] // d["n_heads"]
    rope_cache = step.rounded(seq_len * head_dim // 2 * 8)  # complex64 [seq, head_dim / 2]
    return {
        "policy": policy, "micro_batch_size": micro_batch, "seq_len": seq_len, "tokens": tokens,
        "optimizer": optimizer, "fuse_qkv": fuse_qkv, "rms_norm": rms_norm,
        "silu": silu,
        "dims": {"hidden": d["dim"], "intermediate": info["hidden"], "heads": d["n_heads"],
                 "kv_heads": d["n_kv_heads"], "head_dim": head_dim, "vocab": d["vocab_size"],
                 "layers": d["n_layers"]},
        "parameters_bytes": out["parameters_bytes"],
        "gradients_bytes": out["gradients_bytes"],
        "optimizer_states_bytes": out["optimizer_states_bytes"],
        "rope_cache_buffers_bytes": rope_cache * d["n_layers"],
        "activations_bytes": out["activations_bytes"],
        "activations_by_layer_bytes": out["activations_by_layer_bytes"],
        "activations_outside_layers_bytes": out["activations_outside_layers_bytes"],
        "saved_width_per_layer_elements": [b / (tokens * 2)
                                           for b in out["activations_by_layer_bytes"]],
        "peak_forward_bytes": out["phases"]["forward"],
        "peak_backward_bytes": out["phases"]["backward"],
        "peak_optimizer_step_bytes": out["phases"]["optimizer_step"],
        "peak_allocated_bytes": out["peak_allocated_bytes"],
        "peak_phase": out["peak_phase"],
        "gradients_at_peak_bytes": out["gradients_at_peak_bytes"],
        "num_parameters": out["num_parameters"],
        "saved_at_end_of_forward": marks["saved"],
    }


def main() -> None:
    cases = [trace(p, b, s, "adamw", rms_norm=n)
             for n in ("composite", "fused") for p in POLICIES for b, s in SHAPES]
    cases += [trace("none", b, s, "adamw-fused") for b, s in SHAPES]  # torchtitan's default
    cases += [trace("selective_op", b, s, "adamw", fuse_qkv=False) for b, s in SHAPES]
    cases += [trace(p, b, s, "adamw", rms_norm="fused", silu="fused")
              for p in POLICIES for b, s in SHAPES]
    OUT.write_text(json.dumps({
        "provenance": {
            "torchtitan": "0.3.0", "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": "PYTHONPATH=<torchtitan-0.3.0 src>:<deps> python "
                       "tests/data/framework_traces/make_torchtitan_traces.py",
            "deps": "tyro 1.0.17, docstring-parser 0.18.0, typeguard 4.6.1, spmd_types 0.2.3, "
                    "einops 0.8.2 (pip --no-deps); torchtitan.distributed.minimal_async_ep "
                    "stubbed (MoE triton kernels, unused by a dense model)",
            "device": "trainmem fake cuda (sm90), SDPA as flash (GQA native)",
            "notes": [
                "attention: torchtitan ScaledDotProductAttention (is_causal) replaces the "
                "registry's FlexAttention; model otherwise from llama3._build_llama3_layers",
                "loss: torchtitan CrossEntropyLoss: cross_entropy(logits.float(), sum) / "
                "valid tokens, on the full logits (the registry's llama3 trainers wrap it "
                "in ChunkedLossWrapper, not traced here)",
                "activations_by_layer_bytes: storages made inside block k alive at the end "
                "of forward; under checkpointing a block's kept input is the previous "
                "block's output, so it is counted in block k-1 (block 0's: outside)",
                "rms_norm composite: what the fake device runs on a CPU torch build; fused: "
                "the CUDA build's _fused_rms_norm saved set (input, rstd), emulated",
                "silu composite: fake mode decomposes aten::silu_backward "
                "(CompositeImplicitAutograd: sigmoid, 1 - sigmoid and their products, several "
                "[tokens, ffn] temporaries at once); fused: one kernel, one output like its "
                "input, as a GPU runs it (make_torchtitan_8b_fsdp_traces.py _FusedSiLU)",
                "rope_cache_buffers_bytes: complex64 ComplexRoPE caches (max_seq_len = "
                "seq_len, one per layer), computed, inside every peak",
            ],
        },
        "cases": cases,
    }, indent=1) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
