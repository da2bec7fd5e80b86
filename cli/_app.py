"""The `trainmem` command line (typer): estimate, models, optimizers, trace, gpus; the others
register from their modules (fit, sweep, points, recommend, heatmap, serve), imported only when
their command is named (LAZY_COMMANDS).

Exit codes (every command, report.EXIT_CODES, docs/exit-codes.md): 0 the command ran; 1 with
--check when it does not fit; 2 bad input (one line naming the field and the allowed values on
stderr, no traceback).
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Annotated, Any

import typer
import typer.main
from typer.core import TyperGroup

from trainmem.catalog import load_model, load_optimizers, model_presets
from trainmem.engine import ATTENTION
from trainmem.hardware import GIB, gpu_aliases, load_gpus
from trainmem.report import (
    ESTIMATE_OPTIONS,
    EXIT_CODES,
    command_fields,
    estimate_report,
    human_table,
)

from ._options import command

LAZY_COMMANDS = {
    "fit": "._fit",
    "sweep": "._sweep",
    "points": "._sweep",
    "recommend": "._recommend",
    "serve": "._serve",
    "heatmap": "._heatmap",
}
"""Commands built from their module (its `register(app)`) when named, after this file's own:
`trainmem estimate` imports neither them nor what they run (polars, Optuna, FastAPI, ...)."""


class _Commands(MutableMapping[str, Any]):
    """A group's commands by name, in order; a LAZY_COMMANDS one is built when looked up."""

    def __init__(self, built: Mapping[str, Any]) -> None:
        self._commands: dict[str, Any] = {**built, **dict.fromkeys(LAZY_COMMANDS)}

    def __getitem__(self, name: str) -> Any:
        if self._commands[name] is None:
            self._commands[name] = _build_command(name)
        return self._commands[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._commands[name] = command

    def __delitem__(self, name: str) -> None:
        del self._commands[name]

    def __contains__(self, name: object) -> bool:
        return name in self._commands  # without building it

    def __iter__(self) -> Iterator[str]:
        return iter(self._commands)

    def __len__(self) -> int:
        return len(self._commands)


class _LazyGroup(TyperGroup):
    """The `trainmem` group: click's lazily loaded subcommands, on typer's group."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = _Commands(self.commands)

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # the names, without building every command


def _build_command(name: str) -> Any:
    """The click command `name` of LAZY_COMMANDS, as typer builds the group's own."""
    registry = typer.Typer()
    importlib.import_module(LAZY_COMMANDS[name], __package__).register(registry)
    (info,) = (c for c in registry.registered_commands if c.name == name)
    return typer.main.get_command_from_info(
        info,
        pretty_exceptions_short=app.pretty_exceptions_short,
        rich_markup_mode=app.rich_markup_mode,
    )


app = typer.Typer(
    cls=_LazyGroup,
    add_completion=False,
    no_args_is_help=True,
    help="Predict the per-GPU memory of a training job before it runs.",
)


@app.command("estimate", epilog=EXIT_CODES)
@command(ESTIMATE_OPTIONS)
def estimate_cmd(training: dict[str, Any], *, as_json: bool, check: bool, **options: Any) -> None:
    """Per-device memory of one training configuration: breakdown, phase peaks, fit."""
    report = estimate_report(training, **options)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        typer.echo(human_table(report))
    if check and not report["fits"]:
        raise typer.Exit(1)


@app.command("models", epilog=EXIT_CODES)
def models_cmd(
    models_dir: Annotated[
        str | None,
        typer.Option(help="Folder of extra model presets, NAME.json (or TRAINMEM_MODELS_DIR)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The model presets (built-in and user) with their exact parameter counts and source."""
    rows = []
    for name, source in model_presets(models_dir).items():
        m = load_model(name, models_dir=models_dir)
        rows.append(
            {
                "name": name,
                "family": m.family,
                "num_parameters": m.num_parameters,
                "hidden_size": m.hidden_size,
                "num_hidden_layers": m.num_hidden_layers,
                "num_attention_heads": m.num_attention_heads,
                "num_key_value_heads": m.num_key_value_heads,
                "vocab_size": m.vocab_size,
                "source": source,
            }
        )
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    typer.echo(f"{'name':<20}{'family':<9}{'parameters':>18}{'layers':>8}{'hidden':>8}{'heads':>7}")
    for r in rows:
        typer.echo(
            f"{r['name']:<20}{r['family']:<9}{r['num_parameters']:>18,}"
            f"{r['num_hidden_layers']:>8}{r['hidden_size']:>8}"
            f"{r['num_attention_heads']:>4}/{r['num_key_value_heads']:<3}"
            + ("" if r["source"] == "built-in" else f"  {r['source']}")
        )


@app.command("optimizers", epilog=EXIT_CODES)
def optimizers_cmd(
    optimizers_dir: Annotated[
        str | None,
        typer.Option(help="Folder of user optimizers, NAME.toml (or TRAINMEM_OPTIMIZERS_DIR)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The optimizers (built-in and user files): states per parameter, step temporaries, source."""
    rows = [
        {
            "name": o.name,
            "num_states": o.num_states,
            "state_bytes": o.state_bytes,
            "step_temp_states": o.step_temp_states,
            "eight_bit_blockwise": o.eight_bit_blockwise,
            "step_bytes_per_parameter": o.step_bytes_per_parameter,
            "description": o.description,
            "source": o.path,
        }
        for o in load_optimizers(optimizers_dir).values()
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    typer.echo(f"{'name':<14}{'states':>7}{'dtype':>12}{'temps':>6}  source")
    for r in rows:
        dtype = (
            "8-bit block"
            if r["eight_bit_blockwise"]
            else (f"{r['state_bytes']:g} B" if r["state_bytes"] else "param dtype")
        )
        typer.echo(
            f"{r['name']:<14}{r['num_states']:>7g}{dtype:>12}{r['step_temp_states']:>6g}  "
            f"{r['source']}"
        )
    typer.echo("(adafactor keeps factored moments; adamw-fused adds a device step per tensor)")


@app.command("trace", epilog=EXIT_CODES)
def trace_cmd(
    model: Annotated[str, typer.Option(help="Preset name or path to a HF config.json.")] = (
        "llama-3.2-1b"
    ),
    module: Annotated[
        str | None,
        typer.Option(
            help="Trace any nn.Module instead: pkg.mod:factory or path/file.py:factory "
            "(factory() -> (module, batch[, loss_fn]); see README)."
        ),
    ] = None,
    seq_len: Annotated[int, typer.Option(help="Sequence length (tokens).")] = 2048,
    micro_batch_size: Annotated[int, typer.Option(help="Sequences per step.")] = 1,
    precision: Annotated[
        str, typer.Option(help="fp32 | bf16 | amp-bf16 (| mixed-bf16 with --zero 3)")
    ] = "bf16",
    optimizer: Annotated[
        str, typer.Option(help="adamw | adamw-fused | sgd | sgd-momentum")
    ] = "adamw",
    recompute: Annotated[str, typer.Option(help="none|full")] = "none",
    attention: Annotated[str, typer.Option(help=" | ".join(ATTENTION))] = "flash",
    sdpa_kernel: Annotated[
        str, typer.Option(help="SDPA kernel the GPU runs: flash|efficient|cudnn|math.")
    ] = "flash",
    device: Annotated[
        str, typer.Option(help="Fake device: cuda (CUDA kernels and autocast) or cpu.")
    ] = "cuda",
    num_gpus: Annotated[int, typer.Option(help="Ranks of the job (one rank is traced).")] = 1,
    zero: Annotated[int, typer.Option(help="3: FSDP2 fully_shard over num-gpus ranks.")] = 0,
    tp: Annotated[
        int, typer.Option(help="Tensor parallel degree (HF tp_plan layout; --num-gpus = tp).")
    ] = 1,
    sequence_parallel: Annotated[
        bool,
        typer.Option(
            "--sequence-parallel", help="With --tp: norms and residuals split over the sequence."
        ),
    ] = False,
    gpu: Annotated[str, typer.Option(help="GPU profile of the estimate it is compared with.")] = (
        "h100-sxm-80gb"
    ),
    save_profile: Annotated[
        str | None,
        typer.Option(help="Trace two lengths and write an activation profile JSON here."),
    ] = None,
    profile_seq_lens: Annotated[
        str | None, typer.Option(help="The two lengths A,B (default: seq-len, 2 x seq-len).")
    ] = None,
    profile_name: Annotated[str | None, typer.Option(help="The profile's name.")] = None,
    real_gpu: Annotated[
        bool,
        typer.Option("--real-gpu", help="Also run the step on this machine's CUDA device."),
    ] = False,
    lora_rank: Annotated[
        int, typer.Option(help="peft LoRA rank (0: full fine-tuning; needs peft).")
    ] = 0,
    lora_targets: Annotated[
        str, typer.Option(help="LoRA target modules: all-linear or q_proj,v_proj,...")
    ] = "all-linear",
    qlora: Annotated[
        bool, typer.Option("--qlora", help="Refused: QLoRA needs bitsandbytes' CUDA kernels.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Measure one training step on fake tensors next to the estimate (needs the trace extra)."""
    fields = command_fields(locals())
    from trainmem.report import command_defaults
    from trainmem.trace import trace_report, trace_text

    from ._progress import spinner

    try:
        what = fields["module"] or fields["model"]
        with spinner(f"tracing {what} on fake tensors", as_json=as_json):
            report = trace_report(**fields, estimate_defaults=command_defaults(estimate_cmd))
    except (RuntimeError, AssertionError, NotImplementedError, TypeError) as exc:
        # A model code path the fake device cannot run: one line, not torch's traceback.
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ValueError(
            f"trace: the step failed on fake tensors: {type(exc).__name__}: {first}"
        ) from None
    typer.echo(json.dumps(report, indent=2) if as_json else trace_text(report))


@app.command("gpus", epilog=EXIT_CODES)
def gpus_cmd(
    hardware_dir: Annotated[
        str | None, typer.Option(help="Folder of extra GPU TOML files.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The GPU profiles: memory, usable memory, dense bf16 throughput, price."""
    gpus = load_gpus(hardware_dir)
    aliases = gpu_aliases(gpus)
    rows = [
        {
            "name": g.name,
            "memory_bytes": g.memory_bytes,
            "usable_bytes": g.usable_bytes,
            "bf16_flops": g.bf16_flops,
            "price_per_hour_usd": g.price_per_hour_usd,
            "price_date": g.price_date,
            "path": g.path,
            "aliases": [alias for alias, target in aliases.items() if target == g.name],
        }
        for g in sorted(gpus.values(), key=lambda g: g.name)
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    typer.echo(
        f"{'name':<18}{'memory GiB':>11}{'usable GiB':>11}{'bf16 TFLOP/s':>13}{'$/h':>7}  aliases"
    )
    for r in rows:
        typer.echo(
            f"{r['name']:<18}{r['memory_bytes'] / GIB:>11.2f}{r['usable_bytes'] / GIB:>11.2f}"
            f"{r['bf16_flops'] / 1e12:>13.1f}{r['price_per_hour_usd']:>7.2f}  "
            f"{', '.join(r['aliases'])}".rstrip()
        )


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: one-line errors, exit code 2 on bad input.

    typer vendors its own click in recent releases, so click's exceptions are matched by their
    interface (`exit_code`, `format_message`) rather than by class.
    """
    try:
        # Not standalone, click returns typer.Exit's code instead of raising it.
        code = app(args=argv, standalone_mode=False)
    except ValueError as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if type(exc).__name__ == "Exit":
            return int(getattr(exc, "exit_code", 0) or 0)
        if type(exc).__name__ == "Abort":
            print("error: aborted", file=sys.stderr)
            return 130
        if hasattr(exc, "format_message"):
            message = " ".join(str(exc.format_message()).split())
            if message:
                print(f"error: {message}", file=sys.stderr)
            return int(getattr(exc, "exit_code", 2) or 2)
        raise
    return code if isinstance(code, int) else 0


def run() -> None:
    """The `trainmem` console script: main() on sys.argv, its code as the exit status."""
    sys.exit(main())
