"""`trainmem recommend`: the best plan for a job on a fleet, its runners-up and launch configs.

The search is the sweep's (`make_space` + `run_exhaustive`, in memory) over the layouts the
framework can launch (LAUNCHABLE). The chosen points are evaluated once more in
one vectorized call (`evaluate_columns`) for their full breakdown, so each plan equals
`trainmem estimate` run with its `estimate_command`.

When nothing fits, the report says so (`fits` false, `reason`) and describes the valid point
nearest to fitting (lowest device peak / usable memory) instead of raising: a scheduler learns
how far off the job is. The CLI then exits with code 1 (bad input: 2).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
from collections.abc import Mapping
from typing import Any

import numpy as np

from trainmem.catalog import load_model, model_config_dict, optimizer_columns
from trainmem.engine import (
    COMPONENTS,
    DEFAULTS,
    DEFAULTS_BY_FIELD,
    FIELD_NAMES,
    FRAMEWORK_SPECS,
    FRAMEWORKS,
    KNOBS,
    PRECISIONS,
    TrainingConfig,
    resolved_loss,
)
from trainmem.hardware import GIB, Fleet, FleetSource, load_gpus, parse_fleet
from trainmem.report import (
    ERROR_BAR_KEYS,
    JOB_DEFAULTS,
    check_headroom,
    check_options,
    choice,
    gib_to_bytes,
    overhead_overrides,
    training_config,
)
from trainmem.sweep import (
    SEARCH_DEFAULTS,
    SearchResult,
    extra_fields,
    parse_objectives,
    run_exhaustive,
)
from trainmem.sweep._axes import AXES, INNER_AXES, RL_AXES, SHOW, heading, shown_columns
from trainmem.sweep._axes import LAYOUT as SWEEP_LAYOUT
from trainmem.sweep._fleet_use import fleet_gpus, fleet_use, fleet_use_text
from trainmem.sweep._risk import space_risk
from trainmem.sweep._space import (
    _NAMES,
    Space,
    evaluate_columns,
    make_space,
    reason_texts,
    rows_on_pools,
)

from ._launch import DEFAULT_FRAMEWORK, TIME_RE
from ._options import RECOMMEND_OPTIONS

LAYOUT = SWEEP_LAYOUT
"""Columns that make two plans different layouts (the alternatives are distinct layouts)."""
TIE_BREAK = ("peak_device_bytes", *LAYOUT, *INNER_AXES)
"""After the objective and the sweep's tie-break: more headroom first, then a fixed order, so
that the answer is deterministic."""

LAUNCHABLE: dict[str, dict[str, tuple[Any, ...]]] = {
    name: spec.launch_axes for name, spec in FRAMEWORK_SPECS.items()
}
"""Axis values each framework can launch (others are dropped from the sweep's space): its
FrameworkSpec.launch_axes, whose reasons are its launch_source (engine/_frameworks.py), so a
framework added there is launchable here with no other edit."""
FRAMEWORK_PRECISIONS: dict[str, tuple[str, ...]] = {
    name: spec.launch_precisions for name, spec in FRAMEWORK_SPECS.items()
}
"""Precisions each framework runs, its default first: FrameworkSpec.launch_precisions."""
OBJECTIVE_WORDS = {"cost": "cheapest", "time": "fastest", "gpus": "fewest GPUs"}
CONTRACT = (
    "gpu",
    "num_gpus",
    "num_nodes",
    "gpus_per_node",
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "zero",
    "recompute",
    "micro_batch_size",
    "grad_accum_steps",
    "peak_device_bytes",
    "headroom_bytes",
    "step_time_s",
    "cost_per_million_tokens",
)
"""The JSON keys outside tools rely on (a contract: extended, never renamed)."""
MODEL_KEYS = (
    "name",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
    "norm",
    "gated_mlp",
    "rotary",
    "attention_bias",
    "mlp_bias",
    "dropout",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "num_dense_layers",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "qk_norm",
    "partial_rotary_factor",
)
"""The model's shape in the report (what the launch formats need); `rope_architecture` adds
the rotary base and scaling and the norm epsilon from the model's config."""
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
"""A job name (fullmatch-like: `\\Z`, since `$` also matches before a trailing newline)."""


def recommend_report(
    training: TrainingConfig | Mapping[str, Any] | None = None,
    *,
    model: str = "llama-3.1-8b",
    fleet: FleetSource = "8xh100-sxm-80gb",
    fleet_label: str | None = None,
    objective: str = "cost",
    num_alternatives: int = 4,
    max_micro_batch_size: int = 16,
    max_pp: int = 16,
    max_cp: int = 4,
    host_memory_gib: float | None = None,
    min_gpus: int = 1,
    use_all_gpus: bool = False,
    max_step_time_s: float | None = None,
    max_cost_per_million_tokens: float | None = None,
    tokens: float | None = None,
    headroom: float = 0.10,
    script: str | None = None,
    job_name: str = "trainmem",
    time_limit: str = "24:00:00",
    hardware_dir: str | None = None,
    models_dir: str | None = None,
    optimizers_dir: str | None = None,
    family: str | None = None,
    allow_long_seq: bool = False,
    lengths: str | list[int] | None = None,
    lengths_histogram: str | list[Any] | None = None,
    batching: str = "pad-longest",
    buckets: str | None = None,
    risk: float = 0.001,
    overhead: list[str] | None = None,
    overhead_file: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """The best plan (CONTRACT keys at the top level, and more) and `alternatives`: the next
    `num_alternatives` distinct layouts, then the best layout of each other GPU type of the fleet.

    The job's training fields: `training` updated by keyword fields, over SEARCH_DEFAULTS;
    searched fields left unset (None) are searched. Pure: prints nothing, writes nothing (the
    search runs in memory; `trainmem sweep --out` stores points). `framework` None: megatron.
    `fleet`: text, a TOML path or the pools in memory (hardware's parse_fleet); `fleet_label`
    names it in the answer and its messages (None: `fleet` itself, or its pools).
    `overhead`, `overhead_file`: estimate's, over every pool's GPU defaults (the plans'
    `estimate_command` repeats them). ValueError (one line, naming the field) on bad input.
    """
    scope = dict(locals())  # the arguments (the first statement)
    args = {k: v for k, v in scope.items() if k not in ("training", "fields")}
    job = training_config(training, fields, defaults=RECOMMEND_TRAINING)
    space = job_space(**{**args, **job})
    objectives = parse_objectives(objective)
    result, rows, plans = _search(space, objectives, num_alternatives)
    context = _context(args, job, space, objectives)
    for plan in plans:
        _complete_plan(plan, args, job, space)
    answer = _answer(context, result, rows, plans)
    if space.warnings:  # present only when there is something to say
        answer["warnings"] = list(space.warnings)
    return answer


def _search(
    space: Space, objectives: tuple[str, ...], num_alternatives: int
) -> tuple[SearchResult, list[dict[str, Any]], list[dict[str, Any]]]:
    """The exhaustive search in memory, each layout's best point (LAYOUT, TIE_BREAK): the
    result, the fitting layouts a launcher can start (whole nodes) and the plans picked from
    them (`_pick`, evaluated once more), or the closest point when none fits."""
    result = run_exhaustive(
        space,
        out=None,
        study="recommend",
        objectives=objectives,
        top=None,
        distinct=LAYOUT,
        tie_break=TIE_BREAK,
    )
    rows = [r for r in result.top.to_dicts() if _whole_nodes(space.fleet, r)]
    picked = _pick(rows, space.fleet, num_alternatives)
    if not picked and result.extra["closest"] is not None:
        picked = [(result.extra["closest"], "closest: does not fit")]
    return result, rows, _evaluate(space, picked)


def _context(
    args: Mapping[str, Any],
    job: Mapping[str, Any],
    space: Space,
    objectives: tuple[str, ...],
) -> dict[str, Any]:
    """What every plan of the answer shares: the model and its shape, the fleet, the
    objective, the job's framework, precision and optimizer, its sizes and the launch names."""
    spec = space.model
    return {
        "model": spec.name,
        "num_parameters": spec.num_parameters,
        "architecture": {
            **{k: getattr(spec, k) for k in MODEL_KEYS},
            **rope_architecture(args["model"], models_dir=args["models_dir"]),
        },
        "fleet": fleet_text(args["fleet"], args["fleet_label"], space.fleet),
        "objective": objectives[0],
        "framework": space.fixed["framework"],
        "precision": space.fixed["precision"],
        "optimizer": job["optimizer"],
        "seq_len": job["seq_len"],
        "global_batch_size": job["global_batch_size"],
        "headroom": args["headroom"],
        "fleet_gpus": fleet_gpus(space.fleet),  # also each plan's, with its own used_gpus
        "tokens": args["tokens"],
        "launch": {
            "script": args["script"],
            "job_name": args["job_name"],
            "time_limit": args["time_limit"],
        },
    }


RL_JOB_FIELDS = (
    "rl", "rollout", "rollout_tp", "rollout_gpu_memory_utilization", "rl_group_size",
    "response_len", "rollout_batch_size", "rollout_max_num_seqs",
    "rollout_max_num_batched_tokens", "rollout_sleep_level", "ref_model", "rl_trainer_offload",
    "log_prob_micro_batch_size", "rl_max_token_len_per_gpu", "rl_mean_seq_len", "lora_rank",
    "lora_targets",
)  # fmt: skip
"""The RL job's fields a plan carries (`rl_job`): what a launch format (verl) must state."""


def rl_job(job: Mapping[str, Any], plan: Mapping[str, Any]) -> dict[str, Any] | None:
    """The JSON key `rl_job` of an RL job's plan: RL_JOB_FIELDS as the estimate runs them,
    `auto` and 0 resolved (the rollout engine and the reference by the engine's own
    rl_rows; prompts per rollout global_batch_size / group; the log-prob micro-batch the
    plan's), the searched RL axes (rollout_tp, ref_model, rl_trainer_offload) the plan's;
    None for a job without RL."""
    from trainmem.engine import make_grid
    from trainmem.engine._rl import rl_rows
    from trainmem.engine._vocab import REF_MODELS, ROLLOUTS

    out = {name: DEFAULTS_BY_FIELD[name] if job.get(name) is None else job[name]
           for name in RL_JOB_FIELDS}  # fmt: skip
    out.update({name: plan[name] for name in RL_AXES if name in plan})  # the search's choice
    if out["rl"] == "none":
        return None
    codes = rl_rows(make_grid({k: out[k] for k in ("rl", "rollout", "ref_model", "lora_rank")}))
    rollout = int(codes["rollout"][0])
    out["rollout"] = "none" if rollout < 0 else ROLLOUTS[rollout]  # dpo: no engine (-1)
    out["ref_model"] = REF_MODELS[int(codes["ref_model"][0])]
    if not out["rollout_batch_size"]:
        out["rollout_batch_size"] = int(plan["global_batch_size"]) // int(out["rl_group_size"])
    if not out["log_prob_micro_batch_size"]:
        out["log_prob_micro_batch_size"] = int(plan["micro_batch_size"])
    return out


def _complete_plan(
    plan: dict[str, Any], args: Mapping[str, Any], job: Mapping[str, Any], space: Space
) -> None:
    """Add to `plan` (in place) the space's fixed fields that are not axes (a traced model may
    fix precision, attention; an axis is the plan's own) and its `estimate_command`."""
    fixed = dict(
        framework=space.fixed["framework"],
        precision=space.fixed["precision"],
        optimizer=job["optimizer"],
        attention=space.fixed.get("attention", DEFAULTS["attention"]),
        recompute_every=space.fixed.get("recompute_every", DEFAULTS["recompute_every"]),
        compile=space.fixed.get("compile", DEFAULTS["compile"]),
        allocator=space.fixed.get("allocator", DEFAULTS["allocator"]),
    )
    plan.update({k: v for k, v in fixed.items() if k not in space.axes})  # axes: the plan's
    plan.update(  # fleet_gpus, used_gpus, tokens, time_to_train_s, cost_to_train_usd
        fleet_use(
            space.fleet,
            used_gpus=plan["num_gpus"],
            tokens=args["tokens"],
            tokens_per_second=plan.get("tokens_per_second"),
            cost_per_million_tokens=plan.get("cost_per_million_tokens"),
        )
    )
    rl = rl_job(job, plan)
    if rl is not None:
        plan["rl_job"] = rl
    plan["estimate_command"] = estimate_command(
        plan,
        model=args["model"],
        headroom=args["headroom"],
        hardware_dir=args["hardware_dir"],
        models_dir=args["models_dir"],
        optimizers_dir=args["optimizers_dir"],
        extra=extra_fields(job),
        family=args["family"],
        host_memory_gib=args["host_memory_gib"],
        overhead=args["overhead"],
        overhead_file=args["overhead_file"],
    ) + _risk_flags(args)


def _risk_flags(args: Mapping[str, Any]) -> str:
    """The reproduce line's `--lengths` flags (a dataset given as a file; an inline one, from
    the Python API or HTTP, has no flag), with a leading space; "" without a dataset."""
    flags: list[str] = []
    for key in ("lengths", "lengths_histogram"):
        if isinstance(args.get(key), (str, os.PathLike)):
            flags += ["--" + key.replace("_", "-"), os.fspath(args[key])]
    if not flags:
        return ""
    flags += ["--batching", str(args["batching"])]
    if args.get("buckets") is not None:
        flags += ["--buckets", str(args["buckets"])]
    flags += ["--risk", repr(float(args["risk"]))]
    return " " + shlex.join(flags)


def _answer(
    context: dict[str, Any],
    result: SearchResult,
    rows: list[dict[str, Any]],
    plans: list[dict[str, Any]],
) -> dict[str, Any]:
    """The report: the best plan's CONTRACT keys first, its other keys, the context, whether
    anything fits (and why not: the closest configuration's reason), the counts and the
    alternatives."""
    best = plans[0] if plans else dict.fromkeys(CONTRACT)
    fits = bool(rows)
    # Nothing fits: the closest configuration uses no GPUs and trains nothing.
    unused = {} if fits else {"used_gpus": None, "time_to_train_s": None, "cost_to_train_usd": None}
    if fits:
        reason = ""
    elif plans:
        reason = f"nothing fits on {context['fleet']}; the closest configuration: {best['reason']}"
    else:
        reason = f"nothing fits on {context['fleet']}: no valid configuration in the space"
    return {
        **{k: best.get(k) for k in CONTRACT},
        **{k: v for k, v in best.items() if k not in CONTRACT},
        **context,
        **unused,
        "fits": fits,
        "reason": reason,
        "num_points": result.num_points,
        "num_fitting_layouts": len(rows),
        "alternatives": plans[1:],
        "units": "bytes per device (worst rank); GiB = 2**30 in the human output",
    }


def rope_architecture(model: str, *, models_dir: str | None = None) -> dict[str, Any]:
    """The rotary base (`rope_theta`, None: the framework's default 10000), the scaling block
    (`rope_scaling`, None when absent) and `norm_epsilon` of a model's Hugging Face config: the
    launch formats write them (Megatron-LM --rotary-base, --use-rope-scaling, --norm-epsilon).
    transformers 5 nests theta and scaling in `rope_parameters`; older configs have both keys."""
    config = model_config_dict(model, models_dir=models_dir)
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    eps = config.get("rms_norm_eps", config.get("layer_norm_eps", config.get("layer_norm_epsilon")))
    return {
        "rope_theta": config.get("rope_theta", params.get("rope_theta")),
        "rope_scaling": {**scaling, "rope_type": kind} if kind != "default" else None,
        "norm_epsilon": eps,
    }


def space_points(**fields: Any) -> int:
    """How many points `recommend_report(**fields)` would search (without searching): the HTTP
    service bounds a request's work with it."""
    options = {
        o.name: o.default for o in RECOMMEND_OPTIONS if o.name not in ("fmt", "as_json", "check")
    } | {"fleet_label": None}
    unknown = sorted(set(fields) - set(options))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
    return job_space(**{**options, **fields}).num_points


def job_space(**fields: Any) -> Space:
    """The validated space of `recommend_report(**fields)` (all its arguments), cut to what the
    framework launches."""
    f, framework = _checked_fields(fields)
    space = _searched_space(f, framework)
    return launchable(_launchable_counts(space, f), framework)


def _checked_fields(fields: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The fields checked (ValueError, one line naming the field), with the framework (None:
    the default) and the precision it runs (the search's default one it does not run: its own
    first one)."""
    f = dict(fields)
    framework = f["framework"] or DEFAULT_FRAMEWORK["json"]
    choice("framework", framework, FRAMEWORKS)
    choice("precision", f["precision"], PRECISIONS)
    runs = FRAMEWORK_PRECISIONS[framework]
    if f["precision"] == SEARCH_DEFAULTS["precision"] and f["precision"] not in runs:
        # The search's default precision is one the framework does not run (torchtune: the
        # whole model in bf16): its own first one instead. An explicit choice is still checked.
        f = {**f, "precision": runs[0]}
    choice(f"precision (framework {framework})", f["precision"], runs)
    if len(parse_objectives(f["objective"])) != 1:
        raise ValueError(
            f"objective: recommend takes one of cost, time, gpus, got '{f['objective']}'"
        )
    check_headroom(f["headroom"])
    check_options(RECOMMEND_OPTIONS, f)
    if f["num_alternatives"] < 0:
        raise ValueError(f"num-alternatives: must be >= 0, got {f['num_alternatives']}")
    if not isinstance(f["job_name"], str) or not _NAME_RE.match(f["job_name"]):
        raise ValueError(f"job-name: letters, digits, '.', '_' and '-' only, got '{f['job_name']}'")
    if not TIME_RE.match(f["time_limit"]):
        raise ValueError(
            f"time-limit: sbatch --time format (e.g. 24:00:00, 2-00:00:00), got '{f['time_limit']}'"
        )
    if f["script"] is not None and not f["script"].strip():
        raise ValueError("script: must not be empty")
    return f, framework


def _searched_space(f: Mapping[str, Any], framework: str) -> Space:
    """The sweep's space of the checked fields `f` (make_space) on their fleet, with the
    overheads of --overhead-file and --overhead (read and checked before the model and fleet)."""
    overheads = overhead_overrides(f["overhead_file"], f["overhead"])
    gpus = load_gpus(f["hardware_dir"])
    return make_space(
        load_model(f["model"], models_dir=f["models_dir"], family=f["family"]),
        parse_fleet(f["fleet"], gpus),
        gpus,
        seq_len=f["seq_len"],
        global_batch_size=f["global_batch_size"],
        precision=f["precision"],
        optimizer=optimizer_columns(f["optimizer"], f["optimizers_dir"]),
        framework=framework,
        max_micro_batch_size=f["max_micro_batch_size"],
        max_pp=f["max_pp"],
        max_cp=f["max_cp"],
        headroom=f["headroom"],
        training=extra_fields(f),
        optimizer_name=f["optimizer"],
        host_memory_bytes=gib_to_bytes(f["host_memory_gib"]),
        min_gpus=f["min_gpus"],
        use_all_gpus=f["use_all_gpus"],
        max_step_time_s=f["max_step_time_s"],
        max_cost_per_million_tokens=f["max_cost_per_million_tokens"],
        allow_long_seq=f["allow_long_seq"],
        risk=space_risk(
            lengths=f["lengths"],
            lengths_histogram=f["lengths_histogram"],
            batching=f["batching"],
            buckets=f["buckets"],
            risk=f["risk"],
            seq_len=f["seq_len"],
        ),
        overheads=overheads,
    )


def _launchable_counts(space: Space, f: Mapping[str, Any]) -> Space:
    """`space` with the GPU counts a launcher can start: within one node, or whole nodes of
    some pool; ValueError when none is left."""
    counts = tuple(
        c
        for c in space.axes["num_gpus"]
        if any(
            c <= p.num_gpus and (c <= p.gpus_per_node or c % p.gpus_per_node == 0)
            for p in space.fleet.pools
        )
    )
    if not counts:
        raise ValueError(
            f"num_gpus: {space.axes['num_gpus'][0]} GPUs cannot be launched on "
            f"{fleet_text(f['fleet'], f['fleet_label'], space.fleet)} (within one node, or whole "
            "nodes of a pool)"
        )
    return dataclasses.replace(space, axes={**space.axes, "num_gpus": counts})


def fleet_text(fleet: FleetSource, label: str | None, pools: Fleet) -> str:
    """The fleet as the answer names it: `label`, else the text or path given, else (pools in
    memory) NODESxPER_NODExGPU per pool (COUNTxGPU for one node)."""
    if label is not None:
        return label
    if isinstance(fleet, str):
        return fleet
    if not isinstance(fleet, (Mapping, list, tuple)):
        return str(fleet)  # a path
    return ",".join(
        f"{p.num_gpus}x{p.gpu}" if p.num_nodes == 1 else f"{p.num_nodes}x{p.gpus_per_node}x{p.gpu}"
        for p in pools.pools
    )


def launchable(space: Space, framework: str) -> Space:
    """`space` with each axis cut to the values `framework` can launch (LAUNCHABLE)."""
    keep = LAUNCHABLE[framework]
    axes = {
        a: tuple(v for v in values if a not in keep or v in keep[a])
        for a, values in space.axes.items()
    }
    for axis, values in axes.items():
        if not values and space.axes[axis]:  # a pinned value the framework cannot launch
            allowed = ", ".join(str(v) for v in keep[axis])
            raise ValueError(
                f"{axis}: {space.axes[axis][0]} is not launchable with framework "
                f"{framework} (allowed: {allowed})"
            )
    return dataclasses.replace(space, axes=axes)


def _whole_nodes(pools: Fleet, row: dict[str, Any]) -> bool:
    """Whether the row's GPUs fill whole nodes (or fit in one) of some pool of its GPU: a
    launcher starts the same number of processes on every node."""
    n = row["num_gpus"]
    return any(
        p.gpu == row["gpu"]
        and n <= p.num_gpus
        and (n <= p.gpus_per_node or n % p.gpus_per_node == 0)
        for p in pools.pools
    )


def _pick(
    rows: list[dict[str, Any]], pools: Fleet, num_alternatives: int
) -> list[tuple[dict[str, Any], str]]:
    """(row, note): the best, the runners-up, then the best of each GPU type not shown yet."""
    picked = [
        (r, "best" if i == 0 else f"runner-up {i}")
        for i, r in enumerate(rows[: 1 + num_alternatives])
    ]
    shown = {r["gpu"] for r, _ in picked}
    for gpu in pools.gpu_names:
        first = next((r for r in rows if r["gpu"] == gpu), None)
        if first is not None and gpu not in shown:
            picked.append((first, f"best on {gpu}"))
            shown.add(gpu)
    return picked


def _evaluate(space: Space, picked: list[tuple[dict[str, Any], str]]) -> list[dict[str, Any]]:
    """Each picked row evaluated again, in one call, on each pool of its GPU type that can hold
    it; the best of those (fitting, then lowest cost) is the plan."""
    cand, cols = rows_on_pools(space, [row for row, _ in picked])
    if not cand:
        return []
    res = evaluate_columns(space, cols)
    plans = []
    for k, (_, note) in enumerate(picked):
        rows = [j for j, (kk, _) in enumerate(cand) if kk == k]
        j = min(
            rows, key=lambda r: (not res["fits"][r], _finite(res["cost_per_million_tokens"][r]))
        )
        plans.append({**_plan(space, res, j), "note": note})
    return plans


def _finite(x: Any) -> float:
    x = float(x)
    return x if math.isfinite(x) else math.inf


def _number(x: Any) -> float | None:
    """A float for JSON (None for NaN: time and cost of an invalid layout)."""
    x = float(x)
    return x if math.isfinite(x) else None


def _plan(space: Space, res: dict[str, np.ndarray], j: int) -> dict[str, Any]:
    """Row `j` of `evaluate_columns` as a plan (the `estimate --json` rounding of bytes)."""
    pool = space.fleet.pools[int(res["pool"][j])]
    profile = space.gpus[pool.gpu]
    n = int(res["num_gpus"][j])
    per_node = min(n, pool.gpus_per_node)
    breakdown = {c: int(round(float(res[c][j]))) for c in COMPONENTS}
    peak = int(round(float(res["peak_device_bytes"][j])))
    breakdown["transient"] += peak - sum(breakdown.values())  # rounding, as row_report
    headroom_bytes = int(round(float(res["headroom_bytes"][j])))
    fits = bool(res["fits"][j])
    reason = str(reason_texts(res["reason"][j : j + 1])[0])
    risk = _plan_risk(res, j)
    if not reason and not fits and risk:
        reason = (
            f"over --risk {space.risk.risk if space.risk else 0:g}: OOM probability of an "
            f"epoch {risk['oom_probability']:g}, worst step "
            f"{risk['worst_step_peak_device_bytes'] / GIB:.2f} GiB per device"
        )
    elif not reason and not fits:
        reason = (
            f"does not fit: {peak / GIB:.2f} GiB per device, "
            f"{(peak + headroom_bytes) / GIB:.2f} GiB allowed"
        )
    price = pool.price_per_gpu_hour(profile)
    plan = {
        "gpu": pool.gpu,
        "num_gpus": n,
        "num_nodes": -(-n // per_node),
        "gpus_per_node": per_node,
        **{k: int(res[k][j]) for k in ("tp", "pp", "dp", "cp", "ep", "virtual_stages", "zero")},
        "sequence_parallel": bool(space.fixed["sequence_parallel"]),
        "recompute": _NAMES["recompute"][int(res["recompute"][j])],
        "offload": _NAMES["offload"][int(res["offload"][j])],
        "micro_batch_size": int(res["micro_batch_size"][j]),
        "grad_accum_steps": int(res["grad_accum_steps"][j]),
        "global_batch_size": int(space.fixed["global_batch_size"]),
        "seq_len": int(space.fixed["seq_len"]),
        **_deepspeed_buckets(space),
        "peak_device_bytes": peak,
        **_error_bars(res, j),
        "peak_reserved_bytes": int(round(float(res["peak_reserved_bytes"][j]))),
        "peak_allocated_bytes": int(round(float(res["peak_allocated_bytes"][j]))),
        "headroom_bytes": headroom_bytes,
        "usable_bytes": int(profile.usable_bytes),
        "host_bytes": int(round(float(res["host_bytes"][j]))),
        "fits": fits,
        "reason": reason,
        "breakdown": breakdown,
        "step_time_s": _number(res["step_time_s"][j]),
        "tokens_per_second": _number(res["tokens_per_second"][j]),
        "mfu": _number(res["mfu"][j]),
        "cost_per_million_tokens": _number(res["cost_per_million_tokens"][j]),
        "price_per_gpu_hour_usd": price,
        **risk,
    }
    # A search axis the contract above does not name: its value, after the others.
    return {**plan, **{a: _axis_item(a, res[a][j]) for a in AXES[1:] if a not in plan}}


def _deepspeed_buckets(space: Space) -> dict[str, Any]:
    """A DeepSpeed plan's reduce bucket and overlap_comm where the job set them (the launch
    config writes them: plan/_launch.py _deepspeed_zero); nothing at their defaults."""
    fixed = space.fixed
    out: dict[str, Any] = {}
    if float(fixed.get("zero_bucket_elems", 0.0) or 0.0) > 0:
        out["zero_bucket_elems"] = float(fixed["zero_bucket_elems"])
    if fixed.get("overlap_comm", "auto") != "auto":
        out["overlap_comm"] = str(fixed["overlap_comm"])
    return out


def _error_bars(res: dict[str, np.ndarray], j: int) -> dict[str, Any]:
    """Row `j`'s 90% interval of the device peak (whole bytes) and fit_probability, as
    evaluate_columns gives them (report/_error_bars.py)."""
    low, high = (int(round(float(res[k][j]))) for k in ERROR_BAR_KEYS[:2])
    return {
        ERROR_BAR_KEYS[0]: low,
        ERROR_BAR_KEYS[1]: high,
        "fit_probability": float(res["fit_probability"][j]),
    }


def _plan_risk(res: dict[str, np.ndarray], j: int) -> dict[str, Any]:
    """`--lengths`: the plan's epoch over the dataset (issue 28's keys; sweep/_risk.py), {}
    without a dataset or where the row has none (an invalid layout)."""
    if "oom_probability" not in res or not math.isfinite(float(res["oom_probability"][j])):
        return {}
    worst, p50, p99 = (
        int(round(float(res[c][j])))
        if math.isfinite(float(res[c][j]))
        else None  # invalid at some step length
        for c in (
            "worst_step_peak_device_bytes",
            "step_peak_p50_device_bytes",
            "step_peak_p99_device_bytes",
        )
    )
    return {
        "oom_probability": float(res["oom_probability"][j]),
        "worst_step_peak_device_bytes": worst,
        "step_peak_quantiles": {"p50": p50, "p99": p99, "max": worst},
    }


def _axis_item(axis: str, value: Any) -> Any:
    """A search axis's value in a plan: a name, a switch or a whole number."""
    if axis in _NAMES:
        return _NAMES[axis][int(value)]
    return bool(value) if isinstance(value, (bool, np.bool_)) else int(value)


COMMAND_LEAD = ("num_gpus", "seq_len", "global_batch_size", "micro_batch_size")
COMMAND_FIELDS = tuple(
    dict.fromkeys((*COMMAND_LEAD, *AXES[1:], "precision", "optimizer", "attention", "framework"))
)
"""The fields `estimate_command` writes, in order: the job's size, every search axis, then the
space's fixed precision, optimizer, attention and framework (every plan has them)."""


def estimate_command(
    plan: dict[str, Any],
    *,
    model: str,
    headroom: float,
    hardware_dir: str | None = None,
    models_dir: str | None = None,
    optimizers_dir: str | None = None,
    extra: Mapping[str, Any] | None = None,
    family: str | None = None,
    host_memory_gib: float | None = None,
    overhead: list[str] | None = None,
    overhead_file: str | None = None,
) -> str:
    """The `trainmem estimate` line of the plan's configuration (same engine row); `extra`:
    the job's other training fields (written where they differ from estimate's defaults);
    `overhead_file`, `overhead`: the search's, as given (the items after the file: they win)."""
    args = ["trainmem", "estimate", "--model", model, "--gpu", plan["gpu"]]
    if family is not None:
        args += ["--family", family]
    for key in COMMAND_FIELDS:
        if key in RL_AXES and plan[key] == DEFAULTS_BY_FIELD[key]:
            continue  # an RL axis at its default (every job without --rl): estimate's own
        if isinstance(plan[key], bool):  # a switch searched: its flag when on
            args += [KNOBS[key].flag or "--" + key.replace("_", "-")] if plan[key] else []
        else:
            args += ["--" + key.replace("_", "-"), str(plan[key])]
    if plan["sequence_parallel"]:
        args.append("--sequence-parallel")
    for key, value in (extra or {}).items():
        if key in plan or (value == DEFAULTS_BY_FIELD[key] and key not in JOB_DEFAULTS):
            continue  # estimate's own defaults (JOB_DEFAULTS) differ from TrainingConfig's
        if key == "loss" and value == resolved_loss(str(plan["framework"]), "auto"):
            continue  # what `--loss auto` (the default) resolves to
        flag = KNOBS[key].flag or "--" + key.replace("_", "-")
        args += [flag] if isinstance(value, bool) else [flag, str(value)]
    args += ["--headroom", repr(float(headroom))]
    if host_memory_gib is not None:
        args += ["--host-memory-gib", repr(float(host_memory_gib))]
    for flag, value in (
        ("--hardware-dir", hardware_dir),
        ("--models-dir", models_dir),
        ("--optimizers-dir", optimizers_dir),
    ):
        if value is not None:
            args += [flag, value]
    if overhead_file is not None:
        args += ["--overhead-file", os.fspath(overhead_file)]
    for item in overhead or ():
        args += ["--overhead", item]
    return shlex.join(args)


# ---- human output ------------------------------------------------------------------------------

ROW = ("gpu", "num_gpus", "num_nodes", *SHOW[2:])
"""The alternatives table's columns: the sweep's (SHOW), with the nodes after the GPU count."""


def summary(report: dict[str, Any]) -> str:
    """A few lines on the best plan and a table of the alternatives."""
    word = OBJECTIVE_WORDS[report["objective"]]
    lines = [
        f"{report['model']} on {report['fleet']}, seq {report['seq_len']}, global batch "
        f"{report['global_batch_size']} ({report['framework']}, {report['precision']}, "
        f"{report['optimizer']}): {word} of {report['num_points']:,} points, "
        f"{report['num_fitting_layouts']} layouts fit"
        + (f"; the best {fleet_use_text(report)}" if report["fits"] else "")
    ]
    if report["gpu"] is None:
        return "\n".join([*lines, report["reason"]])
    head = "best" if report["fits"] else "NOTHING FITS; closest"
    allowed = report["peak_device_bytes"] + report["headroom_bytes"]
    lines += [
        f"{head}: {report['num_gpus']} x {report['gpu']} ({report['num_nodes']} node(s) x "
        f"{report['gpus_per_node']}), tp {report['tp']} pp {report['pp']} cp {report['cp']} "
        f"dp {report['dp']} ep {report['ep']}, zero {report['zero']}, recompute "
        f"{report['recompute']}, offload {report['offload']}, micro-batch "
        f"{report['micro_batch_size']} x accumulation {report['grad_accum_steps']}",
        f"  peak {report['peak_device_bytes'] / GIB:.2f} GiB per GPU of {allowed / GIB:.2f} GiB "
        f"allowed ({report['usable_bytes'] / GIB:.2f} usable, {report['headroom']:.0%} headroom): "
        f"margin {report['headroom_bytes'] / GIB:+.2f} GiB",
    ]
    if report.get("oom_probability") is not None:  # --lengths
        q = {
            k: "invalid" if v is None else f"{v / GIB:.2f}"
            for k, v in report["step_peak_quantiles"].items()
        }
        lines.append(
            f"  over the dataset: worst step {q['max']} GiB, p50 {q['p50']}, p99 {q['p99']}; "
            f"OOM probability of an epoch {report['oom_probability']:g} (the fit: within "
            "--risk, not the peak at seq_len above)"
        )
    if report["step_time_s"] is not None:
        lines.append(
            f"  step {report['step_time_s']:.3g} s, {report['tokens_per_second']:,.0f} tokens/s, "
            f"MFU {report['mfu']:.0%}, ${report['cost_per_million_tokens']:.4g} per million tokens"
        )
    lines.append(f"  reproduce: {report['estimate_command']}")
    if not report["fits"]:
        hint = "  what to change: run the reproduce line (estimate lists what makes it fit)"
        return "\n".join([*lines, report["reason"], hint])
    if report["alternatives"]:
        is_rl = bool((report.get("rl_job") or {}).get("rl"))
        lines += ["alternatives (distinct layouts):", _table(report["alternatives"], rl=is_rl)]
    fmt = "torchrun|slurm" if report["framework"] in ("megatron", "deepspeed") else ""
    fmt += "|deepspeed" if report["framework"] == "deepspeed" else ""
    fmt += "accelerate" if report["framework"] == "hf" else ""
    rl = (report.get("rl_job") or {}).get("rl")
    rl_formats = ["verl"] if rl in ("grpo", "ppo") else []
    rl_formats += ["trl"] if rl in ("grpo", "dpo") and report["framework"] == "deepspeed" else []
    fmt = "|".join([f for f in (fmt, *rl_formats) if f])
    if fmt:
        lines.append(f"launch config: --format {fmt}; --format json for all of this")
    return "\n".join(lines)


def _table(plans: list[dict[str, Any]], *, rl: bool) -> str:
    row_columns = shown_columns(ROW, rl=rl)
    heads = tuple(heading(c) for c in row_columns)
    width = [
        max(len(h), *(len(str(p[c])) for p in plans))
        for h, c in zip(heads, row_columns, strict=True)
    ]
    cells = [
        " ".join(f"{h:<{w}}" for h, w in zip(heads, width, strict=True))
        + f"{'GiB':>8}{'step s':>9}{'$/Mtok':>9}  note"
    ]
    for p in plans:
        row = " ".join(f"{p[c]!s:<{w}}" for c, w in zip(row_columns, width, strict=True))
        step, cost = p["step_time_s"] or math.nan, p["cost_per_million_tokens"] or math.nan
        cells.append(
            f"{row}{p['peak_device_bytes'] / GIB:>8.2f}{step:>9.3g}{cost:>9.4g}  {p['note']}"
        )
    return "\n".join("  " + c for c in cells)


RECOMMEND_TRAINING = {
    **DEFAULTS_BY_FIELD,
    **{o.name: o.default for o in RECOMMEND_OPTIONS if o.name in FIELD_NAMES},
    "sequence_parallel": True,
}
"""The training fields of a recommendation when not given (searched fields: None)."""
RECOMMEND_ARGS = tuple(
    o.name for o in RECOMMEND_OPTIONS if o.name not in ("fmt", "as_json", "check")
)
REPORT_FIELDS = RECOMMEND_ARGS
"""recommend_report's keyword arguments (the options but the output ones)."""
