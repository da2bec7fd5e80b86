"""Regenerate litgpt_qlora.json: traced memory of LitGPT 0.5.13's QLoRA fine-tuning step
(`litgpt finetune_lora --quantize bnb.nf4 --precision bf16-true`) on trainmem's fake CUDA device.

Pinned: litgpt 0.5.13 source on PYTHONPATH (as make_litgpt_traces.py), lightning 2.6.6 (read,
not imported: its plugin is reproduced below), bitsandbytes 0.50.2 (pip install --no-deps),
torch 2.13.0+cpu. Not run at test time.

    PYTHONPATH=/path/to/litgpt-0.5.13-src python tests/data/framework_traces/make_litgpt_qlora_traces.py

bitsandbytes' own Python code runs as in make_hf_qlora_traces.py (imported first: its gemm_4bit
override, the CUDA kernel's dequantise-then-F.linear allocations); litgpt's model and loss as in
make_litgpt_traces.py (imported: its build_model, lightning stubbed). What LitGPT + Lightning do
on top, reproduced:

- finetune/lora.py setup: `--quantize bnb.nf4` is BitsandbytesPrecision("nf4", bf16)
  (lightning/fabric/plugins/precision/bitsandbytes.py). module_init_context replaces the class
  torch.nn.Linear by _NF4Linear while GPT(config) is built, so EVERY nn.Linear is NF4: each
  LoRALinear's / LoRAQKVLinear's base `linear` and the lm_head's (LoRALinear with r 0); lora_A,
  lora_B are nn.Parameters (bf16, not quantised). _NF4Linear: quant_type nf4,
  compress_statistics=False (fp32 absmax per 64 weights, no double quantisation; that is
  `bnb.nf4-dq`), quantised at construction on the GPU from `weight.to(torch.half)`, so each quant
  state's dtype is fp16: MatMul4Bit.backward's dequantize_4bit returns fp16 [N, K] and
  `.to(grad_output.dtype)` makes a bf16 copy beside it. Here the model is built, then each
  nn.Linear swapped (Params4bit cannot wrap a fake tensor: make_hf_qlora_traces.py's shim).
- main: the optimizer is bnb.optim.PagedAdamW over model.parameters() (utils.py
  instantiate_bnb_optimizer; fp32 states, paged only for tensors of >= 1e5 elements, none here),
  THEN transformer.wte is replaced by bnb's StableEmbedding (a LayerNorm after the lookup)
  copied from the old one. The old embedding stays referenced (main's local `old_embedding`, and
  the optimizer's param group), the new one's weight and norm require grad but are not in the
  optimizer: backward computes a [V, h] bf16 gradient that optimizer.zero_grad never frees.
- fit, under Fabric: forward_context sets the default dtype bf16 (StableEmbedding's
  `emb.to(torch.get_default_dtype())` is bf16), and _FabricModule.forward's convert_output casts
  the returned chunk logits to the default dtype outside it: fp32 (lightning/fabric/wrappers.py,
  plugins/precision/bitsandbytes.py convert_output); chunked_cross_entropy runs on those.

The third case replays bitsandbytes <= 0.43.1's MatMul4Bit.forward, which kept its input
(`ctx.tensors = (A, B)` when an input needs a gradient; 0.43.2+ keep `(None, B)`): how much the
stacks LitGPT's published QLoRA tables ran on kept beyond 0.50.2.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import make_hf_qlora_traces as hfq  # noqa: E402  (bnb fakes as CUDA; before litgpt's stubs)
import make_litgpt_traces as lt  # noqa: E402  (lightning stubbed, litgpt from PYTHONPATH)

import bitsandbytes as bnb  # noqa: E402
from torch._subclasses.fake_tensor import unset_fake_temporarily  # noqa: E402

import trainmem.trace._step as step  # noqa: E402
from trainmem.trace._core import step_contexts  # noqa: E402
from _trace_origins import TRACKERS, saved_since  # noqa: E402

OUT = Path(__file__).with_name("litgpt_qlora.json")
DIMS = lt.DIMS
MICRO_BATCH, SEQ_LEN = 2, 1024


def quantise_every_linear(model) -> list:
    """Lightning's _NF4Linear for every nn.Linear (the head included): NF4, fp32 absmax, no
    double quantisation, quantised from an fp16 copy; the quant states, for their bytes."""
    states = []
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            with unset_fake_temporarily():
                q = bnb.nn.Linear4bit(child.in_features, child.out_features,
                                      bias=child.bias is not None, compute_dtype=torch.bfloat16,
                                      compress_statistics=False, quant_type="nf4",
                                      quant_storage=torch.uint8, device="meta")
            w4, state = bnb.functional.quantize_4bit(
                child.weight.data.contiguous().to(torch.half), blocksize=64,
                compress_statistics=False, quant_type="nf4", quant_storage=torch.uint8)
            weight = torch.nn.Parameter(w4, requires_grad=False)
            weight.quant_state, weight.bnb_quantized = state, True
            weight.quant_type, weight.blocksize, weight.compress_statistics = "nf4", 64, False
            weight.quant_storage, weight.module = torch.uint8, q
            q.weight, q.quant_state = weight, state
            q.compute_type_is_set = False  # BitsandbytesPrecision.convert_module
            setattr(module, name, q)
            states.append(state)
    return states


def trace(targets: dict, *, old_bnb: bool = False) -> dict:
    from bitsandbytes.nn import StableEmbedding
    from litgpt.utils import chunked_cross_entropy

    held: dict = {}
    states: list = []

    def build():
        model = lt.build_model(SEQ_LEN, targets, 0.05, "bf16")
        states.extend(quantise_every_linear(model))
        old = model.transformer.wte  # main's `old_embedding`: referenced through fit
        plain = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # .to(dtype=old.weight.dtype): bf16
        try:
            new = StableEmbedding(old.num_embeddings, old.embedding_dim)
        finally:
            torch.set_default_dtype(plain)
        with torch.no_grad():
            new.weight.copy_(old.weight)
        model.transformer.wte, held["old_embedding"], held["new"] = new, old, new
        for p in new.parameters():  # made after the optimizer: run_step must not see them
            p.requires_grad_(False)
        tokens = torch.randint(0, DIMS["vocab"], (MICRO_BATCH, SEQ_LEN))
        labels = torch.randint(0, DIMS["vocab"], (MICRO_BATCH, SEQ_LEN))

        def loss(m, batch):
            plain = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16)  # Fabric forward_context
            try:
                logits = m(batch[0], lm_head_chunk_size=lt.LM_HEAD_CHUNK_SIZE)
            finally:
                torch.set_default_dtype(plain)
            logits = [t.to(plain) for t in logits]  # convert_output: fp32
            held["logits"] = logits  # fit's `logits` local, until the next forward returns
            logits[-1] = logits[-1][..., :-1, :]
            return chunked_cross_entropy(logits, batch[1][..., 1:])

        return step.StepJob(model=model, batch=(tokens, labels), loss=loss, full_warm_up=True,
                            dtypes_set=True)

    def paged_adamw(params, optimizer):  # instantiate_bnb_optimizer, then the new wte
        opt = bnb.optim.PagedAdamW(params)
        for p in held["new"].parameters():
            p.requires_grad_(True)
        return opt

    marks: dict = {}

    def on_phase_end(name: str) -> None:
        tracker = TRACKERS[-1]
        if name == "warm-up":
            marks["start"] = tracker.sequence
        elif name == "forward":
            marks["saved"] = saved_since(tracker, marks["start"])

    device_type, contexts, note = step_contexts(device="cuda", fake=True, sdpa_kernel="flash")
    assert device_type == "cuda" and not note, note
    plain_silu, plain_opt, plain_sync = lt.F.silu, step._make_optimizer, torch.cuda.synchronize
    lt.F.silu = lambda x, inplace=False: lt._FusedSiLU.apply(x)
    step._make_optimizer, torch.cuda.synchronize = paged_adamw, lambda *a, **k: None
    plain_forward = hfq.old_bnb_saves_input() if old_bnb else None
    try:
        out = step.run_step(build, precision="bf16", recompute="none", optimizer="adamw",
                            device_type=device_type, contexts=contexts,
                            on_phase_end=on_phase_end)
    finally:
        lt.F.silu, step._make_optimizer, torch.cuda.synchronize = plain_silu, plain_opt, plain_sync
        if plain_forward is not None:
            bnb.autograd._functions.MatMul4Bit.forward = staticmethod(plain_forward)
    return {
        "targets": targets, "bnb_saves_input": old_bnb, "lora_dropout": 0.05,
        "precision": "bf16", "ac": False, "micro_batch_size": MICRO_BATCH, "seq_len": SEQ_LEN,
        "tokens": MICRO_BATCH * SEQ_LEN, "optimizer": "adamw", "dims": DIMS, "lora_rank": 16,
        "lm_head_chunk_size": lt.LM_HEAD_CHUNK_SIZE,
        **{k: out[k] for k in (
            "parameters_bytes", "gradients_bytes", "optimizer_states_bytes",
            "activations_bytes", "activations_by_layer_bytes",
            "activations_outside_layers_bytes", "peak_allocated_bytes", "peak_phase",
            "transient_bytes", "transient_phase", "num_parameters", "trainable_parameters")},
        "quant_state_bytes": sum(s.absmax.untyped_storage().nbytes() for s in states),
        "peak_forward_bytes": out["phases"]["forward"],
        "peak_backward_bytes": out["phases"]["backward"],
        "peak_optimizer_step_bytes": out["phases"]["optimizer_step"],
        "saved_at_end_of_forward": marks["saved"],
    }


def main() -> None:
    cases = [trace(lt.DEFAULT_TARGETS), trace(lt.ALL_TARGETS),
             trace(lt.DEFAULT_TARGETS, old_bnb=True)]
    OUT.write_text(json.dumps({
        "provenance": {
            "litgpt": "0.5.13", "lightning": "2.6.6 (BitsandbytesPrecision reproduced)",
            "bitsandbytes": bnb.__version__, "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": "PYTHONPATH=<litgpt-0.5.13 src> python "
                       "tests/data/framework_traces/make_litgpt_qlora_traces.py",
            "device": "trainmem fake cuda (sm90), SDPA as flash, silu_backward fused, "
                      "gemm_4bit as the CUDA kernel's dequantise + F.linear",
            "notes": [
                "parameters_bytes: packed NF4 uint8 weights (every Linear, head included), "
                "bf16 norms, old and new embeddings, StableEmbedding's norm and the bf16 "
                "adapters; quant_state_bytes: the fp32 absmax tensors (not parameters; the "
                "engine counts them in parameters)",
                "the new embedding's [V, h] bf16 gradient is in no optimizer: kept from the "
                "warm-up on (in activations_outside_layers_bytes)",
                "case 3 (bnb_saves_input): bitsandbytes <= 0.43.0 MatMul4Bit keeping its input",
            ],
        },
        "cases": cases,
    }, indent=1) + "\n")
    for c in cases:
        print(c["bnb_saves_input"], c["parameters_bytes"], c["activations_bytes"],
              c["peak_allocated_bytes"], c["peak_phase"])


if __name__ == "__main__":
    main()
