"""Activation profiles: per-layer coefficients measured by `trainmem trace`, for architectures
the formulas do not know.

A profile is a JSON file (format "trainmem-profile", version 1):

    {"format": "trainmem-profile", "version": 1, "name": str,
     "source": {"command": str, "torch": str, "traced_seq_lens": [s1, s2],
                "micro_batch_size": int, "created": ISO date},
     "valid_for": {"precision": str, "recompute": "none"|"full", "attention": str},
     "num_layers": int, "layer_class": str,
     "parameters": {"per_layer": int, "outside_layers": int, "trainable": int},
     "activation_bytes": {"per_layer": COEFFICIENTS, "outside_layers": COEFFICIENTS},
     "transient_bytes": COEFFICIENTS,
     "transient_phase": "forward"|"backward"|"backward_end",   (optional, default "backward")
     "hidden_size": int}                          (optional)

    COEFFICIENTS = {"per_token": float, "per_token_sq": float, "constant": float}
                   ("constant" optional, default 0)

Parameters are element counts. The bytes of a micro-batch of b sequences of length s are
b * (per_token * s + per_token_sq * s^2) + constant (per layer for "per_layer"). "constant" is
the part that does not grow with the micro-batch (autocast's cached 16-bit weight copies, rng
state, allocator rounding). Activation bytes are those saved for backward at the end of the
forward pass. Transient bytes are what the step's forward/backward peak holds beyond the model
states and the activations, at the phase `transient_phase` names: "forward" (the loss) or
"backward" (its start, no gradients yet): the peak less parameters, optimizer states and those
activations; "backward_end" (the gradients exist, the activations are mostly freed): the peak
less parameters, optimizer states and the gradients alive at the peak.
`hidden_size` is the width of a block's input per token (pipeline receive buffers, DeepSpeed
buckets); without it the engine takes sqrt(parameters per layer / 12), a standard block's
12 h^2 parameters.

A profile estimates only the configurations it was traced for: the precision, recompute policy
and attention of `valid_for`, tp = cp = ep = 1, no LoRA/QLoRA, the full loss. Other rows get the
reason "profile: ..." (engine._estimate.REASONS). Model states (ZeRO 1-3, FSDP, offload,
optimizers, pipeline splits of the layers) come from the parameter counts, as for any model.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ._grid import ATTENTION, PRECISIONS
from ._model import ModelSpec

FORMAT = "trainmem-profile"
VERSION = 1
RECOMPUTE_TRACED = ("none", "full")
PHASES_TRACED = ("forward", "backward", "backward_end")
VALID_FOR = {"precision": PRECISIONS, "recompute": RECOMPUTE_TRACED, "attention": ATTENTION}
"""The allowed values of each `valid_for` field of a profile."""
PARAMETERS_PER_LAYER_PER_H2 = 12.0
"""A standard transformer block holds 12 h^2 parameters (attention 4 h^2, MLP 8 h^2): the width
taken for a profile without `hidden_size`. Source: Narayanan et al. 2021 Sec. 5.1 (P = 12 l h^2)."""

TRACE_KEYS = (
    "seq_len",
    "micro_batch_size",
    "num_layers",
    "layer_class",
    "parameters_per_layer",
    "parameters_outside_layers",
    "trainable_parameters",
    "activations_per_layer_bytes",
    "activations_outside_layers_bytes",
    "transient_bytes",
)
"""What `derive_profile` needs of each traced step. Optional: "transient_phase" or "peak_phase"
(forward or backward, of the forward/backward peak), "gradients_at_peak_bytes" (.grad bytes alive
at that peak; > 0 means the peak is in backward with gradients made), and the autocast weight
copies counted apart ("activations_autocast_weight_copies_bytes", "..._in_layers_bytes")."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Coefficients:
    """Bytes of a micro-batch of b sequences of length s: b (per_token s + per_token_sq s^2) +
    constant."""

    per_token: float
    per_token_sq: float
    constant: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationProfile:
    """The measured part of a profile the engine estimates with (see the module docstring)."""

    precision: str
    recompute: Literal["none", "full"]
    attention: str
    per_layer: Coefficients
    """Saved for backward by one layer."""
    outside_layers: Coefficients
    """Saved for backward outside the layers (embeddings, head, loss)."""
    transient: Coefficients
    transient_phase: Literal["forward", "backward", "backward_end"] = "backward"
    num_parameters_per_layer: int
    num_parameters_outside_layers: int

    @property
    def valid_for_text(self) -> str:
        """The rows this profile describes, in words (for error messages)."""
        return (
            f"precision {self.precision}, recompute {self.recompute}, attention {self.attention}; "
            "tp, cp, ep and etp 1, no lora or qlora, loss full"
        )


# ---- deriving a profile from two traced steps ----------------------------------------------


def _fit(seq_lens: tuple[int, int], micro: tuple[int, int], values: tuple[float, float]):
    """Coefficients through two measurements y_i = b_i (a s_i + c s_i^2), solved exactly.

    Source: the two linear equations in (a, c); Cramer's rule.
    Assumes: c >= 0 (attention scores grow with s^2, nothing shrinks). A negative c comes from
    allocator rounding (512-byte blocks) or a part that does not grow with the micro-batch
    (autocast's weight copies, rng seeds): then c = 0 and the two equations are solved for
    y_i = b_i a s_i + K instead (K the `constant`), exact at both traced sizes. A negative K or a
    (noise only) is clamped to 0, keeping the larger per-token rate (an upper bound).
    """
    (s1, s2), (b1, b2), (y1, y2) = seq_lens, micro, values
    t1, t2 = b1 * s1, b2 * s2  # tokens
    det = t1 * b2 * s2**2 - t2 * b1 * s1**2
    a = (y1 * b2 * s2**2 - y2 * b1 * s1**2) / det
    c = (t1 * y2 - t2 * y1) / det
    if c >= 0.0 and a >= 0.0:
        return {"per_token": a, "per_token_sq": c, "constant": 0.0}
    if c >= 0.0:  # a < 0: convex data through the origin, keep the quadratic part only
        return {
            "per_token": 0.0,
            "per_token_sq": max(y1 / (b1 * s1**2), y2 / (b2 * s2**2)),
            "constant": 0.0,
        }
    # c < 0: rounding (tiny) or a size-independent part; clamp c to 0 and fit a constant.
    rate = max(y1 / t1, y2 / t2)
    if t1 == t2:
        return {"per_token": rate, "per_token_sq": 0.0, "constant": 0.0}
    a = (y2 - y1) / (t2 - t1)
    k = y1 - a * t1
    if k < 0.0 or a < 0.0:
        return {"per_token": rate, "per_token_sq": 0.0, "constant": 0.0}
    return {"per_token": a, "per_token_sq": 0.0, "constant": k}


def _trace_number(trace: dict[str, Any], key: str, which: str) -> float:
    value = trace.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"trace {which}: {key}: must be a finite number, got {value!r}")
    if value < 0:
        raise ValueError(f"trace {which}: {key}: must be >= 0, got {value}")
    return float(value)


def _optional(trace: dict[str, Any], key: str, which: str) -> float:
    return _trace_number(trace, key, which) if key in trace else 0.0


def derive_profile(
    trace_a: dict[str, Any],
    trace_b: dict[str, Any],
    *,
    name: str,
    source: dict[str, Any],
    valid_for: dict[str, Any],
) -> dict[str, Any]:
    """A profile (a JSON-able dict, validated) from two traced steps at different lengths.

    Each trace holds TRACE_KEYS: seq_len, micro_batch_size, num_layers, layer_class,
    parameters_per_layer, parameters_outside_layers, trainable_parameters (element counts),
    activations_per_layer_bytes (saved by one layer at the end of forward),
    activations_outside_layers_bytes, transient_bytes (max(forward peak, backward peak) less
    parameters, optimizer states and the activations), and optionally peak_phase ("forward" or
    "backward"; "transient_phase" first if given), activations_autocast_weight_copies_bytes and
    activations_autocast_weight_copies_in_layers_bytes (when the activations above leave
    autocast's weight copies out: added to the `constant` terms, in the layers and outside),
    and
    gradients_at_peak_bytes (the .grad tensors alive at that peak; when the
    longer trace has some, the peak is at the end of backward: the profile's transient is then
    the peak less parameters, optimizer states and those gradients, "backward_end"; without the
    key the gradients stay in the transient, an upper bound under ZeRO-2/3). Both traces must
    peak in the same phase. `source` gives "command" and "torch" (and may give "created");
    traced_seq_lens and micro_batch_size are taken from the traces. `valid_for` gives
    precision, recompute and attention as traced. Each term is solved from the two traces (see
    _fit).
    """
    trace_a, trace_b, seq, micro = _paired_traces(trace_a, trace_b)

    def fit(key: str) -> dict[str, float]:
        values = (_trace_number(trace_a, key, "a"), _trace_number(trace_b, key, "b"))
        return _fit(seq, micro, values)

    phase = _transient_phase(trace_a, trace_b, seq)
    if phase == "backward_end":
        _exclude_gradients(trace_a, trace_b)
    per_layer, outside = _activation_coefficients(trace_a, trace_b, fit)
    profile = {
        "format": FORMAT,
        "version": VERSION,
        "name": name,
        "source": {
            "created": datetime.date.today().isoformat(),
            **source,
            "traced_seq_lens": list(seq),
            "micro_batch_size": micro[0],
        },
        "valid_for": dict(valid_for),
        **_module_fields(trace_a),
        "activation_bytes": {"per_layer": per_layer, "outside_layers": outside},
        "transient_bytes": fit("transient_bytes"),
        "transient_phase": phase,
    }
    validate_profile(profile)
    return profile


def _activation_coefficients(
    trace_a: dict[str, Any], trace_b: dict[str, Any], fit: Callable[[str], dict[str, float]]
) -> tuple[dict[str, float], dict[str, float]]:
    """(per layer, outside the layers) activation coefficients, `fit` from the two traces.

    Autocast's weight copies, when the trace counts them apart from the activations: measured,
    not fitted (they do not grow with tokens), so they go to `constant` directly and the two
    traces still solve per_token and per_token_sq.
    """
    pair = (("a", trace_a), ("b", trace_b))
    copies = max(_optional(t, "activations_autocast_weight_copies_bytes", w) for w, t in pair)
    copies_in_layers = max(
        _optional(t, "activations_autocast_weight_copies_in_layers_bytes", w) for w, t in pair
    )
    per_layer = fit("activations_per_layer_bytes")
    per_layer["constant"] += copies_in_layers / int(trace_a["num_layers"])
    outside = fit("activations_outside_layers_bytes")
    outside["constant"] += max(copies - copies_in_layers, 0.0)
    return per_layer, outside


def _module_fields(trace: dict[str, Any]) -> dict[str, Any]:
    """The traced module's profile fields: num_layers, layer_class, parameters."""
    return {
        "num_layers": int(trace["num_layers"]),
        "layer_class": str(trace["layer_class"]),
        "parameters": {
            "per_layer": int(trace["parameters_per_layer"]),
            "outside_layers": int(trace["parameters_outside_layers"]),
            "trainable": int(trace["trainable_parameters"]),
        },
    }


def _paired_traces(
    trace_a: dict[str, Any], trace_b: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], tuple[int, int], tuple[int, int]]:
    """(shorter trace, longer trace, their sequence lengths, micro-batch sizes): copies, checked
    to hold TRACE_KEYS and to trace the same module and micro-batch at two lengths."""
    for which, trace in (("a", trace_a), ("b", trace_b)):
        missing = [k for k in TRACE_KEYS if k not in trace]
        if missing:
            raise ValueError(f"trace {which}: missing field(s): {', '.join(missing)}")
    if trace_a["seq_len"] > trace_b["seq_len"]:
        trace_a, trace_b = trace_b, trace_a
    trace_a, trace_b = dict(trace_a), dict(trace_b)  # the backward_end case rewrites copies
    for key in (
        "num_layers",
        "layer_class",
        "parameters_per_layer",
        "parameters_outside_layers",
        "trainable_parameters",
        "micro_batch_size",
    ):
        if trace_a[key] != trace_b[key]:
            raise ValueError(
                f"{key}: the two traces differ ({trace_a[key]!r} vs {trace_b[key]!r}); trace "
                "the same module and micro-batch at two sequence lengths"
            )
    seq = (int(trace_a["seq_len"]), int(trace_b["seq_len"]))
    if seq[0] == seq[1]:
        raise ValueError(f"seq_len: the two traces need different sequence lengths, got {seq[0]}")
    if seq[0] < 1:
        raise ValueError(f"seq_len: must be >= 1, got {seq[0]}")
    return trace_a, trace_b, seq, (int(trace_a["micro_batch_size"]),) * 2


def _transient_phase(trace_a: dict[str, Any], trace_b: dict[str, Any], seq) -> str:
    """The phase both traces peak in (one transient per profile: two phases would fit a line
    through unrelated points)."""

    def phase_of(trace: dict[str, Any]) -> str:
        if trace.get("gradients_at_peak_bytes"):
            return "backward_end"
        named = trace.get("transient_phase", trace.get("peak_phase"))
        return "forward" if named == "forward" else "backward"

    phase = phase_of(trace_b)
    if phase_of(trace_a) != phase:
        raise ValueError(
            f"transient_bytes: the traces peak in different phases ({phase_of(trace_a)} at "
            f"seq_len {seq[0]}, {phase} at {seq[1]}); trace two lengths on the same side"
        )
    return phase


def _exclude_gradients(trace_a: dict[str, Any], trace_b: dict[str, Any]) -> None:
    """At a backward_end peak the transient is the peak less parameters, optimizer states and
    the gradients alive at it: rewrite each trace's transient_bytes so (in place)."""
    num_layers = int(trace_a["num_layers"])
    for which, trace in (("a", trace_a), ("b", trace_b)):
        grads = (
            _trace_number(trace, "gradients_at_peak_bytes", which)
            if "gradients_at_peak_bytes" in trace
            else 0.0
        )
        acts = num_layers * _trace_number(trace, "activations_per_layer_bytes", which)
        acts += _trace_number(trace, "activations_outside_layers_bytes", which)
        acts += _optional(trace, "activations_autocast_weight_copies_bytes", which)
        transient = _trace_number(trace, "transient_bytes", which) + acts - grads
        if transient < 0:
            raise ValueError(
                f"trace {which}: gradients_at_peak_bytes: more than the peak holds beyond "
                "parameters and optimizer states"
            )
        trace["transient_bytes"] = transient


# ---- validating and loading ----------------------------------------------------------------


def _need(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise ValueError(f"profile{where}: {key}: missing")
    value = data[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise ValueError(f"profile{where}: {key}: must be {names}, got {value!r}")
    return value


def _count(data: dict[str, Any], key: str, where: str, *, minimum: int = 0) -> int:
    value = _need(data, key, int, where)
    if value < minimum:
        raise ValueError(f"profile{where}: {key}: must be an integer >= {minimum}, got {value}")
    return int(value)


def _coefficients(data: dict[str, Any], key: str, where: str) -> Coefficients:
    obj = _need(data, key, dict, where)
    inner = f"{where}: {key}" if where else f": {key}"
    out = {}
    for name in ("per_token", "per_token_sq", "constant"):
        if name == "constant" and name not in obj:
            out[name] = 0.0
            continue
        value = _need(obj, name, (int, float), inner)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"profile{inner}: {name}: must be a finite number >= 0, got {value}")
        out[name] = float(value)
    return Coefficients(**out)


def _check_source(source: dict[str, Any], inner: str) -> None:
    """The profile's `source` object: command, torch, traced_seq_lens, micro_batch_size,
    created (an ISO date)."""
    _need(source, "command", str, inner)
    _need(source, "torch", str, inner)
    lens = _need(source, "traced_seq_lens", list, inner)
    if len(lens) != 2 or not all(isinstance(v, int) and v >= 1 for v in lens):
        raise ValueError(f"profile{inner}: traced_seq_lens: must be two integers >= 1")
    _count(source, "micro_batch_size", inner, minimum=1)
    created = _need(source, "created", str, inner)
    try:
        datetime.date.fromisoformat(created[:10])
    except ValueError:
        raise ValueError(f"profile{inner}: created: must be an ISO date, got {created!r}") from None


def validate_profile(data: Any, *, where: str = "") -> ActivationProfile:
    """Check a profile's fields; one-line ValueError naming the first bad one.

    `where` (e.g. " tests/data/profiles/x.json") goes after "profile" in the messages.
    """
    if not isinstance(data, dict):
        raise ValueError(f"profile{where}: must be a JSON object")
    if data.get("format") != FORMAT:
        raise ValueError(f"profile{where}: format: must be {FORMAT!r}, got {data.get('format')!r}")
    if data.get("version") != VERSION:
        raise ValueError(f"profile{where}: version: must be {VERSION}, got {data.get('version')!r}")
    if not _need(data, "name", str, where):
        raise ValueError(f"profile{where}: name: must not be empty")
    _check_source(_need(data, "source", dict, where), f"{where}: source")
    valid = _need(data, "valid_for", dict, where)
    inner = f"{where}: valid_for"
    for key, allowed in VALID_FOR.items():
        if _need(valid, key, str, inner) not in allowed:
            choices = ", ".join(allowed)
            raise ValueError(
                f"profile{inner}: {key}: unknown value {valid[key]!r}; allowed: {choices}"
            )
    _count(data, "num_layers", where, minimum=1)
    _need(data, "layer_class", str, where)
    params = _need(data, "parameters", dict, where)
    inner = f"{where}: parameters"
    per_layer = _count(params, "per_layer", inner, minimum=1)
    outside = _count(params, "outside_layers", inner)
    trainable = _count(params, "trainable", inner)
    total = per_layer * data["num_layers"] + outside
    if trainable != total:
        raise ValueError(
            f"profile{inner}: trainable: must equal per_layer x num_layers + outside_layers "
            f"({total:,}); frozen parameters are not modelled, got {trainable:,}"
        )
    acts = _need(data, "activation_bytes", dict, where)
    per = _coefficients(acts, "per_layer", f"{where}: activation_bytes")
    out = _coefficients(acts, "outside_layers", f"{where}: activation_bytes")
    transient = _coefficients(data, "transient_bytes", where)
    phase = data.get("transient_phase", "backward")
    if phase not in PHASES_TRACED:
        raise ValueError(
            f"profile{where}: transient_phase: must be forward, backward or backward_end, "
            f"got {phase!r}"
        )
    if "hidden_size" in data:
        _count(data, "hidden_size", where, minimum=1)
    return ActivationProfile(
        precision=valid["precision"],
        recompute=valid["recompute"],
        attention=valid["attention"],
        per_layer=per,
        outside_layers=out,
        transient=transient,
        transient_phase=phase,
        num_parameters_per_layer=per_layer,
        num_parameters_outside_layers=outside,
    )


def profile_model(data: dict[str, Any], *, where: str = "") -> ModelSpec:
    """The ModelSpec (family "profile") the engine estimates a validated profile with.

    Its parameter inventory is one [per_layer] tensor per layer (group "layer") and one
    [outside_layers] tensor (group "embed", on the first pipeline stage), replicated under tensor
    parallelism; attention widths are 0 (no attention FLOPs: the step time counts 6 FLOPs per
    parameter per token); hidden_size is the profile's or sqrt(per_layer / 12).
    """
    profile = validate_profile(data, where=where)
    per_layer = profile.num_parameters_per_layer
    hidden = int(data.get("hidden_size") or 0) or max(
        1, round(math.sqrt(per_layer / PARAMETERS_PER_LAYER_PER_H2))
    )
    return ModelSpec(
        name=str(data["name"]),
        family="profile",
        model_type=str(data["layer_class"]),
        hidden_size=hidden,
        intermediate_size=0,
        num_hidden_layers=int(data["num_layers"]),
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=0,
        vocab_size=0,
        max_position_embeddings=0,
        tie_word_embeddings=False,
        mlp_act="gelu",
        gated_mlp=False,
        norm="layernorm",
        attention_bias=False,
        o_proj_bias=False,
        mlp_bias=False,
        rotary=False,
        fused_qkv=False,
        fused_gate_up=False,
        profile=profile,
    )
