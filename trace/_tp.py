"""`trainmem trace --num-gpus T --tp T [--sequence-parallel]`: rank 0 of a tensor-parallel
job on a fake process group.

The Hugging Face model is built as in the FSDP2 trace (trace/_dist.py) and its modules are
parallelised with torch.distributed.tensor.parallel.parallelize_module on the "tp" dimension of a
fake DeviceMesh, as Hugging Face's own tensor parallelism (`tp_plan`) lays them out:

- without sequence parallelism, the model's `tp_plan`: q/k/v and gate/up ColwiseParallel, o and
  down RowwiseParallel (an all-reduce to a replicated output), lm_head ColwiseParallel gathering
  its output (full logits, a plain cross entropy), and the token embedding RowwiseParallel on the
  vocabulary (transformers' `embedding_rowwise`, as in the plan of the ground-truth traces,
  tests/data/groundtruth/llama-2-7b_tp*.json; transformers 5.24's Llama plan leaves the embedding
  whole); the norms stay plain, full-size tensors on every rank;
- with --sequence-parallel, the layout of torchtitan's Llama `apply_tp` on the same modules: the
  embedding RowwiseParallel (vocab-sharded, its output reduce-scattered over the sequence), the
  norms SequenceParallel, the attention and MLP inputs all-gathered (PrepareModuleInput), o and
  down RowwiseParallel reduce-scattering to Shard(1), the final norm SequenceParallel and lm_head
  ColwiseParallel from Shard(1) gathering its output (full logits: Hugging Face's loss).

A tied lm_head (tie_word_embeddings) stays the embedding's own (vocab-sharded) tensor. The
engine's framework for these layouts is "hf" (transformers' model code and loss; sequence
parallelism splits the norms' and residuals' activations).

Not traced: TP with pipeline or context parallelism, TP with FSDP2 (fully_shard on the dp
sub-mesh of a 2-D fake mesh fails under fake tensors: a real mesh tensor reaches the fake mode),
ZeRO 1/2 or data-parallel replicas next to tp, models
whose tp_plan is not colwise/rowwise linears (fused qkv, MoE experts, q/k norms over the whole
projection), tp not dividing the key/value heads.

Source: torch/distributed/tensor/parallel/style.py (ColwiseParallel, RowwiseParallel,
SequenceParallel, PrepareModuleInput), torch 2.13; transformers/distributed/tensor_parallel.py
(the styles of `tp_plan`) and models/llama/configuration_llama.py (base_model_tp_plan),
modeling_llama.py (_tp_plan: lm_head colwise_gather_output), transformers 5.24; torchtitan 0.3.0
models/common/decoder_sharding.py (set_decoder_sharding_config, set_gqa_attention_sharding,
set_dense_ffn_sharding, norm_config: the sequence-parallel layout).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PLAIN_STYLES = ("colwise", "rowwise")
"""The tp_plan styles of the decoder layers the trace lays out (with lm_head's gather)."""
QK_NORM_STYLE = "replicated_with_grad_allreduce"
"""Per-head q/k norms (Qwen3): plain replicated weights whose gradients are all-reduced; the
all-reduce is in place, so they are kept plain here."""
FRAMEWORK = "hf"
"""The engine's framework whose semantics the traced layouts follow."""


def tp_precisions(*, num_gpus: int, tp: int) -> tuple[str, ...]:
    """Precisions of the TP trace: fp32, bf16 and amp-bf16 (autocast over the shards)."""
    return ("fp32", "bf16", "amp-bf16")


def check_tp(*, num_gpus: int, zero: int, tp: int) -> None:
    """One-line ValueErrors for the tensor-parallel layouts the trace does not run."""
    if num_gpus % tp:
        raise ValueError(f"tp: num-gpus ({num_gpus}) must be a multiple of tp ({tp})")
    if zero:
        raise ValueError(
            f"zero: the TP trace runs --zero 0 (got {zero}); FSDP2 next to tp is not traced "
            "(fully_shard on a 2-D fake mesh fails under fake tensors)"
        )
    if num_gpus != tp:
        raise ValueError(
            f"num-gpus: the TP trace runs tp ranks only (num-gpus {tp}); data-parallel "
            "replicas next to tp are not traced"
        )


def layer_plan(config: Any) -> dict[str, str]:
    """The decoder layers' tp_plan (module path under the base model -> style name), or a
    one-line ValueError naming what the trace cannot lay out."""
    plan = dict(getattr(config, "base_model_tp_plan", None) or {})
    if not plan:
        raise ValueError(f"tp: {config.model_type} has no tp_plan in transformers")
    layers = {k: v for k, v in plan.items() if v != QK_NORM_STYLE}
    if _num_experts(config) > 1 and not any(".mlp" in k for k in layers):
        raise ValueError(
            f"tp: {config.model_type}'s tp_plan leaves the MoE experts unsharded (attention "
            "only, as transformers 5.25 writes it); the TP trace lays out colwise/rowwise "
            "linears only (no fused qkv, MoE experts or whole-width q/k norms)"
        )
    odd = sorted({v for v in layers.values() if v not in PLAIN_STYLES})
    if odd:
        raise ValueError(
            f"tp: {config.model_type}'s tp_plan uses {', '.join(odd)}; the TP trace lays out "
            "colwise/rowwise linears only (no fused qkv, MoE experts or whole-width q/k norms)"
        )
    return layers


def _num_experts(config: Any) -> int:
    """The routed experts per MoE layer (0 for a dense model), under any of transformers'
    field names."""
    for name in ("num_local_experts", "num_experts", "n_routed_experts"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return 0


def heads_error(config: Any, tp: int) -> str:
    """Why tp cannot split the model's heads ("" when it can)."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    if heads % tp or kv % tp:
        return (
            f"tp: {tp} must divide the attention heads ({heads}) and key/value heads ({kv}); "
            "transformers' colwise q/k/v split whole heads"
        )
    return ""


def layer_norms(model: Any) -> list[str]:
    """The decoder layers' norms on the residual stream (input_layernorm,
    post_attention_layernorm, ...; not the per-head q/k norms inside attention)."""
    prefix = f"{model.base_model_prefix}.layers."
    return [
        name
        for name, _ in model.named_modules()
        if name.startswith(prefix)
        and "norm" in name.rsplit(".", 1)[-1]
        and name.rsplit(".", 1)[-1] not in ("q_norm", "k_norm")
    ]


def torch_plan(model: Any, *, sequence_parallel: bool) -> dict[str, Any]:
    """parallelize_module's plan (module path -> ParallelStyle) for `model` (see the module
    docstring)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    base = model.base_model_prefix
    layers = layer_plan(model.config)
    plan: dict[str, Any] = {}
    for key, style in layers.items():
        if style == "colwise":
            plan[f"{base}.{key}"] = ColwiseParallel()
        elif sequence_parallel:
            plan[f"{base}.{key}"] = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
        else:
            plan[f"{base}.{key}"] = RowwiseParallel()
    if sequence_parallel:
        for parent in sorted({k.rsplit(".", 1)[0] for k in layers}):
            # attention takes hidden_states by keyword, the MLP by position
            kwarg = parent.endswith("attn")
            plan[f"{base}.{parent}"] = PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)} if kwarg else None,
                desired_input_kwarg_layouts={"hidden_states": Replicate()} if kwarg else None,
                input_layouts=None if kwarg else (Shard(1),),
                desired_input_layouts=None if kwarg else (Replicate(),),
                use_local_output=True,
            )
        for name in layer_norms(model):
            plan[name] = SequenceParallel(use_local_output=False)
        plan[f"{base}.embed_tokens"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
        )
        plan[f"{base}.norm"] = SequenceParallel(use_local_output=False)
        plan["lm_head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    else:  # embedding_rowwise, colwise_gather_output
        plan[f"{base}.embed_tokens"] = RowwiseParallel(input_layouts=Replicate())
        plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    for style in plan.values():
        style.src_data_rank = None  # each rank's shard of the (fake) full tensor: no scatter
    return plan


def tp_job(
    config: dict[str, Any],
    *,
    num_gpus: int,
    tp: int,
    zero: int,
    sequence_parallel: bool,
    micro_batch_size: int,
    seq_len: int,
    precision: str,
    recompute: str,
    attention: str,
) -> Callable[[], Any]:
    """A builder of the tensor-parallel step (see the module docstring)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from ._dist import rank_base_job, wrapped_step

    plain = rank_base_job(
        config,
        micro_batch_size=micro_batch_size,
        seq_len=seq_len,
        precision=precision,
        attention=attention,
    )

    def build() -> Any:
        job = plain()
        model = job.model
        error = heads_error(model.config, tp)
        if error:
            raise ValueError(error)
        with unset_fake_temporarily():  # the meshes hold real rank numbers
            tp_mesh = init_device_mesh("cuda", (tp,), mesh_dim_names=("tp",))
        plan = torch_plan(model, sequence_parallel=sequence_parallel)
        parallelize_module(model, tp_mesh, plan)
        if getattr(model.config, "tie_word_embeddings", False):  # the head on the same shards
            model.get_output_embeddings().weight = model.get_input_embeddings().weight
        if recompute == "full" and job.enable_recompute is not None:
            job.enable_recompute(model)  # after the layout, as the HF Trainer does
        return wrapped_step(job, model)

    return build
