"""ModelSpec: the architecture facts the formulas need, read from a Hugging Face config.json.

Field names follow Hugging Face (`hidden_size`, `num_attention_heads`, ...). The parameter
inventory (`param_tensors`) lists every parameter tensor with its shape and how tensor
parallelism splits it, so that parameter counts equal PyTorch's exactly and per-rank bytes can be
rounded per tensor, as the CUDA caching allocator does. The config.json readers are
engine/_model_readers.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

from ._vision import VisionSpec, vision_group_count, vision_param_tensors

if TYPE_CHECKING:
    from ._activation_profile import ActivationProfile

Family = Literal["decoder", "gpt2", "bert", "profile"]
NormKind = Literal["rms", "gemma_rms", "olmo2_rms", "layernorm"]
MlpAct = Literal["silu", "gelu", "gelu_new", "relu", "quick_gelu"]
QkNormLayout = Literal["head", "full", "head_ln", "per_head_ln"]
"""Where q/k normalisation sits: head = one RMSNorm(head_dim) shared by the heads (Qwen3); full =
one RMSNorm over the whole q / k projection width (OLMo 2); head_ln = one LayerNorm(head_dim) with
bias shared by the heads (Phi qk_layernorm); per_head_ln = a bias-free LayerNorm(head_dim) per
head (StableLM qk_layernorm)."""
TpSplit = Literal["col", "row", "vocab", "rep"]
Group = Literal[
    "embed", "layer", "mlp", "moe", "final", "head", "cross", "vision", "vision_block",
    "vision_global",
]  # fmt: skip
"""embed/final/head once; layer (attention + norms) in every block; mlp in dense blocks only;
moe (router, routed and shared experts) in mixture-of-experts blocks only; cross: what a
cross-attention block (Mllama) has beyond a self-attention one (q/k norms, two gates); vision
(once), vision_block, vision_global: a VLM's tower and projector (_vision.py)."""
BLOCK_GROUPS: tuple[Group, ...] = ("layer", "mlp", "moe")
"""ModelSpec parameter groups that live in the transformer blocks."""


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
    vision: VisionSpec | None = None
    """A vision-language model's tower and projector (_vision.py); None: a text model."""
    num_cross_attention_layers: int = 0
    """Mllama: blocks of the language model that are cross-attention blocks (text_config
    cross_attention_layers); counted in num_hidden_layers (their q/k/v/o, norms and MLP have a
    self-attention block's shapes; the extras are group "cross")."""
    num_extra_embedding_rows: int = 0
    """Mllama: embed_tokens has vocab_size + 8 rows (MllamaTextModel), lm_head vocab_size."""

    @property
    def rotary_dim(self) -> int:
        """Width of the rotary cos/sin tables: the rotated part of a head (partial rotary:
        int(head_dim * partial_rotary_factor), as transformers' rotary embeddings build them;
        MLA: qk_rope_head_dim)."""
        if self.is_mla:
            return self.qk_rope_head_dim
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def learned_positions(self) -> bool:
        """Absolute positions from a learned table of `max_position_embeddings` rows (GPT-2,
        BERT): a longer sequence has no row to look up (rotary positions can be scaled)."""
        return self.family in ("gpt2", "bert")

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
        if group == "layer":
            return self.num_hidden_layers
        if group == "mlp":
            return self.num_mlp_layers
        if group == "moe":
            return self.num_moe_layers
        if group == "cross":
            return self.num_cross_attention_layers
        if self.vision is not None:
            return vision_group_count(self.vision, group)
        return 1

    def param_tensors(self) -> tuple[ParamTensor, ...]:
        """Every parameter tensor, per layer for group "layer" (once each otherwise)."""
        return _param_tensors(self)

    @property
    def num_parameters(self) -> int:
        """Exact count, tied embeddings counted once (PyTorch's `sum(p.numel())`)."""
        return _num_parameters(self)

    def num_parameters_in(self, group: Group) -> int:
        """Parameters of one occurrence of a group (one block's attention, one MoE block...)."""
        return sum(p.numel for p in self.param_tensors() if p.group == group)

    @property
    def num_param_tensors(self) -> int:
        """How many parameter tensors (fused AdamW keeps one fp32 `step` per tensor on GPU)."""
        return sum(self.group_count(p.group) for p in self.param_tensors())


@lru_cache(maxsize=256)
def _num_parameters(m: ModelSpec) -> int:
    """ModelSpec.num_parameters, cached per spec as _param_tensors is."""
    return sum(p.numel * m.group_count(p.group) for p in m.param_tensors())


@lru_cache(maxsize=256)
def _param_tensors(m: ModelSpec) -> tuple[ParamTensor, ...]:
    """The inventory of `m` (a frozen, hashable spec: the tuple is cached per spec, as every
    estimate of one job asks for it about ten times; 48 us each for an 8B model)."""
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
    if m.num_cross_attention_layers:
        _add_cross_attention_extras(inv, m)
    if m.vision is not None:
        for name, shape, group in vision_param_tensors(m.vision):
            inv.add(name, shape, group, "rep")
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


def _add_cross_attention_extras(inv: _Inventory, m: ModelSpec) -> None:
    """MllamaCrossAttentionDecoderLayer beyond a self-attention block's tensors: cross_attn
    q_norm / k_norm (RMSNorm(head_dim)) and the tanh gates cross_attn_attn_gate /
    cross_attn_mlp_gate ([1] each). Source: transformers 5.24.0 modeling_mllama.py."""
    inv.add("cross_attn.q_norm.weight", (m.head_dim,), "cross", "rep")
    inv.add("cross_attn.k_norm.weight", (m.head_dim,), "cross", "rep")
    inv.add("cross_attn_attn_gate", (1,), "cross", "rep")
    inv.add("cross_attn_mlp_gate", (1,), "cross", "rep")


def _add_embeddings(inv: _Inventory, m: ModelSpec) -> None:
    rows = m.vocab_size + m.num_extra_embedding_rows
    inv.add("embed_tokens.weight", (rows, m.hidden_size), "embed", "vocab")
    if m.learned_positions:
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
