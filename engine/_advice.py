"""Advice: every single-knob change of one configuration, evaluated as one grid.

`neighbours` lists the changes (recompute, ZeRO, micro-batch with matching accumulation, tp / pp /
cp, offload, chunked loss, 8-bit AdamW, LoRA / QLoRA, activation offload, a larger GPU);
`advise` evaluates them and the current configuration in one `estimate` and one `estimate_time`
call and ranks them; `top_consumers` names the largest pieces of the current peak in words.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._config import parallel_layout
from ._data_parallel import ZERO_PARAMETERS, ZERO_STATES, is_fsdp2
from ._estimate import PHASES, estimate, layout_reason
from ._frameworks import (
    ADAPTERS_IN_PARAM_DTYPE,
    FRAMEWORK_SPECS,
    FSDP_ACCUMULATES_UNSHARDED,
    QLORA_KBIT_PREPARED,
    head_chunk_tokens,
    recipe_optimizer,
    resolved_loss,
    state_shard_degree,
)
from ._grid import FRAMEWORKS, PRECISIONS, RECOMPUTE, make_grid
from ._lora import (
    KBIT_UPCAST_BYTES,
    LORA_ADAPTER_BYTES,
    kbit_prepared_rows,
    kbit_pure_16,
    sharded_qlora_adapters_16bit,
)
from ._loss import LOSS_GRADIENT_TENSORS, megatron_in_place_loss_gradient_bytes
from ._model import ModelSpec
from ._optimizers import BUILTIN_OPTIMIZERS, OPTIMIZERS
from ._overhead import Overheads
from ._precision import COMPUTE_BYTES, IS_MIXED, PARAM_BYTES, STATE_BYTES
from ._time import estimate_time
from ._time_params import TimeParams
from ._units import GIB

LORA_ADVICE_RANK = 16
"""Rank of the LoRA / QLoRA neighbours (PEFT's common choice; all-linear targets)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuChoice:
    """One GPU as the advice sees it (the engine does not read hardware profiles itself)."""

    name: str
    usable_bytes: float
    """What torch reports as total memory; `fits` compares against it less the headroom."""
    cublas_workspace_bytes: float
    """The cuBLAS workspace of the GPU's architecture (`cublas_workspace_bytes_for`)."""
    time_kwargs: Mapping[str, float] = field(default_factory=dict)
    """The GPU keyword arguments of `estimate_time` (`time_inputs(profile)`)."""
    cuda_context_bytes: float | None = None
    """The GPU's CUDA context after a step: its profile's, else its architecture's
    (`cuda_context_bytes_for`; `overheads_for` gives both defaults). None: the estimate's
    `Overheads.cuda_context_bytes`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Neighbour:
    """One single-knob change: its words, the changed configuration and the GPU it runs on."""

    knob: str
    change: str
    config: dict[str, Any]
    gpu: str
    changes: dict[str, Any] = field(default_factory=dict)
    """The grid fields this change sets (the rest as in the current configuration)."""


def _resolved_batch(config: Mapping[str, Any]) -> tuple[int, int, int]:
    """(dp, global batch, gradient accumulation steps) exactly as `estimate` derives them."""
    mb = max(int(config["micro_batch_size"]), 1)
    layout = parallel_layout({**config, "micro_batch_size": mb})
    dp, gbs = int(layout["dp"]), int(layout["global_batch_size"])
    return dp, gbs, max(int(layout["grad_accum_steps"]), 1)


def neighbours(
    config: Mapping[str, Any],
    *,
    gpu: str,
    larger_gpus: Sequence[str] = (),
    optimizer_name: str | None = None,
) -> list[Neighbour]:
    """Every single-knob change of `config` (grid field names, categorical values as names).

    Changes that cannot apply (same value, micro-batch not divisible, ZeRO on one data-parallel
    rank, where it shards nothing) are left out; layouts the engine rejects are dropped by
    `advise`. Parallel degrees double with num_gpus fixed (dp halves) and the global batch kept,
    like the micro-batch changes (micro x accumulation x dp constant).
    """
    c = dict(config)
    changes = [*_layout_changes(c), *_memory_changes(c, optimizer_name=optimizer_name)]
    out = [
        Neighbour(knob=knob, change=words, config={**c, **fields}, gpu=gpu, changes=fields)
        for knob, words, fields in changes
    ]
    for name in larger_gpus:
        if name != gpu:
            out.append(Neighbour(knob="gpu", change=f"gpu {gpu} -> {name}", config={**c}, gpu=name))
    return out


_Change = tuple[str, str, dict[str, Any]]
"""(knob, the change in words, the grid fields it sets)."""


def _layout_changes(c: dict[str, Any]) -> list[_Change]:
    """Recompute policy, ZeRO stage, micro-batch (accumulation kept), tp / pp / cp doubled."""
    out: list[_Change] = []
    for value in RECOMPUTE:
        if value != c["recompute"]:
            out.append(
                ("recompute", f"recompute {c['recompute']} -> {value}", {"recompute": value})
            )
    dp, gbs, accum = _resolved_batch(c)
    if dp > 1:
        for stage in range(ZERO_PARAMETERS + 1):
            if stage != c["zero"]:
                out.append(("zero", f"zero {c['zero']} -> {stage}", {"zero": stage}))
    mb = int(c["micro_batch_size"])
    for div in (2, 4):
        if mb % div == 0:
            words = (
                f"micro-batch {mb} -> {mb // div}, gradient accumulation {accum} -> {accum * div}"
            )
            out.append(
                (
                    "micro_batch_size",
                    words,
                    {"micro_batch_size": mb // div, "global_batch_size": gbs},
                )
            )
    for knob in ("tp", "pp", "cp"):
        old = int(c[knob])
        if dp % 2 == 0:
            words = f"{knob} {old} -> {2 * old} (dp {dp} -> {dp // 2})"
            out.append((knob, words, {"global_batch_size": gbs, knob: 2 * old}))
    return out


def _memory_changes(c: dict[str, Any], *, optimizer_name: str | None) -> list[_Change]:
    """Offload, the chunked loss, 8-bit AdamW, LoRA / QLoRA, activation offload, 16-bit
    weights instead of autocast, the expandable-segments allocator, torch.compile of the
    blocks."""
    out: list[_Change] = []
    zero = int(c["zero"])
    if c["offload"] != "optimizer":
        new_zero = max(zero, ZERO_STATES)
        words = f"offload {c['offload']} -> optimizer"
        if new_zero != zero:
            words += f" (zero {zero} -> {new_zero})"
        out.append(("offload", words, {"offload": "optimizer", "zero": new_zero}))
    if c["offload"] != "optimizer+params":
        words = f"offload {c['offload']} -> optimizer+params"
        if zero != ZERO_PARAMETERS:
            words += f" (zero {zero} -> {ZERO_PARAMETERS})"
        out.append(("offload", words, {"offload": "optimizer+params", "zero": ZERO_PARAMETERS}))
    loss = resolved_loss(str(c["framework"]), str(c["loss"]))
    if loss not in ("chunked", "chunked-head"):  # the wrapper already chunks the head and loss
        out.append(("loss", f"loss {loss} -> chunked", {"loss": "chunked"}))
    custom = bool(c.get("optimizer_custom", False))
    if c["optimizer"] != "adamw-8bit" or custom:
        name = optimizer_name or c["optimizer"]
        reset: dict[str, Any] = {"optimizer_custom": False} if custom else {}
        out.append(
            ("optimizer", f"optimizer {name} -> adamw-8bit", {"optimizer": "adamw-8bit", **reset})
        )
    rank = int(c["lora_rank"])
    if rank <= 0:
        words = f"full fine-tuning -> LoRA rank {LORA_ADVICE_RANK}, all-linear (adapters only)"
        out.append(("lora", words, {"lora_rank": LORA_ADVICE_RANK, "lora_targets": "all-linear"}))
    if not c["qlora"]:
        new_rank = rank if rank > 0 else LORA_ADVICE_RANK
        words = (
            "LoRA -> QLoRA (NF4 base)"
            if rank > 0
            else f"full fine-tuning -> QLoRA rank {new_rank}, all-linear (NF4 base, adapters only)"
        )
        targets = c["lora_targets"] if rank > 0 else "all-linear"
        out.append(
            ("qlora", words, {"lora_rank": new_rank, "lora_targets": targets, "qlora": True})
        )
    if not c["activation_offload"]:
        out.append(
            ("activation_offload", "activation offload off -> on", {"activation_offload": True})
        )
    if str(c["precision"]).startswith("amp-"):  # autocast over fp32 weights -> 16-bit weights
        pure = str(c["precision"]).removeprefix("amp-")
        out.append(("precision", f"precision {c['precision']} -> {pure}", {"precision": pure}))
    if c["allocator"] != "expandable-segments":
        words = "allocator native -> expandable-segments (PYTORCH_CUDA_ALLOC_CONF)"
        out.append(("allocator", words, {"allocator": "expandable-segments"}))
    if c["compile"] == "none":
        out.append(("compile", "compile none -> blocks", {"compile": "blocks"}))
    load = str(c.get("load", "auto"))
    resolved = FRAMEWORK_SPECS[str(c["framework"])].load if load == "auto" else load
    if resolved in ("full-state-dict", "cpu-full-state-dict"):
        words = f"load {resolved} -> meta-init (rank 0 reads the checkpoint, shards stream out)"
        out.append(("load", words, {"load": "meta-init"}))
    return out


def combinations(singles: Sequence[Neighbour], *, max_changes: int) -> list[Neighbour]:
    """Compositions of 2..max_changes single changes on different knobs that agree on every
    field they both set (LoRA and QLoRA count as one knob), on the current GPU: a larger GPU is
    offered alone."""
    family = {"qlora": "lora"}
    out: list[Neighbour] = []

    def compatible(a: Neighbour, b: Neighbour) -> bool:
        if family.get(a.knob, a.knob) == family.get(b.knob, b.knob):
            return False
        shared = a.changes.keys() & b.changes.keys()
        return all(a.changes[k] == b.changes[k] for k in shared)

    same_gpu = [n for n in singles if n.knob != "gpu"]
    # Pairwise compatibility and each single's base configuration, once (not per combination).
    ok = [[compatible(a, b) for b in same_gpu] for a in same_gpu]
    bases = [{k: v for k, v in n.config.items() if k not in n.changes} for n in same_gpu]
    for size in range(2, max_changes + 1):
        for idx in itertools.combinations(range(len(same_gpu)), size):
            if not all(ok[i][j] for i, j in itertools.combinations(idx, 2)):
                continue
            combo = [same_gpu[i] for i in idx]
            changes: dict[str, Any] = {}
            for n in combo:
                changes.update(n.changes)
            out.append(
                Neighbour(
                    knob="+".join(n.knob for n in combo),
                    change=" + ".join(n.change for n in combo),
                    config={**bases[idx[0]], **changes},
                    gpu=combo[0].gpu,
                    changes=changes,
                )
            )
    return out


def advise(
    m: ModelSpec,
    config: Mapping[str, Any],
    *,
    gpu: GpuChoice,
    catalogue: Sequence[GpuChoice] = (),
    headroom: float = 0.10,
    overheads: Overheads | None = None,
    time_params: TimeParams | None = None,
    max_changes: int = 3,
    optimizer_name: str | None = None,
) -> dict[str, Any]:
    """Evaluate every neighbour of `config` in one grid; rank them.

    `catalogue`: GPUs to consider; those with more usable memory than `gpu` become neighbours.
    The grid holds the current configuration, every single change and every composition of up
    to `max_changes` of them (see `combinations`); the compositions are reported only when no
    single change fits, and then only the minimal fitting ones (no fitting part).
    Returns {"current": the current row's estimate (one-row columns), "advice": [ {knob, change,
    changes (the fields set), config, gpu, num_changes, saved_bytes (current peak_device_bytes
    - the neighbour's), peak_device_bytes, fits, step_time_ratio (neighbour / current step
    time)} ] ranked: fitting first, then least slowdown, then most bytes saved}.
    Assumes: every row with its own GPU's usable memory, cuBLAS workspace and step-time inputs;
    the other overheads shared.
    """
    ov = overheads or Overheads()
    by_name = {g.name: g for g in (gpu, *catalogue)}
    larger = [g.name for g in catalogue if g.usable_bytes > gpu.usable_bytes]
    singles = neighbours(config, gpu=gpu.name, larger_gpus=larger, optimizer_name=optimizer_name)
    rows, grid = _candidates(m, config, gpu=gpu.name, singles=singles, max_changes=max_changes)
    gpus = [by_name[r.gpu] for r in rows]
    out = _estimate_on_own_gpus(m, grid, gpus, headroom=headroom, overheads=ov)
    time_kwargs = {
        key: np.array([g.time_kwargs[key] for g in gpus], dtype=np.float64)
        for key in gpu.time_kwargs
    }
    step = (
        estimate_time(m, grid, **time_kwargs, params=time_params)["step_time_s"]
        if time_kwargs
        else np.full(len(rows), np.nan)
    )
    # What a change saves is judged on the binding peak: the step's or, where larger, the load's.
    peak = np.maximum(out["peak_device_bytes"], out["peak_load_bytes"])
    items: list[dict[str, Any]] = []
    for i, r in enumerate(rows[1:], start=1):
        items.append(
            {
                "knob": r.knob,
                "change": r.change,
                "changes": r.changes,
                "config": r.config,
                "gpu": r.gpu,
                "num_changes": r.knob.count("+") + 1,
                "saved_bytes": int(round(peak[0])) - int(round(peak[i])),
                "peak_device_bytes": int(round(out["peak_device_bytes"][i])),
                "fits": bool(out["fits"][i]),
                "step_time_ratio": float(step[i] / step[0]),
            }
        )
    return {"current": {k: v[:1] for k, v in out.items()}, "advice": _ranked(items)}


def _candidates(
    m: ModelSpec,
    config: Mapping[str, Any],
    *,
    gpu: str,
    singles: list[Neighbour],
    max_changes: int,
) -> tuple[list[Neighbour], dict[str, np.ndarray]]:
    """(rows, their grid): the current configuration first, then the single changes the engine
    accepts and their compositions (combinations), invalid layouts dropped."""
    current = Neighbour(knob="", change="", config=dict(config), gpu=gpu)
    rows = [current, *singles]
    probe = make_grid({k: [r.config[k] for r in rows] for k in config})
    ok = layout_reason(m, probe) == 0
    singles = [n for n, good in zip(singles, ok[1:], strict=True) if good]
    rows = [current, *singles, *combinations(singles, max_changes=max_changes)]
    grid = make_grid({k: [r.config[k] for r in rows] for k in config})
    valid = layout_reason(m, grid) == 0
    valid[0] = True
    keep = np.flatnonzero(valid)
    return [rows[i] for i in keep], {k: v[keep] for k, v in grid.items()}


def _estimate_on_own_gpus(
    m: ModelSpec,
    grid: dict[str, np.ndarray],
    gpus: list[GpuChoice],
    *,
    headroom: float,
    overheads: Overheads,
) -> dict[str, np.ndarray]:
    """estimate() of every row with its own GPU's usable memory, cuBLAS workspace (additive
    to reserved, device and framework overhead) and CUDA context (additive to device, the load
    peak and framework overhead); fits and headroom against its own memory."""
    usable = np.array([g.usable_bytes for g in gpus], dtype=np.float64)
    out = estimate(m, grid, usable_bytes=usable, headroom=headroom, overheads=overheads)
    ws = np.array([g.cublas_workspace_bytes for g in gpus], dtype=np.float64)
    extra = ws - overheads.cublas_workspace_bytes
    for key in ("peak_reserved_bytes", "peak_device_bytes", "framework_overhead"):
        out[key] = out[key] + extra
    context = np.array(
        [
            overheads.cuda_context_bytes if g.cuda_context_bytes is None else g.cuda_context_bytes
            for g in gpus
        ],
        dtype=np.float64,
    )
    context_extra = context - overheads.cuda_context_bytes
    for key in ("peak_device_bytes", "peak_load_bytes", "framework_overhead"):
        out[key] = out[key] + context_extra
    limit = usable * (1.0 - headroom)
    out["headroom_bytes"] = limit - np.maximum(out["peak_device_bytes"], out["peak_load_bytes"])
    out["fits"] = (out["headroom_bytes"] >= 0) & (out["reason"] == 0)
    return out


def _ranked(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The single changes (and, when none fits, the minimal fitting compositions) ranked:
    fitting first, then least slowdown, then most bytes saved."""
    single = [a for a in items if a["num_changes"] == 1]
    if not any(a["fits"] for a in single):
        fitting = [a for a in items if a["num_changes"] > 1 and a["fits"]]
        fitting_sets = [frozenset(a["change"].split(" + ")) for a in fitting]
        minimal = [
            a
            for a, parts in zip(fitting, fitting_sets, strict=True)
            if not any(other < parts for other in fitting_sets)
        ]
        single += minimal

    def rank(item: dict[str, Any]) -> tuple[bool, float, int]:
        ratio = item["step_time_ratio"]
        return (not item["fits"], np.inf if np.isnan(ratio) else ratio, -item["saved_bytes"])

    return sorted(single, key=rank)


def _dtype(nbytes: float) -> str:
    return {4.0: "fp32", 2.0: "16-bit", 1.0: "8-bit"}.get(float(nbytes), f"{nbytes:g}-byte")


def top_consumers(
    m: ModelSpec,
    config: Mapping[str, Any],
    out: Mapping[str, np.ndarray],
    *,
    row: int = 0,
    optimizer_name: str | None = None,
) -> list[tuple[str, float]]:
    """The pieces of the current peak named in words, largest first: (words, bytes).

    Splits `activations` into saved activations and autocast weight copies, and `transient` at a
    backward peak on the loss stage into the loss gradients (two fp32 [tokens, vocab] tensors)
    and the rest; at an optimizer-step peak into the step temporaries and the rest.
    """

    def at(key: str) -> float:
        return float(np.asarray(out[key]).reshape(-1)[row])

    prec = PRECISIONS.index(str(config["precision"]))
    lora = int(config["lora_rank"]) > 0
    items: list[tuple[str, float]] = []
    weights = _weights_words(config, prec)
    items.append((f"parameters ({weights}, {m.num_parameters / 1e9:.2f}B)", at("parameters")))
    items.append(("fp32 master weights", at("master_weights")))
    items.append((_gradients_words(config, at, lora=lora), at("gradients")))
    states = _optimizer_states_words(config, prec=prec, lora=lora)
    name = optimizer_name or _recipe_optimizer_name(config)
    items.append((f"optimizer states ({name}, {states})", at("optimizer_states")))
    acts = at("activations")
    copies = at("activations_autocast_weight_copies") if acts > 0 else 0.0
    items.append(("activations saved for backward", acts - copies))
    items.append(("autocast weight copies (16-bit casts of the fp32 weights)", copies))
    items.extend(_transient_items(m, config, at))
    items.append(
        ("framework overhead (CUDA context, cuBLAS workspace, NCCL)", at("framework_overhead"))
    )
    items.append((_fragmentation_words(at), at("fragmentation")))
    items = [(k, v) for k, v in items if v > 0.5]
    return sorted(items, key=lambda kv: -kv[1])


def _fragmentation_words(at: Callable[[str], float]) -> str:
    """Fragmentation, with the load's cached blocks where the load's device peak is the row's
    (engine/_load.py cached_load_reserve_bytes raised the step's to it)."""
    try:
        load = at("peak_load_bytes")
    except KeyError:  # a caller without the load's columns
        return "allocator fragmentation"
    if load >= at("peak_device_bytes") > 0:
        return (
            "allocator cache: the load's freed blocks, still reserved (the load peaked above "
            "the step), and fragmentation"
        )
    return "allocator fragmentation"


def _gradients_words(config: Mapping[str, Any], at: Callable[[str], float], *, lora: bool) -> str:
    """The gradients, with why they are whole where FSDP accumulates them unsharded over the
    micro-batches (engine/_data_parallel.py unsharded_accumulated_gradient_bytes) at a forward
    or backward peak."""
    words = "gradients" + (" of the LoRA adapters" if lora else "")
    fw = FRAMEWORKS.index(str(config["framework"]))
    steps = int(at("num_microbatches"))
    shards = state_shard_degree(at("dp"), int(config["cp"]), int(config.get("dp_shard", 0)))
    fsdp = int(config["zero"]) >= ZERO_PARAMETERS and float(shards) > 1
    in_step = PHASES[int(at("peak_phase"))] != "optimizer_step"
    if FSDP_ACCUMULATES_UNSHARDED[fw] and fsdp and steps > 1 and in_step:
        words += (
            f" (unsharded: accumulated over {steps} micro-batches with gradient sync off, "
            "FSDP no_sync)"
        )
    return words


def _weights_words(config: Mapping[str, Any], prec: int) -> str:
    """What the parameters' bytes are: the NF4 base (QLoRA); FSDP2's fp32 shards under mixed
    precision (the master copy itself, gathered as 16-bit per block: engine/_data_parallel.py
    model_state_element_bytes); other shards; or whole working weights."""
    if config["qlora"]:  # the unquantised modules (embeddings, head, norms)
        fw = FRAMEWORKS.index(str(config["framework"]))
        prepared = kbit_prepared_rows(QLORA_KBIT_PREPARED[fw], zero=int(config["zero"]))
        upcast = kbit_pure_16(prec, prepared=prepared)
        rest = np.where(upcast, KBIT_UPCAST_BYTES, PARAM_BYTES[prec])
        return f"NF4 base weights, {_dtype(float(rest))} rest"
    zero = int(config["zero"])
    fsdp2 = bool(is_fsdp2(np.array([FRAMEWORKS.index(str(config["framework"]))]), zero)[0])
    if fsdp2 and IS_MIXED[prec]:
        return "fp32 shards, the master copy; gathered in 16 bits per block"
    kind = "sharded working weights" if zero >= ZERO_PARAMETERS else "working weights"
    return f"{_dtype(PARAM_BYTES[prec])} {kind}"


def _recipe_optimizer_name(config: Mapping[str, Any]) -> str:
    """The optimizer the stack's recipe builds (engine/_frameworks.py recipe_optimizer: litgpt's
    QLoRA swaps in PagedAdamW), by name."""
    code = recipe_optimizer(
        np.array([OPTIMIZERS.index(str(config["optimizer"]))]),
        fw=np.array([FRAMEWORKS.index(str(config["framework"]))]),
        qlora=np.array([bool(config["qlora"]) and int(config["lora_rank"]) > 0]),
    )
    return OPTIMIZERS[int(code[0])]


def _optimizer_states_words(config: Mapping[str, Any], *, prec: int, lora: bool) -> str:
    """What the optimizer keeps per parameter, in words (the registry's spec or the user's;
    a built-in's own state dtype, as engine/_optimizers.py state_element_bytes reads it)."""
    spec = BUILTIN_OPTIMIZERS[_recipe_optimizer_name(config)]
    custom = bool(config.get("optimizer_custom", False))
    custom_e = float(config.get("optimizer_state_bytes", 0.0)) if custom else 0.0
    n = float(config["optimizer_num_states"]) if custom else spec.num_states
    plural = "s" if n != 1 else ""
    if spec.eight_bit_blockwise or (custom and bool(config.get("optimizer_eight_bit"))):
        return f"{n:g} 8-bit blockwise state{plural} per parameter"
    if spec.factored_second_moment and not custom:
        return "factored fp32 second moments"
    # LoRA: peft's fp32 adapters, or adapters in the model's dtype (FrameworkSpec).
    fw = FRAMEWORKS.index(str(config["framework"]))
    in_param_dtype = ADAPTERS_IN_PARAM_DTYPE[fw] or bool(
        sharded_qlora_adapters_16bit(
            QLORA_KBIT_PREPARED[fw], qlora=bool(config["qlora"]), zero=int(config["zero"])
        )
    )
    adapter_e = PARAM_BYTES[prec] if in_param_dtype else LORA_ADAPTER_BYTES
    elem = custom_e or spec.state_bytes or (adapter_e if lora else STATE_BYTES[prec])
    return f"{n:g} {_dtype(elem)} state{plural} per parameter"


def _transient_items(
    m: ModelSpec, config: Mapping[str, Any], at: Callable[[str], float]
) -> list[tuple[str, float]]:
    """`transient` split at a backward peak on the loss stage into the loss gradients and the
    rest; at an optimizer-step peak into the step temporaries and the rest."""
    phase = PHASES[int(at("peak_phase"))]
    transient = at("transient")
    items: list[tuple[str, float]] = []
    named = 0.0
    pp = int(config["pp"])
    last_stage = pp == 1 or int(at("pp_stage")) == pp - 1
    # A framework's own loss over head chunks (LitGPT) has no fp32 [T, v] gradients.
    fw_code = FRAMEWORKS.index(str(config["framework"]))
    own_chunks = head_chunk_tokens(fw_code, int(config["lora_rank"])) > 0
    loss = resolved_loss(str(config["framework"]), str(config["loss"]))
    # The two fp32 [T, v] tensors are the eager loss's (loss_gradient_bytes); Megatron's
    # in-place softmax has its own (megatron_in_place_loss_gradient_bytes); a compiled loss or
    # a fused one writing into its logits (verl) none.
    fw_spec = FRAMEWORK_SPECS[str(config["framework"])]
    in_place_softmax = fw_spec.loss_softmax_in_place
    eager_loss = not (
        fw_spec.loss_logits_in_place or str(config.get("compile", "none")) == "blocks+loss"
    )
    if phase == "backward" and loss == "full" and last_stage and not own_chunks and eager_loss:
        tokens = int(config["micro_batch_size"]) * int(config["seq_len"]) / int(config["cp"])
        tp_div = int(config["tp"]) if fw_spec.tp_loss_gradients_sharded else 1
        shape = f"[{int(tokens):,}, {m.vocab_size // tp_div:,}]"
        if in_place_softmax:
            e = COMPUTE_BYTES[PRECISIONS.index(str(config["precision"]))]
            loss_grads = float(
                megatron_in_place_loss_gradient_bytes(m, T=tokens, e=e, loss_tp_div=tp_div)
            )
            what = (
                f"the loss gradient's copy for the output layer over a {m.vocab_size:,}-token "
                f"vocabulary (the in-place cross entropy writes it into its saved fp32 "
                f"softmax, {shape}, then casts it)"
            )
        else:
            loss_grads = LOSS_GRADIENT_TENSORS * 4.0 * tokens * m.vocab_size / tp_div
            what = (
                f"the fp32 loss gradients over a {m.vocab_size:,}-token vocabulary "
                f"(two {shape} tensors at the start of backward)"
            )
        # A peak whose transients are smaller than the loss gradients is not at that moment
        # (a later block's backward): nothing of it is named the loss's.
        if loss_grads <= transient:
            named = loss_grads
            items.append((what, named))
    elif phase == "optimizer_step":
        named = min(at("optimizer_step_temporaries"), transient)
        items.append((f"optimizer-step temporaries ({config['optimizer']})", named))
    items.append(
        (f"other transient buffers at the {phase.replace('_', ' ')} peak", transient - named)
    )
    return items


def describe_bytes(num_bytes: float) -> str:
    """GiB (2**30) with two decimals."""
    return f"{num_bytes / GIB:.2f} GiB"
