"""Regenerate tests/data/param_counts.json from the built-in presets.

For every catalog/presets/<name>.json this builds the model with Hugging Face
transformers on PyTorch's meta device (no weights are allocated, so even the
405B preset costs no memory) and records exactly what PyTorch reports:

    num_parameters = sum(p.numel() for p in model.parameters())

``model.parameters()`` yields each Parameter once, so tied input/output
embeddings are counted once.  Alongside the total the file records the
embedding, lm_head and first-layer counts and the shape of every parameter of
the first layer, so the analytic engine can be checked term by term.

This script needs torch and transformers; the test suite only reads the JSON
it writes.  Run it after changing a preset:

    pip install torch==2.13.0 transformers
    python tests/data/make_param_counts.py

It exits non-zero if a known published count (ANCHORS) is not reproduced,
which means a preset field is wrong.

Mixture-of-experts presets (any layer whose ``mlp`` holds ``experts``) get a
different entry (see ``describe_moe``): their layers are not all alike
(DeepSeek's first ``first_k_dense_replace`` layers are dense), so instead of a
single ``per_layer`` the entry records ``num_dense_layers``/``num_moe_layers``,
``per_layer_dense`` and ``per_layer_moe``, and splits one MoE layer into
attention, router, routed experts, shared experts and norms with every
parameter shape.  Buffers (e.g. DeepSeek-V3's router
``e_score_correction_bias``) are listed but not counted, exactly as
``model.parameters()`` does not count them; a multi-token-prediction module
that the checkpoint carries but transformers does not build is noted, not
counted.
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    BertForMaskedLM,
    BertModel,
    GPT2LMHeadModel,
    RobertaForMaskedLM,
    RobertaModel,
)

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "catalog" / "presets"
OUT = Path(__file__).resolve().parent / "param_counts.json"

# Published totals that the presets must reproduce exactly.
ANCHORS = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "llama-2-7b": 6_738_415_616,
    "llama-3-8b": 8_030_261_248,
    "llama-3.2-1b": 1_235_814_400,
    "mistral-7b": 7_241_732_096,
    "tinyllama-1.1b": 1_100_048_384,
    "mixtral-8x7b": 46_702_792_704,
    # Hub safetensors totals (all tensors of the checkpoint; these two store no
    # buffers and no extra modules, so the total is the parameter count), as
    # recorded for Qwen/Qwen3-30B-A3B @ad44e777 and deepseek-ai/DeepSeek-V2-Lite
    # @604d5664 in a public model inventory.
    "qwen3-30b-a3b": 30_532_122_624,
    "deepseek-v2-lite": 15_706_484_224,
    # Published totals of the families added for issue 14 (model cards, the Pythia paper).
    "pythia-2.8b": 2_775_208_960,
    "pythia-6.9b": 6_857_302_016,
    "gemma-2-2b": 2_614_341_888,
    "gemma-2-9b": 9_241_705_984,
    "phi-2": 2_779_683_840,
    # keras-hub gemma3_presets.py (gemma3_1b, gemma3_{4b,12b,27b}_text) counts the text models
    # with 262,144 embedding rows; the HF checkpoints' text_config has 262,208 (64 x hidden more).
    "gemma-3-1b": 999_885_952,
    "gemma-3-4b": 3_880_099_328 + 64 * 2560,
    "gemma-3-12b": 11_765_788_416 + 64 * 3840,
    "gemma-3-27b": 27_009_002_240 + 64 * 5376,
    "stablelm-2-1.6b": 1_644_515_328,
}

METHOD = (
    "config = AutoConfig.for_model(model_type, **preset_fields) (keys starting with '_' dropped); "
    "model built under `with torch.device('meta'):` with AutoModelForCausalLM.from_config "
    "(GPT2LMHeadModel(config) for model_type gpt2; "
    "BertForMaskedLM(config) and BertModel(config) for bert, RobertaForMaskedLM / RobertaModel "
    "for roberta); "
    "num_parameters = sum(p.numel() for p in model.parameters()), so tied embeddings count once. "
    "embedding = all nn.Embedding weights (token + learned position + token-type); "
    "lm_head = parameters of the output head that are not shared with the input embedding "
    "(0 when tied; for BertForMaskedLM the whole cls head less the tied decoder weight); "
    "per_layer = first transformer block; other = num_parameters - embedding - lm_head - "
    "num_layers * per_layer (final norm, pooler, ...)."
)

METHOD_MOE = (
    "Mixture-of-experts presets (a layer's mlp holds `experts`): same build and total; a layer is "
    "'moe' if its mlp holds experts, else 'dense'; per_layer_dense / per_layer_moe = parameters of "
    "one such layer (all layers of a kind are checked to be identical; null when there is none); "
    "other = num_parameters - embedding - lm_head - num_dense_layers * per_layer_dense - "
    "num_moe_layers * per_layer_moe (the final norm). moe_layer_split groups one MoE layer's "
    "parameters by name: attention = self_attn.* (projections and the norms inside attention, "
    "e.g. q_norm/k_norm, q_a_layernorm/kv_a_layernorm), router = mlp.gate.*, experts = "
    "mlp.experts.* (routed experts; transformers stores them fused: gate_up_proj [E, 2*I, H] and "
    "down_proj [E, H, I]), shared_experts = mlp.shared_expert*.* (incl. Qwen2-MoE's "
    "shared_expert_gate), norms = the layer's own RMSNorms. Buffers are listed, never counted."
)


METHOD_VLM = (
    "Vision-language presets (model_type qwen2_vl, qwen2_5_vl, mllama, llava): config = "
    "AutoConfig.for_model(model_type, **preset_fields) (nested text_config / vision_config as the "
    "file has them), built on the meta device with AutoModelForImageTextToText.from_config; same "
    "total. The entry splits it by top-level module: vision_tower = model.visual (Qwen: patch "
    "embedding, blocks, merger), model.vision_model (Mllama) or model.vision_tower (LLaVA), "
    "projector = model.multi_modal_projector (Mllama, LLaVA; Qwen's merger is inside "
    "model.visual), language_model "
    "= model.language_model, lm_head; num_param_tensors = len(list(model.parameters())); "
    "per-block counts of the tower's block lists and, for Mllama, one cross-attention block."
)
VLM_TYPES = ("qwen2_vl", "qwen2_5_vl", "mllama", "llava")


def describe_vlm(model: torch.nn.Module) -> dict:
    """A VLM's count, split by its top-level modules and its tower's block lists."""
    params = list(model.parameters())
    parts: OrderedDict = OrderedDict()
    for name, p in model.named_parameters():
        head = name.split(".")[0]
        part = name.split(".")[1] if head == "model" else head
        parts[part] = parts.get(part, 0) + p.numel()
    blocks = OrderedDict()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) and "vision" in name + "visual":
            if name.startswith(("model.visual", "model.vision_model", "model.vision_tower")):
                blocks[name] = OrderedDict(count=len(module), per_block=numel(module[0].parameters()))
    language = model.model.language_model
    cross = [layer for layer in language.layers if hasattr(layer, "cross_attn")]
    entry = OrderedDict(
        num_parameters=numel(params),
        model_class=type(model).__name__,
        num_param_tensors=len(params),
        parts=parts,
        vision_blocks=blocks,
        language_layers=len(language.layers),
        embedding=language.embed_tokens.weight.numel(),
        lm_head=model.lm_head.weight.numel(),
    )
    if cross:
        entry["cross_attention_layers"] = len(cross)
        entry["per_cross_attention_layer"] = numel(cross[0].parameters())
    return entry


def load_preset(path: Path) -> tuple[str, dict]:
    data = json.loads(path.read_text())
    fields = {k: v for k, v in data.items() if not k.startswith("_")}
    return fields.pop("model_type"), fields


def build(model_type: str, fields: dict, cls=None) -> torch.nn.Module:
    config = AutoConfig.for_model(model_type, **fields)
    with torch.device("meta"):
        return cls(config) if cls is not None else AutoModelForCausalLM.from_config(config)


def numel(params) -> int:
    return sum(p.numel() for p in params)


def unique(params):
    seen = set()
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            yield p


def first_layer_and_count(model: torch.nn.Module) -> tuple[torch.nn.Module, int]:
    """The first repeated block and how many there are."""
    best = None
    for name, module in model.named_modules():
        is_stack = isinstance(module, torch.nn.ModuleList) and len(module) > 0
        if is_stack and (best is None or len(module) > len(best[1])):
            best = (name, module)
    if best is None:
        raise RuntimeError(f"no layer list in {type(model).__name__}")
    return best[1][0], len(best[1])


def describe(model: torch.nn.Module) -> dict:
    params = list(model.parameters())  # already de-duplicated by PyTorch
    total = numel(params)

    embeddings = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    emb_weights = list(unique(m.weight for m in embeddings))
    emb_ids = {id(w) for w in emb_weights}
    embedding = numel(emb_weights)
    embedding_detail = OrderedDict()
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Embedding):
            embedding_detail[name] = m.weight.numel()

    # Output head: BERT's MLM head is the whole `cls` module; decoders expose
    # get_output_embeddings().
    head_module = getattr(model, "cls", None)
    if head_module is None:
        head_module = model.get_output_embeddings()
    if head_module is None:
        lm_head = 0
        tied = None
    else:
        head_params = list(unique(head_module.parameters()))
        lm_head = numel(p for p in head_params if id(p) not in emb_ids)
        out_emb = model.get_output_embeddings()
        tied = out_emb is not None and id(out_emb.weight) in emb_ids

    layer, num_layers = first_layer_and_count(model)
    per_layer = numel(layer.parameters())
    breakdown = OrderedDict()
    for child_name, child in layer.named_children():
        n = numel(child.parameters())
        if n:
            breakdown[child_name] = n
    direct = numel(layer.parameters(recurse=False))
    if direct:
        breakdown["<direct>"] = direct
    shapes = OrderedDict((name, list(p.shape)) for name, p in layer.named_parameters())

    other = total - embedding - lm_head - num_layers * per_layer
    return OrderedDict(
        num_parameters=total,
        model_class=type(model).__name__,
        embedding=embedding,
        embedding_detail=embedding_detail,
        lm_head=lm_head,
        tied_embeddings=tied,
        num_layers=num_layers,
        per_layer=per_layer,
        other=other,
        per_layer_breakdown=breakdown,
        per_layer_shapes=shapes,
        layer_class=type(layer).__name__,
    )


# --------------------------------------------------------------------------- MoE

MOE_GROUPS = ("attention", "router", "experts", "shared_experts", "norms")


def is_moe(model: torch.nn.Module) -> bool:
    layers, _ = _layer_stack(model)
    return any(_is_moe_layer(layer) for layer in layers)


def _layer_stack(model: torch.nn.Module) -> tuple[torch.nn.ModuleList, str]:
    best = None
    for name, module in model.named_modules():
        is_stack = isinstance(module, torch.nn.ModuleList) and len(module) > 0
        if is_stack and (best is None or len(module) > len(best[1])):
            best = (name, module)
    if best is None:
        raise RuntimeError(f"no layer list in {type(model).__name__}")
    return best[1], best[0]


def _is_moe_layer(layer: torch.nn.Module) -> bool:
    mlp = getattr(layer, "mlp", None)
    return mlp is not None and hasattr(mlp, "experts")


def _group(param_name: str) -> str:
    if param_name.startswith("self_attn."):
        return "attention"
    if param_name.startswith("mlp.gate."):
        return "router"
    if param_name.startswith("mlp.experts."):
        return "experts"
    if param_name.startswith("mlp.shared_expert"):
        return "shared_experts"
    if "." not in param_name.removesuffix(".weight").removesuffix(".bias") and "norm" in param_name:
        return "norms"
    if param_name.startswith("mlp."):
        return "mlp"  # dense layers only
    raise RuntimeError(f"unclassified layer parameter {param_name}")


def _split(layer: torch.nn.Module) -> OrderedDict:
    groups: OrderedDict = OrderedDict()
    for pname, p in layer.named_parameters():
        g = groups.setdefault(_group(pname), OrderedDict(params=0, shapes=OrderedDict()))
        g["params"] += p.numel()
        g["shapes"][pname] = list(p.shape)
    order = ("attention", "mlp", "router", "experts", "shared_experts", "norms")
    return OrderedDict((k, groups[k]) for k in order if k in groups)


def _layer_signature(layer: torch.nn.Module) -> tuple:
    return tuple((n, tuple(p.shape)) for n, p in layer.named_parameters())


def _outside_layers(model: torch.nn.Module, stack_name: str, embedding_detail: dict) -> dict:
    """Parameters outside the layer stack, the embeddings and the output head (final norm)."""
    out = OrderedDict()
    for n, p in model.named_parameters():
        module = n.rsplit(".", 1)[0]
        if n.startswith(stack_name + ".") or module in embedding_detail or module == "lm_head":
            continue
        out[n] = p.numel()
    return out


def describe_moe(model: torch.nn.Module) -> dict:
    base = describe(model)  # totals, embedding and lm_head are computed the same way
    config = model.config
    layers, stack_name = _layer_stack(model)
    kinds = ["moe" if _is_moe_layer(layer) else "dense" for layer in layers]
    dense_idx = [i for i, k in enumerate(kinds) if k == "dense"]
    moe_idx = [i for i, k in enumerate(kinds) if k == "moe"]

    def one_kind(indices):
        if not indices:
            return None, None
        first = layers[indices[0]]
        sig = _layer_signature(first)
        for i in indices[1:]:
            if _layer_signature(layers[i]) != sig:
                raise RuntimeError(f"layer {i} differs from layer {indices[0]}")
        return first, numel(first.parameters())

    dense_layer, per_layer_dense = one_kind(dense_idx)
    moe_layer, per_layer_moe = one_kind(moe_idx)
    total = base["num_parameters"]
    other = (
        total
        - base["embedding"]
        - base["lm_head"]
        - len(dense_idx) * (per_layer_dense or 0)
        - len(moe_idx) * per_layer_moe
    )

    split = _split(moe_layer)
    for g in MOE_GROUPS:
        split.setdefault(g, OrderedDict(params=0, shapes=OrderedDict()))
    split = OrderedDict((g, split[g]) for g in MOE_GROUPS)
    assert sum(g["params"] for g in split.values()) == per_layer_moe
    experts = moe_layer.mlp.experts
    num_experts = getattr(experts, "num_experts", None)
    if num_experts:
        split["experts"]["num_experts"] = num_experts
        split["experts"]["per_expert"] = split["experts"]["params"] // num_experts

    buffers = OrderedDict(
        (
            bname,
            OrderedDict(
                shape=list(b.shape), dtype=str(b.dtype).removeprefix("torch."), counted=False
            ),
        )
        for bname, b in moe_layer.named_buffers()
    )
    router_bias_params = [n for n in split["router"]["shapes"] if n.endswith("bias")]
    router_bias_buffers = [n for n in buffers if n.startswith("mlp.gate.")]
    if router_bias_params:
        router_bias = f"parameter(s) {router_bias_params}, counted"
    elif router_bias_buffers:
        router_bias = (
            f"buffer(s) {router_bias_buffers} (nn.Buffer, not in model.parameters(), not counted; "
            "the checkpoint stores them as tensors)"
        )
    else:
        router_bias = "none (router is a bias-free Linear)"

    # Multi-token prediction: layers the checkpoint carries beyond num_hidden_layers.
    n_mtp = getattr(config, "num_nextn_predict_layers", None)
    if n_mtp is None:
        n_mtp = getattr(config, "num_mtp_layers", None)
    mtp = None
    if n_mtp:
        built = len(layers) - config.num_hidden_layers
        mtp = OrderedDict(
            config_num_nextn_predict_layers=n_mtp,
            instantiated=built > 0,
            note=(
                f"{type(model).__name__} builds {len(layers)} layers = num_hidden_layers; "
                f"the checkpoint's MTP layer(s) model.layers.{config.num_hidden_layers}.* "
                "are not built (transformers ignores them on load; they live in a separate "
                "MtpModel used only for speculative decoding) and are not in num_parameters"
            ),
        )

    entry = OrderedDict(
        num_parameters=total,
        model_class=base["model_class"],
        embedding=base["embedding"],
        embedding_detail=base["embedding_detail"],
        lm_head=base["lm_head"],
        tied_embeddings=base["tied_embeddings"],
        num_layers=len(layers),
        num_dense_layers=len(dense_idx),
        num_moe_layers=len(moe_idx),
        dense_layer_indices=dense_idx,
        per_layer_dense=per_layer_dense,
        per_layer_moe=per_layer_moe,
        other=other,
        other_detail=_outside_layers(model, stack_name, base["embedding_detail"]),
        moe_layer_index=moe_idx[0],
        moe_layer_split=split,
        moe_layer_buffers=buffers,
        router_bias=router_bias,
        dense_layer_split=_split(dense_layer) if dense_layer is not None else None,
        mtp=mtp,
        layer_class=type(moe_layer).__name__,
        moe_block_class=type(moe_layer.mlp).__name__,
    )
    assert sum(entry["other_detail"].values()) == other, (entry["other_detail"], other)
    return entry


def main() -> int:
    result = OrderedDict()
    result["_provenance"] = OrderedDict(
        torch=torch.__version__,
        transformers=transformers.__version__,
        method=METHOD,
        method_moe=METHOD_MOE,
        method_vlm=METHOD_VLM,
        generator="tests/data/make_param_counts.py",
    )
    failures = []
    for path in sorted(PRESETS.glob("*.json")):
        name = path.stem
        model_type, fields = load_preset(path)
        if model_type in ("bert", "roberta"):
            mlm, bare = {
                "bert": (BertForMaskedLM, BertModel),
                "roberta": (RobertaForMaskedLM, RobertaModel),
            }[model_type]
            entry = describe(build(model_type, fields, mlm))
            base = describe(build(model_type, fields, bare))
            entry["bert_model"] = base  # encoder only, with pooler, no MLM head
        elif model_type == "gpt2":
            entry = describe(build(model_type, fields, GPT2LMHeadModel))
        elif model_type in VLM_TYPES:
            config = AutoConfig.for_model(model_type, **fields)
            with torch.device("meta"):
                entry = describe_vlm(AutoModelForImageTextToText.from_config(config))
        else:
            model = build(model_type, fields)
            entry = describe_moe(model) if is_moe(model) else describe(model)
        result[name] = entry
        want = ANCHORS.get(name)
        mark = ""
        if want is not None and entry["num_parameters"] == want:
            mark = "anchor ok"
        elif want is not None:
            mark = f"ANCHOR MISMATCH (want {want:,})"
            failures.append(name)
        print(f"{name:22s} {entry['model_class']:22s} {entry['num_parameters']:>17,} {mark}")

    missing = sorted(set(ANCHORS) - set(result))
    if missing:
        failures.extend(f"{m} (no preset)" for m in missing)

    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")
    if failures:
        print("anchor failures: " + ", ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
