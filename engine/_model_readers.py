"""Hugging Face config.json -> ModelSpec: which reader a model_type takes, the field checks,
and the readers.

Every reader reads the same dozen layout fields (sizes, heads, vocabulary, positions, tying,
activation, dropouts) under the keys its family's config.json names them by. One table
(`LAYOUTS`: per reader, where it keeps each field, its defaults and the ModelSpec fields the
family fixes) and one generic reader (`_common_fields`) read them; a family's own function
(`_OWN_FIELDS`) adds only what the family does differently (Gemma's norms, MoE, MLA, Falcon's
k/v heads, ...).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ._model import Family, MlpAct, ModelSpec
from ._vision import VLM_MODEL_TYPES, is_vlm_config, read_vision_spec

_GELU_TANH_PYTHON = {"gelu_new", "gelu_fast", "gelu_python"}
"""Activations that transformers implements as a Python tanh formula (several saved tensors)."""

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
    "vision-language": VLM_MODEL_TYPES,
}
"""The config.json `model_type`s each family reads; any other is an error (never a guess)."""

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
    if is_vlm_config(config):  # before the decoders: a gemma3 config with its SigLIP tower
        return "vlm"
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
    if reader == "vlm":
        return _vlm_spec(config, name=name)
    if family is not None and not isinstance(config.get("model_type"), str):
        config = {**config, "model_type": family.replace("-", "_")}
    if reader == "falcon" and config.get("hidden_size") is None and "n_embed" in config:
        config = {**config, "hidden_size": config["n_embed"]}  # FalconConfig's old name
    if reader == "decoder" and str(config.get("model_type")).lower() in ("gemma3", "gemma3_text"):
        config = _gemma3_text_config(config, name=name)
    missing = [k for k in LAYOUTS[reader].required if config.get(k) is None]
    if missing:
        forced = f" (read as --family {family})" if family is not None else ""
        raise ValueError(
            f"model: {name}: config is missing required field(s): {', '.join(missing)}{forced}"
        )
    check_hf_fields(config, name=name)
    return _read(config, reader, name=name)


_VLM_TEXT_MODEL_TYPE = {"qwen2_vl": "qwen2", "qwen2_5_vl": "qwen2", "mllama": "llama"}
"""The decoder reader's model_type for a VLM's language model: Qwen2-VL / 2.5-VL's is Qwen2's
layout (q/k/v biases; M-RoPE changes the rotary positions, not the tensors), Mllama's is Llama's
plus its cross-attention blocks."""
LLAMA_CONFIG_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
}
"""LlamaConfig's defaults, which a LLaVA config.json's text_config relies on (llava-1.5-7b-hf
lists only vocab_size 32064 and the positions). Source: transformers 5.24.0
configuration_llama.py."""
MLLAMA_EXTRA_EMBEDDING_ROWS = 8
"""MllamaTextModel: nn.Embedding(vocab_size + 8, hidden_size). Source: transformers 5.24.0
modeling_mllama.py."""


def _vlm_spec(config: dict[str, Any], *, name: str) -> ModelSpec:
    """A vision-language model's spec: its language model read by the decoder reader, plus the
    vision tower (_vision.read_vision_spec).

    Qwen2-VL / Qwen2.5-VL (Qwen2VLForConditionalGeneration): the language model's fields are the
    top-level ones (the Hub files) or text_config's (transformers 5 re-saves), text_config
    winning; tie_word_embeddings is the top-level flag. Mllama (MllamaForConditionalGeneration):
    text_config holds them, with cross_attention_layers; lm_head is never tied (embed_tokens has
    8 more rows). LLaVA (LlavaForConditionalGeneration): text_config (LlamaConfig's defaults
    where a Llama one omits a field), tied as the top-level flag says. Gemma 3
    (Gemma3ForConditionalGeneration): the Gemma 3 reader's language model of the whole config.
    """
    model_type = str(config["model_type"]).lower()
    fields, num_cross = _vlm_language_fields(config, model_type=model_type, name=name)
    language = model_from_hf_config(fields, name=name)
    vision = read_vision_spec(
        config, model_type=model_type, text_hidden_size=language.hidden_size, name=name
    )
    return dataclasses.replace(
        language,
        model_type=model_type,
        vision=vision,
        num_cross_attention_layers=num_cross,
        num_extra_embedding_rows=MLLAMA_EXTRA_EMBEDDING_ROWS if model_type == "mllama" else 0,
    )


def _vlm_language_fields(
    config: dict[str, Any], *, model_type: str, name: str
) -> tuple[dict[str, Any], int]:
    """(the language model's config.json fields, its cross-attention blocks) of a VLM config
    (_vlm_spec says where each family keeps them)."""
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ValueError(f"model: {name}: text_config must be an object, got {text!r}")
    if model_type == "mllama":
        if text is None:
            raise ValueError(f"model: {name}: config is missing required field(s): text_config")
        fields = {**text, "tie_word_embeddings": False}
        cross = text.get("cross_attention_layers")
        layers = text.get("num_hidden_layers")
        if (
            not isinstance(cross, list)
            or not isinstance(layers, int)
            or any(isinstance(i, bool) or not isinstance(i, int) for i in cross)
            or not all(0 <= i < layers for i in cross)
        ):
            raise ValueError(
                f"model: {name}: text_config.cross_attention_layers must list layer indexes in "
                f"[0, num_hidden_layers), got {cross!r}"
            )
        num_cross = len(set(cross))
    elif model_type == "llava":
        # LlavaConfig: text_config (default LlamaConfig) holds the language model; lm_head
        # ties as tie_word_embeddings says (LlavaConfig's own flag, default False).
        fields = {"model_type": "llama", **(text or {})}
        if str(fields["model_type"]).lower() == "llama":  # Hub files list what differs
            fields = {**LLAMA_CONFIG_DEFAULTS, **fields}
        fields["tie_word_embeddings"] = bool(config.get("tie_word_embeddings", False))
        num_cross = 0
    elif model_type == "gemma3":
        # The Gemma 3 reader takes the multimodal config whole (its text_config with
        # Gemma3TextConfig's defaults); the tower is added below.
        fields = {k: v for k, v in config.items() if k != "vision_config"}
        num_cross = 0
    else:
        top = {k: v for k, v in config.items() if k not in ("text_config", "vision_config")}
        fields = {**top, **(text or {})}
        if "tie_word_embeddings" in config:
            fields["tie_word_embeddings"] = config["tie_word_embeddings"]
        num_cross = 0
    if model_type in _VLM_TEXT_MODEL_TYPE:
        fields["model_type"] = _VLM_TEXT_MODEL_TYPE[model_type]
    if str(fields.get("model_type")).lower() in VLM_MODEL_TYPES and model_type != "gemma3":
        raise ValueError(
            f"model: {name}: text_config.model_type {fields['model_type']!r} is a "
            "vision-language model; a language model's is expected"
        )
    return fields, num_cross


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Where one reader's config.json keeps the fields every ModelSpec has, their defaults, and
    the ModelSpec fields the family fixes (the same for every model of it)."""

    family: Family
    """ModelSpec.family."""
    model_type: str | None = None
    """ModelSpec.model_type; None: the config's (lowercased)."""
    hidden_size: str = "hidden_size"
    num_hidden_layers: str = "num_hidden_layers"
    num_attention_heads: str = "num_attention_heads"
    intermediate_size: str = "intermediate_size"
    """The MLP width's key; absent (where not required) or 0: 4 x hidden_size."""
    intermediate_required: bool = True
    """Whether the MLP width's key is a required field (`required`)."""
    num_key_value_heads: str | None = None
    """The k/v heads' key (None: one k/v head per query head, unless the family's own fields
    set them: Falcon); absent or 0: `kv_heads_default`."""
    kv_heads_default: int | None = None
    """k/v heads where the key is absent (None: num_attention_heads)."""
    head_dim: str | None = None
    """The head width's key (None, absent or 0: hidden_size / num_attention_heads)."""
    max_position_embeddings: tuple[str, ...] = ("max_position_embeddings",)
    """Keys tried in order (the first present is read), else `max_positions_default`."""
    max_positions_default: int
    tie_word_embeddings: bool | None
    """tie_word_embeddings's default; None: the family's own fields decide."""
    act: tuple[str, ...]
    """The activation's keys: the first set one, else the last one's value or `act_default`."""
    act_default: str
    dropout: tuple[str, float] | None
    """(key, default) of the residual dropout; None: fixed (`fixed`)."""
    attention_dropout: tuple[str, float] = ("attention_dropout", 0.0)
    fixed: Mapping[str, Any]
    """ModelSpec fields the family fixes."""

    @property
    def required(self) -> tuple[str, ...]:
        """The keys a config.json must set (missing: one ValueError naming them all)."""
        width = (self.intermediate_size,) if self.intermediate_required else ()
        return (
            self.hidden_size,
            *width,
            self.num_hidden_layers,
            self.num_attention_heads,
            "vocab_size",
        )


_LAYERNORM_BLOCK = {"gated_mlp": False, "norm": "layernorm", "fused_gate_up": False}
"""A block with LayerNorm and a plain (not gated) MLP in one linear per direction."""
_BIASED_LEARNED = {
    **_LAYERNORM_BLOCK,
    "attention_bias": True,
    "o_proj_bias": True,
    "mlp_bias": True,
    "rotary": False,
}
"""GPT-2 and BERT: every linear with a bias, learned absolute positions."""
_STABLELM_OR_PHI = {
    "norm": "layernorm",
    "rotary": True,
    "fused_qkv": False,
    "fused_gate_up": False,
    "rotary_cat": True,
}
_DECODER: dict[str, Any] = {
    "max_positions_default": 2048,
    "tie_word_embeddings": False,
    "act": ("hidden_act",),
}
"""The own-layout decoders' (GPT-NeoX, StableLM, Phi) defaults: 2,048 positions, untied."""

LAYOUTS: dict[str, Layout] = {
    # GPT-2/3: n_embd, n_layer, n_head; Conv1D (fused q/k/v), learned positions.
    "gpt2": Layout(
        family="gpt2",
        hidden_size="n_embd",
        num_hidden_layers="n_layer",
        num_attention_heads="n_head",
        intermediate_size="n_inner",
        intermediate_required=False,
        max_position_embeddings=("n_positions", "n_ctx"),
        max_positions_default=1024,
        tie_word_embeddings=True,
        act=("activation_function",),
        act_default="gelu_new",
        dropout=("resid_pdrop", 0.1),
        attention_dropout=("attn_pdrop", 0.1),
        fixed={**_BIASED_LEARNED, "fused_qkv": True},
    ),
    # BERT-style encoders with an MLM head (token types: _bert_fields).
    "bert": Layout(
        family="bert",
        max_positions_default=512,
        tie_word_embeddings=True,
        act=("hidden_activation", "hidden_act"),
        act_default="silu",
        dropout=("hidden_dropout_prob", 0.1),
        attention_dropout=("attention_probs_dropout_prob", 0.1),
        fixed={**_BIASED_LEARNED, "fused_qkv": False},
    ),
    "decoder": Layout(
        family="decoder",
        num_key_value_heads="num_key_value_heads",
        head_dim="head_dim",
        max_positions_default=4096,
        tie_word_embeddings=None,  # Gemma ties by default (_decoder_fields)
        act=("hidden_activation", "hidden_act"),
        act_default="silu",
        dropout=None,
        fixed={"gated_mlp": True, "rotary": True, "dropout": 0.0},
    ),
    "gpt_neox": Layout(
        family="decoder",
        model_type="gpt_neox",
        **_DECODER,
        act_default="gelu",
        dropout=("hidden_dropout", 0.0),
        fixed={
            **_LAYERNORM_BLOCK,
            "mlp_bias": True,
            "rotary": True,
            "fused_qkv": True,
            "rotary_cat": True,
        },
    ),
    "stablelm": Layout(
        family="decoder",
        model_type="stablelm",
        num_key_value_heads="num_key_value_heads",
        kv_heads_default=32,  # StableLmConfig's default
        **_DECODER,
        act_default="silu",
        dropout=("hidden_dropout", 0.0),
        fixed={
            **_STABLELM_OR_PHI,
            "gated_mlp": True,
            "o_proj_bias": False,
            "mlp_bias": False,
            "qk_norm_layout": "per_head_ln",
            "lm_head_bias": False,
        },
    ),
    "phi": Layout(
        family="decoder",
        model_type="phi",
        num_key_value_heads="num_key_value_heads",
        **_DECODER,
        act_default="gelu_new",
        dropout=("resid_pdrop", 0.0),
        fixed={
            **_STABLELM_OR_PHI,
            "gated_mlp": False,
            "o_proj_bias": True,
            "mlp_bias": True,
            "qk_norm_layout": "head_ln",
            "lm_head_bias": True,
        },
    ),
    # k/v heads, biases, norms, rotary (unless ALiBi): _falcon_fields.
    "falcon": Layout(
        family="decoder",
        model_type="falcon",
        intermediate_size="ffn_hidden_size",
        intermediate_required=False,
        max_positions_default=2048,
        tie_word_embeddings=True,
        act=("activation",),
        act_default="gelu",
        dropout=("hidden_dropout", 0.0),
        fixed={**_LAYERNORM_BLOCK, "fused_qkv": True},
    ),
}
"""Per reader (`_reader_of`): where its config.json keeps the common fields and what it fixes."""


def _common_fields(
    config: dict[str, Any], layout: Layout, *, name: str, model_type: str
) -> dict[str, Any]:
    """The ModelSpec fields every reader reads, from `layout`'s keys and defaults (`model_type`:
    the spec's, `_read`)."""
    h = int(config[layout.hidden_size])
    a = int(config[layout.num_attention_heads])
    width = config.get(layout.intermediate_size)
    kv = config.get(layout.num_key_value_heads) if layout.num_key_value_heads else None
    head_dim = config.get(layout.head_dim) if layout.head_dim else None
    positions = _first_present(config, layout.max_position_embeddings, layout.max_positions_default)
    fields = {
        "name": name,
        "family": layout.family,
        "model_type": model_type,
        "hidden_size": h,
        "intermediate_size": int(width) if width else 4 * h,
        "num_hidden_layers": int(config[layout.num_hidden_layers]),
        "num_attention_heads": a,
        "num_key_value_heads": int(kv) if kv else (layout.kv_heads_default or a),
        "head_dim": int(head_dim) if head_dim else h // a,
        "vocab_size": int(config["vocab_size"]),
        "max_position_embeddings": int(positions),
        "mlp_act": _act(_act_name(config, layout.act, layout.act_default)),
        "attention_dropout": _dropout(config, *layout.attention_dropout),
        **layout.fixed,
    }
    if layout.tie_word_embeddings is not None:
        tie = config.get("tie_word_embeddings", layout.tie_word_embeddings)
        fields["tie_word_embeddings"] = bool(tie)
    if layout.dropout is not None:
        fields["dropout"] = _dropout(config, *layout.dropout)
    return fields


def _first_present(config: dict[str, Any], keys: tuple[str, ...], default: Any) -> Any:
    """The value of the first of `keys` the config has (even null), else `default`."""
    for key in keys:
        if key in config:
            return config[key]
    return default


def _act_name(config: dict[str, Any], keys: tuple[str, ...], default: str) -> str:
    """The activation's name: the first of `keys` set (Gemma's hidden_activation before
    hidden_act), else the last one's value (even null: "None"), else `default`."""
    value = None
    for key in keys[:-1]:
        value = value or config.get(key)
    return str(value or config.get(keys[-1], default))


def _dropout(config: dict[str, Any], key: str, default: float) -> float:
    """A dropout probability (check_hf_fields: a number in [0, 1) or null). A null reads as 0
    where the family's default is 0; GPT-2's and BERT's default of 0.1 takes a number."""
    value = config.get(key, default)
    return float(value or 0.0) if default == 0 else float(value)


def _read(config: dict[str, Any], reader: str, *, name: str) -> ModelSpec:
    """The spec: the family's own fields (computed first: their checks raise first), then the
    table's common ones (`LAYOUTS`); the family's own value wins where both set a field."""
    layout = LAYOUTS[reader]
    model_type = layout.model_type or str(config["model_type"]).lower()
    own = _OWN_FIELDS[reader](config, name=name, model_type=model_type)
    common = _common_fields(config, layout, name=name, model_type=model_type)
    return ModelSpec(**{**common, **own})


def _bert_fields(config: dict[str, Any], *, name: str, model_type: str) -> dict[str, Any]:
    """BERT-style encoders with an MLM head: token-type embeddings."""
    return {"type_vocab_size": int(config.get("type_vocab_size", 2))}


def _decoder_fields(config: dict[str, Any], *, name: str, model_type: str) -> dict[str, Any]:
    """Llama-style decoders (Llama, Mistral, Qwen, Gemma, Phi-3; MoE and MLA variants): what
    their model_type changes in the Llama layout."""
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
    return {
        **moe,
        **mla,
        **variant,
        # GemmaConfig / Gemma2Config tie by default (their hub files omit the field).
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", is_gemma)),
        # Qwen2 always has q/k/v biases (modeling_qwen2.py: bias=True), no o_proj bias.
        "attention_bias": attention_bias or is_qwen2,
        "o_proj_bias": attention_bias and not is_qwen2,
        "mlp_bias": bool(config.get("mlp_bias", False)),
        "fused_qkv": is_phi3,
        "fused_gate_up": is_phi3,
        "embed_scale": is_gemma,
        # modeling_{mistral,mixtral,phi3}.py build create_sliding_window_causal_mask whenever
        # config.sliding_window is set (Qwen2/Qwen3-MoE only with use_sliding_window; not read).
        "sliding_window": int(config.get("sliding_window") or 0)
        if model_type in ("mistral", "mixtral", "phi3")
        else 0,
        "rotary_cat": is_phi3,
    }


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


def _gpt_neox_fields(config: dict[str, Any], *, name: str, model_type: str) -> dict[str, Any]:
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
    rope = config.get("rope_parameters") or config.get("rope_scaling")
    partial = rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    if partial is None:
        partial = config.get("rotary_pct", 0.25)
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise ValueError(f"model: {name}: rotary_pct must be a number in (0, 1], got {partial!r}")
    bias = bool(config.get("attention_bias", True))
    return {
        "attention_bias": bias,
        "o_proj_bias": bias,
        "parallel_residual": bool(config.get("use_parallel_residual", True)),
        "partial_rotary_factor": float(partial),
    }


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


def _stablelm_or_phi_fields(
    config: dict[str, Any], *, name: str, model_type: str
) -> dict[str, Any]:
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
    parallel = phi or bool(config.get("use_parallel_residual", False))
    return {
        "attention_bias": phi or bool(config.get("use_qkv_bias", False)),
        "num_norms_per_layer": 1 if parallel else 2,
        "parallel_residual": parallel,
        "partial_rotary_factor": _partial_rotary(config, name=name, default=0.5 if phi else 0.25),
        "qk_norm": bool(config.get("qk_layernorm", False)),
    }


def _falcon_fields(config: dict[str, Any], *, name: str, model_type: str) -> dict[str, Any]:
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
    bias = bool(config.get("bias", False))
    return {
        "num_key_value_heads": kv,
        "attention_bias": bias,
        "o_proj_bias": bias,
        "mlp_bias": bias,
        "rotary": not bool(config.get("alibi", False)),
        "num_norms_per_layer": 2 if (not parallel or num_ln == 2) else 1,
        "parallel_residual": parallel,
        "falcon_kv_expanded": new_arch,
    }


def _no_fields(config: dict[str, Any], *, name: str, model_type: str) -> dict[str, Any]:
    """GPT-2/3: the table says it all."""
    return {}


OwnFields = Callable[..., dict[str, Any]]
"""A family's own ModelSpec fields: (config, *, name, model_type) -> fields."""
_OWN_FIELDS: dict[str, OwnFields] = {
    "gpt2": _no_fields,
    "bert": _bert_fields,
    "decoder": _decoder_fields,
    "gpt_neox": _gpt_neox_fields,
    "stablelm": _stablelm_or_phi_fields,
    "phi": _stablelm_or_phi_fields,
    "falcon": _falcon_fields,
}
"""Per reader: what its family does differently from the table (`LAYOUTS`)."""


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
    if int(top_k) > num_experts:  # a token cannot be routed to more experts than there are
        raise ValueError(
            f"model: num_experts_per_tok: {int(top_k)} experts per token exceed the model's "
            f"{num_experts} experts (allowed: 1 to {num_experts})"
        )
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
