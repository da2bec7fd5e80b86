"""The training configuration: every training field declared once, with its type, choices,
default, bounds and help text.

`TrainingConfig` is the one declaration. From its fields come the grid columns and codes
(`config.grid_columns()`, `make_grid`), the CLI options of every command (trainmem.cli), the HTTP
request models (trainmem.serve), the public Python API (`trainmem.estimate(config, ...)`) and the
points table's configuration columns (trainmem.results). A field added here appears in all of
them; tests/unit/test_config_reach.py proves it.

The parallel layout (dp, gradient accumulation, the groups that shard model states) is derived
once, by `parallel_layout`, for a single configuration and for columns alike.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._vocab import (
    ALLOCATORS,
    ATTENTION,
    BITSANDBYTES_VERSIONS,
    COMPILES,
    FRAMEWORKS,
    LOADS,
    LORA_SCOPES,
    LOSSES,
    OFFLOADS,
    OVERLAP_COMMS,
    PRECISIONS,
    RECOMPUTE,
    REF_MODELS,
    RL_ALGORITHMS,
    RL_TRAINER_OFFLOADS,
    ROLLOUTS,
)

INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Knob:
    """What a training field is: its help text, allowed values and bounds (inclusive)."""

    help: str
    """One line for --help and the HTTP schema."""
    choices: tuple[str, ...] | None = None
    """Closed vocabulary of a categorical field (None: any value of its type)."""
    open_choices: bool = False
    """The vocabulary is extensible (user optimizers): choices lists the built-in ones."""
    ge: float | None = None
    le: float | None = None
    flag: str | None = None
    """The CLI flag of a boolean switch (`--qlora`); others are --field-name."""
    grid: str | None = None
    """The grid column, where it differs from the field (capacity_factor -> capacity_factor_pct)."""
    sweep_axis: bool = False
    """Searched by `trainmem sweep` / `recommend` (a value given there pins the axis): an axis of
    the space, of Optuna's trials, of the points and recommend tables (trainmem.sweep._axes)."""
    layout: bool = False
    """A search axis that places ranks: points differing in it are different layouts (an Optuna
    trial samples it; the other axes are enumerated within a layout)."""
    axis_order: int | None = None
    """Position among the search axes, slowest-varying first, layout axes before the others
    (None: after the numbered ones, in declaration order): the flat point index, the tables'
    columns."""
    axis_values: tuple[Any, ...] | None = None
    """A search axis's candidate values where the space has no rule of its own (None: its
    choices, or off and on for a switch)."""
    heading: str | None = None
    """The column heading in the sweep's and recommend's tables (None: the field's name)."""
    rl_axis: bool = False
    """A search axis only for an RL job (--rl): other jobs search its default alone, and their
    tables leave it out (sweep/_space.py _rl_axes, sweep/_axes.py shown_columns)."""


def knob(default: Any, **meta: Any) -> Any:
    """A dataclass field whose metadata is a Knob (the declaration of a training field)."""
    return dataclasses.field(default=default, metadata={"knob": Knob(**meta)})


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingConfig:
    """One training job's configuration (everything but the model and the GPU).

    Field names follow Hugging Face where they exist and torchtitan for parallel degrees.
    Construction checks choices and bounds (one ValueError naming the field and what is
    allowed); whether a layout is valid for a model (heads divisible by tp, ...) is the engine's
    `layout_reason`, since it needs the model.

    >>> c = TrainingConfig(num_gpus=8, tp=2, micro_batch_size=2, global_batch_size=64)
    >>> c.dp, c.grad_accum_steps
    (4, 8)
    """

    micro_batch_size: int = knob(
        1,
        help="Sequences per GPU per step.",
        ge=1,
        le=1 << 16,
        sweep_axis=True,
        axis_order=10,
        heading="mbs",
    )
    seq_len: int = knob(2048, help="Sequence length (tokens).", ge=1, le=1 << 22)
    num_gpus: int = knob(
        1,
        help="Total GPUs; dp = num_gpus/(tp*pp*cp).",
        ge=1,
        le=1 << 20,
        sweep_axis=True,
        layout=True,
        axis_order=1,
        heading="n",
    )
    global_batch_size: int = knob(
        0, help="Sequences per optimizer step (0: micro x dp).", ge=0, le=1 << 24
    )
    tp: int = knob(
        1, help="Tensor parallel degree.", ge=1, le=1024, sweep_axis=True, layout=True, axis_order=2
    )
    pp: int = knob(
        1,
        help="Pipeline parallel degree.",
        ge=1,
        le=1024,
        sweep_axis=True,
        layout=True,
        axis_order=3,
    )
    cp: int = knob(
        1,
        help="Context parallel degree.",
        ge=1,
        le=1024,
        sweep_axis=True,
        layout=True,
        axis_order=5,
    )
    virtual_stages: int = knob(
        1,
        help="Interleaved stages per rank.",
        ge=1,
        le=64,
        sweep_axis=True,
        layout=True,
        axis_order=4,
        heading="v",
    )
    zero: int = knob(
        0,
        help="ZeRO stage 0-3 (3 = FSDP full shard).",
        ge=0,
        le=3,
        sweep_axis=True,
        axis_order=7,
        axis_values=(0, 1, 2, 3),
    )
    dp_shard: int = knob(
        0,
        help="Ranks a ZeRO/FSDP shard group spans (HSDP: dp/dp_shard replicas); 0: all of dp.",
        ge=0,
        le=1 << 20,
    )
    sequence_parallel: bool = knob(
        False, help="Megatron-style sequence parallelism.", flag="--sequence-parallel"
    )
    precision: str = knob("amp-bf16", help=" | ".join(PRECISIONS), choices=PRECISIONS)
    optimizer: str = knob(
        "adamw",
        help="Built-in or user optimizer (`trainmem optimizers`).",
        choices=None,
        open_choices=True,
    )
    recompute: str = knob(
        "none",
        help=" | ".join(RECOMPUTE) + " (selective: the framework's own selective mode)",
        choices=RECOMPUTE,
        sweep_axis=True,
        axis_order=8,
        axis_values=("none", "selective", "full"),
    )
    recompute_every: int = knob(
        2, help="selective-layer: checkpoint every N-th block.", ge=1, le=1024
    )
    attention: str = knob("flash", help=" | ".join(ATTENTION), choices=ATTENTION)
    framework: str = knob("hf", help=" | ".join(FRAMEWORKS), choices=FRAMEWORKS)
    ep: int = knob(
        1,
        help="Expert parallel degree (MoE; divides dp*cp).",
        ge=1,
        le=1024,
        sweep_axis=True,
        layout=True,
        axis_order=6,
    )
    etp: int = knob(1, help="Expert tensor parallel degree (MoE).", ge=1, le=1024)
    capacity_factor: float = knob(
        0.0,
        help="MoE expert capacity factor (0: dropless routing).",
        ge=0,
        le=64,
        grid="capacity_factor_pct",
    )
    offload: str = knob(
        "none", help=" | ".join(OFFLOADS), choices=OFFLOADS, sweep_axis=True, axis_order=9
    )
    lora_rank: int = knob(0, help="LoRA rank (0: full fine-tuning).", ge=0, le=1 << 16)
    lora_targets: str = knob(
        "all-linear", help="PEFT target modules, e.g. q_proj,v_proj, or all-linear."
    )
    qlora: bool = knob(False, help="NF4 base weights (QLoRA); needs --lora-rank.", flag="--qlora")
    loss: str = knob(
        "auto",
        help=" | ".join(LOSSES) + " (auto: the framework's own; torchtitan 0.3: chunked-head, "
        "every other framework: full; vocab-parallel: Megatron's in-place vocab-parallel cross "
        "entropy, e.g. Megatron-LM under DeepSpeed)",
        choices=LOSSES,
    )
    activation_offload: bool = knob(
        False, help="Keep two blocks' activations on GPU.", flag="--activation-offload"
    )
    compile: str = knob(
        "none",
        help=" | ".join(COMPILES)
        + " (torch.compile of each block; blocks+loss: torchtitan, torchtune)",
        choices=COMPILES,
    )
    optimizer_in_backward: bool = knob(
        False,
        help="Step each parameter as its gradient is ready (torchtune optimizer_in_bwd).",
        flag="--optimizer-in-backward",
    )
    allocator: str = knob(
        "native",
        help=" | ".join(ALLOCATORS) + " (PYTORCH_CUDA_ALLOC_CONF expandable_segments)",
        choices=ALLOCATORS,
    )
    load: str = knob(
        "auto",
        help=" | ".join(LOADS) + " (how the model and checkpoint load before step 1; auto: the "
        "framework's own)",
        choices=LOADS,
    )
    bitsandbytes_version: str = knob(
        "current",
        help=" | ".join(BITSANDBYTES_VERSIONS) + " (the bitsandbytes of a --qlora job: legacy is "
        "0.43.1 and earlier, whose 4-bit matmul keeps each frozen linear's input for backward; "
        "current: 0.43.2 and later)",
        choices=BITSANDBYTES_VERSIONS,
    )

    rl: str = knob(
        "none",
        help=" | ".join(RL_ALGORITHMS) + " (RL post-training: phases rollout, score, train; "
        "engine/_rl.py)",
        choices=RL_ALGORITHMS,
    )
    rollout: str = knob(
        "auto",
        help=" | ".join(ROLLOUTS) + " (the RL rollout engine on the training GPUs; auto: vllm "
        "for grpo and ppo, none for dpo)",
        choices=ROLLOUTS,
    )
    rollout_tp: int = knob(
        1,
        help="Rollout engine tensor parallel degree (verl rollout.tensor_model_parallel_size).",
        ge=1,
        le=1024,
        sweep_axis=True,
        rl_axis=True,
        heading="rtp",
    )
    rollout_gpu_memory_utilization: float = knob(
        0.5,
        help="Rollout engine's share of GPU memory (vLLM gpu_memory_utilization, SGLang "
        "mem_fraction_static); default verl's 0.5.",
        ge=0.01,
        le=1.0,
    )
    rl_group_size: int = knob(
        8,
        help="Responses per prompt (verl rollout.n, TRL num_generations; default TRL's 8).",
        ge=1,
        le=1 << 16,
    )
    response_len: int = knob(
        512,
        help="Max response tokens of the rollout (verl max_response_length, TRL "
        "max_completion_length); seq_len is prompt + response.",
        ge=1,
        le=1 << 22,
    )
    rollout_batch_size: int = knob(
        0,
        help="Prompts per rollout step over all GPUs (verl data.train_batch_size); 0: "
        "global_batch_size / rl_group_size.",
        ge=0,
        le=1 << 24,
    )
    rollout_max_num_seqs: int = knob(
        256, help="Rollout engine's max_num_seqs (verl's default 256).", ge=1, le=1 << 20
    )
    rollout_max_num_batched_tokens: int = knob(
        8192,
        help="Rollout engine's max_num_batched_tokens (verl's default 8192).",
        ge=1,
        le=1 << 24,
    )
    rollout_sleep_level: int = knob(
        2,
        help="vLLM sleep level between phases: 0 no sleep, 1 weights to CPU and KV freed, 2 "
        "both discarded (verl's for full weights).",
        ge=0,
        le=2,
    )
    ref_model: str = knob(
        "auto",
        help=" | ".join(REF_MODELS) + " (RL reference model; auto: shared-lora with a LoRA "
        "rank, else separate)",
        choices=REF_MODELS,
        sweep_axis=True,
        rl_axis=True,
        heading="ref",
    )
    rl_trainer_offload: str = knob(
        "none",
        help=" | ".join(RL_TRAINER_OFFLOADS) + " (trainer states on CPU during the rollout: "
        "verl fsdp_config.optimizer_offload / param_offload)",
        choices=RL_TRAINER_OFFLOADS,
        sweep_axis=True,
        rl_axis=True,
        heading="rl_offload",
    )
    log_prob_micro_batch_size: int = knob(
        0,
        help="Sequences per forward of the RL score phase (verl log_prob_micro_batch_size_"
        "per_gpu); 0: micro_batch_size.",
        ge=0,
        le=1 << 16,
    )
    rl_max_token_len_per_gpu: int = knob(
        0,
        help="Tokens per packed micro-batch of the RL train and score phases (verl "
        "use_dynamic_bsz with ppo_max_token_len_per_gpu; padding removed); 0: "
        "micro_batch_size (log_prob_micro_batch_size) whole sequences of seq_len.",
        ge=0,
        le=1 << 24,
    )
    rl_mean_seq_len: int = knob(
        0,
        help="Tokens per sequence of the RL train and score micro-batches, padding removed "
        "(verl use_remove_padding: prompt_length/mean + response_length/mean of its logs); 0: "
        "seq_len (every sequence at its longest, the bound).",
        ge=0,
        le=1 << 22,
    )
    images_per_sample: int = knob(
        0,
        help="Images per sequence of a vision-language model (0: text only); Qwen2-VL / "
        "Qwen2.5-VL, LLaVA and Gemma 3 add their image tokens to seq_len, Llama 3.2 Vision's "
        "cross-attention layers read them.",
        ge=0,
        le=1024,
    )
    image_size: int = knob(
        448,
        help="Side of a (square) image in pixels, before the processor resizes it (Qwen2-VL "
        "smart_resize to multiples of 28; Llama 3.2 Vision 560-pixel tiles; LLaVA and Gemma 3 "
        "resize to their tower's side, so it changes nothing).",
        ge=1,
        le=1 << 15,
    )
    freeze_vision: bool = knob(
        False,
        help="Freeze a vision-language model's vision tower and projector (no gradients, "
        "optimizer states or saved activations for them).",
        flag="--freeze-vision",
    )
    lora_scope: str = knob(
        "auto",
        help=" | ".join(LORA_SCOPES) + " (a vision-language model's LoRA: auto, PEFT's matching of "
        "lora_targets, all-linear adapting the vision tower's and projector's linears too; "
        "language: the language model's only, as LLaMA-Factory; freeze_vision adapts none of "
        "the tower's either way)",
        choices=LORA_SCOPES,
    )
    zero_bucket_elems: float = knob(
        0.0,
        help="DeepSpeed ZeRO's reduce_bucket_size in elements (0: the HF Trainer's \"auto\", "
        "hidden x hidden; a DeepSpeed config without the key: DeepSpeed's 5e8).",
        ge=0.0,
        le=1e12,
    )
    overlap_comm: str = knob(
        "auto",
        help=" | ".join(OVERLAP_COMMS) + " (DeepSpeed ZeRO's overlap_comm; auto: on, as the HF "
        "Trainer's example configs; off: one reduce bucket buffer under ZeRO 1-2, DeepSpeed's "
        "own default there)",
        choices=OVERLAP_COMMS,
    )

    def __post_init__(self) -> None:
        check_fields(self.as_dict())

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> TrainingConfig:
        """The configuration of the training fields in `fields` (other keys ignored)."""
        return cls(**{k: fields[k] for k in FIELD_NAMES if k in fields})

    def as_dict(self) -> dict[str, Any]:
        """Field name -> value, in declaration order."""
        return {name: getattr(self, name) for name in FIELD_NAMES}

    def grid_columns(self) -> dict[str, Any]:
        """The engine grid's columns of this configuration (`make_grid` input)."""
        return grid_columns(self.as_dict())

    def replace(self, **changes: Any) -> TrainingConfig:
        return dataclasses.replace(self, **changes)

    @property
    def dp(self) -> int:
        """Data-parallel degree: num_gpus / (tp x pp x cp), at least 1."""
        return int(parallel_layout(self.as_dict())["dp"])

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches per optimizer step per data-parallel rank."""
        return int(parallel_layout(self.as_dict())["grad_accum_steps"])


FIELDS: tuple[dataclasses.Field[Any], ...] = dataclasses.fields(TrainingConfig)
FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in FIELDS)
KNOBS: dict[str, Knob] = {f.name: f.metadata["knob"] for f in FIELDS}
DEFAULTS_BY_FIELD: dict[str, Any] = {f.name: f.default for f in FIELDS}
TYPES: dict[str, type] = {
    f.name: {"int": int, "float": float, "bool": bool, "str": str}[str(f.type)] for f in FIELDS
}
"""Each field's Python type (int, float, bool or str)."""
SWEEP_AXES: tuple[str, ...] = tuple(n for n, k in KNOBS.items() if k.sweep_axis)


def grid_columns(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Training fields (names as declared) -> grid columns (capacity_factor -> _pct)."""
    out: dict[str, Any] = {}
    for name, value in fields.items():
        target = KNOBS[name].grid if name in KNOBS else None
        if target == "capacity_factor_pct":
            out[target] = (
                int(round(value * 100))
                if np.ndim(value) == 0
                else np.rint(np.asarray(value, dtype=np.float64) * 100).astype(np.int64)
            )
        else:
            out[name] = value
    return out


def check_fields(fields: Mapping[str, Any], *, order: tuple[str, ...] | None = None) -> None:
    """ValueError naming the first field whose value is outside its choices, then the first
    outside its bounds (declaration order; NaN and infinities are outside), then the first
    broken cross-field rule (`cross_field_reason`). Fields absent or None are skipped.
    """
    names = order or tuple(fields)
    for name in names:
        knob_ = KNOBS.get(name)
        if knob_ is None or knob_.choices is None or knob_.open_choices:
            continue
        value = fields[name]
        if value is not None and value not in knob_.choices:
            raise ValueError(
                f"{name}: unknown value '{value}'; allowed: {', '.join(knob_.choices)}"
            )
    for name in FIELD_NAMES:
        if name in fields and fields[name] is not None:
            reason = bound_reason(fields[name], ge=KNOBS[name].ge, le=KNOBS[name].le)
            if reason:
                raise ValueError(f"{name}: {reason}")
    reason = cross_field_reason(fields)
    if reason:
        raise ValueError(reason)


def bound_reason(
    value: Any,
    *,
    ge: float | None = None,
    le: float | None = None,
    gt: float | None = None,
    lt: float | None = None,
) -> str | None:
    """Why a number is outside inclusive [ge, le] / exclusive (gt, lt) bounds, or not finite
    ("must be in [1, 1024], got 0"); None when it is inside (non-numbers: None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    finite = not isinstance(value, (float, np.floating)) or math.isfinite(value)
    if finite and not (
        (ge is not None and value < ge)
        or (le is not None and value > le)
        or (gt is not None and value <= gt)
        or (lt is not None and value >= lt)
    ):
        return None  # inside: no words to build
    low = f"[{_num(ge)}" if ge is not None else (f"({_num(gt)}" if gt is not None else None)
    high = f"{_num(le)}]" if le is not None else (f"{_num(lt)})" if lt is not None else None)
    if low and high:
        rule = f"must be in {low}, {high}"
    elif low:
        rule = f"must be {'>=' if ge is not None else '>'} {low[1:]}"
    elif high:
        rule = f"must be {'<=' if le is not None else '<'} {high[:-1]}"
    else:
        rule = "must be a finite number"
    return f"{rule}, got {value}"


def _num(bound: float) -> str:
    """A bound as written: 4194304, 0.5, 1e+18."""
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e15 else f"{bound:g}"


def cross_field_reason(fields: Mapping[str, Any]) -> str | None:
    """The first rule between training fields that needs no model, broken by `fields` (absent or
    None fields are not judged): interleaved stages need pipeline parallelism; QLoRA needs a
    LoRA rank; a LoRA rank needs target modules; the optimizer in backward needs one
    micro-batch per step (its gradients are freed as they are stepped)."""

    def given(name: str) -> Any:
        return fields.get(name)

    vs, pp = given("virtual_stages"), given("pp")
    if vs is not None and pp is not None and vs > 1 and pp <= 1:
        return f"virtual_stages: {vs} interleaved stages need pp > 1, got pp {pp}"
    rank = given("lora_rank")
    if given("qlora") and rank is not None and rank <= 0:
        return "qlora: needs lora_rank > 0, got 0"
    targets = given("lora_targets")
    if rank is not None and rank > 0 and targets is not None and not str(targets).strip(" ,"):
        return "lora_targets: must name at least one module (or all-linear) with lora_rank > 0"
    if given("optimizer_in_backward") and pp is not None and pp > 1:
        return f"optimizer_in_backward: needs pp 1 (one micro-batch per step), got pp {pp}"
    return rl_reason(fields)


RL_ONLY_FIELDS = (
    "rollout",
    "rollout_tp",
    "rollout_gpu_memory_utilization",
    "rollout_batch_size",
    "rollout_sleep_level",
    "ref_model",
    "rl_trainer_offload",
    "rl_max_token_len_per_gpu",
    "rl_mean_seq_len",
)
"""Fields that mean something only for an RL job: given with rl none (a value other than the
default), they are an error rather than silently ignored."""


def rl_reason(fields: Mapping[str, Any]) -> str | None:
    """The first RL rule `fields` breaks: an RL-only field changed without --rl; a rollout
    engine with dpo (no generation); a response as long as the whole sequence (seq_len is
    prompt + response)."""
    rl = fields.get("rl")
    if rl is None:
        return None
    if rl == "none":
        for name in RL_ONLY_FIELDS:
            value = fields.get(name)
            if value is not None and value != DEFAULTS_BY_FIELD[name]:
                return f"{name}: needs --rl grpo|ppo|dpo, got rl none"
        return None
    rollout = fields.get("rollout")
    if rl == "dpo" and rollout not in (None, "auto"):
        return f"rollout: dpo generates nothing (no rollout engine), got rollout {rollout}"
    tp, gpus = fields.get("rollout_tp"), fields.get("num_gpus")
    if rl != "dpo" and tp is not None and gpus is not None and gpus % tp:
        return f"rollout_tp: must divide num_gpus {gpus} (one rollout engine per group), got {tp}"
    seq, response = fields.get("seq_len"), fields.get("response_len")
    if rl != "dpo" and seq is not None and response is not None and response >= seq:
        return (
            f"response_len: must be < seq_len (prompt + response), got {response} with "
            f"seq_len {seq}"
        )
    mean = fields.get("rl_mean_seq_len")
    if mean and seq is not None and mean > seq:
        return f"rl_mean_seq_len: must be 0 or at most seq_len {seq}, got {mean}"
    packed = fields.get("rl_max_token_len_per_gpu")
    if packed and seq is not None and packed < seq:
        return (
            f"rl_max_token_len_per_gpu: must be 0 or at least seq_len {seq} (verl: max_token_len "
            f"must be greater than the sequence length), got {packed}"
        )
    return None


def parallel_layout(c: Mapping[str, Any]) -> dict[str, Any]:
    """dp, the global batch and gradient accumulation of a configuration or of grid columns
    (vectorized; the one derivation every module uses).

    dp = num_gpus // (tp x pp x cp), at least 1. global_batch_size 0 means micro_batch_size x dp
    (no accumulation): then grad_accum_steps is 1; else global // (micro x dp), which is 0 where
    the global batch is smaller than one step's micro-batches (layout_reason marks the row).
    Source: Megatron-LM megatron/training/arguments.py (data_parallel_size, num_micro_batches).
    """
    par = np.maximum(np.asarray(c["tp"]) * np.asarray(c["pp"]) * np.asarray(c["cp"]), 1)
    dp = np.maximum(np.asarray(c["num_gpus"]) // par, 1)
    given = np.asarray(c["global_batch_size"])
    micro = np.asarray(c["micro_batch_size"])
    per_step = micro * dp
    return {
        "dp": dp,
        "global_batch_size": np.where(given > 0, given, per_step),
        "grad_accum_steps": np.where(given > 0, given // np.maximum(per_step, 1), 1),
    }
