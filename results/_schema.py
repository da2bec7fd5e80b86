"""The points table's columns: names, polars dtypes and the schema version.

One row per evaluated point of a sweep, fitting or not. A snapshot test freezes this list; bump
SCHEMA_VERSION when a column is added, removed or changes type.
"""

from __future__ import annotations

import polars as pl

from trainmem.engine import COMPONENTS, FIELD_NAMES, TYPES

SCHEMA_VERSION = 12
"""12: the training fields zero_bucket_elems and overlap_comm (DeepSpeed ZeRO's reduce bucket
and its second buffer), parts of schema 11 and older read with them null; 11: the training
field lora_scope (which of a vision-language model's modules LoRA adapts),
parts of schema 10 and older read with it null; 10: the training fields
rl_max_token_len_per_gpu and rl_mean_seq_len (the RL trainer's packed micro-batches), parts of
schema 9 and older read with them null; 9: the training fields
images_per_sample, image_size and freeze_vision (vision-language models), parts of schema 8 and
older read with them null; 8: the RL post-training fields (rl, rollout, rollout_tp,
rollout_gpu_memory_utilization, rl_group_size, response_len, rollout_batch_size,
rollout_max_num_seqs, rollout_max_num_batched_tokens, rollout_sleep_level, ref_model,
rl_trainer_offload, log_prob_micro_batch_size), parts of schema 7 and older read with them null
(an RL point's peak_device_bytes is its largest phase's, its components the trainer step's); 7:
the error bars peak_device_bytes_low, peak_device_bytes_high (a 90% interval) and
fit_probability, and the risk over a dataset (`sweep --lengths`: oom_probability and
RISK_BYTE_COLUMNS, the step peaks, null without a dataset); parts of schema 6 and older read
with both null; 6: the training field `bitsandbytes_version`; 5: the training field `load` and
the load phase's peak_load_bytes; 4: byte columns (BYTE_COLUMNS) are whole bytes, Int64 (were
Float64), and the string columns are stored dictionary-encoded (Categorical; readers see
strings); 3: the fields dp_shard, recompute_every, compile, optimizer_in_backward and allocator,
and the vocabularies' new names (recompute selective-op / selective-layer, framework torchtune,
loss chunked-output); 2: every training field of the configuration is a column (1: the searched
ones only)."""

_POLARS_TYPES: dict[type, type[pl.DataType] | pl.DataType] = {
    int: pl.Int64,
    float: pl.Float64,
    bool: pl.Boolean,
    # A column of a few names repeated over every row (precision, gpu, reason): stored as a
    # dictionary of the names and small integer codes, which polars writes without hashing
    # every row's string again (a third of a part's write time as strings).
    str: pl.Categorical(),
}

CONFIG_COLUMNS: dict[str, type[pl.DataType] | pl.DataType] = {
    "gpu": pl.Categorical(),
    **{name: _POLARS_TYPES[TYPES[name]] for name in FIELD_NAMES},
    "dp": pl.Int64,
    "grad_accum_steps": pl.Int64,
}
"""The configuration of a point."""

RISK_BYTE_COLUMNS = (
    "worst_step_peak_device_bytes",
    "step_peak_p50_device_bytes",
    "step_peak_p99_device_bytes",
)
"""`sweep --lengths`: the worst micro-batch's device peak of an epoch over the dataset (the step
peak's max), and the step peak's median and 99th percentile (sweep/_risk.py)."""
BYTE_COLUMNS = (
    "peak_device_bytes",
    *COMPONENTS,
    "peak_allocated_bytes",
    "peak_load_bytes",
    "peak_device_bytes_low",
    "peak_device_bytes_high",
    *RISK_BYTE_COLUMNS,
)
"""Bytes per device, rounded to the byte (null where the engine gives no finite number)."""

PREDICTION_COLUMNS: dict[str, type[pl.DataType] | pl.DataType] = {
    **{name: pl.Int64 for name in BYTE_COLUMNS if name not in RISK_BYTE_COLUMNS},
    "fits": pl.Boolean,
    "fit_probability": pl.Float64,
    "reason": pl.Categorical(),
    "step_time_s": pl.Float64,
    "tokens_per_second": pl.Float64,
    "mfu": pl.Float64,
    "cost_per_million_tokens": pl.Float64,
    "oom_probability": pl.Float64,
    **{name: pl.Int64 for name in RISK_BYTE_COLUMNS},
}
"""What the engine predicts for it (bytes per device; NaN time and cost for invalid points);
oom_probability: P(some micro-batch of an epoch over `--lengths` exceeds the limit), null
without a dataset and on invalid points."""

PROVENANCE_COLUMNS: dict[str, type[pl.DataType] | pl.DataType] = {
    "model": pl.Categorical(),
    "study": pl.Categorical(),
    "trial": pl.Int64,
}
"""Where the point comes from; `trial` is null for an exhaustive sweep."""

SCHEMA: dict[str, type[pl.DataType] | pl.DataType] = {
    **CONFIG_COLUMNS,
    **PREDICTION_COLUMNS,
    **PROVENANCE_COLUMNS,
}
"""Every column, in file order, as stored."""

READ_SCHEMA: dict[str, type[pl.DataType] | pl.DataType] = {
    name: pl.String if dtype == pl.Categorical else dtype for name, dtype in SCHEMA.items()
}
"""Every column as `scan_points` (queries, heatmaps) gives it: the categoricals as strings."""
