"""ModelSpec: the architecture facts the formulas need, read from a Hugging Face config.json.

Field names follow Hugging Face (`hidden_size`, `num_attention_heads`, ...). The parameter
inventory (`param_tensors`) lists every parameter tensor with its shape and how tensor
parallelism splits it, so that parameter counts equal PyTorch's exactly and per-rank bytes can be
rounded per tensor, as the CUDA caching allocator does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Family = Literal["decoder", "gpt2", "bert"]
NormKind = Literal["rms", "gemma_rms", "layernorm"]
MlpAct = Literal["silu", "gelu", "gelu_new", "relu"]
TpSplit = Literal["col", "row", "vocab", "rep"]
Group = Literal["embed", "layer", "final", "head"]

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
    no_weight_decay_1d: bool = False

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A transformer's architecture, in Hugging Face field names."""

    name: str
    """Preset name or the config file's path."""
    family: Family
    """decoder: Llama-style (Llama, Mistral, Qwen2, Gemma, Phi-3); gpt2: GPT-2/3 (Conv1D, learned
    positions, LayerNorm with bias); bert: encoder-only BERT with an MLM head."""
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

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def param_tensors(self) -> tuple[ParamTensor, ...]:
        """Every parameter tensor, per layer for group "layer" (once each otherwise)."""
        return _param_tensors(self)

    @property
    def num_parameters(self) -> int:
        """Exact count, tied embeddings counted once (PyTorch's `sum(p.numel())`)."""
        return sum(
            p.numel * (self.num_hidden_layers if p.group == "layer" else 1)
            for p in self.param_tensors()
        )

    def num_parameters_in(self, group: Group) -> int:
        return sum(p.numel for p in self.param_tensors() if p.group == group)

    @property
    def num_param_tensors(self) -> int:
        """How many parameter tensors (fused AdamW keeps one fp32 `step` per tensor on GPU)."""
        per_layer = sum(1 for p in self.param_tensors() if p.group == "layer")
        other = sum(1 for p in self.param_tensors() if p.group != "layer")
        return per_layer * self.num_hidden_layers + other


def _param_tensors(m: ModelSpec) -> tuple[ParamTensor, ...]:
    h, f, v = m.hidden_size, m.intermediate_size, m.vocab_size
    qd, kvd = m.q_dim, m.kv_dim
    out: list[ParamTensor] = []

    def add(name: str, shape: tuple[int, ...], group: Group, split: TpSplit) -> None:
        out.append(ParamTensor(name=name, shape=shape, group=group, tp_split=split))

    norm_has_bias = m.norm == "layernorm"

    def add_norm(name: str, group: Group) -> None:
        add(f"{name}.weight", (h,), group, "rep")
        if norm_has_bias:
            add(f"{name}.bias", (h,), group, "rep")

    # Embeddings.
    add("embed_tokens.weight", (v, h), "embed", "vocab")
    if m.family in ("gpt2", "bert"):
        add("position_embeddings.weight", (m.max_position_embeddings, h), "embed", "rep")
    if m.family == "bert":
        add("token_type_embeddings.weight", (m.type_vocab_size, h), "embed", "rep")
        add_norm("embeddings.LayerNorm", "embed")

    # One transformer block.
    if m.family == "decoder":
        add_norm("input_layernorm", "layer")
    if m.family == "gpt2":
        add_norm("ln_1", "layer")
    if m.fused_qkv:
        add("qkv_proj.weight", (qd + 2 * kvd, h), "layer", "col")
        if m.attention_bias:
            add("qkv_proj.bias", (qd + 2 * kvd,), "layer", "col")
    else:
        for proj, dim in (("q_proj", qd), ("k_proj", kvd), ("v_proj", kvd)):
            add(f"{proj}.weight", (dim, h), "layer", "col")
            if m.attention_bias:
                add(f"{proj}.bias", (dim,), "layer", "col")
    add("o_proj.weight", (h, qd), "layer", "row")
    if m.o_proj_bias:
        add("o_proj.bias", (h,), "layer", "rep")
    if m.family == "bert":
        add_norm("attention.output.LayerNorm", "layer")
    if m.family == "decoder":
        add_norm("post_attention_layernorm", "layer")
    if m.family == "gpt2":
        add_norm("ln_2", "layer")
    if m.gated_mlp:
        if m.fused_gate_up:
            add("gate_up_proj.weight", (2 * f, h), "layer", "col")
        else:
            add("gate_proj.weight", (f, h), "layer", "col")
            add("up_proj.weight", (f, h), "layer", "col")
            if m.mlp_bias:
                add("gate_proj.bias", (f,), "layer", "col")
                add("up_proj.bias", (f,), "layer", "col")
    else:
        add("fc_in.weight", (f, h), "layer", "col")
        if m.mlp_bias:
            add("fc_in.bias", (f,), "layer", "col")
    add("fc_out.weight", (h, f), "layer", "row")
    if m.mlp_bias:
        add("fc_out.bias", (h,), "layer", "rep")
    if m.family == "bert":
        add_norm("output.LayerNorm", "layer")

    # Final norm and head.
    if m.family == "decoder":
        add_norm("norm", "final")
    if m.family == "gpt2":
        add_norm("ln_f", "final")
    if m.family == "bert":
        # BertForMaskedLM's cls.predictions: transform dense + LayerNorm, decoder bias.
        add("cls.transform.dense.weight", (h, h), "head", "rep")
        add("cls.transform.dense.bias", (h,), "head", "rep")
        add_norm("cls.transform.LayerNorm", "head")
        add("cls.decoder.bias", (v,), "head", "vocab")
    if not m.tie_word_embeddings:
        add("lm_head.weight", (v, h), "head", "vocab")
    return tuple(out)


_REQUIRED = {
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


def _family_of(config: dict[str, Any]) -> Family:
    model_type = str(config.get("model_type", "")).lower()
    if model_type in ("gpt2", "gpt3", "openai-gpt") or "n_embd" in config:
        return "gpt2"
    if model_type in ("bert", "roberta", "distilbert", "electra") or "type_vocab_size" in config:
        return "bert"
    return "decoder"


def model_from_hf_config(config: dict[str, Any], *, name: str) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config.json's fields.

    Llama-style names (`hidden_size`, ...) and GPT-2 names (`n_embd`, ...) are read; an unknown
    `model_type` with the standard fields is read as a Llama-style decoder. Missing fields raise
    one ValueError naming all of them.
    """
    family = _family_of(config)
    missing = [k for k in _REQUIRED[family] if config.get(k) is None]
    if missing:
        raise ValueError(f"{name}: config is missing required field(s): {', '.join(missing)}")
    model_type = str(config.get("model_type", family))
    if family == "gpt2":
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
    h = int(config["hidden_size"])
    a = int(config["num_attention_heads"])
    kv = config.get("num_key_value_heads")
    head_dim = config.get("head_dim")
    act_name = str(config.get("hidden_activation") or config.get("hidden_act", "silu"))
    if family == "bert":
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
    is_qwen2 = model_type.startswith("qwen2")
    is_phi3 = model_type == "phi3"
    is_gemma = model_type.startswith("gemma")
    attention_bias = bool(config.get("attention_bias", False))
    return ModelSpec(
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
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        mlp_act=_act(act_name),
        gated_mlp=True,
        norm="gemma_rms" if is_gemma else "rms",
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
    )


def _act(name: str) -> MlpAct:
    name = name.lower()
    if name in _GELU_TANH_PYTHON:
        return "gelu_new"
    if name.startswith("gelu"):
        return "gelu"
    if name == "relu":
        return "relu"
    return "silu"
