"""The model a config file names, resolved offline: a Hugging Face id (`meta-llama/Llama-3.1-8B-
Instruct`), a checkpoint folder (`/tmp/Meta-Llama-3.1-8B-Instruct`), a stack's own model name
(`llama3_1_8b`, `Llama-3.1-8B`), or a preset name, to a shipped preset or a local config.json.

No model hub is asked: an id names its preset by the preset's own Hugging Face id (its `_source`)
or by its name once the usual release suffixes are dropped (-Instruct, -hf, -chat, -it, -base,
a version tag, a quantisation tag); fine-tuned checkpoints keep their base model's architecture.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from trainmem.catalog import model_presets
from trainmem.catalog._presets import did_you_mean, preset_hub_ids

SUFFIXES = re.compile(
    r"(-(instruct|chat|hf|it|base|sft|dpo|rlhf|gptq|awq|fp8|bnb|4bit|8bit|nf4|unsloth|"
    r"v\d+(\.\d+)*|\d{4}|intermediate-step-\d+k-[\d.]+t|step-?\d+k?))+$"
)
"""Release tags after the architecture's name: `Llama-2-7b-chat-hf`, `Mistral-7B-Instruct-v0.3`,
`gemma-2-9b-it`, `llama-3-8b-bnb-4bit`, `Phi-3-mini-4k-instruct` (the context tag is below)."""
CONTEXT_TAG = re.compile(r"-(4k|8k|32k|128k)(?=-|$)")


def normalise(name: str) -> str:
    """A model name as the presets spell theirs: lower case, the org and folder dropped,
    `meta-` dropped, underscores between version digits as dots (`llama3_1` -> `llama-3.1`),
    release tags dropped."""
    base = name.strip().rstrip("/").replace("\\", "/").split("/")[-1].lower()
    base = base.removeprefix("meta-")
    base = re.sub(r"^llama(\d)", r"llama-\1", base)  # llama3_1_8b, llama3.1-8b
    base = re.sub(r"(\d)_(\d)(?=[_-])", r"\1.\2", base)  # 3_1_8b -> 3.1_8b
    base = base.replace("_", "-")
    base = CONTEXT_TAG.sub("", base)
    previous = None
    while previous != base:
        previous, base = base, SUFFIXES.sub("", base)
    return base


@functools.cache
def _hub_ids() -> dict[str, str]:
    """Each built-in preset's Hugging Face id (catalog preset_hub_ids), lower case -> preset."""
    return {hub.lower(): name for name, hub in preset_hub_ids().items()}


def resolve_model(
    name: str,
    *,
    models_dir: str | None = None,
    base_dir: str | None = None,
    local_paths: bool = True,
) -> str:
    """What `--model` takes for a file's model name: a local config.json's path (a folder
    holding one, relative paths from `base_dir`; not with `local_paths` False, as over HTTP,
    where a request never names a server file), else a preset's name. ValueError (one line)
    when it names nothing trainmem has offline."""
    for candidate in _local_candidates(name, base_dir) if local_paths else ():
        if candidate.is_file() and candidate.name.endswith(".json"):
            return os.fspath(candidate)
        if (candidate / "config.json").is_file():
            return os.fspath(candidate / "config.json")
    presets = model_presets(models_dir)
    if name in presets:
        return name
    lowered = name.strip().rstrip("/").lower()
    hub = _hub_ids()
    if lowered in hub:
        return hub[lowered]
    key = normalise(name)
    if key in presets:
        return key
    by_normal = {normalise(p): p for p in presets}
    if key in by_normal:
        return by_normal[key]
    raise ValueError(
        f"model: cannot resolve {name!r} offline to a preset or a local config.json; "
        f"{did_you_mean(key, presets)}give --model PRESET or PATH/config.json, or --models-dir"
    )


def _local_candidates(name: str, base_dir: str | None) -> list[Path]:
    if not name or "\n" in name or len(name) > 4096:
        return []
    path = Path(os.path.expanduser(name))
    out = [path]
    if base_dir is not None and not path.is_absolute():
        out.insert(0, Path(base_dir) / path)
    return out
