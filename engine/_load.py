"""The load phase: what a rank holds while the job builds its model and loads the checkpoint,
before step 1.

Jobs run out of memory here although their step fits: a full state dict materialised on every
rank before sharding, or a model moved whole to the GPU before ZeRO-3 partitions it. The peak
of the load is the rank's resident parameters (as the step holds them: sharded, offloaded,
quantised) plus the load's own buffer, which depends on how the stack loads (`load`):

- full-state-dict: on each GPU the whole model slice, before it is sharded; in host RAM, per
  rank, the whole slice;
- cpu-full-state-dict: on each GPU one block unsharded (moved or unsharded unit by unit); in
  host RAM, per rank, the whole slice;
- meta-init: on each GPU the largest tensor unsharded (broadcast tensor by tensor); no host RAM
  per rank (rank 0's one full copy is ignored);
- sharded: on each GPU the largest tensor's shard; no host RAM.

"The model slice" is the rank's tensor- and pipeline-parallel part, unsharded by data
parallelism, in the parameters' dtype (the dtype the model is built in). `auto` is the stack's
own default (FrameworkSpec.load).
"""

from __future__ import annotations

import numpy as np

from ._vocab import LOADS

FULL_STATE_DICT = LOADS.index("full-state-dict")
CPU_FULL_STATE_DICT = LOADS.index("cpu-full-state-dict")
META_INIT = LOADS.index("meta-init")
SHARDED = LOADS.index("sharded")
AUTO = LOADS.index("auto")


def load_policy(load, stack_default, *, sharded_qlora_default=None, sharded_qlora=False):
    """The load mode a row runs: `auto` becomes the stack's own (`stack_default`, the
    FrameworkSpec.load code of the row's framework; for a QLoRA row under ZeRO-3,
    `sharded_qlora`, the stack's FrameworkSpec.load_sharded_qlora code where it has one:
    DeepSpeed moves a quantised model whole to the GPU, transformers having built it outside
    zero.Init); every other code is itself."""
    load = np.asarray(load, dtype=np.int64)
    default = np.asarray(stack_default, dtype=np.int64)
    if sharded_qlora_default is not None:
        default = np.where(sharded_qlora, sharded_qlora_default, default)
    return np.where(load == AUTO, default, load)


def load_buffer_bytes(
    mode, *, slice_bytes, resident_param_bytes, block_bytes, largest_tensor_bytes, shard_degree
) -> np.ndarray:
    """Bytes the load holds on the GPU beyond the rank's resident parameters, at its peak.

    - full-state-dict: the whole slice is on the GPU before sharding frees it unit by unit
      (`from_pretrained(device_map=...)` or `model.cuda()` before FSDP wraps it; DeepSpeed's
      engine moving the module to its device before ZeRO-3 partitions it when the model was not
      built under `zero.Init`): the peak is the slice, of which the resident shards are part.
      Source: deepspeed 0.19 runtime/engine.py `_configure_distributed_model`
      (`self.module.to(self.device)` unless `dont_change_device`), then stage3.py partitions.
    - cpu-full-state-dict: the model is whole in host RAM and the wrapper moves it to the GPU
      block by block (torch FSDP2 `fully_shard` moves a CPU module's parameters to the device,
      then shards them; FSDP1 FULL_STATE_DICT `load_state_dict` unshards one flat parameter at a
      time): one block unsharded. Source: accelerate 1.x utils/fsdp_utils.py
      `fsdp2_prepare_model` (without `cpu_ram_efficient_loading`, `fully_shard` on a CPU model);
      lightning fabric strategies/fsdp.py `_load_raw_module_state` (FULL_STATE_DICT context).
    - meta-init: the model is built on the meta device and sharded there; each tensor of the
      full state dict is broadcast from rank 0 and distributed: one full tensor at a time.
      Source: accelerate fsdp_utils.py `fsdp2_load_full_state_dict` (broadcast per parameter,
      `distribute_tensor`); torchtune 0.6 training/_distributed.py
      `load_from_full_model_state_dict` (`full_tensor.to(device)`, then `distribute_tensor`).
    - sharded: each rank reads its own shard into its parameters (torch.distributed.checkpoint,
      Megatron's distributed checkpoint, DeepSpeed's per-rank ZeRO files): the largest tensor's
      shard in flight. Source: torchtitan components/checkpoint.py (dcp.load into the sharded
      model); megatron/core/dist_checkpointing.
    Assumes: the checkpoint's tensors are cast to the parameters' dtype as they arrive (no
    second copy in the checkpoint's dtype on the GPU); the optimizer states do not exist yet
    (torch optimizers create them at the first step; a resumed optimizer state is not modelled).
    """
    mode = np.asarray(mode, dtype=np.int64)
    whole = np.maximum(slice_bytes - resident_param_bytes, 0.0)
    shard = largest_tensor_bytes / np.maximum(shard_degree, 1.0)
    return np.select(
        [mode == FULL_STATE_DICT, mode == CPU_FULL_STATE_DICT, mode == META_INIT],
        [whole, block_bytes, largest_tensor_bytes],
        shard,
    )


def load_host_bytes(mode, *, slice_bytes) -> np.ndarray:
    """Host RAM one rank holds at the load's peak: the whole model slice where each rank reads
    the full checkpoint or builds the model on the CPU (full-state-dict, cpu-full-state-dict:
    `from_pretrained` on every rank), else nothing.

    Source: load_buffer_bytes' sources (accelerate without `cpu_ram_efficient_loading` builds
    the full model on every rank; with it, only rank 0 does).
    Ignores: under meta-init, rank 0's one full copy (one rank of one node); under sharded, the
    per-tensor staging buffers of torch.distributed.checkpoint; safetensors' memory-mapped pages
    (page cache, shared between the node's ranks).
    """
    mode = np.asarray(mode, dtype=np.int64)
    per_rank = (mode == FULL_STATE_DICT) | (mode == CPU_FULL_STATE_DICT)
    return np.where(per_rank, slice_bytes, 0.0)


def cached_load_reserve_bytes(load_device_bytes, step_device_bytes) -> np.ndarray:
    """Bytes by which the load's device peak exceeds the step's: the caching allocator keeps
    the segments the load reserved (a model moved whole to the GPU, then sharded, leaves its
    blocks cached, free), so torch's reserved memory and nvidia-smi show at least the load's
    peak through the steps that follow; the step's tensors reuse those cached blocks.

    Source: torch c10/cuda/CUDACachingAllocator.cpp (freed blocks return to the cache, released
    to the driver only by empty_cache or an allocation that fails); no stack modelled here
    empties the cache between the load and step 1: HF Trainer's free_memory (accelerate
    release_memory: empty_cache) runs before accelerator.prepare wraps the model
    (transformers trainer.py _inner_training_loop), accelerate's FSDP and DeepSpeed preparation
    and DeepSpeed's engine init call none (deepspeed 0.19.8 runtime/engine.py, zero/stage3.py:
    empty_cache only in offload_states and empty_partition_cache), and torchtitan empties it
    before building its model (components/metrics.py DeviceMemoryMonitor).
    Ignores: the load's segments that do not fit the step's larger tensors (counted as the
    step's own fragmentation, on top, only where the step's peak is above the load's).
    """
    return np.maximum(np.asarray(load_device_bytes) - np.asarray(step_device_bytes), 0.0)
