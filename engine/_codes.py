"""Named codes of the categorical grid fields, derived from their vocabularies.

A grid stores a categorical field as the index of its name in the vocabulary tuple
(engine/_vocab.py, re-exported by engine/_grid.py). The engine compares codes only through
these names, so a vocabulary and the formulas cannot drift apart. Per-precision and
per-optimizer tables are derived by name too (engine/_precision.py, engine/_optimizers.py).
"""

from __future__ import annotations

from ._vocab import (
    ALLOCATORS,
    ATTENTION,
    BITSANDBYTES_VERSIONS,
    COMPILES,
    FRAMEWORKS,
    LORA_SCOPES,
    LOSSES,
    OFFLOADS,
    OVERLAP_COMMS,
    PRECISIONS,
    RECOMPUTE,
)

FP32 = PRECISIONS.index("fp32")
BF16 = PRECISIONS.index("bf16")
FP16 = PRECISIONS.index("fp16")
AMP_BF16 = PRECISIONS.index("amp-bf16")
AMP_FP16 = PRECISIONS.index("amp-fp16")
MIXED_BF16 = PRECISIONS.index("mixed-bf16")
MIXED_FP16 = PRECISIONS.index("mixed-fp16")
FP8_MIXED = PRECISIONS.index("fp8-mixed")

HF = FRAMEWORKS.index("hf")
MEGATRON = FRAMEWORKS.index("megatron")
DEEPSPEED = FRAMEWORKS.index("deepspeed")
TORCHTITAN = FRAMEWORKS.index("torchtitan")
TORCHTUNE = FRAMEWORKS.index("torchtune")

RECOMPUTE_NONE = RECOMPUTE.index("none")
RECOMPUTE_SELECTIVE = RECOMPUTE.index("selective")
RECOMPUTE_FULL = RECOMPUTE.index("full")
RECOMPUTE_SELECTIVE_OP = RECOMPUTE.index("selective-op")
RECOMPUTE_SELECTIVE_LAYER = RECOMPUTE.index("selective-layer")

FLASH = ATTENTION.index("flash")
EAGER = ATTENTION.index("eager")
EAGER_UNFUSED = ATTENTION.index("eager-unfused")
"""Attention codes other than FLASH materialise the s x s scores."""

OFFLOAD_NONE = OFFLOADS.index("none")
OFFLOAD_OPTIMIZER = OFFLOADS.index("optimizer")
OFFLOAD_PARAMS = OFFLOADS.index("optimizer+params")
"""Offload codes grow with what moves to the host: `offload >= OFFLOAD_OPTIMIZER` means the
optimizer states (and master weights) are on the host, with or without the parameters."""

LOSS_FULL = LOSSES.index("full")
LOSS_CHUNKED = LOSSES.index("chunked")
LOSS_CHUNKED_OUTPUT = LOSSES.index("chunked-output")
LOSS_CHUNKED_HEAD = LOSSES.index("chunked-head")
LOSS_AUTO = LOSSES.index("auto")
LOSS_VOCAB_PARALLEL = LOSSES.index("vocab-parallel")
BNB_LEGACY = BITSANDBYTES_VERSIONS.index("legacy")
LORA_SCOPE_LANGUAGE = LORA_SCOPES.index("language")
OVERLAP_COMM_OFF = OVERLAP_COMMS.index("off")

EXPANDABLE_SEGMENTS = ALLOCATORS.index("expandable-segments")

COMPILE_NONE = COMPILES.index("none")
COMPILE_BLOCKS_AND_LOSS = COMPILES.index("blocks+loss")

assert OFFLOAD_NONE < OFFLOAD_OPTIMIZER < OFFLOAD_PARAMS, "offload codes must grow"
