"""typer options made from the commands' declared options (trainmem.report.Option).

`command(options)` turns a function taking `(training, **other)` into a typer command whose
signature is the declared options: the training configuration's fields (collected into
`training`, a dict of the values given) and the command's own (passed by name). Nothing about a
field is written here: its type, default, help and choices come from the declaration.

`dress(command)` gives every built click command its --help layout: each option in its panel
(PANEL_OF, the one name -> panel table, in PANELS order), flags without a type, and shell
completion of the catalogue's names (--model, --gpu, --optimizer).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer

from trainmem.engine import FIELD_NAMES
from trainmem.report import Option, check_options
from trainmem.report._validate import precision_given


def typer_parameter(option: Option) -> inspect.Parameter:
    """The keyword parameter typer reads for one option (Annotated type + typer.Option); an
    option with choices shows them as its type, [a|b|c], and completes them in a shell."""
    extra: dict[str, Any] = {}
    if option.choices:
        extra = {"metavar": choices_metavar(option.choices), "autocompletion": _completer(option)}
    decls = (option.flag,) if option.flag else ()
    if option.type is bool and option.default is True and option.flag and "/" not in option.flag:
        decls = (f"{option.flag}/--no-{option.flag.removeprefix('--')}",)  # on by default
    help_text = choice_help(option.help, option.choices)
    annotation = Annotated[option.type, typer.Option(*decls, help=help_text, **extra)]
    return inspect.Parameter(
        option.name, inspect.Parameter.KEYWORD_ONLY, default=option.default, annotation=annotation
    )


def command(options: Sequence[Option]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the typer command of `options`; the function gets (training, **the rest)."""

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def run(**values: Any) -> Any:
            check_options(options, values)
            training = {k: values.pop(k) for k in FIELD_NAMES if k in values}
            with precision_given(_given_on_command_line("precision")):
                return function(training, **values)

        parameters = [typer_parameter(o) for o in options]
        run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        run.options = tuple(options)  # type: ignore[attr-defined]
        return run

    return wrap


def _given_on_command_line(name: str) -> bool:
    """Whether the running command's option `name` came from the command line (or its
    environment variable), not its default: typer's click context's parameter source."""
    from typer._click.core import ParameterSource
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    if ctx is None or name not in ctx.params:
        return False
    source = ctx.get_parameter_source(name)
    return source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


METAVAR_WIDTH = 28
"""Widest line of a choices type in --help: a longer list breaks after a `|` (rich would
otherwise fold it inside a word)."""


def choices_metavar(choices: Sequence[str], *, width: int = METAVAR_WIDTH) -> str:
    """An option's type in --help when its values are a fixed set: ``[a|b|c]`` (click's),
    on lines of at most `width` characters (one choice per line when it is longer)."""
    lines = [""]
    for i, c in enumerate(choices):
        item = ("[" if i == 0 else "") + c + ("]" if i == len(choices) - 1 else "|")
        if lines[-1] and len(lines[-1]) + len(item) > width:
            lines.append("")
        lines[-1] += item
    return "\n".join(lines)


def choice_help(help_text: str, choices: Sequence[str] | None) -> str:
    """`help_text` without a leading list of the choices (``a | b | c (note)`` -> ``note``):
    --help shows them as the option's type (`choices_metavar`)."""
    for listed in (" | ".join(choices or ()), "|".join(choices or ())):
        if listed and help_text.startswith(listed):
            rest = help_text.removeprefix(listed).strip()
            if rest.startswith("(") and rest.rstrip(".").endswith(")") and rest.count("(") == 1:
                rest = rest.rstrip(".")[1:-1]
            return rest
    return help_text


def _completer(option: Option) -> Callable[[str], list[str]]:
    """Shell completion of an option's fixed choices (typer `autocompletion`)."""
    choices = tuple(option.choices or ())

    def complete(incomplete: str) -> list[str]:
        return [c for c in choices if c.startswith(incomplete)]

    return complete


# ---- --help panels and completion of every command ---------------------------------------------

PANELS = (
    "Model",
    "Batch",
    "Parallelism",
    "Precision",
    "Memory techniques",
    "Training setup",
    "RL post-training",
    "Hardware",
    "Time and cost",
    "Search",
    "Axes",
    "Query",
    "Launch",
    "Trace",
    "Server",
    "Comparison",
    "Output",
    "Help",
)
"""The --help panels, in the order every command shows them."""

_PANEL_NAMES: dict[str, tuple[str, ...]] = {
    "Model": ("model", "family", "profile_file", "models_dir", "module", "capacity_factor"),
    "Batch": (
        *("micro_batch_size", "seq_len", "allow_long_seq", "global_batch_size"),
        *("lengths", "lengths_histogram", "batching", "buckets", "risk"),
        *("images_per_sample", "image_size"),
    ),
    "Parallelism": (
        *("tp", "pp", "cp", "virtual_stages", "dp_shard", "sequence_parallel", "ep", "etp"),
    ),
    "Precision": ("precision",),
    "Memory techniques": (
        *("zero", "zero_bucket_elems", "overlap_comm", "recompute", "recompute_every"),
        *("offload", "activation_offload"),
        *("lora_rank", "lora_targets", "qlora", "bitsandbytes_version", "loss"),
        *("freeze_vision", "lora_scope"),
    ),
    "Training setup": (
        *("framework", "stack", "optimizer", "optimizer_in_backward", "optimizers_dir"),
        *("attention", "compile", "allocator", "load"),
    ),
    "RL post-training": (
        *("rl", "rollout", "rollout_tp", "rollout_gpu_memory_utilization", "rl_group_size"),
        *("response_len", "rollout_batch_size", "rollout_max_num_seqs"),
        *("rollout_max_num_batched_tokens", "rollout_sleep_level", "ref_model"),
        *("rl_trainer_offload", "log_prob_micro_batch_size"),
        *("rl_max_token_len_per_gpu", "rl_mean_seq_len"),
    ),
    "Hardware": (
        *("gpu", "fleet", "num_gpus", "headroom", "host_memory_gib", "hardware_dir"),
        *("overhead", "overhead_file", "device_used_gib"),
    ),
    "Time and cost": ("tokens", "time_param", "max_cost_per_million_tokens"),
    "Search": (
        *("method", "objective", "trials", "seed", "storage", "study_name", "workers"),
        *("warm_start", "jobs", "scheduler", "minimize", "max_micro_batch_size"),
        *("max_num_gpus", "max_pp", "max_cp", "min_gpus", "use_all_gpus", "max_step_time_s"),
        "num_alternatives",
    ),
    "Axes": ("x", "y", "x_values", "y_values"),
    "Query": ("points", "where", "sort", "descending", "head", "columns"),
    "Launch": ("fmt", "script", "job_name", "time_limit"),
    "Trace": (
        *("sdpa_kernel", "device", "real_gpu", "save_profile", "profile_seq_lens"),
        *("profile_name", "snapshot", "timeout", "max_memory_gb"),
    ),
    "Server": (
        *("host", "port", "max_points", "max_grid_rows", "timeout_s", "max_concurrent"),
        "max_body_bytes",
    ),
    "Comparison": ("vs", "config", "calibrate"),
    "Output": (
        *("as_json", "check", "fix", "per_stage", "advice", "plot", "memory_viz", "out"),
        "store",
    ),
    "Help": ("help", "show_version"),
}
PANEL_OF: dict[str, str] = {name: panel for panel, names in _PANEL_NAMES.items() for name in names}
"""Every option's --help panel, by its Python name (one table for every command: an option
of the same name sits in the same panel everywhere). A new option is added here; a test walks
every command's options and fails on one without a panel."""
OTHER_PANEL = "Options"
"""typer's own panel: where an option missing from PANEL_OF lands (the test refuses it)."""


def _complete_models(ctx: Any, incomplete: str) -> list[str]:
    from trainmem.catalog import model_presets

    names = model_presets(ctx.params.get("models_dir"))
    return [n for n in names if n.startswith(incomplete)]


def _complete_gpus(ctx: Any, incomplete: str) -> list[str]:
    from trainmem.hardware import gpu_aliases, load_gpus

    gpus = load_gpus(ctx.params.get("hardware_dir"))
    return [n for n in (*gpus, *gpu_aliases(gpus)) if n.startswith(incomplete)]


def _complete_optimizers(ctx: Any, incomplete: str) -> list[str]:
    from trainmem.catalog import load_optimizers

    names = load_optimizers(ctx.params.get("optimizers_dir"))
    return [n for n in names if n.startswith(incomplete)]


NAME_COMPLETERS: dict[str, Callable[[Any, str], list[str]]] = {
    "model": _complete_models,
    "gpu": _complete_gpus,
    "optimizer": _complete_optimizers,
}
"""Shell completion of the catalogue's open vocabularies (presets, GPU profiles, optimizers,
user folders included), read when the shell asks, by option name."""


def dress(command: Any) -> Any:
    """`command` (a built click command) with its --help layout: every option in its PANEL_OF
    panel and the options ordered by PANELS (declaration order within a panel), flags shown
    without a type, and NAME_COMPLETERS for --model/--gpu/--optimizer. Returns `command`."""
    help_option = command.get_help_option(command.context_class(command))
    params = [*command.params, *([help_option] if help_option is not None else [])]
    for param in params:
        if param.param_type_name != "option":
            continue
        param.rich_help_panel = PANEL_OF.get(param.name, OTHER_PANEL)
        if param.is_flag and param.metavar is None:
            param.metavar = ""  # a flag takes no value: no <bool> beside it
        complete = NAME_COMPLETERS.get(param.name)
        if complete is not None and param._custom_shell_complete is None:
            param._custom_shell_complete = lambda ctx, _, text, f=complete: f(ctx, text)
    order = {panel: i for i, panel in enumerate(PANELS)}
    command.params.sort(key=lambda p: order.get(getattr(p, "rich_help_panel", None) or "", -1))
    return command
