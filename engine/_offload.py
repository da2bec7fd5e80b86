"""CPU offload: the optimizer (ZeRO-Offload), optimizer and parameters (ZeRO-Infinity / FSDP
CPU offload), and activation offloading to pinned host memory.
"""

from __future__ import annotations

import numpy as np

from ._codes import OFFLOAD_OPTIMIZER, OFFLOAD_PARAMS
from ._collectives import exposed_s
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
