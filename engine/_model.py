"""ModelSpec: the architecture facts the formulas need, read from a Hugging Face config.json.

Field names follow Hugging Face (`hidden_size`, `num_attention_heads`, ...). The parameter
inventory (`param_tensors`) lists every parameter tensor with its shape and how tensor
parallelism splits it, so that parameter counts equal PyTorch's exactly and per-rank bytes can be
rounded per tensor, as the CUDA caching allocator does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from ._activation_profile import ActivationProfile

Family = Literal["decoder", "gpt2", "bert", "profile"]
NormKind = Literal["rms", "gemma_rms", "olmo2_rms", "layernorm"]
MlpAct = Literal["silu", "gelu", "gelu_new", "relu"]
QkNormLayout = Literal["head", "full", "head_ln", "per_head_ln"]
"""Where q/k normalisation sits: head = one RMSNorm(head_dim) shared by the heads (Qwen3); full =
one RMSNorm over the whole q / k projection width (OLMo 2); head_ln = one LayerNorm(head_dim) with
bias shared by the heads (Phi qk_layernorm); per_head_ln = a bias-free LayerNorm(head_dim) per
head (StableLM qk_layernorm)."""
TpSplit = Literal["col", "row", "vocab", "rep"]
Group = Literal["embed", "layer", "mlp", "moe", "final", "head"]
"""embed/final/head once; layer (attention + norms) in every block; mlp in dense blocks only;
moe (router, routed and shared experts) in mixture-of-experts blocks only."""
BLOCK_GROUPS: tuple[Group, ...] = ("layer", "mlp", "moe")
"""ModelSpec parameter groups that live in the transformer blocks."""

_GELU_TANH_PYTHON = {"gelu_new", "gelu_fast", "gelu_python"}
"""Activations that transformers implements as a Python tanh formula (several saved tensors)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamTensor:
    """One parameter tensor kind (repeated `count` times per layer for group "layer")."""

    name: str
    shape: tuple[int, ...]
    group: Group
    tp_split: TpSplit
    """How tensor parallelism splits it: col = dim 0, row = dim 1, vocab = dim 0 of an
    embedding/lm_head, rep = replicated (norms, row-parallel biases)."""
    expert: bool = False
    """A routed-experts tensor [E, ...]: expert parallelism divides its dim 0."""
    lora_targets: tuple[str, ...] = ()
    """The PEFT target names that adapt this (linear) weight, e.g. ("q_proj",)."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def is_block_linear(self) -> bool:
        """A linear layer's weight inside a transformer block (what LoRA adapts, QLoRA
        quantises and fp8 recipes cast)."""
        return len(self.shape) == 2 and self.group in BLOCK_GROUPS


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A transformer's architecture, in Hugging Face field names."""

    name: str
    """Preset name or the config file's path."""
    family: Family
    """decoder: rotary decoders without learned positions: Llama-style (Llama, Mistral, Qwen2/3,
    Gemma, Gemma 2, Gemma 3, Phi-3, Mixtral, Qwen-MoE, DeepSeek-V2/V3) and GPT-NeoX / Falcon
    (fused query_key_value, LayerNorm with bias, non-gated GeLU MLP, parallel residual); gpt2:
    GPT-2/3 (Conv1D, learned positions, LayerNorm with bias); bert: encoder-only BERT with an
    MLM head; profile: an architecture known only by its traced activation profile (`profile`,
    see _profile.py). `model_type` tells the decoders apart; `SUPPORTED_MODEL_TYPES` lists them."""
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    mlp_act: MlpAct
    gated_mlp: bool
    norm: NormKind
    attention_bias: bool
    """Bias on q/k/v (and on o_proj for Llama's `attention_bias`)."""
    o_proj_bias: bool
    mlp_bias: bool
    rotary: bool
    fused_qkv: bool
    """One q/k/v projection whose output holds all three (GPT-2 c_attn, Phi-3 qkv_proj)."""
    fused_gate_up: bool
    type_vocab_size: int = 0
    dropout: float = 0.0
    """Hidden/residual dropout probability in training (GPT-2 0.1, BERT 0.1, Llama 0)."""
    attention_dropout: float = 0.0
    embed_scale: bool = False
    """Gemma multiplies the embedding output by sqrt(hidden_size) (a new tensor)."""
    qk_norm: bool = False
    """Normalisation of q and k before rotary (Qwen3, OLMo 2: q_norm, k_norm; `qk_norm_layout`)."""
    qk_norm_layout: QkNormLayout = "head"
    lm_head_bias: bool = False
    """The output head has a bias (Phi: lm_head = Linear(hidden, vocab, bias=True))."""
    logits_scaling: float = 0.0
    """Granite: the logits are divided by this (a second [tokens, vocab] tensor); 0: none."""
    num_experts: int = 0
    """Routed experts per MoE block (0: a dense model)."""
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    """Total intermediate size of the always-on shared expert(s) (0: none)."""
    shared_expert_gate: bool = False
    """Qwen2-MoE gates the shared expert with sigmoid(Linear(h, 1))."""
    router_fp32: bool = False
    """DeepSeek-V2/V3 compute the router in fp32 (input and weight upcast)."""
    num_dense_layers: int = 0
    """Leading blocks with a dense MLP in an MoE model (DeepSeek first_k_dense_replace)."""
    q_lora_rank: int = 0
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank q (0: a plain q_proj)."""
    kv_lora_rank: int = 0
    """MLA compressed KV width (0: not MLA)."""
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int = 0
    """Tokens each query attends back over when the modeling code builds a sliding-window causal
    mask (Mistral, Mixtral, Phi-3 `sliding_window`); 0: a plain causal mask."""
    rotary_cat: bool = False
    """apply_rotary_pos_emb rebuilds q and k with torch.cat (Phi-3's partial-rotary form), so
    they come out contiguous in [b, heads, s, head_dim] order rather than in the projection's."""
    profile: ActivationProfile | None = None
    """Family "profile": the traced coefficients that replace the activation formulas."""
    num_norms_per_layer: int = 2
    """Normalisation layers per block: 2 (pre-attention, pre-MLP; Llama, GPT-NeoX, Falcon-40B's
    ln_attn / ln_mlp), 1 (Falcon-7B: one input_layernorm feeds attention and MLP), 4 (Gemma 2's
    sandwich: pre/post attention, pre/post feedforward). The parameter inventory is exact; the
    activation formulas count the one norm of a parallel block (block_single_norm_bytes) and
    Gemma 2's two post-norms (sandwich_post_norm_bytes)."""
    falcon_kv_expanded: bool = False
    """Falcon's new_decoder_architecture (Falcon-40B): _split_heads broadcasts each k/v group to
    its query heads and flattens them (copies) before the kernel, so k and v are saved at every
    query head (_activations.falcon_eager_attention_bytes)."""
    parallel_residual: bool = False
    """Attention and MLP both read the block input and add to one residual (GPT-NeoX
    use_parallel_residual, Falcon parallel_attn); parameters are unchanged, activations are
    counted as for the sequential block (the same tensors are saved)."""
    partial_rotary_factor: float = 1.0
    """Fraction of head_dim that rotary rotates (GPT-NeoX rotary_pct, 0.25 in Pythia)."""
    attn_logit_softcapping: float = 0.0
    """Gemma 2: attention scores pass through cap * tanh(scores / cap) (0: none; eager saves the
    tanh output, _activations.softcap_scores_bytes)."""
    final_logit_softcapping: float = 0.0
    """Gemma 2: logits pass through cap * tanh(logits / cap) (0: none; the tanh output [T, v] is
    saved, _activations.final_softcap_bytes)."""
    query_pre_attn_scalar: float = 0.0
    """Gemma 2: queries are scaled by query_pre_attn_scalar**-0.5 (0: head_dim**-0.5)."""
    alternating_sliding_window: int = 0
    """Gemma 2 / 3: the layers layer_types marks "sliding_attention" (every other layer in Gemma
    2, `num_sliding_layers` of them in Gemma 3) attend over this many tokens; the other layers
    are global. `sliding_window` stays 0 (its formulas assume every layer is windowed). Eager
    attention (transformers' only path for Gemma 2 besides FlashAttention-2) builds the window's
    mask once per step and saves none of it per layer: traced at lengths below, at and above the
    window (bench/conformance.py, families gemma2 and gemma3), the layer bytes do not change
    with it; under SDPA the windowed layers take a mask from the window's length on
    (_activations.alternating_window_sdpa_delta_bytes)."""
    num_sliding_layers: int = 0
    """Gemma 3: how many blocks are sliding-window layers (layer_types, or every layer but each
    sliding_window_pattern-th: 5 of 6); 0 for Gemma 2 (every other layer, eager only)."""
    num_rotary_tables: int = 1
    """cos/sin table pairs the model builds per step: 2 for Gemma 3 with both layer types (a
    local rope for the sliding layers, a global, scaled one for the others)."""

    @property
    def rotary_dim(self) -> int:
        """Width of the rotary cos/sin tables: the rotated part of a head (partial rotary:
        int(head_dim * partial_rotary_factor), as transformers' rotary embeddings build them;
        MLA: qk_rope_head_dim)."""
        if self.is_mla:
            return self.qk_rope_head_dim
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_hidden_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def num_mlp_layers(self) -> int:
        """Blocks with a dense MLP."""
        return self.num_dense_layers if self.is_moe else self.num_hidden_layers

    @property
    def q_dim(self) -> int:
        """Width of the query (per token, all heads)."""
        if self.is_mla:
            return self.num_attention_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the keys (per token, all KV heads)."""
        if self.is_mla:
            return self.num_attention_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.num_key_value_heads * self.head_dim

    @property
    def o_dim(self) -> int:
        """Width of the attention output (o_proj's input)."""
        if self.is_mla:
            return self.num_attention_heads * self.v_head_dim
        return self.q_dim

    def group_count(self, group: Group) -> int:
        """How many times a group's tensors occur in the model."""
        return {
            "layer": self.num_hidden_layers,
            "mlp": self.num_mlp_layers,
            "moe": self.num_moe_layers,
        }.get(group, 1)

    def param_tensors(self) -> tuple[ParamTensor, ...]:
        """Every parameter tensor, per layer for group "layer" (once each otherwise)."""
        return _param_tensors(self)

    @property
    def num_parameters(self) -> int:
        """Exact count, tied embeddings counted once (PyTorch's `sum(p.numel())`)."""
        return sum(p.numel * self.group_count(p.group) for p in self.param_tensors())

    def num_parameters_in(self, group: Group) -> int:
        """Parameters of one occurrence of a group (one block's attention, one MoE block...)."""
        return sum(p.numel for p in self.param_tensors() if p.group == group)

    @property
    def num_param_tensors(self) -> int:
        """How many parameter tensors (fused AdamW keeps one fp32 `step` per tensor on GPU)."""
        return sum(self.group_count(p.group) for p in self.param_tensors())


def _param_tensors(m: ModelSpec) -> tuple[ParamTensor, ...]:
    if m.profile is not None:
        # A traced profile knows its parameter counts only: one tensor per layer, one outside.
        per_layer = m.profile.num_parameters_per_layer
        outside = m.profile.num_parameters_outside_layers
        layer = ParamTensor(name="layer", shape=(per_layer,), group="layer", tp_split="rep")
        if not outside:
            return (layer,)
        embed = ParamTensor(name="outside_layers", shape=(outside,), group="embed", tp_split="rep")
        return (embed, layer)
    inv = _Inventory(m)
    _add_embeddings(inv, m)
    _add_attention_block(inv, m)
    # The dense MLP (every block of a dense model; the leading blocks of an MoE model).
    if m.num_mlp_layers:
        inv.add_mlp("", m.intermediate_size, "mlp")
    if m.is_moe:
        _add_moe_block(inv, m)
    _add_head(inv, m)
    return tuple(inv.tensors)


class _Inventory:
    """The parameter tensors of a model, in module order, as they are added."""

    def __init__(self, m: ModelSpec) -> None:
        self.m = m
        self.tensors: list[ParamTensor] = []

    def add(
        self,
        name: str,
        shape: tuple[int, ...],
        group: Group,
        split: TpSplit,
        lora: tuple[str, ...] = (),
        expert: bool = False,
    ) -> None:
        self.tensors.append(
            ParamTensor(
                name=name, shape=shape, group=group, tp_split=split, lora_targets=lora,
                expert=expert,
            )
        )  # fmt: skip

    def add_norm(self, name: str, group: Group, width: int | None = None) -> None:
        width = self.m.hidden_size if width is None else width
        self.add(f"{name}.weight", (width,), group, "rep")
        if self.m.norm == "layernorm":
            self.add(f"{name}.bias", (width,), group, "rep")

    def add_mlp(self, prefix: str, width: int, group: Group) -> None:
        m, h, add = self.m, self.m.hidden_size, self.add
        if m.gated_mlp:
            if m.fused_gate_up:
                add(f"{prefix}gate_up_proj.weight", (2 * width, h), group, "col",
                    ("gate_proj", "up_proj"))  # fmt: skip
            else:
                add(f"{prefix}gate_proj.weight", (width, h), group, "col", ("gate_proj",))
                add(f"{prefix}up_proj.weight", (width, h), group, "col", ("up_proj",))
                if m.mlp_bias:
                    add(f"{prefix}gate_proj.bias", (width,), group, "col")
                    add(f"{prefix}up_proj.bias", (width,), group, "col")
        else:
            add(f"{prefix}fc_in.weight", (width, h), group, "col", ("up_proj",))
            if m.mlp_bias:
                add(f"{prefix}fc_in.bias", (width,), group, "col")
        add(f"{prefix}fc_out.weight", (h, width), group, "row", ("down_proj",))
        if m.mlp_bias:
            add(f"{prefix}fc_out.bias", (h,), group, "rep")


def _add_embeddings(inv: _Inventory, m: ModelSpec) -> None:
    inv.add("embed_tokens.weight", (m.vocab_size, m.hidden_size), "embed", "vocab")
    if m.family in ("gpt2", "bert"):
        inv.add("position_embeddings.weight", (m.max_position_embeddings, m.hidden_size), "embed",
                "rep")  # fmt: skip
    if m.family == "bert":
        inv.add("token_type_embeddings.weight", (m.type_vocab_size, m.hidden_size), "embed", "rep")
        inv.add_norm("embeddings.LayerNorm", "embed")


def _add_attention_block(inv: _Inventory, m: ModelSpec) -> None:
    """One transformer block's attention and norms (group "layer")."""
    h, qd, kvd, add = m.hidden_size, m.q_dim, m.kv_dim, inv.add
    norms = _decoder_norm_names(m) if m.family == "decoder" else ()
    if norms:
        inv.add_norm(norms[0], "layer")
    if m.family == "gpt2":
        inv.add_norm("ln_1", "layer")
    if m.is_mla:
        _add_mla_projections(inv, m)
    elif m.fused_qkv:
        add("qkv_proj.weight", (qd + 2 * kvd, h), "layer", "col", ("q_proj", "k_proj", "v_proj"))
        if m.attention_bias:
            add("qkv_proj.bias", (qd + 2 * kvd,), "layer", "col")
    else:
        for proj, dim in (("q_proj", qd), ("k_proj", kvd), ("v_proj", kvd)):
            add(f"{proj}.weight", (dim, h), "layer", "col", (proj,))
            if m.attention_bias:
                add(f"{proj}.bias", (dim,), "layer", "col")
    if m.qk_norm:
        _add_qk_norms(inv, m)
    add("o_proj.weight", (h, m.o_dim), "layer", "row", ("o_proj",))
    if m.o_proj_bias:
        add("o_proj.bias", (h,), "layer", "rep")
    if m.family == "bert":
        inv.add_norm("attention.output.LayerNorm", "layer")
    for norm in norms[1:]:
        inv.add_norm(norm, "layer")
    if m.family == "gpt2":
        inv.add_norm("ln_2", "layer")
    if m.family == "bert":
        inv.add_norm("output.LayerNorm", "layer")


def _add_qk_norms(inv: _Inventory, m: ModelSpec) -> None:
    """q/k normalisation (QkNormLayout): Qwen3 q_norm / k_norm RMSNorm(head_dim); OLMo 2
    RMSNorm(q_dim) / RMSNorm(kv_dim); Phi q_layernorm / k_layernorm LayerNorm(head_dim) with bias;
    StableLM StableLmLayerNormPerHead: one bias-free LayerNorm(head_dim) per q / kv head."""
    d, add = m.head_dim, inv.add
    if m.qk_norm_layout == "full":
        add("q_norm.weight", (m.q_dim,), "layer", "rep")
        add("k_norm.weight", (m.kv_dim,), "layer", "rep")
    elif m.qk_norm_layout == "per_head_ln":  # one tensor per head, as the ModuleList holds them
        for name, heads in (("q", m.num_attention_heads), ("k", m.num_key_value_heads)):
            for i in range(heads):
                add(f"{name}_layernorm.norms.{i}.weight", (d,), "layer", "rep")
    else:
        for name in ("q_norm", "k_norm"):
            add(f"{name}.weight", (d,), "layer", "rep")
            if m.qk_norm_layout == "head_ln":
                add(f"{name}.bias", (d,), "layer", "rep")


def _decoder_norm_names(m: ModelSpec) -> tuple[str, ...]:
    """A decoder block's norms, as transformers names them; the first precedes q/k/v (OLMo 2:
    none does, both norm a sublayer's output)."""
    if m.model_type == "olmo2":
        return ("post_attention_layernorm", "post_feedforward_layernorm")
    if m.num_norms_per_layer == 1:
        return ("input_layernorm",)
    if m.num_norms_per_layer == 4:
        return (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        )
    if m.model_type == "falcon" and m.parallel_residual:
        return ("ln_attn", "ln_mlp")
    return ("input_layernorm", "post_attention_layernorm")


def _add_mla_projections(inv: _Inventory, m: ModelSpec) -> None:
    """DeepseekV3Attention: q_a_proj -> q_a_layernorm -> q_b_proj (or q_proj),
    kv_a_proj_with_mqa -> kv_a_layernorm -> kv_b_proj (o_proj is added by the caller)."""
    h, qd, add = m.hidden_size, m.q_dim, inv.add
    if m.q_lora_rank:
        add("q_a_proj.weight", (m.q_lora_rank, h), "layer", "rep", ("q_proj",))
        inv.add_norm("q_a_layernorm", "layer", m.q_lora_rank)
        add("q_b_proj.weight", (qd, m.q_lora_rank), "layer", "col", ("q_proj",))
    else:
        add("q_proj.weight", (qd, h), "layer", "col", ("q_proj",))
    width = m.kv_lora_rank + m.qk_rope_head_dim
    add("kv_a_proj_with_mqa.weight", (width, h), "layer", "rep", ("k_proj",))
    inv.add_norm("kv_a_layernorm", "layer", m.kv_lora_rank)
    kv_b = m.num_attention_heads * (m.qk_nope_head_dim + m.v_head_dim)
    add("kv_b_proj.weight", (kv_b, m.kv_lora_rank), "layer", "col", ("v_proj",))


def _add_moe_block(inv: _Inventory, m: ModelSpec) -> None:
    """The MoE block: router, routed experts as 3-D tensors (transformers 5), shared experts."""
    e, fe, h = m.num_experts, m.moe_intermediate_size, m.hidden_size
    inv.add("router.weight", (e, h), "moe", "rep")
    inv.add("experts.gate_up_proj", (e, 2 * fe, h), "moe", "rep", expert=True)
    inv.add("experts.down_proj", (e, h, fe), "moe", "rep", expert=True)
    if m.shared_expert_intermediate_size:
        inv.add_mlp("shared_experts.", m.shared_expert_intermediate_size, "moe")
    if m.shared_expert_gate:
        inv.add("shared_expert_gate.weight", (1, h), "moe", "rep")


def _add_head(inv: _Inventory, m: ModelSpec) -> None:
    """Final norm and head."""
    h, v = m.hidden_size, m.vocab_size
    if m.family == "decoder":
        inv.add_norm("norm", "final")
    if m.family == "gpt2":
        inv.add_norm("ln_f", "final")
    if m.family == "bert":
        # BertForMaskedLM's cls.predictions: transform dense + LayerNorm, decoder bias.
        inv.add("cls.transform.dense.weight", (h, h), "head", "rep")
        inv.add("cls.transform.dense.bias", (h,), "head", "rep")
        inv.add_norm("cls.transform.LayerNorm", "head")
        inv.add("cls.decoder.bias", (v,), "head", "vocab")
    if not m.tie_word_embeddings:
        inv.add("lm_head.weight", (v, h), "head", "vocab")
    if m.lm_head_bias:
        inv.add("lm_head.bias", (v,), "head", "vocab")


_LLAMA_STYLE = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "gemma3",
    "phi3",
    "olmo2",
    "granite",
)
"""model_types read by _decoder_spec (Llama-style layout, with their known variations)."""
_OWN_READERS = ("gpt_neox", "falcon", "stablelm", "phi")
"""Decoders whose model_type names their own reader (a layout of their own)."""
_GPT2_TYPES = ("gpt2", "gpt3")
_BERT_TYPES = ("bert", "roberta")
"""openai-gpt (no ln_f, post-LN), electra (embedding_size projection) and distilbert (other field
names) were once read by these families; their counts differed from PyTorch's, so they are now
refused like any other unknown model_type."""
_T5_TYPES = ("t5", "mt5", "umt5", "t5gemma")
"""Encoder-decoders refused with the shipped traced T5 profiles named (docs/models.md)."""
_T5_PROFILES = (
    "estimate T5 from a shipped traced profile: --profile t5-v1_1-base-amp-bf16 (also "
    "t5-v1_1-base-amp-bf16-recompute-full, t5-base-amp-bf16; other sizes: trace one, "
    "docs/models.md#t5)"
)
SUPPORTED_MODEL_TYPES: dict[str, tuple[str, ...]] = {
    "decoder": (*_LLAMA_STYLE, "gpt_neox", "falcon", "stablelm", "phi"),
    "gpt2": _GPT2_TYPES,
    "bert": _BERT_TYPES,
}
"""The config.json `model_type`s each family reads; any other is an error (never a guess)."""

_REQUIRED = {
    "gpt_neox": (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
    ),
    "falcon": ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"),
    "stablelm": (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
    ),
    "phi": (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
    ),
    "decoder": (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
    ),
    "gpt2": ("n_embd", "n_layer", "n_head", "vocab_size"),
    "bert": (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
    ),
}


FAMILIES = {
    "llama": "decoder",
    "gpt-neox": "gpt_neox",
    "falcon": "falcon",
    "gpt2": "gpt2",
    "bert": "bert",
}
"""Families a user may force on a config.json whose model_type no reader knows (`--family`):
the name -> the reader that builds it. Forcing reads the config with that family's layout and
field names (a Llama-style decoder: RMSNorm, gated MLP, rotary, untied unless the config ties);
what the architecture does differently is not counted (the user's assumption, said in the
error that proposes it)."""


def _reader_of(config: dict[str, Any], *, name: str, family: str | None = None) -> str:
    """Which reader builds the spec: "decoder" (Llama-style), "gpt_neox", "falcon", "gpt2" or
    "bert" (`family`, a FAMILIES name, forces one); a one-line ValueError for a model_type none
    of them knows (or none at all) and no family forced."""
    if family is not None:
        if family not in FAMILIES:
            raise ValueError(f"family: unknown value '{family}'; allowed: {', '.join(FAMILIES)}")
        return FAMILIES[family]
    raw = config.get("model_type")
    model_type = str(raw).lower() if isinstance(raw, str) else ""
    if model_type in _GPT2_TYPES:
        return "gpt2"
    if model_type in _BERT_TYPES:
        return "bert"
    if model_type in _LLAMA_STYLE:
        return "decoder"
    if model_type in _OWN_READERS:
        return model_type
    supported = "; ".join(f"{fam}: {', '.join(t)}" for fam, t in SUPPORTED_MODEL_TYPES.items())
    what = f"model_type {raw!r} is not supported" if raw is not None else "model_type is missing"
    if model_type in _T5_TYPES:
        raise ValueError(
            f"model: {name}: {what} (an encoder-decoder; the formulas model one stack of "
            f"layers); supported model_types: {supported}; {_T5_PROFILES}"
        )
    raise ValueError(
        f"model: {name}: {what} (its layout would be guessed); supported model_types: "
        f"{supported}; force a family with --family {'|'.join(FAMILIES)} if the layout is "
        f"one of them, or trace a profile (trainmem trace)"
    )


_POSITIVE_INTS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "max_position_embeddings",
    "head_dim",
    "moe_intermediate_size",
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "decoder_sparse_step",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_nope_head_dim",
    "v_head_dim",
    "sliding_window",
    "num_kv_heads",
    "ffn_hidden_size",
    "num_ln_in_parallel_attn",
    "n_embd",
    "n_layer",
    "n_head",
    "n_inner",
    "n_positions",
    "n_ctx",
)
"""Sizes and counts of a config.json that must be integers >= 1 (None: absent)."""
_NON_NEGATIVE_INTS = (
    "qk_rope_head_dim",
    "n_shared_experts",
    "shared_expert_intermediate_size",
    "first_k_dense_replace",
    "type_vocab_size",
)
_BOOLS = (
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "use_parallel_residual",
    "parallel_attn",
    "multi_query",
    "new_decoder_architecture",
    "bias",
    "alibi",
    "use_qkv_bias",
    "qk_layernorm",
)
_PROBABILITIES = (
    "attention_dropout",
    "hidden_dropout",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "resid_pdrop",
    "attn_pdrop",
    "embd_pdrop",
)
_MAX_SIZE = 2**31 - 1


def _integer(value: Any) -> int | None:
    """`value` as an int when it is an integer (4096 or 4096.0), else None (bools excluded)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def check_hf_fields(config: dict[str, Any], *, name: str) -> None:
    """One-line ValueError naming the first config.json field that is not a valid size, count,
    switch or probability, or heads that do not divide (checked before any formula runs)."""
    for key in (*_POSITIVE_INTS, *_NON_NEGATIVE_INTS):
        value = config.get(key)
        if value is None:
            continue
        low = 1 if key in _POSITIVE_INTS else 0
        number = _integer(value)
        if number is None or not low <= number <= _MAX_SIZE:
            raise ValueError(
                f"model: {name}: {key} must be an integer in [{low}, {_MAX_SIZE}], got {value!r}"
            )
    for key in _BOOLS:
        value = config.get(key)
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"model: {name}: {key} must be true or false, got {value!r}")
    for key in _PROBABILITIES:
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(f"model: {name}: {key} must be a number in [0, 1), got {value!r}")
    hidden = config.get("hidden_size", config.get("n_embd"))
    heads = config.get("num_attention_heads", config.get("n_head"))
    for kv_key in ("num_key_value_heads", "num_kv_heads"):
        kv_heads = config.get(kv_key)
        if heads is not None and kv_heads is not None and int(heads) % int(kv_heads):
            raise ValueError(
                f"model: {name}: num_attention_heads ({heads}) must be divisible by "
                f"{kv_key} ({kv_heads})"
            )
    if (
        hidden is not None
        and heads is not None
        and config.get("head_dim") is None
        and config.get("qk_nope_head_dim") is None
        and int(hidden) % int(heads)
    ):
        key = "hidden_size" if "hidden_size" in config else "n_embd"
        raise ValueError(
            f"model: {name}: {key} ({hidden}) must be divisible by the number of heads ({heads}) "
            "when head_dim is absent"
        )


def model_from_hf_config(
    config: dict[str, Any], *, name: str, family: str | None = None
) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config.json's fields.

    The reader is chosen by `model_type` (SUPPORTED_MODEL_TYPES): Llama-style decoders, GPT-NeoX,
    Falcon, GPT-2/3 and BERT. Any other model_type, or none, raises a one-line ValueError listing
    the supported ones: a layout is never guessed, unless `family` (FAMILIES) forces a reader.
    Missing fields raise one ValueError naming all of them.
    """
    reader = _reader_of(config, name=name, family=family)
    if family is not None and not isinstance(config.get("model_type"), str):
        config = {**config, "model_type": family.replace("-", "_")}
    if reader == "falcon" and config.get("hidden_size") is None and "n_embed" in config:
        config = {**config, "hidden_size": config["n_embed"]}  # FalconConfig's old name
    if reader == "decoder" and str(config.get("model_type")).lower() in ("gemma3", "gemma3_text"):
        config = _gemma3_text_config(config, name=name)
    missing = [k for k in _REQUIRED[reader] if config.get(k) is None]
    if missing:
        raise ValueError(f"{name}: config is missing required field(s): {', '.join(missing)}")
    check_hf_fields(config, name=name)
    model_type = str(config["model_type"]).lower()
    if reader == "gpt2":
        return _gpt2_spec(config, name=name, model_type=model_type)
    if reader == "bert":
        return _bert_spec(config, name=name, model_type=model_type)
    if reader == "gpt_neox":
        return _gpt_neox_spec(config, name=name)
    if reader == "falcon":
        return _falcon_spec(config, name=name)
    if reader in ("stablelm", "phi"):
        return _stablelm_or_phi_spec(config, name=name, model_type=reader)
    return _decoder_spec(config, name=name, model_type=model_type)


def _gpt2_spec(config: dict[str, Any], *, name: str, model_type: str) -> ModelSpec:
    """GPT-2/3 (n_embd, n_layer, n_head; Conv1D, learned positions, LayerNorm with bias)."""
    h = int(config["n_embd"])
    a = int(config["n_head"])
    n_inner = config.get("n_inner")
    act = str(config.get("activation_function", "gelu_new"))
    return ModelSpec(
        name=name,
        family="gpt2",
        model_type=model_type,
        hidden_size=h,
        intermediate_size=int(n_inner) if n_inner else 4 * h,
        num_hidden_layers=int(config["n_layer"]),
        num_attention_heads=a,
        num_key_value_heads=a,
        head_dim=h // a,
        vocab_size=int(config["vocab_size"]),
        max_position_embeddings=int(config.get("n_positions", config.get("n_ctx", 1024))),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        mlp_act="gelu_new" if act in _GELU_TANH_PYTHON else _act(act),
        gated_mlp=False,
        norm="layernorm",
        attention_bias=True,
        o_proj_bias=True,
        mlp_bias=True,
        rotary=False,
        fused_qkv=True,
        fused_gate_up=False,
        dropout=float(config.get("resid_pdrop", 0.1)),
        attention_dropout=float(config.get("attn_pdrop", 0.1)),
    )


def _bert_spec(config: dict[str, Any], *, name: str, model_type: str) -> ModelSpec:
    """BERT-style encoders with an MLM head."""
    h = int(config["hidden_size"])
    a = int(config["num_attention_heads"])
    act_name = str(config.get("hidden_activation") or config.get("hidden_act", "silu"))
    return ModelSpec(
        name=name,
        family="bert",
        model_type=model_type,
        hidden_size=h,
        intermediate_size=int(config["intermediate_size"]),
        num_hidden_layers=int(config["num_hidden_layers"]),
        num_attention_heads=a,
        num_key_value_heads=a,
        head_dim=h // a,
        vocab_size=int(config["vocab_size"]),
        max_position_embeddings=int(config.get("max_position_embeddings", 512)),
        type_vocab_size=int(config.get("type_vocab_size", 2)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        mlp_act=_act(act_name),
        gated_mlp=False,
        norm="layernorm",
        attention_bias=True,
        o_proj_bias=True,
        mlp_bias=True,
        rotary=False,
        fused_qkv=False,
        fused_gate_up=False,
        dropout=float(config.get("hidden_dropout_prob", 0.1)),
        attention_dropout=float(config.get("attention_probs_dropout_prob", 0.1)),
    )


def _decoder_spec(config: dict[str, Any], *, name: str, model_type: str) -> ModelSpec:
    """Llama-style decoders (Llama, Mistral, Qwen, Gemma, Phi-3; MoE and MLA variants)."""
    h = int(config["hidden_size"])
    a = int(config["num_attention_heads"])
    kv = config.get("num_key_value_heads")
    head_dim = config.get("head_dim")
    act_name = str(config.get("hidden_activation") or config.get("hidden_act", "silu"))
    is_qwen2 = model_type.startswith("qwen2")
    is_phi3 = model_type == "phi3"
    is_gemma = model_type.startswith("gemma")
    attention_bias = bool(config.get("attention_bias", False))
    variant = {
        "qk_norm": model_type in ("qwen3", "qwen3_moe"),
        "norm": "gemma_rms" if is_gemma else "rms",
        **_variant_fields(config, model_type, name=name),
    }
    moe = _moe_fields(config, model_type)
    mla = _mla_fields(config)
    return ModelSpec(
        **moe,
        **mla,
        **variant,
        name=name,
        family="decoder",
        model_type=model_type,
        hidden_size=h,
        intermediate_size=int(config["intermediate_size"]),
        num_hidden_layers=int(config["num_hidden_layers"]),
        num_attention_heads=a,
        num_key_value_heads=int(kv) if kv else a,
        head_dim=int(head_dim) if head_dim else h // a,
        vocab_size=int(config["vocab_size"]),
        max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
        # GemmaConfig / Gemma2Config tie by default (their hub files omit the field).
        tie_word_embeddings=bool(config.get("tie_word_embeddings", is_gemma)),
        mlp_act=_act(act_name),
        gated_mlp=True,
        # Qwen2 always has q/k/v biases (modeling_qwen2.py: bias=True), no o_proj bias.
        attention_bias=attention_bias or is_qwen2,
        o_proj_bias=attention_bias and not is_qwen2,
        mlp_bias=bool(config.get("mlp_bias", False)),
        rotary=True,
        fused_qkv=is_phi3,
        fused_gate_up=is_phi3,
        dropout=0.0,
        attention_dropout=float(config.get("attention_dropout", 0.0) or 0.0),
        embed_scale=is_gemma,
        # modeling_{mistral,mixtral,phi3}.py build create_sliding_window_causal_mask whenever
        # config.sliding_window is set (Qwen2/Qwen3-MoE only with use_sliding_window; not read).
        sliding_window=int(config.get("sliding_window") or 0)
        if model_type in ("mistral", "mixtral", "phi3")
        else 0,
        rotary_cat=is_phi3,
    )


def _variant_fields(config: dict[str, Any], model_type: str, *, name: str) -> dict[str, Any]:
    """What sets Gemma 2, OLMo 2 and Granite apart from the Llama layout (ModelSpec fields).

    OLMo 2 (modeling_olmo2.py): no pre-norms; post_attention_layernorm and
    post_feedforward_layernorm norm the sublayers' outputs before the residual add, with
    Olmo2RMSNorm (weight applied in fp32, then cast: "olmo2_rms"); q_norm / k_norm are RMSNorms
    over the whole q / k projection width. Granite (modeling_granite.py): Llama with scalar
    multipliers (embedding_multiplier, residual_multiplier, attention_multiplier: no new saved
    tensors) and logits divided by logits_scaling.
    """
    if model_type == "gemma2":
        return _gemma2_fields(config, name=name)
    if model_type in ("gemma3", "gemma3_text"):
        return _gemma3_fields(config, name=name)
    if model_type == "olmo2":
        return {"norm": "olmo2_rms", "qk_norm": True, "qk_norm_layout": "full"}
    if model_type == "granite":
        return {"logits_scaling": _float_field(config, "logits_scaling", name=name)}
    return {}


def _gemma2_fields(config: dict[str, Any], *, name: str) -> dict[str, Any]:
    """Gemma 2 (modeling_gemma2.py): four RMSNorms per block (sandwich), logit soft-capping,
    query_pre_attn_scalar, sliding-window attention on every other layer (layer_types).

    Approximate activations (parameters are exact): the decoder formulas with Gemma's norms,
    gated GeLU-tanh MLP (torch gelu, as Gemma) and embedding scale; not modelled: the two extra
    (post) norms per block, the tanh soft-capping of attention scores (an eager-attention cost)
    and of the final logits (a [tokens, vocab] tanh output), and the sliding-window masks.
    """
    window = config.get("sliding_window")
    return {
        "num_norms_per_layer": 4,
        "attn_logit_softcapping": _float_field(config, "attn_logit_softcapping", name=name),
        "final_logit_softcapping": _float_field(config, "final_logit_softcapping", name=name),
        "query_pre_attn_scalar": _float_field(config, "query_pre_attn_scalar", name=name),
        "alternating_sliding_window": int(window) if window else 0,
    }


_GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
}
"""Gemma3TextConfig's defaults (transformers 5.24 configuration_gemma3.py), which the published
multimodal checkpoints rely on: their text_config lists only what differs (gemma-3-4b: hidden,
intermediate, layers, sliding window and rope scaling)."""


def _gemma3_text_config(config: dict[str, Any], *, name: str) -> dict[str, Any]:
    """The language model's config.json fields of a Gemma 3 checkpoint, with Gemma3TextConfig's
    defaults where a field is absent. A multimodal "gemma3" config (Gemma3ForConditionalGeneration)
    is read through its text_config; its SigLIP vision tower and multi-modal projector are not
    counted (parameters nor activations: a text-only model of the language part, as fine-tuning
    on text runs it). use_bidirectional_attention (EmbeddingGemma) is refused: not a causal LM."""
    if str(config.get("model_type")).lower() == "gemma3":
        text = config.get("text_config") or {}
        if not isinstance(text, dict):
            raise ValueError(f"model: {name}: text_config must be an object, got {text!r}")
        tie = config.get("tie_word_embeddings", True)  # Gemma3Config's own flag ties lm_head
        config = {**text, "model_type": "gemma3", "tie_word_embeddings": tie}
    if config.get("use_bidirectional_attention"):
        raise ValueError(
            f"model: {name}: use_bidirectional_attention (an encoder such as EmbeddingGemma) is "
            "not supported; Gemma 3 causal LMs are"
        )
    return {**_GEMMA3_TEXT_DEFAULTS, **config}


def _gemma3_fields(config: dict[str, Any], *, name: str) -> dict[str, Any]:
    """Gemma 3 (modeling_gemma3.py): Gemma 2's sandwich norms and query_pre_attn_scalar, plus
    q_norm / k_norm (one Gemma3RMSNorm over head_dim each, shared by the heads, before rotary),
    sliding-window attention on the layers layer_types marks sliding_attention (default: all but
    every sliding_window_pattern-th, 6), and two rotary embeddings (local base for the sliding
    layers, global with rope scaling): cos/sin tables for each layer type present.

    Gemma3Attention never passes attn_logit_softcapping to the attention function (the value is
    ignored, as transformers ignores it); final_logit_softcapping applies when set (null in every
    published config).
    """
    num_layers = int(config["num_hidden_layers"])
    num_sliding = _num_sliding_layers(config, num_layers, name=name)
    window = _integer(config.get("sliding_window")) or 0
    return {
        "num_norms_per_layer": 4,
        "qk_norm": True,
        "final_logit_softcapping": _float_field(config, "final_logit_softcapping", name=name),
        "query_pre_attn_scalar": _float_field(config, "query_pre_attn_scalar", name=name),
        "alternating_sliding_window": window if num_sliding else 0,
        "num_sliding_layers": num_sliding if window else 0,
        "num_rotary_tables": int(num_sliding > 0) + int(num_sliding < num_layers),
    }


def _num_sliding_layers(config: dict[str, Any], num_layers: int, *, name: str) -> int:
    """How many blocks layer_types marks "sliding_attention"; without layer_types, Gemma 3's
    rule: block i slides unless (i + 1) is a multiple of sliding_window_pattern (default 6)."""
    types = config.get("layer_types")
    if types is not None:
        allowed = {"sliding_attention", "full_attention"}
        if not isinstance(types, list) or len(types) != num_layers or set(types) - allowed:
            raise ValueError(
                f"model: {name}: layer_types must list 'sliding_attention' or 'full_attention' "
                f"for each of the {num_layers} layers, got {types!r}"
            )
        return types.count("sliding_attention")
    pattern = _integer(config.get("sliding_window_pattern", 6))
    if pattern is None or pattern < 1:
        raise ValueError(
            f"model: {name}: sliding_window_pattern must be an integer >= 1, "
            f"got {config.get('sliding_window_pattern')!r}"
        )
    return num_layers - num_layers // pattern


def _float_field(config: dict[str, Any], key: str, *, name: str) -> float:
    """A non-negative finite number field (None: 0), else a one-line ValueError."""
    value = config.get(key)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"model: {name}: {key} must be a non-negative number, got {value!r}")
    return float(value)


def _gpt_neox_spec(config: dict[str, Any], *, name: str) -> ModelSpec:
    """GPT-NeoX / Pythia (modeling_gpt_neox.py): embed_in, per block input_layernorm and
    post_attention_layernorm (LayerNorm with bias), attention.query_key_value (fused, bias) and
    attention.dense (bias: attention_bias, default true), mlp.dense_h_to_4h / dense_4h_to_h (GeLU,
    biases), final_layer_norm, embed_out (untied unless tie_word_embeddings). Rotary on
    rotary_pct (rope_parameters partial_rotary_factor) of head_dim, rebuilt with torch.cat.

    Approximate activations (parameters are exact): the decoder formulas with LayerNorm, a fused
    q/k/v whose output stays alive (as Phi-3), a non-gated GeLU MLP; the parallel residual is
    counted like the sequential block (it saves the same tensors), the rotary cos/sin tables at
    the full head_dim (they are rotary_pct of it).
    """
    h = int(config["hidden_size"])
    a = int(config["num_attention_heads"])
    rope = config.get("rope_parameters") or config.get("rope_scaling")
    partial = rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    if partial is None:
        partial = config.get("rotary_pct", 0.25)
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise ValueError(f"model: {name}: rotary_pct must be a number in (0, 1], got {partial!r}")
    bias = bool(config.get("attention_bias", True))
    return ModelSpec(
        name=name,
        family="decoder",
        model_type="gpt_neox",
        hidden_size=h,
        intermediate_size=int(config["intermediate_size"]),
        num_hidden_layers=int(config["num_hidden_layers"]),
        num_attention_heads=a,
        num_key_value_heads=a,
        head_dim=h // a,
        vocab_size=int(config["vocab_size"]),
        max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        mlp_act=_act(str(config.get("hidden_act", "gelu"))),
        gated_mlp=False,
        norm="layernorm",
        attention_bias=bias,
        o_proj_bias=bias,
        mlp_bias=True,
        rotary=True,
        fused_qkv=True,
        fused_gate_up=False,
        dropout=float(config.get("hidden_dropout", 0.0) or 0.0),
        attention_dropout=float(config.get("attention_dropout", 0.0) or 0.0),
        rotary_cat=True,
        parallel_residual=bool(config.get("use_parallel_residual", True)),
        partial_rotary_factor=float(partial),
    )


def _partial_rotary(config: dict[str, Any], *, name: str, default: float) -> float:
    """The rotated fraction of a head: rope_parameters / rope_scaling partial_rotary_factor
    (transformers 5), else the top-level partial_rotary_factor or rotary_pct, else `default`."""
    rope = config.get("rope_parameters") or config.get("rope_scaling")
    partial = rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    for key in ("partial_rotary_factor", "rotary_pct"):
        if partial is None:
            partial = config.get(key)
    partial = default if partial is None else partial
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise ValueError(
            f"model: {name}: partial_rotary_factor must be a number in (0, 1], got {partial!r}"
        )
    return float(partial)


def _stablelm_or_phi_spec(config: dict[str, Any], *, name: str, model_type: str) -> ModelSpec:
    """StableLM (modeling_stablelm.py) and Phi-1/2 (modeling_phi.py): LayerNorm with bias,
    q/k/v and o projections, partial rotary rebuilt with torch.cat, untied lm_head.

    StableLM: q/k/v bias if use_qkv_bias, o_proj without; gated SiLU MLP without biases;
    input_layernorm, plus post_attention_layernorm unless use_parallel_residual (then attention
    and MLP share the one norm); hidden_dropout after the MLP; qk_layernorm: a bias-free
    LayerNorm(head_dim) per head. Phi: every linear with a bias (lm_head included); one
    input_layernorm feeding attention and the fc1/fc2 GeLU MLP in parallel; resid_dropout on
    both outputs; qk_layernorm: one LayerNorm(head_dim) with bias shared by the heads.
    Ignores (activations): the q/k LayerNorms (no preset has them), Phi's embd_pdrop mask,
    StableLM's hidden_dropout is counted as two masks per block (it is one).
    """
    phi = model_type == "phi"
    h = int(config["hidden_size"])
    a = int(config["num_attention_heads"])
    kv = config.get("num_key_value_heads")
    parallel = phi or bool(config.get("use_parallel_residual", False))
    qkv_bias = phi or bool(config.get("use_qkv_bias", False))
    default_act = "gelu_new" if phi else "silu"
    drop = config.get("resid_pdrop" if phi else "hidden_dropout")
    return ModelSpec(
        name=name,
        family="decoder",
        model_type=model_type,
        hidden_size=h,
        intermediate_size=int(config["intermediate_size"]),
        num_hidden_layers=int(config["num_hidden_layers"]),
        num_attention_heads=a,
        # StableLmConfig defaults to 32 k/v heads, PhiConfig to num_attention_heads.
        num_key_value_heads=int(kv) if kv else (a if phi else 32),
        head_dim=h // a,
        vocab_size=int(config["vocab_size"]),
        max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        mlp_act=_act(str(config.get("hidden_act", default_act))),
        gated_mlp=not phi,
        norm="layernorm",
        attention_bias=qkv_bias,
        o_proj_bias=phi,
        mlp_bias=phi,
        rotary=True,
        fused_qkv=False,
        fused_gate_up=False,
        dropout=float(drop or 0.0),
        attention_dropout=float(config.get("attention_dropout", 0.0) or 0.0),
        rotary_cat=True,
        num_norms_per_layer=1 if parallel else 2,
        parallel_residual=parallel,
        partial_rotary_factor=_partial_rotary(config, name=name, default=0.5 if phi else 0.25),
        qk_norm=bool(config.get("qk_layernorm", False)),
        qk_norm_layout="head_ln" if phi else "per_head_ln",
        lm_head_bias=phi,
    )


def _falcon_spec(config: dict[str, Any], *, name: str) -> ModelSpec:
    """Falcon (modeling_falcon.py): word_embeddings, per block self_attention.query_key_value
    (fused; multi-query: q + one k/v head; new_decoder_architecture: num_kv_heads k/v heads;
    else 3h) and dense, mlp.dense_h_to_4h / dense_4h_to_h (ffn_hidden_size, default 4h, GeLU),
    every linear with `bias` (default false); LayerNorms with bias: one input_layernorm
    (parallel_attn, Falcon-7B), ln_attn + ln_mlp (num_ln_in_parallel_attn 2, the default of
    new_decoder_architecture, Falcon-40B) or input/post_attention (sequential); ln_f; lm_head
    tied unless tie_word_embeddings is false. Rotary unless alibi.

    Approximate activations (parameters are exact): the decoder formulas with LayerNorm, a fused
    q/k/v (as Phi-3) and a non-gated GeLU MLP; they count two norms per block (Falcon-7B has one)
    and k/v at num_kv_heads (new_decoder_architecture expands them to every head before the
    kernel); ALiBi's bias tensors (alibi: true) are not counted.
    """
    h = int(config["hidden_size"])
    a = int(config["num_attention_heads"])  # check_hf_fields: divides hidden_size
    new_arch = bool(config.get("new_decoder_architecture", False))
    parallel = bool(config.get("parallel_attn", True))
    if new_arch:
        kv = int(config.get("num_kv_heads") or a)
    elif bool(config.get("multi_query", True)):
        kv = 1
    else:
        kv = a
    num_ln = config.get("num_ln_in_parallel_attn")
    if num_ln is None and new_arch:
        num_ln = 2
    norms = 2 if (not parallel or num_ln == 2) else 1
    bias = bool(config.get("bias", False))
    ffn = config.get("ffn_hidden_size")
    return ModelSpec(
        name=name,
        family="decoder",
        model_type="falcon",
        hidden_size=h,
        intermediate_size=int(ffn) if ffn else 4 * h,
        num_hidden_layers=int(config["num_hidden_layers"]),
        num_attention_heads=a,
        num_key_value_heads=kv,
        head_dim=h // a,
        vocab_size=int(config["vocab_size"]),
        max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        mlp_act=_act(str(config.get("activation", "gelu"))),
        gated_mlp=False,
        norm="layernorm",
        attention_bias=bias,
        o_proj_bias=bias,
        mlp_bias=bias,
        rotary=not bool(config.get("alibi", False)),
        fused_qkv=True,
        fused_gate_up=False,
        dropout=float(config.get("hidden_dropout", 0.0) or 0.0),
        attention_dropout=float(config.get("attention_dropout", 0.0) or 0.0),
        num_norms_per_layer=norms,
        parallel_residual=parallel,
        falcon_kv_expanded=new_arch,
    )


def _moe_fields(config: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Mixture-of-experts fields in the names the HF families use (Mixtral num_local_experts,
    Qwen-MoE num_experts, DeepSeek n_routed_experts / n_shared_experts / first_k_dense_replace)."""
    num_experts = int(
        config.get("num_local_experts") or config.get("num_experts") or config.get(
            "n_routed_experts") or 0
    )  # fmt: skip
    if not num_experts:
        return {}
    top_k = config.get("num_experts_per_tok")
    if not top_k:
        raise ValueError("model: MoE config is missing required field(s): num_experts_per_tok")
    width = int(config.get("moe_intermediate_size") or config["intermediate_size"])
    shared = int(config.get("shared_expert_intermediate_size") or 0)
    if config.get("n_shared_experts"):
        shared = int(config["n_shared_experts"]) * width
    num_layers = int(config["num_hidden_layers"])
    dense = int(config.get("first_k_dense_replace") or 0)
    if config.get("mlp_only_layers"):
        dense = max(dense, len(config["mlp_only_layers"]))
    step = int(config.get("decoder_sparse_step") or 1)
    if step > 1:
        dense = max(dense, num_layers - num_layers // step)
    return {
        "num_experts": num_experts,
        "num_experts_per_tok": int(top_k),
        "moe_intermediate_size": width,
        "shared_expert_intermediate_size": shared,
        "shared_expert_gate": model_type == "qwen2_moe" and shared > 0,
        "router_fp32": model_type.startswith("deepseek"),
        "num_dense_layers": dense,
    }


def _mla_fields(config: dict[str, Any]) -> dict[str, Any]:
    """Multi-head latent attention (DeepSeek-V2/V3) fields, if the config has them."""
    if not config.get("kv_lora_rank"):
        return {}
    return {
        "q_lora_rank": int(config.get("q_lora_rank") or 0),
        "kv_lora_rank": int(config["kv_lora_rank"]),
        "qk_nope_head_dim": int(config["qk_nope_head_dim"]),
        "qk_rope_head_dim": int(config["qk_rope_head_dim"]),
        "v_head_dim": int(config["v_head_dim"]),
    }


def _act(name: str) -> MlpAct:
    name = name.lower()
    if name in _GELU_TANH_PYTHON:
        return "gelu_new"
    if name.startswith("gelu"):
        return "gelu"
    if name == "relu":
        return "relu"
    return "silu"
