"""What each training framework does with the same flags: per-framework semantics as data.

One `FrameworkSpec` per name in FRAMEWORKS, each field citing the framework file it follows.
The engine reads them through the per-code tables below (indexed by the framework's code), so a
formula never tests a framework by its code or name. The decisions taken from branches on a
framework's code are fields without a default: a framework added without a value for one of
them fails at import, naming itself and the missing fields (framework_specs).

Behaviour shared by every framework is not in the table: model states shard over the data- and
context-parallel ranks together (see `state_shard_degree`).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any

import numpy as np

from ._codes import RECOMPUTE_SELECTIVE
from ._vocab import FRAMEWORKS, LOADS, LOSSES, OPTIMIZERS, PRECISIONS, RECOMPUTE


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameworkSpec:
    """One framework's meaning of the shared flags."""

    selective: str
    """The recompute policy `--recompute selective` means in this framework (its own default
    selective mode): `selective` (Megatron's: the attention core), `selective-op` (per-op SAC)
    or `selective-layer` (every N-th block checkpointed)."""
    loss_parallel: bool
    """Under tensor parallelism the logits stay sharded over the vocabulary and the loss is
    computed on the shards (each rank holds [T, v/tp] logits and loss tensors)."""
    fsdp2: bool
    """ZeRO-3 is torch FSDP2 (`fully_shard`): fp32 sharded parameters as the master copy, fp32
    reduced gradients, per-block all-gathers (else DeepSpeed ZeRO-3 or Megatron-FSDP)."""
    adapters_in_param_dtype: bool
    """LoRA adapters (and so their gradients and Adam states) in the model's parameter dtype;
    False: fp32 adapters whatever the base dtype."""
    fused_rms_norm: bool
    """RMSNorm is torch's fused kernel (saves its input and rstd), not a Python RMSNorm that
    saves an fp32 copy and the normalised tensor."""
    fused_qkv: bool
    """The framework's models project q, k and v with one matrix (one matmul output)."""
    load: str
    """How the stack builds its model and loads the pretrained checkpoint (`--load auto`), one
    of LOADS but `auto` (engine/_load.py)."""
    load_source: str
    """The stack's file that decides `load`."""
    load_sharded_qlora: str = ""
    """`--load auto` of a QLoRA job under ZeRO-3, where it differs from `load` (empty: `load`):
    a stack that builds a quantised model outside its sharding wrapper's init."""
    load_sharded_qlora_source: str = ""
    """The stack's files that decide `load_sharded_qlora`."""
    norm_input_fp32: bool = False
    """The fused RMSNorm runs on an fp32 copy of its input (`F.rms_norm(x.float())`), which it
    keeps for backward instead of the 16-bit input."""
    gqa_kv_expanded: bool = False
    """Grouped-query attention expands k and v to every query head before the attention
    kernel, which then keeps them at full width."""
    loss_parallel_fp32_tensors: float = 0.0
    """fp32 [T, v/tp] tensors the vocab-parallel loss allocates beyond a plain cross entropy's,
    in its forward and again in its backward."""
    fp8_weight_cache: bool = True
    """`--precision fp8-mixed` keeps fp8 copies of the weights from forward to backward
    (Transformer Engine); False: torchao's Float8Linear, which casts inside each linear and keeps
    its 16-bit input for backward (activations as bf16, no weight cache)."""
    logits_upcast_in_model: bool = False
    """The model itself returns fp32 logits (`output(h).float()`), so a compiled loss receives
    and keeps fp32 logits (unless the output is chunked)."""
    loss_softmax_in_place: bool = False
    """The cross entropy upcasts the logits once and normalises that fp32 copy in place into
    the softmax it saves for backward, whose backward writes the logits' gradient into the same
    tensor: beyond the saved fp32 [T, v] softmax, only the 16-bit logits in forward and the
    16-bit cast of the gradient in backward (else a plain cross entropy: logits.float(), then
    log_softmax saving its own fp32 output, and two fp32 gradients in backward)."""
    loss_logits_in_place: bool = False
    """The loss is one fused kernel on the 16-bit logits: it keeps them and an fp32 logsumexp per
    token for backward, and its backward writes the logits' gradient into the saved logits (no
    fp32 copy, no log-softmax, no new gradient tensor): flash-attn's Triton cross_entropy_loss
    with inplace_backward=True, the per-token log-probabilities of an RL actor's loss. Source:
    flash-attn 2.x flash_attn/ops/triton/cross_entropy.py CrossEntropyLoss (forward saves
    logits, lse and labels; backward `dlogits = logits if ctx.inplace_backward else
    torch.empty_like(logits)`)."""
    eager_softmax_fused: bool = False
    """With materialised attention scores (`--attention eager`) the masked softmax is a fused
    16-bit kernel wherever its shape limits allow: it keeps the 16-bit probabilities only (no
    fp32 copy, no causal mask); elsewhere, and under `--attention eager-unfused`, the softmax
    runs as torch ops on an fp32 copy of the scores."""
    fsdp2_embedding_unit: bool = False
    """FSDP2 wraps the token embedding as a unit of its own, resharded after forward, and the
    final norm + head as one kept unsharded until its backward; no block's gather is in flight
    at the loss (else the root holds embedding, norm and head unsharded from forward to the end
    of backward, and one block's gather is in flight)."""
    qlora_kbit_prepared: bool = False
    """`--qlora` is bitsandbytes' Linear4bit base on a model prepared by peft's
    prepare_model_for_kbit_training: every non-quantised 16-bit parameter (embeddings, norms,
    head) cast to fp32, so the residual stream is fp32 whatever the precision; Linear4bit returns
    its output in its input's dtype (`.to(inp_dtype)`: fp32), and peft's bnb LoRA layer feeds
    lora_A its input uncast under autocast. False: the frozen NF4 base leaves dtypes as they are
    (torchtune's torchao NF4Tensor on a model in its own dtype; no QLoRA recipe elsewhere).
    Neither base saves its input: bitsandbytes 0.50.2 MatMul4Bit.forward keeps (None, B),
    torchao LinearNF4 the weight only."""
    head_chunk_tokens: int = 0
    """The model runs its head over chunks of this many positions of each sequence and the
    recipe's loss is a cross entropy per chunk on the chunk's logits, with no fp32 copy of the
    whole (each chunk's log-softmax is saved; under autocast each chunk is upcast apart); the
    training loop holds the list of logits from forward until the next step's forward returns.
    0: one head over the sequence (what `--loss full` means elsewhere)."""
    head_chunk_lora_only: bool = False
    """head_chunk_tokens applies to the LoRA/QLoRA recipe only: a full fine-tune (no adapters)
    runs one head over the sequence and the generic loss. Source: litgpt 0.5.13
    finetune/full.py fit (`logits = model(input_ids)`, then `chunked_cross_entropy(logits[...,
    :-1, :], targets[..., 1:])` on the whole fp32 logits) vs finetune/lora.py fit
    (`model(input_ids, lm_head_chunk_size=128)`). Traced: litgpt_full.json. Ignores: the
    previous step's fp32 logits, which full.py's `logits` local keeps alive through the next
    forward (its traced forward peak is 1.9-4.5% under without AC)."""
    lora_dropout: bool = False
    """The recipe's LoRA dropout is on by default: every adapted module drops its input apart
    and keeps the dropped 16-bit copy (for lora_A's gradient) and a bool mask."""
    lora_qkv_zero_pad: bool = False
    """Adapters on the fused q/k/v projection are one module whose update, when not all of q, k
    and v are adapted, is scattered into a zeroed [T, q + 2 kv] tensor (index_copy_), which keeps
    the adapted part ([T, width of the adapted projections]) for backward."""
    norm_scale_fp32: bool = False
    """The Python RMSNorm multiplies its fp32 normalised tensor by the upcast weight before
    casting back, so a trainable scale keeps the fp32 normalised tensor (4 bytes, not the
    residual dtype's)."""
    o_proj_input_kept: bool = False
    """The output projection reads the attention kernel's own output (a view: SDPA's output is
    laid out [b, s, a, d]), which the kernel keeps for backward, so a frozen, unadapted o_proj
    frees nothing (else it frees the contiguous copy it would have saved)."""
    rope_buffers_fp32: bool = False
    """RoPE's cos/sin are fp32 model buffers of the training length, alive all run, not
    per-forward tables in the hidden dtype that the attention saves."""
    full_recompute_top_moment: bool = False
    """Under full recompute on one stage the blocks' backward has a top-block moment: every
    block's checkpointed input but the top one's still held while the next block recomputes
    and runs its backward (torch.utils.checkpoint, non-reentrant: a block recomputes when its
    backward starts; torch 2.13 torch/utils/checkpoint.py _checkpoint_hook unpack), with the
    FSDP2 buffers of the blocks' backward. False: only the end of backward in layer 0 (the
    moment the conformance matrix's tiny models peak at). Traced at real size:
    tests/data/real_size_traces.json. Off for litgpt: its traced LoRA step with every Block
    checkpointed (tests/data/framework_traces/litgpt_lora.json) peaks at the end of backward,
    and the engine's block working set (read off transformers blocks) is already +2.1% there;
    off for megatron and deepspeed, whose own checkpointing is not traced here."""
    loss: str = "full"
    """The loss `--loss auto` (the default) means: the loss the stack's own recipe or config
    runs, one of LOSSES but `auto`. `full`: one head over the sequence and one cross entropy
    (or what the stack's own fields make of it, e.g. LitGPT's head_chunk_tokens)."""
    tp_sequence_parallel: bool = False
    """Tensor parallelism runs sequence-parallel unless told otherwise (the norms' and residuals'
    activations sharded over the TP ranks, reduce-scatter / all-gather at the TP regions), so
    `--tp N` alone means TP with SP. Source: torchtitan 0.3.0 config/configs.py
    (Parallelism.enable_sequence_parallel = True; models/llama3/parallelize.py apply_tp uses
    SequenceParallel norms when it is set). False: SP only with `--sequence-parallel` (Megatron's
    --sequence-parallel is off by default). Traced: torchtitan_trainer_defaults.json debug-tp4."""
    rope_cache_per_block: bool = False
    """Every block owns a complex64 RoPE cache [training length, rotary dim / 2] (a buffer
    built at init, alive all run) beside the tables the attention saves."""
    zero_bucket_buffers: bool = False
    """ZeRO keeps its own 16-bit bucket buffers on the GPU: reduce (ipg) buckets from ZeRO-1 on
    and, under ZeRO-3, the prefetch bucket and a gathered block (deepspeed_buffer_bytes).
    Source: deepspeed 0.19.8 runtime/zero/stage_1_and_2.py setup_buckets, stage3.py
    _setup_for_real_optimizer (ipg_buckets)."""
    zero3_module_collectives: bool = False
    """ZeRO-3 gathers and reduce-scatters per module (a Linear or a norm), not per block, at
    the per-GPU share of the network (fsdp_exposed_s). Source: deepspeed 0.19.8
    runtime/zero/partitioned_param_coordinator.py (fetch_sub_module per submodule)."""
    offload_streams_gradients: bool = False
    """ZeRO-2/3 with the optimizer offloaded streams each reduced gradient to pinned host
    memory as its bucket is reduced: the GPU keeps the reduce bucket(s), the gradient being
    reduced and (ZeRO-2) one largest-parameter 16-bit staging buffer, not the gradient
    partition; under gradient accumulation ZeRO-2 keeps the 16-bit gradients of its
    partition's bucket-sized-or-larger parameters until the end of each micro-step's backward.
    ZeRO-1 reduces only after backward (the whole 16-bit gradients stay on the GPU).
    Source: deepspeed 0.19.8 runtime/zero/stage_1_and_2.py (reduce_independent_p_g_buckets_
    and_remove_grads, copy_grads_in_partition, async_accumulate_grad_in_cpu_via_gpu,
    async_inplace_copy_grad_to_fp32_buffer_from_gpu, independent_gradient_partition_epilogue
    _clear_param_grad_only), stage3.py partition_grads (grad_partitions_flat_buffer on the
    host under offload_optimizer)."""
    offload_params_persistent_only: bool = False
    """ZeRO-3 with the parameters offloaded keeps on the GPU only the persistent parameters
    (those under stage3_param_persistence_threshold elements, whole) and the live gathered
    ones (the prefetch bucket and the block at work, deepspeed_buffer_bytes); every other
    16-bit partition lives in pinned host memory. Source: deepspeed 0.19.8
    runtime/zero/partition_parameters.py (ds_persist, _partition_param with offload to
    OffloadDeviceEnum.cpu), stage3.py (persistent_parameters, param_persistence_threshold)."""
    qlora_every_linear: bool = False
    """`--qlora` quantises every nn.Linear, the (untied) head included, not only the block
    linears: Lightning's BitsandbytesPrecision.module_init_context replaces the class
    torch.nn.Linear by _NF4Linear while the model is built (lightning 2.6.6
    fabric/plugins/precision/bitsandbytes.py _ClassReplacementContextManager; no ignore_modules
    from litgpt 0.5.13 finetune/lora.py). The head is then NF4 too and its [v, h] weight is the
    largest one dequantised, per 128-token chunk in forward and in backward."""
    qlora_double_quant: bool = True
    """`--qlora`'s NF4 weights use double quantisation (8-bit absmax with a nested fp32 absmax,
    transformers' bnb_4bit_use_double_quant=True); False: one fp32 absmax per 64 weights
    (Lightning's _NF4Linear, `--quantize bnb.nf4`: compress_statistics=False)."""
    qlora_stable_embedding: bool = False
    """`--qlora` swaps the token embedding for bitsandbytes' StableEmbedding after the
    optimizer is built, keeping the old one referenced and giving the new one a gradient no
    optimizer frees (litgpt 0.5.13 finetune/lora.py main): two more [v, h] tensors in the
    parameter dtype, alive all run (engine/_lora.py qlora_stable_embedding_bytes)."""
    qlora_bitsandbytes: bool = True
    """`--qlora`'s NF4 base is bitsandbytes' Linear4bit, whose MatMul4Bit autograd function
    follows `--bitsandbytes-version` (engine/_lora.py bnb_kept_input_bytes); False: torchao's
    NF4Tensor (torchtune 0.6.1 modules/peft/lora.py LoRALinear with quantize_base, torchao
    dtypes/nf4tensor.py linear_nf4: its backward needs the weight only)."""
    qlora_paged_optimizer: bool = False
    """`--qlora` with AdamW runs bitsandbytes' PagedAdamW (32-bit: fp32 states, those of tensors
    of 1e5+ elements in unified memory) whatever optimizer the recipe names, as litgpt 0.5.13
    finetune/lora.py does (`if quantize.startswith("bnb."): instantiate_bnb_optimizer`, utils.py:
    bnb.optim.PagedAdamW; any other optimizer is refused there)."""
    logits_cast_fp32: bool = False
    """The training loop's model wrapper casts the returned chunk logits to fp32 (the default
    dtype) after forward, so the loop holds fp32 logits and the chunked loss runs on them
    (lightning 2.6.6 fabric/wrappers.py _FabricModule.forward, plugins/precision/half.py,
    amp.py and bitsandbytes.py convert_output). With head_chunk_tokens the list of chunk
    logits is held in every phase; without (head_chunk_lora_only on a full fine-tune) one
    head's fp32 logits through the optimizer step (engine/_loss.py
    loop_held_step_logits_bytes)."""
    fsdp_accumulates_unsharded: bool = False
    """Under FSDP (ZeRO-3 on dp > 1 ranks) with gradient accumulation, the training loop turns
    gradient sync off on every micro-batch but the last (FSDP1 `no_sync()`, FSDP2
    `set_requires_gradient_sync(False)`), so each rank accumulates the UNSHARDED gradient of
    every trainable parameter of its slice (in the dtype the parameters are gathered in) from
    the first micro-batch's backward to the last micro-batch's reduce-scatter
    (engine/_data_parallel.py unsharded_accumulated_gradient_bytes). Source: litgpt 0.5.3
    finetune/full.py and lora.py fit (fabric.no_backward_sync(model,
    enabled=is_accumulating)) -> lightning fabric strategies/fsdp.py _FSDPBackwardSyncControl
    (module.no_sync()); transformers 5.24 trainer.py _inner_training_loop (accelerator.no_sync
    on every micro-batch but the last, unless sync_each_batch, DeepSpeed excepted) ->
    accelerate 1.15 accelerator.py no_sync (FSDP2: set_requires_gradient_sync(False); FSDP1:
    model.no_sync). Traced: tests/data/framework_traces/fsdp1_llama.json cases D, E."""
    fsdp1_full_finetune: bool = False
    """ZeRO-3 of a full fine-tune (no LoRA) runs torch FSDP1 (FullyShardedDataParallel: one
    flat parameter per wrapped Block and one root unit, FULL_SHARD, limit_all_gathers) rather
    than FSDP2: the same sharded states (engine/_fsdp1.py), but no block's gather in flight at
    the loss and no reduce-scatter input held into the next block's backward. Source: litgpt
    0.5.13 finetune/full.py (several devices: lightning FSDPStrategy(auto_wrap_policy={Block},
    activation_checkpointing_policy={Block}, state_dict_type="full", limit_all_gathers=True));
    its LoRA recipe runs ModelParallelStrategy (FSDP2, finetune/lora.py). Traced:
    tests/data/framework_traces/fsdp1_llama.json."""
    fsdp1_lora: bool = False
    """ZeRO-3 of a LoRA job runs FSDP1 too, each trainable leaf module (the adapters) an FSDP
    unit of its own, so the frozen blocks' units hold no gradient and reduce-scatter nothing:
    FSDP1's terms (engine/_fsdp1.py) with LoRA's states. Source: verl b178a3c
    verl/utils/fsdp_utils.py get_fsdp_wrap_policy (is_lora: a lambda_auto_wrap_policy over
    leaf modules whose weight requires grad, or-ed with the decoder-layer policy), as
    llama-recipes' fsdp_auto_wrap_policy of 2023. Traced: tests/data/framework_traces/
    llama_recipes_fsdp1.json (lora, lora-7b: one gathered block and no gradient buffer at the
    backward peak)."""
    pp_receive_buffer_per_micro_batch: bool
    """Pipeline stages receive each micro-batch's activations into a buffer of its own
    (torch.distributed.pipelining allocates one receive buffer per micro-batch); False: a stage
    keeps a fixed number of receive buffers in flight whatever the number of micro-batches, as
    Megatron keeps them (engine/_pipeline.py RECEIVE_BUFFERS_MEGATRON, two)."""
    tp_embedding_grad_replicated: bool
    """Under tensor parallelism the vocab-sharded token embedding's backward computes a
    replicated, full-size gradient whose Shard(0) slice is a view of it (so its storage is the
    whole table), and a tied embedding's backward holds that full table beside the two local
    copies. Source: torch/distributed/tensor/_ops/_embedding_ops.py as transformers' tp_plan
    applies it (embed_tokens rowwise/vocab-sharded); traced: bench/conformance_tp.py."""
    tp_norms_plain_tensors: bool
    """Under tensor parallelism without sequence parallelism the replicated parameters (the
    norms) stay plain tensors beside the sharded DTensors, so the foreach optimizer step runs
    them as a separate (device, dtype) group. Source: transformers tp_plan (no plan for the
    norms); torch/optim/optimizer.py _group_tensors_by_device_and_dtype."""
    fsdp2_casts_fp32_adapters: bool
    """Under FSDP2 (ZeRO-3) with mixed precision, fully_shard's MixedPrecisionPolicy(param_dtype)
    casts every all-gathered parameter, peft's fp32 LoRA adapters included, so the adapters run
    in the 16-bit compute dtype (no fp32 copy of an adapted input). Source: accelerate 1.15
    fsdp2_prepare_model over the whole peft model; torch/distributed/fsdp/_fully_shard/
    _fsdp_param.py (param_dtype cast); peft tuners/lora/layer.py _cast_input_dtype. Traced:
    bench/conformance.py LoRA cells on 8 FSDP2 ranks."""
    transformers_model_code: bool
    """The blocks are transformers' own modeling code: its SDPA path is called with
    enable_gqa (unequal q and kv heads passed to the kernel), and the GPT-2 / BERT eager
    softmax runs in the scores' dtype. Source: transformers integrations/sdpa_attention.py
    (use_gqa_in_sdpa), models/gpt2/modeling_gpt2.py eager_attention_forward."""
    megatron_core_blocks: bool
    """The blocks are megatron-core TransformerLayers, whose saved activations under none,
    `selective` (the attention core) and full recompute are Korthikanti et al.'s terms
    (act.megatron_layer_bytes), and whose attention core's backward moments are Megatron's own
    (a recomputed causal mask on the torch softmax path). Per-op SAC is still counted op by op.
    Source: megatron-core 0.16.1 transformer/transformer_layer.py, transformer_block.py
    (_checkpointed_forward); Korthikanti et al. 2022 Sec. 4; traced:
    tests/data/framework_traces/megatron_gpt_local.json."""
    eager_scores_global_buffer: bool
    """The unfused core attention computes its scores into one [b a/t, s, s] 16-bit buffer of
    a global memory buffer, made at the first forward and kept for the run. Source:
    megatron-core 0.16.1 transformer/dot_product_attention.py (get_global_memory_buffer()
    .get_tensor(..., "mpu")); traced: tests/data/framework_traces/megatron_gpt_local.json."""
    checkpoint_keeps_mask: bool
    """A checkpointed block is called with the model's attention mask tensor (a sliding-window
    mask where the model has one), which torch.utils.checkpoint (non-reentrant) keeps among the
    block's arguments until it recomputes. Source: transformers masking_utils.py (sdpa_mask,
    eager_mask); torch/utils/checkpoint.py. False: megatron-core's blocks take no mask tensor
    for causal attention (attn_mask_type causal, the mask made inside the kernel)."""
    fp32_main_grad_buffer: bool
    """The DDP wrapper accumulates the gradients into one contiguous grad buffer (`main_grad`,
    fp32 under mixed precision), zeroed and never freed, so all of it is there in every phase;
    the optimizer steps on it (no separate fp32 gradient partition) and the gradients travel in
    fp32 under mixed precision. Source: megatron-core 0.16.1
    distributed/param_and_grad_buffer.py (_ParamAndGradBuffer.grad_data); traced:
    tests/data/framework_traces/megatron_gpt_local.json (grad_buffer_bytes)."""
    tp_loss_gradients_sharded: bool
    """Under tensor parallelism the fp32 loss gradients that the advice names at the start of a
    full loss's backward are [T, v/tp] per rank (megatron-core tensor_parallel/cross_entropy.py
    _VocabParallelCrossEntropy.backward, on its vocab shard). False elsewhere, torchtitan
    included: its vocab-parallel loss (loss_parallel) is counted by the formulas, but the
    advice's words about these gradients were written for the whole vocabulary there."""
    launch_axes: dict[str, tuple[Any, ...]]
    """The search axes' values `recommend` can launch with this framework (an axis not named:
    every value); what the launch formats can write (plan/_launch.py), whose reasons are
    `launch_source`."""
    launch_precisions: tuple[str, ...]
    """The `--precision` values this framework runs, its default first (`recommend` falls
    back to the first when the search's default is not among them)."""
    launch_source: str
    source: str

    def auto_load(self, *, sharded_qlora: bool) -> tuple[str, str]:
        """The load mode `--load auto` runs and the file that decides it: `load_sharded_qlora`
        for a QLoRA job under ZeRO-3 where the stack has one (engine/_load.py load_policy,
        from the same fields), else `load`."""
        if sharded_qlora and self.load_sharded_qlora:
            return self.load_sharded_qlora, self.load_sharded_qlora_source
        return self.load, self.load_source


DATA_PARALLEL_ONLY: dict[str, tuple[Any, ...]] = {
    "tp": (1,),
    "pp": (1,),
    "virtual_stages": (1,),
    "cp": (1,),
    "ep": (1,),
}
"""`launch_axes` of a framework that launches data parallelism only (no TP, PP, CP or EP)."""


def framework_specs(values: dict[str, dict[str, Any]]) -> dict[str, FrameworkSpec]:
    """The FrameworkSpec of each framework from its field values, checked first: a framework
    whose values lack a field without a default fails here with one line naming the framework
    and every missing field (the dataclass's own TypeError does not say which framework), so a
    new framework cannot be built without a value for each decision."""
    required = [f.name for f in fields(FrameworkSpec) if f.default is MISSING]
    for name, given in values.items():
        missing = [key for key in required if key not in given]
        if missing:
            raise ValueError(
                f"framework {name!r}: FrameworkSpec needs a value for {', '.join(missing)}"
            )
    return {name: FrameworkSpec(**given) for name, given in values.items()}


_SPEC_VALUES: dict[str, dict[str, Any]] = {
    "hf": dict(
        load="cpu-full-state-dict",
        load_source=(
            "transformers from_pretrained on every rank builds the model on the CPU; accelerate "
            "1.15 utils/fsdp_utils.py fsdp2_prepare_model (fsdp_cpu_ram_efficient_loading "
            "defaults to False: fully_shard moves each block of the CPU model to the GPU, then "
            "shards it); the Trainer moves an unsharded model whole "
            "(Trainer._move_model_to_device)."
        ),
        selective="selective",
        loss_parallel=False,
        fsdp2=True,
        adapters_in_param_dtype=False,
        fused_rms_norm=False,
        fused_qkv=False,
        qlora_kbit_prepared=True,
        full_recompute_top_moment=True,
        source="transformers Trainer + accelerate (FSDP2 fully_shard); transformers tp_plan "
        "gathers the logits (lm_head colwise with gather_output); peft LoraModel "
        "autocast_adapter_dtype=True keeps adapters fp32. HF has no selective mode of its own: "
        "`selective` is the attention-core rule. QLoRA: bitsandbytes 0.50.2 nn/modules.py "
        "Linear4bit.forward, peft 0.21.2 utils/other.py prepare_model_for_kbit_training and "
        "tuners/lora/bnb.py Linear4bit.forward; traced: tests/data/framework_traces/"
        "hf_qlora.json.",
        pp_receive_buffer_per_micro_batch=True,
        tp_embedding_grad_replicated=True,
        tp_norms_plain_tensors=True,
        fsdp2_casts_fp32_adapters=True,
        fsdp_accumulates_unsharded=True,
        transformers_model_code=True,
        megatron_core_blocks=False,
        eager_scores_global_buffer=False,
        checkpoint_keeps_mask=True,
        fp32_main_grad_buffer=False,
        tp_loss_gradients_sharded=False,
        launch_axes={
            **DATA_PARALLEL_ONLY,
            "zero": (0, 2, 3),
            "recompute": ("none", "full"),
            "offload": ("none", "optimizer+params"),
        },
        launch_precisions=("mixed-bf16", "mixed-fp16", "fp32"),
        launch_source="accelerate FSDP: no ZeRO-1, CPU offload moves parameters, gradients and "
        "optimizer together; --bf16, --fp16 (FSDP MixedPrecision).",
    ),
    "megatron": dict(
        load="sharded",
        load_source=(
            "megatron/training/checkpointing.py load_checkpoint (each rank loads its own "
            "tensor/pipeline shard; dist_checkpointing with the distributed optimizer)."
        ),
        selective="selective",
        loss_parallel=True,
        fsdp2=False,
        adapters_in_param_dtype=False,
        fused_rms_norm=False,
        fused_qkv=False,
        qlora_kbit_prepared=False,
        loss_softmax_in_place=True,
        eager_softmax_fused=True,
        source="megatron-core 0.16.1: transformer/transformer_config.py (recompute_granularity "
        "'selective' recomputes core_attn); models/gpt/gpt_model.py _postprocess -> "
        "models/common/language_module/language_module.py compute_language_model_loss "
        "(cross_entropy_loss_fusion off by default, model_parallel_config.py: "
        "tensor_parallel.vocab_parallel_cross_entropy; fp16_lm_cross_entropy is stored, never "
        "read); tensor_parallel/cross_entropy.py _VocabParallelCrossEntropy (one .float() "
        "copy, max-subtract, exp and divide in place, saved; backward writes the gradient "
        "into it); fusions/fused_softmax.py FusedScaleMaskSoftmax (the apex kernels under "
        "masked_softmax_fusion, which Megatron-LM's megatron/training/arguments.py turns on "
        "by default: --no-masked-softmax-fusion is a store_false; megatron-core's own "
        "TransformerConfig default is False, the torch path, `--attention eager-unfused`).",
        pp_receive_buffer_per_micro_batch=False,
        tp_embedding_grad_replicated=False,
        tp_norms_plain_tensors=False,
        fsdp2_casts_fp32_adapters=False,
        transformers_model_code=False,
        megatron_core_blocks=True,
        eager_scores_global_buffer=True,
        checkpoint_keeps_mask=False,
        fp32_main_grad_buffer=True,
        tp_loss_gradients_sharded=True,
        launch_axes={
            "offload": ("none", "optimizer"),
            "recompute": ("none", "selective", "full", "selective-layer"),
        },
        launch_precisions=("mixed-bf16", "mixed-fp16", "fp8-mixed", "mxfp8", "nvfp4", "fp32"),
        launch_source="Megatron-LM: any layout; ZeRO 1 = distributed optimizer, 2/3 = "
        "Megatron-FSDP; offload = --optimizer-cpu-offload; no per-op checkpointing "
        "(selective-layer = --recompute-method block); --bf16, --fp16, --fp8-format.",
    ),
    "deepspeed": dict(
        load="cpu-full-state-dict",
        load_sharded_qlora="full-state-dict",
        load_sharded_qlora_source=(
            "transformers from_pretrained builds a quantised model outside deepspeed.zero.Init "
            "(modeling_utils.py get_init_context: zero.Init only `if not is_quantized`; the "
            "bitsandbytes quantizer's update_device_map puts the model on the rank's GPU), so "
            "DeepSpeed's engine finds no ds_id and moves the whole 4-bit model to the device "
            "before ZeRO-3 partitions it (deepspeed 0.19.8 runtime/engine.py "
            "_configure_distributed_model: `self.module.to(self.device)` unless "
            "is_zero_init_model)"
        ),
        load_source=(
            "transformers from_pretrained under deepspeed.zero.Init when ZeRO-3 is on "
            "(integrations/deepspeed.py is_deepspeed_zero3_enabled; each parameter partitioned as "
            "it is created, the state dict read on every rank's CPU and gathered one module at a "
            "time, modeling_utils _load_state_dict_into_zero3_model); stages 0-2 hold the whole "
            "model anyway."
        ),
        selective="selective",
        loss_parallel=False,
        fsdp2=False,
        adapters_in_param_dtype=False,
        fused_rms_norm=False,
        fused_qkv=False,
        qlora_kbit_prepared=True,
        zero_bucket_buffers=True,
        zero3_module_collectives=True,
        offload_streams_gradients=True,
        offload_params_persistent_only=True,
        source="deepspeed/runtime/activation_checkpointing/checkpointing.py (whole-module "
        "checkpoints only; `selective` is the attention-core rule); HF model heads; QLoRA "
        "through the same peft + bitsandbytes recipe as hf.",
        pp_receive_buffer_per_micro_batch=False,
        tp_embedding_grad_replicated=False,
        tp_norms_plain_tensors=False,
        fsdp2_casts_fp32_adapters=False,
        transformers_model_code=True,
        megatron_core_blocks=False,
        eager_scores_global_buffer=False,
        checkpoint_keeps_mask=True,
        fp32_main_grad_buffer=False,
        tp_loss_gradients_sharded=False,
        launch_axes={**DATA_PARALLEL_ONLY, "recompute": ("none", "full")},
        launch_precisions=("mixed-bf16", "mixed-fp16", "fp32"),
        launch_source="DeepSpeed with a Hugging Face model: data parallel only, ZeRO 0-3, "
        "offload_optimizer / offload_param, whole-layer checkpointing; bf16.enabled, "
        "fp16.enabled.",
    ),
    "torchtitan": dict(
        load="sharded",
        load_source=(
            "torchtitan 0.3.0 train.py (model built on the meta device, parallelized, "
            "init_weights on the shards) and components/checkpoint.py (dcp.load of the sharded "
            "state dict)."
        ),
        selective="selective-op",
        loss_parallel=True,
        fsdp2=True,
        adapters_in_param_dtype=False,
        fused_rms_norm=True,
        fused_qkv=True,
        loss_parallel_fp32_tensors=1.0,
        fp8_weight_cache=False,
        fsdp2_embedding_unit=True,
        qlora_kbit_prepared=False,
        full_recompute_top_moment=True,
        loss="chunked-head",
        rope_cache_per_block=True,
        tp_sequence_parallel=True,
        source="torchtitan 0.3.0: models/llama3/config_registry.py (every llama3 trainer's "
        "loss is ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss), num_chunks 8: "
        "components/loss.py ChunkedLossWrapper; the 2024-12 benchmark era's one-piece loss is "
        "`--loss full`); models/common/decoder.py Decoder.Config.update_from_config (every "
        "block's ComplexRoPE cache resized to training.seq_len; models/common/rope.py, "
        "complex64, one per block); distributed/activation_checkpoint.py (SelectiveAC, per-op "
        "SAC, is the default `selective`); components/loss.py (_LossParallelCrossEntropy on "
        "vocab-sharded logits under TP: shifted logits, their exp and the log-probs in "
        "forward; zeros, exp(log_probs) and their sum in backward); "
        "distributed/parallel_dims.py (the fsdp mesh is "
        "dp_shard x cp); models/llama3 (one wqkv projection; nn.RMSNorm; apply_fsdp: "
        "tok_embeddings and [norm, output] units); components/quantization/float8.py "
        "(torchao Float8Linear). Traced: tests/data/framework_traces/"
        "torchtitan_llama3_ac.json, torchtitan_llama3_8b_fsdp.json.",
        pp_receive_buffer_per_micro_batch=False,
        tp_embedding_grad_replicated=False,
        tp_norms_plain_tensors=False,
        fsdp2_casts_fp32_adapters=False,
        transformers_model_code=False,
        megatron_core_blocks=False,
        eager_scores_global_buffer=False,
        checkpoint_keeps_mask=True,
        fp32_main_grad_buffer=False,
        tp_loss_gradients_sharded=False,
        launch_axes={
            "zero": (0, 3),
            "offload": ("none",),
            "recompute": ("none", "selective", "full", "selective-op"),
        },
        launch_precisions=("mixed-bf16", "fp8-mixed", "fp32"),
        launch_source="torchtitan: FSDP2 or DDP; its AC modes are none, full and selective "
        "(per-op, 0.3.0).",
    ),
    "torchtune": dict(
        qlora_bitsandbytes=False,
        load="meta-init",
        load_source=(
            "torchtune 0.6.1 recipes/full_finetune_distributed.py (model built on meta under "
            "set_default_dtype) and training/_distributed.py load_from_full_model_state_dict "
            "(each full tensor moved to the device and distribute_tensor'd, one at a time)."
        ),
        selective="selective-layer",
        loss_parallel=False,
        fsdp2=True,
        adapters_in_param_dtype=True,
        fused_rms_norm=True,
        fused_qkv=False,
        norm_input_fp32=True,
        gqa_kv_expanded=True,
        fp8_weight_cache=False,
        logits_upcast_in_model=True,
        qlora_kbit_prepared=False,
        full_recompute_top_moment=True,
        source="torchtune 0.6.1 torchtune/training/activations.py (ac_mode 'selective' "
        "checkpoints every ac_option-th layer); recipes build the model under "
        "training.set_default_dtype(dtype): LoRA adapters in bf16; shard_model (FSDP2); "
        "modules/transformer.py TransformerDecoder (output(h).float() unless chunked); "
        "modules/rms_norm.py (F.rms_norm(x.float())); modules/attention.py (k, v expanded "
        "to the query heads before SDPA); modules/peft/lora.py (LoRALinear: bf16 lora_a, "
        "lora_b in the model dtype; QLoRA: torchao 0.18.0 nf4_tensor.py LinearNF4 saves the "
        "NF4 weight only, F.linear(input, weight.to(input.dtype))). Traced: "
        "tests/data/framework_traces/torchtune_lora.json; "
        "models/llama3/_parallelism.py gathers the logits (output colwise, Replicate).",
        pp_receive_buffer_per_micro_batch=False,
        tp_embedding_grad_replicated=False,
        tp_norms_plain_tensors=False,
        fsdp2_casts_fp32_adapters=False,
        transformers_model_code=False,
        megatron_core_blocks=False,
        eager_scores_global_buffer=False,
        checkpoint_keeps_mask=True,
        fp32_main_grad_buffer=False,
        tp_loss_gradients_sharded=False,
        launch_axes={
            **DATA_PARALLEL_ONLY,
            "zero": (0, 3),
            "offload": ("none", "optimizer+params"),
            "recompute": ("none", "selective", "full", "selective-layer"),
        },
        launch_precisions=("bf16", "fp32"),
        launch_source="torchtune (recipes full_finetune_distributed / "
        "lora_finetune_distributed): FSDP2 on one node or more, data parallel only here, "
        "fsdp_cpu_offload (parameters, gradients and optimizer); `dtype: bf16|fp32`, the "
        "whole model in that dtype.",
    ),
    "litgpt": dict(
        selective="selective",
        loss_parallel=False,
        fsdp2=True,
        adapters_in_param_dtype=True,
        fused_rms_norm=False,
        fused_qkv=True,
        gqa_kv_expanded=True,
        head_chunk_tokens=128,
        head_chunk_lora_only=True,
        lora_dropout=True,
        lora_qkv_zero_pad=True,
        norm_scale_fp32=True,
        rope_buffers_fp32=True,
        o_proj_input_kept=True,
        qlora_every_linear=True,
        qlora_double_quant=False,
        qlora_stable_embedding=True,
        qlora_paged_optimizer=True,
        logits_cast_fp32=True,
        fsdp1_full_finetune=True,
        fsdp_accumulates_unsharded=True,
        load="meta-init",
        load_source=(
            "litgpt 0.5.13 finetune/lora.py main (fabric.init_module(empty_init=world_size > 1): "
            "on the meta device when sharded, on the GPU on one device) and utils.py "
            "load_checkpoint (ModelParallelStrategy: torch.load(mmap=True) and "
            "load_from_full_model_state_dict, one full tensor at a time into its shards; one "
            "device: lazy_load, load_state_dict tensor by tensor)"
        ),
        source="litgpt 0.5.13: finetune/lora.py (fit: model(input_ids, lm_head_chunk_size=128) "
        "and chunked_cross_entropy, `logits` a local of the loop; setup: lora_dropout 0.05, "
        "lora_query and lora_value on; several devices: ModelParallelStrategy with "
        "parallelize_fn, fully_shard per trainable Linear and per Block, every Block in "
        "checkpoint_wrapper; one device: no checkpointing; precision bf16-true builds the "
        "model, adapters included, in bf16 (fabric.init_module)); utils.py "
        "chunked_cross_entropy (F.cross_entropy per chunk, reduction none, on the logits "
        "Fabric's convert_output cast to fp32: lightning 2.6.6 fabric/wrappers.py); model.py "
        "GPT.forward (lm_head per x.split(128, dim=1)), CausalSelfAttention "
        "(one qkv Linear; k, v repeat_interleave'd to the query heads before SDPA), RMSNorm "
        "((x.float() * rsqrt(...) * weight.float()).to(dtype)); lora.py LoRALinear / "
        "LoRAQKVLinear (lora_dropout per module, one lora_A over the enabled q/k/v, zero_pad "
        "index_copy_). LitGPT has no selective mode: `selective` is the attention-core rule. "
        "QLoRA (--quantize bnb.nf4, bitsandbytes 0.50.2): lightning 2.6.6 "
        "fabric/plugins/precision/bitsandbytes.py (every nn.Linear NF4, no double "
        "quantisation), finetune/lora.py main (bnb PagedAdamW, StableEmbedding swap). "
        "Traced: tests/data/framework_traces/litgpt_lora.json, litgpt_qlora.json.",
        pp_receive_buffer_per_micro_batch=False,
        tp_embedding_grad_replicated=False,
        tp_norms_plain_tensors=False,
        fsdp2_casts_fp32_adapters=False,
        transformers_model_code=False,
        megatron_core_blocks=False,
        eager_scores_global_buffer=False,
        checkpoint_keeps_mask=True,
        fp32_main_grad_buffer=False,
        tp_loss_gradients_sharded=False,
        launch_axes={
            **DATA_PARALLEL_ONLY,
            "zero": (0, 3),
            "offload": ("none",),
            "recompute": ("none", "full"),
        },
        launch_precisions=("amp-bf16", "bf16", "amp-fp16", "fp16", "fp32"),
        launch_source="litgpt 0.5.13 (finetune/lora.py, full.py): one device, or FSDP over data "
        "parallel ranks (ModelParallelStrategy with tensor_parallel_size 1, or FSDPStrategy); "
        "no CPU offload (cpu_offload=False); whole-Block checkpointing or none; --precision "
        "bf16-mixed (its default, utils.py get_default_supported_precision(training=True)), "
        "bf16-true, 16-mixed, 16-true, 32-true.",
    ),
    "verl": dict(
        selective="selective",
        loss_parallel=False,
        fsdp2=True,
        adapters_in_param_dtype=False,
        fused_rms_norm=False,
        fused_qkv=False,
        qlora_kbit_prepared=False,
        loss_logits_in_place=True,
        full_recompute_top_moment=True,
        fsdp1_full_finetune=True,
        fsdp1_lora=True,
        load="meta-init",
        load_source=(
            "verl b178a3c (0.8.0.dev) verl/workers/fsdp_workers.py _build_model_optimizer "
            "(get_init_weight_context_manager(use_meta_tensor=not tie_word_embeddings): rank 0 "
            "reads the checkpoint on the CPU, the others build on the meta device; FSDP "
            "sync_module_states broadcasts it unit by unit)"
        ),
        source="verl b178a3c (0.8.0.dev): the actor is transformers' model code "
        "(AutoModelForCausalLM, flash-attn varlen under use_remove_padding, the model default "
        "true), built in fp32 (fsdp_config.model_dtype fp32 for the actor) and wrapped by "
        "FSDP (strategy fsdp: FSDP1 FULL_SHARD with MixedPrecision(param_dtype=bf16, "
        "reduce_dtype=fp32, buffer_dtype=fp32); fsdp2 under strategy fsdp2) with HF gradient "
        "checkpointing (model.enable_gradient_checkpointing true); workers/actor/dp_actor.py "
        "_forward_micro_batch (logits.div_(temperature), then verl/utils/torch_functional.py "
        "logprobs_from_logits: flash-attn cross_entropy_loss with inplace_backward=True, no "
        "entropy in the update under entropy_coeff 0, the actor.yaml default) and "
        "update_policy (loss.backward() per micro-batch, no no_sync: each micro-batch's "
        "gradients are reduce-scattered into the sharded fp32 gradient). LoRA: peft on the "
        "fp32 model, FSDP's param_dtype casting the adapters to bf16 when gathered.",
        pp_receive_buffer_per_micro_batch=True,
        tp_embedding_grad_replicated=True,
        tp_norms_plain_tensors=True,
        fsdp2_casts_fp32_adapters=True,
        fsdp_accumulates_unsharded=False,
        transformers_model_code=True,
        megatron_core_blocks=False,
        eager_scores_global_buffer=False,
        checkpoint_keeps_mask=True,
        fp32_main_grad_buffer=False,
        tp_loss_gradients_sharded=False,
        launch_axes={
            **DATA_PARALLEL_ONLY,
            "zero": (3,),
            "recompute": ("none", "full"),
            "offload": ("none",),
        },
        launch_precisions=("mixed-bf16",),
        launch_source="verl's FSDP actor (strategy fsdp/fsdp2): FULL_SHARD over every GPU "
        "(ZeRO-3), data parallel (Ulysses sequence parallel not modelled here), gradient "
        "checkpointing on or off; fp32 master weights with bf16 compute; its CPU offload is "
        "between phases (--rl-trainer-offload), not ZeRO-Offload.",
    ),
}
"""Each framework's FrameworkSpec values, in vocabulary order (checked by framework_specs)."""
FRAMEWORK_SPECS: dict[str, FrameworkSpec] = framework_specs(_SPEC_VALUES)
assert tuple(FRAMEWORK_SPECS) == FRAMEWORKS, "one spec per framework, in vocabulary order"
for _name, _spec in FRAMEWORK_SPECS.items():
    assert _spec.load in LOADS and _spec.load != "auto", f"{_name}: load must name a mode"
    assert _spec.loss in LOSSES and _spec.loss != "auto", f"{_name}: loss must name a mode"
    assert set(_spec.launch_precisions) <= set(PRECISIONS), f"{_name}: unknown launch precision"


def _table(field: str) -> np.ndarray:
    return np.array([getattr(FRAMEWORK_SPECS[name], field) for name in FRAMEWORKS])


LOSS_PARALLEL = _table("loss_parallel")
"""Per framework code: the loss is vocab-parallel under tensor parallelism."""
FSDP2_FRAMEWORKS = _table("fsdp2")
"""Per framework code: ZeRO-3 is FSDP2."""
ADAPTERS_IN_PARAM_DTYPE = _table("adapters_in_param_dtype")
"""Per framework code: LoRA adapters in the parameter dtype."""
FUSED_RMS_NORM = _table("fused_rms_norm")
"""Per framework code: torch's fused RMSNorm kernel."""
FUSED_QKV = _table("fused_qkv")
"""Per framework code: one q/k/v projection."""
NORM_INPUT_FP32 = _table("norm_input_fp32")
"""Per framework code: its RMSNorm keeps an fp32 copy of the input."""
GQA_KV_EXPANDED = _table("gqa_kv_expanded")
"""Per framework code: k and v expanded to the query heads before attention."""
LOSS_PARALLEL_FP32_TENSORS = _table("loss_parallel_fp32_tensors")
"""Per framework code: extra fp32 [T, v/tp] tensors of its vocab-parallel loss."""
FP8_WEIGHT_CACHE = _table("fp8_weight_cache")
"""Per framework code: fp8 weight copies kept from forward to backward (Transformer Engine)."""
LOGITS_UPCAST_IN_MODEL = _table("logits_upcast_in_model")
"""Per framework code: the model returns fp32 logits."""
QLORA_KBIT_PREPARED = _table("qlora_kbit_prepared")
"""Per framework code: QLoRA as bitsandbytes + peft's kbit preparation run it (FrameworkSpec)."""
LOGITS_CAST_FP32 = _table("logits_cast_fp32")
"""Per framework code: the loop's wrapper casts the chunk logits to fp32 (FrameworkSpec)."""
QLORA_EVERY_LINEAR = _table("qlora_every_linear")
"""Per framework code: QLoRA quantises the head too (FrameworkSpec)."""
QLORA_DOUBLE_QUANT = _table("qlora_double_quant")
"""Per framework code: QLoRA's NF4 absmax double-quantised (FrameworkSpec)."""
QLORA_STABLE_EMBEDDING = _table("qlora_stable_embedding")
"""Per framework code: QLoRA keeps a second embedding and its gradient (FrameworkSpec)."""
QLORA_BITSANDBYTES = _table("qlora_bitsandbytes")
"""Per framework code: QLoRA's NF4 base is bitsandbytes' Linear4bit (FrameworkSpec)."""
QLORA_PAGED_OPTIMIZER = _table("qlora_paged_optimizer")
"""Per framework code: QLoRA's AdamW is bitsandbytes' PagedAdamW (FrameworkSpec)."""


def recipe_optimizer(opt: np.ndarray, *, fw: np.ndarray, qlora: np.ndarray) -> np.ndarray:
    """The optimizer code the stack's recipe builds: `opt`, but bitsandbytes' paged-adamw for
    AdamW under `--qlora` where the framework swaps it in (FrameworkSpec.qlora_paged_optimizer).
    Source: litgpt 0.5.13 finetune/lora.py main, utils.py instantiate_bnb_optimizer."""
    adamw = (opt == OPTIMIZERS.index("adamw")) | (opt == OPTIMIZERS.index("adamw-fused"))
    return np.where(qlora & QLORA_PAGED_OPTIMIZER[fw] & adamw, OPTIMIZERS.index("paged-adamw"), opt)


LOSS_SOFTMAX_IN_PLACE = _table("loss_softmax_in_place")
"""Per framework code: the cross entropy's softmax and gradient live in its one fp32 copy."""
LOSS_LOGITS_IN_PLACE = _table("loss_logits_in_place")
"""Per framework code: the loss is a fused kernel keeping the 16-bit logits, its gradient written
into them (FrameworkSpec.loss_logits_in_place)."""
EAGER_SOFTMAX_FUSED = _table("eager_softmax_fused")
"""Per framework code: eager attention's masked softmax is a fused 16-bit kernel."""
FSDP2_EMBEDDING_UNIT = _table("fsdp2_embedding_unit")
"""Per framework code: FSDP2 units as torchtitan wraps them (FrameworkSpec)."""
FSDP1_FULL_FINETUNE = _table("fsdp1_full_finetune")
"""Per framework code: ZeRO-3 of a full fine-tune is FSDP1 (FrameworkSpec.fsdp1_full_finetune)."""
FSDP1_LORA = _table("fsdp1_lora")
"""Per framework code: ZeRO-3 of a LoRA job is FSDP1, adapters as units (FrameworkSpec)."""
FSDP_ACCUMULATES_UNSHARDED = _table("fsdp_accumulates_unsharded")
"""Per framework code: FSDP accumulates unsharded gradients over micro-batches (FrameworkSpec)."""
LOAD_POLICY = np.array(
    [LOADS.index(FRAMEWORK_SPECS[name].load) for name in FRAMEWORKS], dtype=np.int64
)
"""Per framework code: the LOADS code `--load auto` resolves to."""
LOAD_SHARDED_QLORA_POLICY = np.array(
    [LOADS.index(FRAMEWORK_SPECS[name].auto_load(sharded_qlora=True)[0]) for name in FRAMEWORKS],
    dtype=np.int64,
)
"""Per framework code: the LOADS code `--load auto` resolves to for QLoRA under ZeRO-3."""
HEAD_CHUNK_TOKENS = _table("head_chunk_tokens").astype(np.float64)
"""Per framework code: positions per head chunk of its own loss (0: one head)."""
HEAD_CHUNK_LORA_ONLY = _table("head_chunk_lora_only")
"""Per framework code: its head chunks only under LoRA (FrameworkSpec.head_chunk_lora_only)."""
LORA_DROPOUT = _table("lora_dropout")
"""Per framework code: the recipe's LoRA dropout is on."""
LORA_QKV_ZERO_PAD = _table("lora_qkv_zero_pad")
"""Per framework code: a fused q/k/v adapter's zero-padded update keeps its adapted part."""
NORM_SCALE_FP32 = _table("norm_scale_fp32")
"""Per framework code: the RMSNorm scale multiplies in fp32 (a trainable one keeps fp32)."""
O_PROJ_INPUT_KEPT = _table("o_proj_input_kept")
"""Per framework code: o_proj's input is the attention output the kernel keeps."""
ROPE_BUFFERS_FP32 = _table("rope_buffers_fp32")
"""Per framework code: RoPE cos/sin are persistent fp32 buffers."""
FULL_RECOMPUTE_TOP_MOMENT = _table("full_recompute_top_moment")
"""Per framework code: full recompute's top-block moment in backward (FrameworkSpec)."""
LOSS_POLICY = np.array(
    [LOSSES.index(FRAMEWORK_SPECS[name].loss) for name in FRAMEWORKS], dtype=np.int64
)
"""Per framework code: the LOSSES code `--loss auto` resolves to."""
ROPE_CACHE_PER_BLOCK = _table("rope_cache_per_block")
"""Per framework code: a complex64 RoPE cache in every block."""
TP_SEQUENCE_PARALLEL = _table("tp_sequence_parallel")
"""Per framework code: tensor parallelism is sequence-parallel by default."""
ZERO_BUCKET_BUFFERS = _table("zero_bucket_buffers")
"""Per framework code: DeepSpeed's ZeRO bucket buffers (FrameworkSpec.zero_bucket_buffers)."""
ZERO3_MODULE_COLLECTIVES = _table("zero3_module_collectives")
"""Per framework code: ZeRO-3 collectives per module (FrameworkSpec)."""
OFFLOAD_STREAMS_GRADIENTS = _table("offload_streams_gradients")
"""Per framework code: an offloaded optimizer streams the gradients to the host (FrameworkSpec)."""
OFFLOAD_PARAMS_PERSISTENT_ONLY = _table("offload_params_persistent_only")
"""Per framework code: offloaded parameters leave only the persistent ones (FrameworkSpec)."""
PP_RECEIVE_BUFFER_PER_MICRO_BATCH = _table("pp_receive_buffer_per_micro_batch")
"""Per framework code: one pipeline receive buffer per micro-batch (FrameworkSpec)."""
TP_EMBEDDING_GRAD_REPLICATED = _table("tp_embedding_grad_replicated")
"""Per framework code: the vocab-sharded embedding's gradient is full size under TP."""
TP_NORMS_PLAIN_TENSORS = _table("tp_norms_plain_tensors")
"""Per framework code: TP without SP keeps the norms as plain tensors (a foreach group)."""
FSDP2_CASTS_FP32_ADAPTERS = _table("fsdp2_casts_fp32_adapters")
"""Per framework code: FSDP2 mixed precision runs peft's fp32 adapters in 16 bits."""
TRANSFORMERS_MODEL_CODE = _table("transformers_model_code")
"""Per framework code: the blocks are transformers' modeling code."""
MEGATRON_CORE_BLOCKS = _table("megatron_core_blocks")
"""Per framework code: the blocks are megatron-core TransformerLayers (Korthikanti's terms)."""
EAGER_SCORES_GLOBAL_BUFFER = _table("eager_scores_global_buffer")
"""Per framework code: unfused attention scores in a run-long global buffer."""
CHECKPOINT_KEEPS_MASK = _table("checkpoint_keeps_mask")
"""Per framework code: checkpointed blocks keep their attention-mask argument."""
FP32_MAIN_GRAD_BUFFER = _table("fp32_main_grad_buffer")
"""Per framework code: fp32 main-grad buffers under mixed precision."""
SELECTIVE_POLICY = np.array(
    [RECOMPUTE.index(FRAMEWORK_SPECS[name].selective) for name in FRAMEWORKS], dtype=np.int64
)
"""Per framework code: the recompute code `selective` resolves to."""


def recompute_policy(fw, rc) -> np.ndarray:
    """The recompute policy a row runs: `selective` becomes the framework's own selective mode
    (FrameworkSpec.selective); every other code is itself."""
    fw = np.asarray(fw, dtype=np.int64)
    rc = np.asarray(rc, dtype=np.int64)
    return np.where(rc == RECOMPUTE_SELECTIVE, SELECTIVE_POLICY[fw], rc)


def head_chunk_tokens(fw, lora_rank) -> np.ndarray:
    """Positions per head chunk of the framework's own loss on these rows (0: one head):
    HEAD_CHUNK_TOKENS, but none on a full fine-tune where the chunking is LoRA-only
    (FrameworkSpec.head_chunk_lora_only, LitGPT's full.py)."""
    full_finetune = np.asarray(lora_rank) <= 0
    return np.where(HEAD_CHUNK_LORA_ONLY[fw] & full_finetune, 0.0, HEAD_CHUNK_TOKENS[fw])


def loss_policy(fw, loss) -> np.ndarray:
    """The loss a row runs: `auto` becomes the framework's own (FrameworkSpec.loss); every other
    code is itself."""
    fw = np.asarray(fw, dtype=np.int64)
    loss = np.asarray(loss, dtype=np.int64)
    return np.where(loss == LOSSES.index("auto"), LOSS_POLICY[fw], loss)


def resolved_loss(framework: str, loss: str) -> str:
    """The loss name a configuration runs (`auto`: FrameworkSpec.loss of `framework`)."""
    return FRAMEWORK_SPECS[framework].loss if loss == "auto" else loss


def state_shard_degree(dp, cp, dp_shard=0) -> np.ndarray:
    """Ranks over which ZeRO / FSDP shard model states: data x context parallel, or under
    hybrid sharding (HSDP, `dp_shard` > 0) the shard group of dp_shard x cp ranks, the states
    being replicated over the dp / dp_shard groups.

    Context-parallel ranks hold the same weights and see different tokens, so every framework
    reduces gradients and shards states over dp x cp. Source (HSDP): torchtitan ParallelDims
    (dp_replicate x dp_shard; fully_shard on a 2-D mesh replicates over dp_replicate);
    DeepSpeed ZeRO++ hpZ and Megatron-FSDP's outer replication follow the same layout.
    Source: torchtitan ParallelDims (fully_shard on the `dp_shard_cp` mesh); Megatron-core
    parallel_state get_data_parallel_group(with_context_parallel=True) (DDP buffers and the
    distributed optimizer); accelerate ParallelismConfig (FSDP on `dp_shard_cp`).
    """
    dp = np.asarray(dp, dtype=np.float64)
    shard = np.asarray(dp_shard, dtype=np.float64)
    group = np.where(shard > 0, np.minimum(shard, dp), dp)
    return group * np.asarray(cp, dtype=np.float64)
