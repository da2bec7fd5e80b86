"""Regenerate megatron_gpt_local.json: traced memory of a megatron-core training step (GPTModel,
local layer spec, Float16Module bf16, megatron DistributedDataParallel with a contiguous fp32
grad buffer, DistributedOptimizer / Adam) on trainmem's fake CUDA device (no GPU, no memory).

Pinned: megatron-core 0.16.1 (source on PYTHONPATH; no further deps: torch, packaging, numpy),
torch 2.13.0+cpu. No Transformer Engine, no apex. Not run at test time.

    PYTHONPATH=/path/to/megatron-core-src python \
        tests/data/framework_traces/make_megatron_traces.py

World 1 (tp = pp = cp = dp = 1) on torch.distributed's "fake" backend (trainmem.trace._dist);
also tp 2 on a fake world of 2 (rank 0 measured, dp 1, no sequence parallel: the local spec's
WrappedTorchNorm refuses it without apex / TE, torch_norm.py:32).
Workarounds, none of which allocates or frees device memory:
- torch.cuda.current_device/device_count/is_available/synchronize/Stream/Event/current_stream/
  default_stream/empty_cache/get_rng_state answer as a GPU would (CPU build of torch);
- tensor_parallel.random: CudaRNGStatesTracker.fork is a null context, _set_cuda_rng_state a no-op,
  _get_cuda_rng_state a host byte tensor (RNG state lives in the generator, not in tracked storages);
- parallel_state.initialize_model_parallel(create_gloo_process_groups=False): the fake backend
  cannot make gloo groups (ProcessGroupGloo: "Not implemented");
- torch.distributed.all_gather_object (optimizer param-group keys; pickles through .item(),
  which fake tensors cannot answer) gives every fake rank this rank's object;
- torch.tensor(data, device="cuda") (small constants) is an empty one of its shape (fake tensors hold no values): under
  FakeTensorMode it would build a real CUDA tensor first (no CUDA backend on this build);
- param_and_grad_buffer._coalescing_manager runs the bucket collectives one by one (c10d's
  reduce_scatter_tensor_coalesced_ has no fake kernel); at world 1 the reduce-scatter output is
  a view of the grad buffer (no allocation either way);
- ChainedOptimizer.get_grad_norm (computed for logging even with clip_grad 0) answers 0.0: its
  fallback multi_tensor_l2norm reads values (.item()); on a GPU it allocates a few scalars;
- torch.optim.optimizer._foreach_supported_types also lists FakeTensor, so that megatron's
  fallback optimizer (torch.optim.AdamW, foreach=None) takes the foreach path as on a GPU;
- Float16Module's module.bfloat16() is done in place (trainmem.trace._step.cast_floating: the
  same bf16 parameters; Module._apply cannot swap weakly referenced fake tensors);
- megatron.core.jit.disable_jit_fuser(): jit_fuser is torch.compile on torch >= 2.2, which cannot
  run under the fake-tensor dispatch tracker; with bias_dropout_fusion, bias_activation_fusion,
  masked_softmax_fusion, gradient_accumulation_fusion (apex ext), persist_layer_norm off, the
  same functions run eagerly (a GPU with torch.compile'd bias-dropout-add / bias-gelu may save
  less; recorded as unfused).
Step (as megatron.core.pipeline_parallel.schedules.forward_backward_no_pipelining runs one micro
batch, and training.train_step): model.zero_grad_buffer(); optimizer.zero_grad(); forward
(GPTModel(tokens, position_ids, None, labels) -> per-token loss, fp32; loss = sum(loss *
loss_mask) / tokens); backward; model.finish_grad_sync(); optimizer.step(). One whole warm-up
step, then the measured one. Bytes counted by trainmem.trace._step.Tracker (512-byte rounding).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import sys
import warnings
from pathlib import Path

import torch

import trainmem.trace._step as step
from trainmem.trace._core import step_contexts
from trainmem.trace._dist import _DEFAULT_STREAM, _Event, _Stream, fake_process_group
from _trace_origins import saved_since  # (patches the Tracker)

warnings.filterwarnings("ignore")
OUT = Path(__file__).with_name("megatron_gpt_local.json")
DIMS = {"layers": 4, "hidden": 512, "heads": 8, "ffn": 2048, "vocab": 2048, "max_seq": 1024}
SHAPES = [(1, 1024), (2, 1024)]
RECOMPUTE = ["none", "selective", "full"]

import megatron.core.jit as mjit  # noqa: E402

mjit.disable_jit_fuser()  # before the fusions modules bind jit_fuser




def patch_cuda() -> None:
    c = torch.cuda
    c.current_device = lambda: 0
    c.device_count = lambda: 8
    c.is_available = lambda: True
    c.synchronize = lambda *a, **k: None
    c.Stream = _Stream
    c.Event = lambda *a, **k: _Event()
    c.current_stream = lambda *a, **k: _DEFAULT_STREAM
    c.default_stream = lambda *a, **k: _DEFAULT_STREAM
    c.stream = lambda s: contextlib.nullcontext()
    c.set_device = lambda d: None
    c.empty_cache = lambda: None
    c.get_rng_state = lambda *a, **k: torch.zeros(16, dtype=torch.uint8, device="cpu")
    c.manual_seed = lambda *a, **k: None


patch_cuda()

from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import (  # noqa: E402
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: E402
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: E402
from megatron.core.tensor_parallel import random as tprandom  # noqa: E402
from megatron.core.transformer.module import Float16Module  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

_plain_tensor = torch.tensor


def _tensor(data: object, *args: object, device: object = None, **kwargs: object) -> torch.Tensor:
    # torch.tensor(data, device="cuda") under FakeTensorMode makes a real CUDA tensor first
    if device is not None and "cuda" in str(device):
        host = _plain_tensor(data, *args, device="cpu", **kwargs)
        return torch.empty(host.shape, dtype=host.dtype, device=device)  # fake: no values
    return _plain_tensor(data, *args, device=device, **kwargs)


torch.tensor = _tensor


def _all_gather_object(out: list, obj: object, group: object = None) -> None:
    out[:] = [obj] * len(out)  # every fake rank holds the same object


torch.distributed.all_gather_object = _all_gather_object


class _Coalesced:
    def wait(self) -> None:
        return None


@contextlib.contextmanager
def _coalescing_manager(group: object = None, device: object = None, async_ops: bool = False):
    yield _Coalesced()  # the collectives inside run one by one (no coalesced fake kernel)


import megatron.core.distributed.param_and_grad_buffer as pgb  # noqa: E402

pgb._coalescing_manager = _coalescing_manager

from megatron.core.optimizer import optimizer as mopt  # noqa: E402

mopt.ChainedOptimizer.get_grad_norm = lambda self: 0.0
tprandom._set_cuda_rng_state = lambda *a, **k: None
# torch.optim picks foreach by exact tensor type (torch.Tensor, Parameter): a fake tensor would get
# the single-tensor loop, a real CUDA tensor the foreach kernels. Count fake tensors as real ones.
from torch._subclasses.fake_tensor import FakeTensor  # noqa: E402
import torch.optim.optimizer as _optim  # noqa: E402

_optim._foreach_supported_types.append(FakeTensor)
tprandom._get_cuda_rng_state = lambda *a, **k: torch.zeros(16, dtype=torch.uint8, device="cpu")
tprandom.CudaRNGStatesTracker.fork = (
    lambda self, name="model-parallel-rng": contextlib.nullcontext())


def config(recompute: str, tp: int = 1) -> TransformerConfig:
    d = DIMS
    extra: dict = {}
    if recompute == "selective":
        extra = {"recompute_granularity": "selective"}
    elif recompute == "full":
        extra = {"recompute_granularity": "full", "recompute_method": "uniform",
                 "recompute_num_layers": 1}
    return TransformerConfig(
        num_layers=d["layers"], hidden_size=d["hidden"], num_attention_heads=d["heads"],
        ffn_hidden_size=d["ffn"], bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16, bias_dropout_fusion=False, masked_softmax_fusion=False,
        bias_activation_fusion=False, gradient_accumulation_fusion=False,
        persist_layer_norm=False, tensor_model_parallel_size=tp, sequence_parallel=False,
        **extra)


def trace(recompute: str, micro_batch: int, seq_len: int, tp: int = 1) -> dict:
    d = DIMS
    device_type, contexts, note = step_contexts(device="cuda", fake=True, sdpa_kernel="flash")
    assert device_type == "cuda" and not note, note
    tracker = step.Tracker("cuda")
    marks: dict = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(fake_process_group(tp))
        parallel_state.initialize_model_parallel(tp, 1, create_gloo_process_groups=False)
        stack.callback(parallel_state.destroy_model_parallel)
        for c in contexts:
            stack.enter_context(c)
        stack.enter_context(tracker)
        cfg = config(recompute, tp)
        with torch.device("cuda"):
            gpt = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(),
                           vocab_size=d["vocab"], max_sequence_length=d["max_seq"],
                           share_embeddings_and_output_weights=True)
            # Float16Module calls module.bfloat16(), whose Module._apply swaps fake tensors and
            # refuses weakly referenced ones: cast in place first (same bytes), then no-op.
            step.cast_floating(gpt, torch.bfloat16)
            gpt.bfloat16 = lambda: gpt
            model = Float16Module(cfg, gpt)
            ddp_cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                                    use_distributed_optimizer=True,
                                                    overlap_grad_reduce=False)
            model = DistributedDataParallel(cfg, ddp_cfg, model)
            opt = get_megatron_optimizer(
                OptimizerConfig(optimizer="adam", lr=1e-4, bf16=True,
                                use_distributed_optimizer=True, clip_grad=0.0), [model],
                use_gloo_process_groups=False)
            tokens = torch.randint(0, d["vocab"], (micro_batch, seq_len))
            labels = torch.randint(0, d["vocab"], (micro_batch, seq_len))
            position_ids = torch.arange(seq_len).unsqueeze(0).expand(micro_batch, -1)
            loss_mask = torch.ones(micro_batch, seq_len, dtype=torch.float32)
        block_path, blocks = step.find_blocks(model)
        for index, block in enumerate(blocks):
            block.register_forward_pre_hook(
                lambda m, a, i=index: setattr(tracker, "scope", i))
            block.register_forward_hook(lambda m, a, o: setattr(tracker, "scope", step.OUTSIDE))
        params = list(model.parameters())
        for p in params:
            tracker.parameter_storages[p.untyped_storage()] = True
        model.train()

        def one_step(measured: bool) -> None:
            model.zero_grad_buffer()
            opt.zero_grad()
            marks["start_sequence"] = tracker.sequence
            marks["start_bytes"] = tracker.current_bytes
            tracker.phase = "forward"
            losses = model(tokens, position_ids, None, labels=labels)
            loss = torch.sum(losses.float().view(-1) * loss_mask.view(-1)) / loss_mask.sum()
            marks["end_of_forward_bytes"] = tracker.current_bytes
            marks["made_in_forward"] = tracker.made_after(marks["start_sequence"])
            saved = saved_since(tracker, marks["start_sequence"], owners=(0, step.OUTSIDE))
            marks["saved"] = {"outside": saved["outside"], "layer_0": saved["0"]}
            del losses
            tracker.phase = "backward"
            torch.autograd.backward(loss)
            del loss
            model.finish_grad_sync()
            tracker.phase = "optimizer_step"
            opt.step()
            tracker.phase = "idle"

        one_step(False)
        tracker.peaks.clear()
        tracker.peak_sequence.clear()
        one_step(True)
        grad_buffers = [b.grad_data for b in model.buffers]
        param_buffers = [b.param_data for b in model.buffers if b.param_data is not None]
        marks["gradients_bytes"] = tracker.storages_bytes(grad_buffers)
        marks["gradients_at_peak_bytes"] = marks["gradients_bytes"]
        inner = getattr(opt, "chained_optimizers", [opt])
        states, mains = [], []
        for o in inner:
            states += [v for s in o.optimizer.state.values() for v in s.values()
                       if torch.is_tensor(v)]
            for group in getattr(o, "shard_fp32_from_float16_groups", []):
                mains += list(group)
        out = step._report(tracker, marks, params=params,
                           trainable=[p for p in params if p.requires_grad], blocks=blocks,
                           block_path=block_path, states=states, started=0.0)
        main_bytes = tracker.storages_bytes(mains)
        global_buffer = tracker.storages_bytes(
            list(parallel_state.get_global_memory_buffer().buffer.values()))
        idle_bytes = tracker.current_bytes
        states_only = out["optimizer_states_bytes"]
        # main params are views of one or more fp32 shard storages or their own tensors
        tokens_n = micro_batch * seq_len
        return {
            "recompute": recompute, "micro_batch_size": micro_batch, "seq_len": seq_len,
            "tp": tp, "sequence_parallel": False, "world_size": tp, "rank": 0,
            "tokens": tokens_n,
            "dims": d, "core_attention": "DotProductAttention (unfused, scores materialised)",
            "num_parameters": out["num_parameters"],
            "param_buffer_bytes": tracker.storages_bytes(param_buffers),
            "parameters_bytes": out["parameters_bytes"],
            "grad_buffer_bytes": marks["gradients_bytes"],
            "main_params_fp32_bytes": main_bytes,
            "adam_states_bytes": states_only,
            "optimizer_dtypes": sorted({str(s.dtype) for s in states}),
            "global_memory_buffer_bytes": global_buffer,
            "idle_after_step_bytes": idle_bytes,
            "activations_bytes": out["activations_bytes"],
            "activations_by_layer_bytes": out["activations_by_layer_bytes"],
            "activations_outside_layers_bytes": out["activations_outside_layers_bytes"],
            "peak_forward_bytes": out["phases"].get("forward"),
            "peak_backward_bytes": out["phases"].get("backward"),
            "peak_optimizer_step_bytes": out["phases"].get("optimizer_step"),
            "peak_allocated_bytes": out["peak_allocated_bytes"],
            "peak_phase": out["peak_phase"],
            "saved_at_end_of_forward": marks["saved"],
            "layer_path": out["layer_path"], "layer_class": out["layer_class"],
            "parameters_per_layer": out["parameters_per_layer"],
        }


def main() -> None:
    only = sys.argv[1:]
    if only == ["tp2"]:
        for r in RECOMPUTE:
            c = trace(r, 1, 1024, tp=2)
            brief = {k: v for k, v in c.items() if k not in ("dims", "saved_at_end_of_forward")}
            print(json.dumps(brief), flush=True)
        return
    cases = []
    for r in RECOMPUTE:
        if only and r not in only:
            continue
        for b, s in SHAPES:
            c = trace(r, b, s)
            print(json.dumps({k: v for k, v in c.items() if k != "dims"}), flush=True)
            cases.append(c)
    if only:
        return
    for r in RECOMPUTE:  # tensor parallel 2 (world 2, rank 0), no sequence parallel
        c = trace(r, 1, 1024, tp=2)
        print(json.dumps({k: v for k, v in c.items() if k != "dims"}), flush=True)
        cases.append(c)
    OUT.write_text(json.dumps({
        "provenance": {
            "megatron-core": "0.16.1", "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": "PYTHONPATH=<megatron-core-0.16.1 src> python "
                       "tests/data/framework_traces/make_megatron_traces.py",
            "device": "trainmem fake cuda (sm90), fake process group world 1",
            "notes": [
                "workarounds: " + __doc__.split("Workarounds")[1].split("Step (as")[0].strip(),
                "core attention: the local spec's DotProductAttention through "
                "FusedScaleMaskSoftmax's torch path (the fused scaled_upper_triang_masked_"
                "softmax_cuda kernels come from apex / Megatron-LM's extensions, absent "
                "here and on a GPU with megatron-core alone): attention_softmax_in_fp32 "
                "(default True) saves the softmax output in fp32 [b, a, s, s] (4 bytes), the "
                "dropout mask (1) and the dropout output (2, for the bmm): 7 a s^2 b bytes, "
                "plus the [s, s] bool causal mask per layer; Korthikanti's 5 a s^2 b assumes "
                "the fused 16-bit softmax. No flash path without Transformer Engine: "
                "megatron-core 0.16.1's flash_attn imports (transformer/attention.py) serve "
                "inference with a KV cache only.",
                "parameters: GPTModel learned absolute positions, tied embeddings "
                "(share_embeddings_and_output_weights, Megatron-LM's default), LayerNorm, "
                "biases, GeLU MLP (GPT-2 layout: 14,183,424 parameters), bf16 in one "
                "contiguous param buffer (DDP with use_distributed_optimizer).",
                "grad_buffer_bytes: DDP's contiguous fp32 grad buffer (grad_reduce_in_fp32), "
                "allocated at wrap time and zeroed (not freed) each step: alive in every peak.",
                "main_params_fp32_bytes: DistributedOptimizer's fp32 shards of the bf16 "
                "params (world 1: all of them); adam_states_bytes: exp_avg, exp_avg_sq (fp32) "
                "of torch.optim.AdamW, foreach (megatron's fallback without TE / apex FusedAdam).",
                "global_memory_buffer_bytes: parallel_state's GlobalMemoryBuffer ('mpu'): "
                "DotProductAttention's baddbmm output [b a, s, s] bf16 (beta 0), made in the "
                "warm-up's first forward and kept for the run (2 a s^2 b bytes, one for all "
                "layers): in every peak, not in activations_bytes (it predates the measured "
                "step); idle_after_step_bytes = params + grad buffer + main params + states + "
                "it.",
                "tp 2 cases: world 2 on the fake backend, rank 0 measured, dp 1, "
                "sequence_parallel off: the local spec's norm without apex is "
                "WrappedTorchNorm, which asserts 'sequence parallel not supported by torch "
                "LayerNorm' (megatron/core/transformer/torch_norm.py:32), so tp + sp needs "
                "apex FusedLayerNorm or Transformer Engine.",
                "activations_by_layer_bytes: storages made inside layer k alive at the end of "
                "forward; saved_at_end_of_forward lists layer 0's and those outside layers.",
            ],
        },
        "cases": cases,
    }, indent=1) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
