"""Regenerate hf_qlora.json: traced memory of a Hugging Face QLoRA step as bitsandbytes and peft
run it (transformers' bitsandbytes 4-bit loading, peft.prepare_model_for_kbit_training,
get_peft_model) on trainmem's fake CUDA device.

Pinned: bitsandbytes 0.50.2 and accelerate 1.15.0 (pip install --no-deps; peft imports
accelerate), peft 0.21.2, transformers 5.24.0, torch 2.13.0+cpu. Not run at test time.

    python tests/data/framework_traces/make_hf_qlora_traces.py
    python tests/data/framework_traces/make_hf_qlora_traces.py --old-bnb

`--old-bnb` writes hf_qlora_old_bnb.json instead: the same three cases with bitsandbytes
<= 0.43.1's MatMul4Bit.forward replayed, which keeps its input for backward (`ctx.tensors =
(A, B)` when an input needs a gradient; 0.43.2 on keep `(None, B)`); every case carries
"bnb_saves_input": true. Only what is kept differs: the forward's kernels stay 0.50.2's.

The real bitsandbytes Python code runs: bitsandbytes 0.50.2 registers a fake (meta) kernel for
each of its ops (bitsandbytes/_ops.py register_fake), so Linear4bit.forward, bnb.matmul_4bit,
MatMul4Bit.forward/backward, functional.quantize_4bit and dequantize_4bit run on fake tensors.
What differs from the GPU, and how this script makes it the GPU's:

- gemm_4bit's fake kernel allocates only the output. Its CUDA kernel (backends/cuda/ops.py,
  `bitsandbytes::gemm_4bit` for "cuda") takes `_dequant_linear_fallback` for M = b s > 1536
  (`_gemm_4bit_custom_max_m`): an fp32 absmax [blocks], the whole weight dequantised to
  A's dtype [N, K], then F.linear. The fake kernel is overridden with those allocations
  (M = 2048 here).
- Params4bit (a torch.Tensor subclass made with _make_subclass) cannot wrap a FakeTensor: the
  weight is quantised with functional.quantize_4bit (as Params4bit._quantize does) and held by
  a plain frozen nn.Parameter carrying the same attributes (quant_state, quant_type, blocksize,
  bnb_quantized, module); Linear4bit is built on the meta device, its weight then replaced.
  Linear4bit.forward reads only weight.quant_state (fix_4bit_weight_quant_state_from_module).
- functional.quantize_blockwise builds its 256-entry dynamic code with .tolist() (data-
  dependent): the cache entry name2qmap["dynamic"] is set to an empty fp32 [256] first.

Recipe (transformers' BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=bf16), the model loaded in bf16): every
nn.Linear but lm_head becomes Linear4bit (get_keys_to_not_convert keeps the head), the model
flagged is_loaded_in_4bit, then peft.prepare_model_for_kbit_training(model,
use_gradient_checkpointing=(recompute == "full")) casts every other bf16 parameter to fp32, and
get_peft_model(LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear"))
adds fp32 adapters (peft's bnb Linear4bit LoRA layer). run_step then runs AdamW (foreach) on the
adapters, under torch.autocast(bf16) for amp-bf16.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))

import bitsandbytes as bnb  # noqa: E402
import peft  # noqa: E402
import transformers  # noqa: E402
from _trace_origins import TRACKERS, saved_since  # noqa: E402  (patches the Tracker)
from torch._subclasses.fake_tensor import unset_fake_temporarily  # noqa: E402

import trainmem.trace._step as step  # noqa: E402
from trainmem.trace._core import hf_job, step_contexts, unpacked_batches  # noqa: E402
from trainmem.trace._lora import in_place_module_to  # noqa: E402

OUT = Path(__file__).with_name("hf_qlora.json")
OUT_OLD_BNB = Path(__file__).with_name("hf_qlora_old_bnb.json")
DIMS = {"hidden": 512, "intermediate": 1536, "heads": 8, "kv_heads": 2, "layers": 4,
        "vocab": 2048}
CONFIG = {"model_type": "llama", "hidden_size": DIMS["hidden"],
          "intermediate_size": DIMS["intermediate"], "num_attention_heads": DIMS["heads"],
          "num_key_value_heads": DIMS["kv_heads"], "num_hidden_layers": DIMS["layers"],
          "vocab_size": DIMS["vocab"], "max_position_embeddings": 4096,
          "tie_word_embeddings": False}
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"}
CASES = [("amp-bf16", "none"), ("amp-bf16", "full"), ("bf16", "none")]
MICRO_BATCH, SEQ_LEN = 1, 2048


def gemm_4bit_cuda(A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None,
                   absmax_code=None, absmax_offset=None):
    """What bitsandbytes 0.50.2's CUDA gemm_4bit allocates for M > 1536
    (backends/cuda/ops.py _dequant_linear_fallback)."""
    if absmax_8bit is not None:
        absmax = torch.empty_like(absmax_8bit, dtype=torch.float32) + absmax_offset
    weight = torch.empty(shapeB, dtype=A.dtype, device=A.device)
    return F.linear(A, weight, bias)


torch.library.register_fake("bitsandbytes::gemm_4bit", gemm_4bit_cuda, allow_override=True)


def quantise_linears(model) -> list:
    """Every nn.Linear but lm_head as an NF4 Linear4bit (double quantisation, bf16 compute);
    the quant states, for their bytes."""
    states = []
    bnb.functional.name2qmap["dynamic"] = torch.empty(256, dtype=torch.float32, device="cuda")
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if not isinstance(child, torch.nn.Linear) or name == "lm_head":
                continue
            with unset_fake_temporarily():
                q = bnb.nn.Linear4bit(child.in_features, child.out_features,
                                      bias=child.bias is not None, compute_dtype=torch.bfloat16,
                                      compress_statistics=True, quant_type="nf4",
                                      quant_storage=torch.uint8, device="meta")
            w4, state = bnb.functional.quantize_4bit(
                child.weight.data.contiguous(), blocksize=64, compress_statistics=True,
                quant_type="nf4", quant_storage=torch.uint8)
            weight = torch.nn.Parameter(w4, requires_grad=False)
            weight.quant_state, weight.bnb_quantized = state, True
            weight.quant_type, weight.blocksize, weight.compress_statistics = "nf4", 64, True
            weight.quant_storage, weight.module = torch.uint8, q
            q.weight, q.quant_state = weight, state
            setattr(module, name, q)
            states.append(state)
    model.is_loaded_in_4bit = True
    return states


def quant_state_bytes(states) -> int:
    """Device bytes of the quant states' tensors (absmax uint8, nested fp32 absmax, offset;
    the shared 256-entry code once)."""
    seen, total = set(), 0
    for s in states:
        for t in (s.absmax, s.state2.absmax, s.offset, s.state2.code):
            key = id(t.untyped_storage())
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
    return total


def old_bnb_saves_input():
    """bitsandbytes <= 0.43.1 MatMul4Bit.forward: `ctx.tensors = (A, B)` if any input needs a
    gradient (0.43.2 on: `(None, B)`); make_litgpt_qlora_traces.py replays it too. Returns the
    plain forward, to put back."""
    plain = bnb.autograd._functions.MatMul4Bit.forward

    def forward(ctx, A, B, out=None, bias=None, quant_state=None):
        output = plain(ctx, A, B, out, bias, quant_state)
        if any(ctx.needs_input_grad[:2]):
            ctx.tensors = (A, ctx.tensors[1])
        return output

    bnb.autograd._functions.MatMul4Bit.forward = staticmethod(forward)
    return plain


def trace(precision: str, recompute: str, *, old_bnb: bool = False) -> dict:
    marks: dict = {}
    states: list = []

    def on_phase_end(name: str) -> None:
        tracker = TRACKERS[-1]
        if name == "warm-up":
            marks["start"] = tracker.sequence
        elif name == "forward":
            marks["saved"] = saved_since(tracker, marks["start"])

    device_type, contexts, note = step_contexts(device="cuda", fake=True, sdpa_kernel="flash")
    assert device_type == "cuda" and not note, note
    base = hf_job(CONFIG, micro_batch_size=MICRO_BATCH, seq_len=SEQ_LEN, precision=precision,
                  attention="flash", device_type=device_type)

    def build():
        job = base()
        step.cast_floating(job.model, torch.bfloat16)  # loaded in bf16
        states.extend(quantise_linears(job.model))
        peft.prepare_model_for_kbit_training(
            job.model, use_gradient_checkpointing=recompute == "full")
        with in_place_module_to():
            job.model = peft.get_peft_model(job.model, peft.LoraConfig(
                **LORA, task_type="CAUSAL_LM"))
        job.dtypes_set = True
        return job

    plain_forward = old_bnb_saves_input() if old_bnb else None
    try:
        out = step.run_step(build, precision=precision, recompute=recompute,
                            optimizer="adamw", device_type=device_type,
                            contexts=[*contexts, unpacked_batches()],
                            on_phase_end=on_phase_end)
    finally:
        if plain_forward is not None:
            bnb.autograd._functions.MatMul4Bit.forward = staticmethod(plain_forward)
    return {
        **({"bnb_saves_input": True} if old_bnb else {}),
        "precision": precision, "recompute": recompute, "micro_batch_size": MICRO_BATCH,
        "seq_len": SEQ_LEN, "optimizer": "adamw", "dims": DIMS, "lora": LORA,
        **{k: out[k] for k in (
            "parameters_bytes", "gradients_bytes", "optimizer_states_bytes",
            "activations_bytes", "activations_by_layer_bytes",
            "activations_outside_layers_bytes", "peak_allocated_bytes", "peak_phase",
            "transient_bytes", "transient_phase", "num_parameters", "trainable_parameters")},
        "quant_state_bytes": quant_state_bytes(states),
        "peak_forward_bytes": out["phases"]["forward"],
        "peak_backward_bytes": out["phases"]["backward"],
        "peak_optimizer_step_bytes": out["phases"]["optimizer_step"],
        "saved_at_end_of_forward": marks["saved"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-bnb", action="store_true",
                        help="replay bitsandbytes <= 0.43.1's MatMul4Bit keeping its input; "
                             f"write {OUT_OLD_BNB.name}")
    parser.add_argument("--out", help="write here instead (a check against the committed file)")
    args = parser.parse_args()
    cases = [trace(p, r, old_bnb=args.old_bnb) for p, r in CASES]
    notes = [
        "gemm_4bit's fake kernel replaced by the CUDA kernel's allocations for M > "
        "1536 (the fp32 absmax, the [N, K] weight dequantised to bf16, F.linear); see "
        "the script's docstring for the Params4bit and dynamic-code shims",
        "parameters_bytes counts the parameters (packed NF4 uint8 weights, fp32 "
        "embeddings, norms, head and adapters); quant_state_bytes the quant states' "
        "absmax tensors and code, which the engine counts in parameters",
        "bf16 (no autocast): prepare_model_for_kbit_training leaves an fp32 residual "
        "stream, so q, k, v reach SDPA in fp32 and grouped-query attention takes the "
        "math kernel (scores [b, a, s, s] fp32 saved)",
    ]
    command = "python tests/data/framework_traces/make_hf_qlora_traces.py"
    if args.old_bnb:
        command += " --old-bnb"
        notes.append(
            "bnb_saves_input: bitsandbytes <= 0.43.1's MatMul4Bit.forward replayed on "
            "0.50.2, keeping its input A (Linear4bit's x.to(compute_dtype)) in ctx.tensors "
            "when an input needs a gradient (0.43.2 on keep (None, B)); kernels stay 0.50.2's")
        notes.append(
            "recompute full: transformers' non-reentrant checkpoint (use_reentrant=False, its "
            "default); A sits in ctx.tensors, not save_for_backward, so the checkpoint's saved-"
            "tensor hooks do not drop it: every Linear4bit input is kept through the forward")
    data = {
        "provenance": {
            "bitsandbytes": bnb.__version__, "peft": peft.__version__,
            "transformers": transformers.__version__, "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": command,
            "device": "trainmem fake cuda (sm90), SDPA as flash where its inputs allow",
            "notes": notes,
        },
        "cases": cases,
    }
    out = Path(args.out) if args.out else OUT_OLD_BNB if args.old_bnb else OUT
    out.write_text(json.dumps(data, indent=1) + "\n")
    for c in cases:
        print(c["precision"], c["recompute"], c["activations_bytes"], c["peak_allocated_bytes"])


if __name__ == "__main__":
    main()
