"""A small Hugging Face Llama built by a factory: `trainmem trace --module` must measure it as
`trainmem trace --model` measures the same config (CONFIG)."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM

CONFIG = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}


def factory(seq_len: int = 128, micro_batch_size: int = 2):
    fields = dict(CONFIG)
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    cfg._attn_implementation = "sdpa"
    cfg.use_cache = False  # as trace --model builds it
    model = AutoModelForCausalLM.from_config(cfg)
    ids = torch.randint(0, cfg.vocab_size, (micro_batch_size, seq_len))
    return model, {"input_ids": ids, "labels": ids}
