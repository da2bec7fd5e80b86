"""Regenerate tests/data/param_counts.json from the built-in presets.

For every engine/presets/<name>.json this builds the model with Hugging Face
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
    BertForMaskedLM,
    BertModel,
    GPT2LMHeadModel,
)

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "engine" / "presets"
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
}

METHOD = (
    "config = AutoConfig.for_model(model_type, **preset_fields) (keys starting with '_' dropped); "
    "model built under `with torch.device('meta'):` with AutoModelForCausalLM.from_config "
    "(GPT2LMHeadModel(config) for model_type gpt2; "
    "BertForMaskedLM(config) and BertModel(config) for bert); "
    "num_parameters = sum(p.numel() for p in model.parameters()), so tied embeddings count once. "
    "embedding = all nn.Embedding weights (token + learned position + token-type); "
    "lm_head = parameters of the output head that are not shared with the input embedding "
    "(0 when tied; for BertForMaskedLM the whole cls head less the tied decoder weight); "
    "per_layer = first transformer block; other = num_parameters - embedding - lm_head - "
    "num_layers * per_layer (final norm, pooler, ...)."
)


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


def main() -> int:
    result = OrderedDict()
    result["_provenance"] = OrderedDict(
        torch=torch.__version__,
        transformers=transformers.__version__,
        method=METHOD,
        generator="tests/data/make_param_counts.py",
    )
    failures = []
    for path in sorted(PRESETS.glob("*.json")):
        name = path.stem
        model_type, fields = load_preset(path)
        if model_type == "bert":
            entry = describe(build(model_type, fields, BertForMaskedLM))
            base = describe(build(model_type, fields, BertModel))
            entry["bert_model"] = base  # encoder only, with pooler, no MLM head
        elif model_type == "gpt2":
            entry = describe(build(model_type, fields, GPT2LMHeadModel))
        else:
            entry = describe(build(model_type, fields))
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
