"""FLOP counts of a training step: GEMM weights per token, MLP width.

Pure functions of a ModelSpec (LoRA adapters: engine/_lora.py `lora_width`).
"""

from __future__ import annotations

import numpy as np

from ._model import BLOCK_GROUPS, ModelSpec


def matmul_parameters(m: ModelSpec) -> tuple[float, float]:
    """(all blocks, outside the blocks) GEMM weights one token passes through.

    Blocks: every weight matrix of every block (biases and norms are not GEMMs); of a
    mixture-of-experts block's routed experts only the top-k a token visits. Outside: the output
    projection (vocab x hidden, tied or not: the embedding lookup is not a GEMM, the logits are)
    and BERT's head transform. Source: PaLM (Chowdhery et al. 2022) Appendix B; torchtitan
    `get_nparams_and_flops` (parameters less the embedding; active experts only for MoE).
    A traced profile knows its parameter counts only: every parameter counts as a GEMM weight
    (6N per token; its attention scores are not counted).
    """
    traced = m.profile
    if traced is not None:
        blocks_traced = float(traced.num_parameters_per_layer * m.num_hidden_layers)
        return blocks_traced, float(traced.num_parameters_outside_layers)
    blocks = 0.0
    for p in m.param_tensors():
        if p.group in BLOCK_GROUPS and len(p.shape) >= 2:
            active = m.num_experts_per_tok / m.num_experts if p.expert else 1.0
            blocks += p.numel * m.group_count(p.group) * active
    head = float(m.vocab_size * m.hidden_size)
    head += sum(p.numel for p in m.param_tensors() if p.name == "cls.transform.dense.weight")
    return blocks, head


def block_linear_widths(m: ModelSpec) -> float:
    """Input plus output widths of every block GEMM a token passes through (of a routed MoE
    expert, its top-k share): the elements per token an fp8 recipe casts to fp8 around the
    block linears. A traced profile has no shapes: 0. Source: the ModelSpec's param_tensors
    (a weight [out, in]); torchao float8 float8_linear.py matmul_with_hp_or_float8_args (the
    input cast in forward, the output gradient and the input again in backward)."""
    if m.profile is not None:
        return 0.0
    widths = 0.0
    for p in m.param_tensors():
        if p.group in BLOCK_GROUPS and len(p.shape) >= 2:
            active = m.num_experts_per_tok / m.num_experts if p.expert else 1.0
            out_dim, in_dim = p.shape[-2:]
            matrices = p.numel / (out_dim * in_dim)  # a stacked experts tensor: E matrices
            widths += float(out_dim + in_dim) * matrices * m.group_count(p.group) * active
    return widths


def mlp_width(m: ModelSpec) -> float:
    """The MLP activation width a token passes through, summed over all blocks (x2 gated)."""
    gate = 2.0 if m.gated_mlp else 1.0
    moe = m.num_experts_per_tok * m.moe_intermediate_size + m.shared_expert_intermediate_size
    return gate * (m.num_mlp_layers * m.intermediate_size + m.num_moe_layers * moe)


def model_flops_per_token(m: ModelSpec, seq_len: np.ndarray) -> np.ndarray:
    """Training FLOPs per token by the MFU convention: 6 x GEMM weights + 12 L s q.

    Source: PaLM (Chowdhery et al. 2022) Appendix B, 6N + 12LHQT; Narayanan et al. 2021 Eq. 3
    less its recomputation pass (72 B s l h^2 (1 + s/6h + V/12lh) per step for GPT).
    Assumes: attention scores counted in full (no causal halving), as both papers do.
    """
    s = np.asarray(seq_len, dtype=np.float64)
    blocks, head = matmul_parameters(m)
    attention = 6.0 * m.num_hidden_layers * s * (m.q_dim + m.o_dim)  # QK^T and AV, 2 + 4
    return 6.0 * (blocks + head) + attention  # 2 forward + 4 backward per weight
