"""CPU offload: the optimizer (ZeRO-Offload), optimizer and parameters (ZeRO-Infinity / FSDP
CPU offload), and activation offloading to pinned host memory.
"""

from __future__ import annotations

import numpy as np

from ._codes import OFFLOAD_OPTIMIZER, OFFLOAD_PARAMS
from ._collectives import exposed_s
from ._data_parallel import DEEPSPEED_BUCKET_ELEMS_PER_H2
from ._frameworks import OFFLOAD_PARAMS_PERSISTENT_ONLY, OFFLOAD_STREAMS_GRADIENTS
from ._model import ModelSpec
from ._time_params import TimeParams

OFFLOAD_PINNED_BUCKETS = 2.0
"""Pinned host buffers of an offloaded optimizer: two gradient buckets in flight (DeepSpeed
ZeRO-Offload double-buffers the device-to-host gradient copies)."""
OFFLOAD_BUCKET_ELEMS_PER_H2 = 4
"""A pinned bucket holds one block's gradients, at most 4 h^2 elements (a judgement, not
sourced: DeepSpeed's bucket sizes are config values)."""
OFFLOAD_RESIDENT_BLOCKS = 2.0
"""With the parameters offloaded only the working set of weights is on the device: the current
and the prefetched block, in 16 bits (ZeRO-Infinity / FSDP CPU offload)."""
ACTIVATION_OFFLOAD_RESIDENT_LAYERS = 2.0
"""Blocks whose activations stay on the GPU under activation offloading: the one computing and
the one being copied (torchtune/torchao OffloadActivations with a second stream)."""


def offloaded_states(
    m: ModelSpec, *, offload, states: dict[str, np.ndarray], state_numel, layer_numel
) -> dict[str, np.ndarray]:
    """Model states with the offloaded ones moved to the host: `states` (parameters,
    master_weights, gradients, optimizer_states, optimizer_step_temporaries, device bytes)
    as they stay on the device, and host_bytes.

    Optimizer offload: the states, the master weights, the fp32 gradients CPU Adam steps on and
    two pinned gradient buckets live on the host; no step on the device. With the parameters:
    the weights (and an fp32 gradient copy) too; the device keeps two 16-bit blocks and their
    gradients. Source: Ren et al. 2021 (ZeRO-Offload) Sec. 4; Rajbhandari et al. 2021
    (ZeRO-Infinity); OFFLOAD_PINNED_BUCKETS, OFFLOAD_RESIDENT_BLOCKS.
    """
    off_opt = offload >= OFFLOAD_OPTIMIZER
    off_params = offload == OFFLOAD_PARAMS
    parameters, master = states["parameters"], states["master_weights"]
    optimizer_states = states["optimizer_states"]
    bucket_numel = np.minimum(layer_numel, float(m.hidden_size) ** 2 * OFFLOAD_BUCKET_ELEMS_PER_H2)
    host_bytes = np.where(
        off_opt,
        optimizer_states
        + master
        + 4.0 * state_numel  # CPU Adam steps on fp32 grads
        + OFFLOAD_PINNED_BUCKETS * 2.0 * bucket_numel,
        0.0,
    )
    host_bytes = host_bytes + np.where(off_params, parameters + 4.0 * state_numel, 0.0)
    param_working = OFFLOAD_RESIDENT_BLOCKS * 2.0 * layer_numel
    return {
        "parameters": np.where(off_params, param_working, parameters),
        "master_weights": np.where(off_opt, 0.0, master),
        "gradients": np.where(
            off_params, np.minimum(states["gradients"], 2.0 * param_working), states["gradients"]
        ),
        "optimizer_states": np.where(off_opt, 0.0, optimizer_states),
        "optimizer_step_temporaries": np.where(off_opt, 0.0, states["optimizer_step_temporaries"]),
        "host_bytes": host_bytes,
    }


def offloaded_activation_bytes(per_layer, *, num_layers, enabled) -> np.ndarray:
    """Activation bytes a stage keeps in pinned host memory: all but
    ACTIVATION_OFFLOAD_RESIDENT_LAYERS blocks' (`per_layer` each), where `enabled`.

    Source: torchtune/torchao OffloadActivations (saved tensors copied to the host on a second
    stream). Assumes: the copies keep pace with compute (no stall).
    """
    offload_act = enabled.astype(bool) & (num_layers > ACTIVATION_OFFLOAD_RESIDENT_LAYERS)
    return np.where(offload_act, per_layer * (num_layers - ACTIVATION_OFFLOAD_RESIDENT_LAYERS), 0.0)


def offload_time_s(
    *,
    offload,
    step_params,
    grad_bytes,
    local,
    shard,
    param_bytes,
    pcie_bytes_per_s,
    per_micro,
    fwd_share,
    num_micro,
    params: TimeParams,
) -> np.ndarray:
    """PCIe traffic and the host's optimizer update of one step.

    The optimizer steps on the host (gradients down, 16-bit weights up over PCIe, a CPU update);
    with the parameters, every micro-batch also streams this GPU's weight shard up for the
    forward and again for the backward, prefetched like the FSDP gathers.
    Source: Ren et al. 2021 (ZeRO-Offload) Sec. 4; Rajbhandari et al. 2021 (ZeRO-Infinity);
    TimeParams.pcie_efficiency, cpu_optimizer_params_per_s.
    """
    pcie = np.asarray(pcie_bytes_per_s, dtype=np.float64) * params.pcie_efficiency
    host_step = (
        step_params * (grad_bytes + 2.0) / pcie + step_params / params.cpu_optimizer_params_per_s
    )
    stream = local / shard * param_bytes / pcie
    fwd_hidden = params.fsdp_overlap_fraction * fwd_share * per_micro
    bwd_hidden = params.fsdp_overlap_fraction * (1.0 - fwd_share) * per_micro
    streamed = exposed_s(stream, fwd_hidden, params) + exposed_s(stream, bwd_hidden, params)
    return np.where(offload >= OFFLOAD_OPTIMIZER, host_step, 0.0) + np.where(
        offload == OFFLOAD_PARAMS, streamed * num_micro, 0.0
    )


def ranks_per_node(num_gpus: np.ndarray, gpus_per_node: np.ndarray) -> np.ndarray:
    """Ranks that share one node's host RAM: a node's GPUs, or all of them on a partial node.

    Assumes: ranks fill nodes one after the other (torchrun, slurm), one rank per GPU."""
    return np.minimum(np.asarray(num_gpus), np.asarray(gpus_per_node))


def node_host_bytes(host_bytes: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Host RAM one node needs: every rank's `host_bytes` (offloaded optimizer states and
    parameters, pinned buffers, offloaded activations; the worst rank's, as the engine reports)
    times the ranks on the node. Ignores the OS, the data loader and the framework's own host
    memory."""
    return np.asarray(host_bytes, dtype=np.float64) * np.asarray(ranks)


DEEPSPEED_PERSISTENCE_ELEMS_PER_H = 10.0
"""HF Trainer's DeepSpeed "auto" stage3_param_persistence_threshold = 10*h elements: smaller
parameters stay whole on every GPU under ZeRO-3 (DeepSpeed's own default, without the Trainer:
1e5, DEEPSPEED_DEFAULT_PERSISTENCE_THRESHOLD). Source: transformers/integrations/deepspeed.py
trainer_config_finalize; deepspeed 0.19.8 runtime/zero/partition_parameters.py (ds_persist)."""
DEEPSPEED_DEFAULT_REDUCE_BUCKET_ELEMS = 5e8
"""DeepSpeed's own reduce_bucket_size (and allgather_bucket_size), where no Trainer fills the
"auto" values; trainmem's `deepspeed` stack is HF Trainer + DeepSpeed and uses the Trainer's
h*h (DEEPSPEED_BUCKET_ELEMS_PER_H2). Source: deepspeed 0.19.8 runtime/zero/config.py."""
DEEPSPEED_DEFAULT_PREFETCH_BUCKET_ELEMS = 5e7
"""DeepSpeed's own stage3_prefetch_bucket_size (the Trainer's: 0.9*h*h). Source: as above."""
DEEPSPEED_DEFAULT_PERSISTENCE_THRESHOLD = 1e5
"""DeepSpeed's own stage3_param_persistence_threshold (the Trainer's: 10*h). Source: as above."""
DEEPSPEED_DEFAULT_MAX_LIVE_PARAMETERS = 1e9
"""DeepSpeed's stage3_max_live_parameters (no Trainer "auto"): a bound far above one gathered
block, so the live set is the prefetch bucket and the block at work. Source: as above."""


def _largest_numel(items, shape, *, where=None) -> np.ndarray:
    """Per row (of `shape`), the largest local tensor's elements among `items` (those
    `where(numel)` holds)."""
    sizes = [np.where(t.count > 0, t.numel, 0.0) for t in items]
    if where is not None:
        sizes = [np.where(where(s), s, 0.0) for s in sizes]
    return np.max(np.stack([np.broadcast_to(s, shape) for s in sizes]), axis=0)


def _deepspeed_numels(m: ModelSpec, full, shape) -> dict[str, np.ndarray]:
    """Per-row element counts DeepSpeed's offload buffers are sized by, over the rank's whole
    (unpartitioned) tensors: `largest` (largest_param_numel), `big` and `big_largest` (the
    parameters of a reduce bucket or more, DEEPSPEED_BUCKET_ELEMS_PER_H2 * h^2, which
    reduce_independent_p_g_buckets_and_remove_grads reduces alone), `total`, `persistent`
    (under DEEPSPEED_PERSISTENCE_ELEMS_PER_H * h)."""
    h = float(m.hidden_size)
    bucket = DEEPSPEED_BUCKET_ELEMS_PER_H2 * h * h
    small = DEEPSPEED_PERSISTENCE_ELEMS_PER_H * h
    return {
        "largest": _largest_numel(full, shape),
        "big": sum((np.where(t.numel > bucket, t.numel * t.count, 0.0) for t in full), np.zeros(1)),
        "big_largest": _largest_numel(full, shape, where=lambda s: s > bucket),
        "total": sum((t.numel * t.count for t in full), np.zeros(1)),
        "persistent": sum(
            (np.where(t.numel < small, t.numel * t.count, 0.0) for t in full), np.zeros(1)
        ),
    }


def deepspeed_offloaded_states(
    m: ModelSpec, *, fw, zero, offload, lora, dp, full, grad_e, param_e, state_numel, before, states
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """DeepSpeed ZeRO-Offload over offloaded_states' generic layout (`states`; `before`: the
    states before offload) where FrameworkSpec.offload_streams_gradients /
    offload_params_persistent_only hold: (the updated states, extra terms).

    Gradients (ZeRO-2/3, optimizer offloaded, not LoRA): each is copied into the reduce bucket
    (or reduced alone), reduced, its partition copied to the pinned fp32 host grads and freed:
    besides the buckets (deepspeed_buffer_bytes) one whole 16-bit gradient is in flight, the
    largest bounding it, and no more than the layout without offload keeps (which, like every
    layout here, leaves that transient out: a small model's embedding gradient at many ranks
    is larger than its gradient shard). `gpu_staging` (ZeRO-1/2):
    temp_grad_buffer_for_gpu_offload, the largest parameter in 16 bits, all run (LoRA: an
    adapter's, negligible).
    `accum_end_grads` (ZeRO-2, accumulation micro-steps): a non-boundary
    copy_grads_in_partition does not clear the gradient, so the partition's bucket-sized
    parameters (reduced alone, not in the reused bucket) keep theirs until the epilogue: their
    1/dp share plus one straddling the partition edge. Parameters
    (ZeRO-3, offloaded): the persistent ones whole; the gathered ones are the buckets.
    Host (deepspeed_host_bytes); `host_accum_bytes`: see there.
    Source: FrameworkSpec.offload_streams_gradients (stage_1_and_2.py, stage3.py).
    Assumes: a partition-edge parameter is a bucket-sized one.
    """
    fw = np.asarray(fw, dtype=np.int64)
    off_opt = OFFLOAD_STREAMS_GRADIENTS[fw] & (offload >= OFFLOAD_OPTIMIZER) & (zero >= 1)
    streams, zero12 = off_opt & (zero >= 2) & ~lora, off_opt & (zero <= 2)
    off_params = OFFLOAD_PARAMS_PERSISTENT_ONLY[fw] & (offload == OFFLOAD_PARAMS) & (zero >= 3)
    n = _deepspeed_numels(m, full, np.shape(dp))
    largest, big = n["largest"], n["big"]
    host, host_accum = deepspeed_host_bytes(
        zero=zero, offload=offload, lora=lora, numels=n, grad_e=grad_e, param_e=param_e,
        state_numel=state_numel, before=before,
    )  # fmt: skip
    out = {
        **states,
        "gradients": np.where(
            streams, np.minimum(grad_e * largest, states["gradients"]), states["gradients"]
        ),
        "parameters": np.where(off_params, param_e * n["persistent"], states["parameters"]),
        "host_bytes": np.where(off_opt, host, states["host_bytes"]),
    }
    accum = np.where(dp > 1, np.minimum(big, big / dp + n["big_largest"]), big)
    return out, {
        "streams": streams,
        "gpu_staging": np.where(zero12 & ~lora, grad_e * largest, 0.0),
        "accum_end_grads": np.where(streams & (zero == 2), grad_e * accum, 0.0),
        "host_accum_bytes": np.where(zero12, host_accum, 0.0),
    }


def deepspeed_host_bytes(
    *, zero, offload, lora, numels, grad_e, param_e, state_numel, before
) -> tuple[np.ndarray, np.ndarray]:
    """(host bytes of a rank under ZeRO-Offload, what gradient accumulation adds there).

    The partition's fp32 master (single_partition_of_fp32_groups, pinned), its fp32 gradients
    (their .grad, pinned) and the optimizer states (DeepSpeedCPUAdam); ZeRO-1/2: the 16-bit
    parameter buffer the step writes the new weights into
    (param_buffer_of_bit16_for_cpu_offload_groups) and the largest parameter's pinned 16-bit
    staging buffer (temp_grad_buffer_for_cpu_offload); ZeRO-3: the 16-bit gradient partition
    (grad_partitions_flat_buffer, on the host under offload_optimizer); with the parameters
    offloaded, their 16-bit partitions. Accumulation (ZeRO-1/2, not LoRA):
    accumulated_grads_in_cpu, each partition parameter's whole 16-bit gradient.
    Source: deepspeed 0.19.8 stage_1_and_2.py (__init__, initialize_optimizer_states,
    async_accumulate_grad_in_cpu_via_gpu), stage3.py _setup_for_real_optimizer.
    """
    largest = numels["largest"]
    host = (
        before["optimizer_states"]
        + before["master_weights"]
        + 4.0 * state_numel  # the fp32 gradient partition, pinned
        + np.where(zero <= 2, param_e * state_numel, grad_e * state_numel)
        + np.where((zero <= 2) & ~lora, grad_e * largest, 0.0)  # staging: LoRA's is an adapter
        + np.where(offload == OFFLOAD_PARAMS, before["parameters"], 0.0)
    )
    accum = np.where(lora, 0.0, grad_e * np.minimum(numels["total"], state_numel + largest))
    return host, accum
