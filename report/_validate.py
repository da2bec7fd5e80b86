"""Checks of command-line values shared by every command: one-line ValueErrors (exit code 2)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from trainmem.engine import (
    KNOBS,
    PRECISION_RATES,
    PRECISIONS,
    ModelSpec,
    bound_reason,
    cross_field_reason,
    lora_mask,
    lora_num_parameters,
    max_lora_rank,
    precision_arch_runs,
    precision_archs_text,
)
from trainmem.hardware import GpuProfile

from ._options import Option

VOCABULARIES: dict[str, tuple[str, ...]] = {
    name: knob.choices
    for name, knob in KNOBS.items()
    if knob.choices is not None and not knob.open_choices
}
"""The closed vocabularies of the training fields (TrainingConfig), by field; optimizers are
open (built-in or user files: see optimizer_columns)."""


def choice(field: str, value: str, allowed: tuple[str, ...]) -> str:
    """`value` if it is one of `allowed`, else a ValueError naming the field and the choices."""
    if value not in allowed:
        raise ValueError(f"{field}: unknown value '{value}'; allowed: {', '.join(allowed)}")
    return value


def check_choices(values: Mapping[str, str]) -> None:
    """`choice` for each named field of VOCABULARIES, in the order given."""
    for field, value in values.items():
        choice(field, value, VOCABULARIES[field])


def check_headroom(headroom: float) -> float:
    """The fraction of usable memory kept free: in [0, 1)."""
    if not 0.0 <= headroom < 1.0:  # NaN fails too
        raise ValueError(f"headroom: must be in [0, 1), got {headroom}")
    return headroom


def check_options(options: Sequence[Option], values: Mapping[str, Any]) -> None:
    """ValueError naming the first option (declaration order) whose value is outside its
    choices (closed training vocabularies first), then outside its bounds (`ge`/`le`/`gt`/
    `lt`; NaN and infinities are outside), then a broken cross-field rule of the training
    fields. Options absent from `values` or None are not judged."""
    given = {o.name: values[o.name] for o in options if values.get(o.name) is not None}
    for o in options:
        if o.name in VOCABULARIES and o.name in given:
            choice(o.name, given[o.name], VOCABULARIES[o.name])
    for o in options:
        if o.name in given:
            reason = bound_reason(given[o.name], ge=o.ge, le=o.le, gt=o.gt, lt=o.lt)
            if reason:  # a flag spelled unlike the name is named too (--max-step-time)
                dashed = "--" + o.name.replace("_", "-")
                also = f" ({o.flag})" if o.flag and o.flag != dashed else ""
                raise ValueError(f"{o.name}{also}: {reason}")
    reason = cross_field_reason({k: v for k, v in given.items() if k in KNOBS})
    if reason:
        raise ValueError(reason)


def gpu_precisions(profile: GpuProfile) -> tuple[str, ...]:
    """The precisions `profile` runs: those whose every matmul format (PRECISION_RATES) has a
    rate above 0 in the GPU's profile (`bf16_flops`, `fp8_flops`, `fp4_flops`, ...) and whose
    block-scaled GEMMs its architecture runs (mxfp8, nvfp4: engine precision_arch_runs)."""
    return tuple(
        p
        for p in PRECISIONS
        if all(profile.peak_flops(r) > 0 for r in PRECISION_RATES[p])
        and precision_arch_runs(p, profile.arch)
    )


def precision_reason(precision: str, profile: GpuProfile) -> str | None:
    """Why `profile` cannot run `precision` (a matmul format its profile rates 0: bf16 before
    Ampere, fp8 before Ada/Hopper), naming the GPU and the precisions it runs; None if it can
    (or the precision is unknown: its own check names it)."""
    lacking = [r for r in PRECISION_RATES.get(precision, ()) if not profile.peak_flops(r) > 0]
    if not lacking and not precision_arch_runs(precision, profile.arch):
        return (
            f"precision: {precision} needs Blackwell block-scaled tensor cores "
            f"({precision_archs_text(precision)}) and gpu {profile.name} is {profile.arch}; "
            f"allowed on {profile.name}: {', '.join(gpu_precisions(profile))}"
        )
    if not lacking:
        return None
    return (
        f"precision: {precision} needs {lacking[0]} matmuls and gpu {profile.name} has none "
        f"({lacking[0]}_flops = 0); allowed on {profile.name}: {', '.join(gpu_precisions(profile))}"
    )


def check_precision(precision: str, profile: GpuProfile) -> None:
    """precision_reason as a ValueError."""
    reason = precision_reason(precision, profile)
    if reason:
        raise ValueError(reason)


PRECISION_GIVEN: ContextVar[bool] = ContextVar("precision_given", default=False)
"""True while a command runs whose precision the user named (`--precision`, an HTTP body's
`precision`, a Python keyword: precision_given): a precision the user named is never swapped
for its fp16 counterpart, only refused."""


@contextlib.contextmanager
def precision_given(named: bool) -> Iterator[None]:
    """PRECISION_GIVEN set to `named` while the block runs (the CLI's commands, the HTTP
    service's workers and the Python API's verbs)."""
    token = PRECISION_GIVEN.set(bool(named))
    try:
        yield
    finally:
        PRECISION_GIVEN.reset(token)


def runnable_precision(
    precision: str, profiles: Sequence[GpuProfile], *, default: str | Sequence[str]
) -> tuple[str, list[str]]:
    """The precision a job runs on `profiles` (one GPU, or a fleet's pools) and the warning
    when it is not the one asked: `precision` if some GPU runs it; the precision left at its
    `default` (amp-bf16, mixed-bf16) and run by none (V100, T4: no bf16) becomes its fp16
    counterpart, said in a warning (not when the user named it: PRECISION_GIVEN); any other
    precision no GPU runs is a ValueError naming the first GPU and the precisions it runs
    (check_precision)."""
    if not profiles or any(precision_reason(precision, g) is None for g in profiles):
        return precision, []
    counterpart = precision.replace("bf16", "fp16")
    runs_counterpart = any(precision_reason(counterpart, g) is None for g in profiles)
    defaults = (default,) if isinstance(default, str) else tuple(default)
    if PRECISION_GIVEN.get():  # named on the command line: the user's choice, not a default
        defaults = ()
    if precision in defaults and counterpart != precision and runs_counterpart:
        names = ", ".join(dict.fromkeys(g.name for g in profiles))
        return counterpart, [
            f"precision: {names} has no bf16 (bf16_flops = 0): the default {precision} is "
            f"estimated as {counterpart} (--precision chooses another)"
        ]
    check_precision(precision, profiles[0])
    return precision, []  # not reached: check_precision raised


def seq_len_warnings(spec: ModelSpec, seq_len: int, *, allow_long_seq: bool) -> list[str]:
    """A sequence beyond the model's `max_position_embeddings`: a ValueError for learned
    absolute positions (GPT-2, BERT: the table has no row for it) unless `allow_long_seq`
    (then a warning), a warning for rotary positions (they can be scaled: YaRN, NTK); [] when
    it is within the positions (a traced profile's model has no positions to judge)."""
    limit = spec.max_position_embeddings
    if spec.profile is not None or limit <= 0 or seq_len <= limit:
        return []
    beyond = f"seq_len: {seq_len} tokens exceed {spec.name}'s {limit} positions"
    if spec.learned_positions and not allow_long_seq:
        raise ValueError(
            f"{beyond} (learned position embeddings, max_position_embeddings rows; allowed: up "
            f"to {limit}, or --allow-long-seq)"
        )
    if spec.learned_positions:
        return [f"{beyond}: estimated as given (the learned position table keeps {limit} rows)"]
    return [f"{beyond} (max_position_embeddings): it needs RoPE scaling (e.g. YaRN)"]


def check_lora_rank(spec: ModelSpec, lora_rank: int, lora_targets: str) -> None:
    """ValueError when a LoRA rank exceeds the smaller side of an adapted matrix (an adapter
    of a larger rank only adds parameters; engine max_lora_rank), naming the largest allowed;
    or when the targets adapt none of the model's linears (a VLM tower's name on a text model:
    peft's get_peft_model refuses target modules it does not find)."""
    if lora_rank <= 0:
        return
    if lora_num_parameters(spec, lora_rank, lora_mask(lora_targets)) == 0:
        raise ValueError(
            f"lora_targets: {lora_targets!r} adapts none of {spec.name}'s linears "
            "(peft: target modules not found in the base model)"
        )
    limit = max_lora_rank(spec, lora_mask(lora_targets))
    if limit is not None and lora_rank > limit:
        raise ValueError(
            f"lora_rank: {lora_rank} exceeds the smaller side of {spec.name}'s adapted matrices "
            f"(allowed: 1 to {limit})"
        )


def check_overhead_bytes(overrides: Mapping[str, float], profile: GpuProfile) -> None:
    """ValueError when an overhead in bytes exceeds the GPU's whole memory (nothing could fit:
    a typo such as cuda_context_bytes=1e300), naming the key and the allowed range."""
    for key, value in overrides.items():
        if "bytes" in key and value > profile.memory_bytes:
            raise ValueError(
                f"overhead: {key}={value:g} exceeds gpu {profile.name}'s memory (allowed: 0 to "
                f"{profile.memory_bytes} bytes)"
            )


def key_numbers(flag: str, items: list[str], keys: tuple[str, ...]) -> dict[str, float]:
    """KEY=NUMBER items of a repeatable flag (--overhead, --time-param) as a dict."""
    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[key.strip()] = float(value)
        except ValueError:
            raise ValueError(
                f"{flag}: expected KEY=NUMBER, got '{item}'; keys: {', '.join(keys)}"
            ) from None
    return out
