"""T5 encoder-decoders for `trainmem trace --module` (the formulas refuse model_type t5).

Built with transformers' T5ForConditionalGeneration from a T5Config written out here (no
network). The config values are those published on the Hugging Face Hub:
- google/t5-v1_1-base config.json: d_model 768, d_ff 2048, d_kv 64, num_heads 12, num_layers 12,
  num_decoder_layers 12, feed_forward_proj "gated-gelu", tie_word_embeddings false,
  vocab_size 32128, relative_attention_num_buckets 32, dropout_rate 0.1, layer_norm_epsilon 1e-6;
- t5-base (google-t5/t5-base) config.json: the same but d_ff 3072, feed_forward_proj "relu" and
  the head tied to the shared embedding (tie_word_embeddings true, the default).

The batch: input_ids [b, s] and labels [b, s] (the target as long as the input, as in
translation fine-tuning). A profile is fitted against seq_len only, so it describes that ratio;
a shorter target (summarisation, span corruption's 114 for 512) makes it an upper bound. The
loss is the model's own (labels shifted right into decoder_input_ids, cross-entropy over the
vocabulary); no KV cache (use_cache false), as the Trainer's step.

Both stacks' T5Blocks (encoder.block, decoder.block: two nn.ModuleLists of one class) are the
profile's repeated blocks, 24 in all: a decoder block also holds cross-attention, so the profile's
per-layer parameters and activations are the mean of an encoder and a decoder block.
"""

from __future__ import annotations

import torch
from transformers import T5Config, T5ForConditionalGeneration

T5_V1_1_BASE = {
    "d_model": 768,
    "d_ff": 2048,
    "d_kv": 64,
    "num_heads": 12,
    "num_layers": 12,
    "num_decoder_layers": 12,
    "feed_forward_proj": "gated-gelu",
    "tie_word_embeddings": False,
    "vocab_size": 32128,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "dropout_rate": 0.1,
    "layer_norm_epsilon": 1e-6,
}
"""google/t5-v1_1-base config.json (247,577,856 parameters)."""
T5_BASE = {**T5_V1_1_BASE, "d_ff": 3072, "feed_forward_proj": "relu", "tie_word_embeddings": True}
"""t5-base config.json (222,903,552 parameters: the head tied to the shared embedding)."""


def _t5(config: dict, *, seq_len: int, micro_batch_size: int):
    cfg = T5Config(**config, use_cache=False, decoder_start_token_id=0, pad_token_id=0)
    model = T5ForConditionalGeneration(cfg)
    if config["tie_word_embeddings"] is False:
        # transformers 5's T5Config always ties lm_head to `shared` (tie_word_embeddings false only
        # turns off the decoder-output scaling); v1.1 checkpoints hold a head of their own.
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.shared.weight))
    input_ids = torch.randint(1, cfg.vocab_size, (micro_batch_size, seq_len))
    labels = torch.randint(1, cfg.vocab_size, (micro_batch_size, seq_len))
    return model, {"input_ids": input_ids, "labels": labels}


def t5_v1_1_base_factory(seq_len: int = 512, micro_batch_size: int = 2):
    """google/t5-v1_1-base (gated-GELU, untied head): catalog/profiles/t5-v1_1-base-*.json."""
    return _t5(T5_V1_1_BASE, seq_len=seq_len, micro_batch_size=micro_batch_size)


def t5_base_factory(seq_len: int = 512, micro_batch_size: int = 2):
    """t5-base (ReLU, head tied to the shared embedding)."""
    return _t5(T5_BASE, seq_len=seq_len, micro_batch_size=micro_batch_size)
