"""torch.compile of each transformer block: what AOTAutograd's partitioner keeps for backward
instead of eager's saved tensors.

torchtitan (apply_compile) and torchtune (`compile: True`) compile every block on its own;
inductor partitions the joint graph with the min-cut partitioner, which recomputes cheap
pointwise ops in backward rather than saving their outputs. Measured on torchtitan 0.3.0's
Llama 3 (tests/data/framework_traces/torchtitan_llama3_compile.json: inductor's decompositions
and partition_fn on the fake CUDA device; the saved sets agree with real inductor on CPU):

- no checkpointing: the norms keep their input and rstd only (as torch's fused RMSNorm), and
  the MLP's activation output is recomputed from the gate's (one [T, f] less);
- per-op selective checkpointing: the down projection's output, which SAC marks must-save but
  backward never reads, is dropped (one [T, h] less);
- full checkpointing: unchanged (the block's input only).

Ignores: the loss (compiled separately by newer torchtitan and torchtune versions: not
modelled); MoE and MLA blocks (eager formulas); the backward's transients (inductor fuses them;
eager's are kept, an upper bound); the step time.
"""

from __future__ import annotations

import numpy as np

from ._activations import hf_mlp_bytes
from ._codes import RECOMPUTE_SELECTIVE_OP
from ._model import ModelSpec


def compiled_mlp_delta_bytes(m: ModelSpec, *, T, e, amp, tp) -> np.ndarray:
    """Change of a dense block's saved bytes under compile without checkpointing (the norms:
    see hf_norm_bytes `fused`): the MLP keeps its matmul outputs only, the activation's output
    (and a Python GELU's intermediates) being recomputed.
    Source: the module docstring's traces (gated: w1, w3 and their product kept, silu's output
    not)."""
    Tf = T * m.intermediate_size / tp
    if m.gated_mlp:
        return -e * Tf
    return -(hf_mlp_bytes(m, T=T, e=e, amp=amp, tp=tp) - e * Tf)


def compiled_op_sac_delta_bytes(m: ModelSpec, *, T, e, policy, down_kept) -> np.ndarray:
    """Change under compile of what per-op SAC keeps: the down projection's output, when SAC
    counts it among the kept matmuls (`down_kept`), is not kept."""
    return np.where((policy == RECOMPUTE_SELECTIVE_OP) & down_kept, -e * T * m.hidden_size, 0.0)
