"""`trainmem models`, `optimizers` and `gpus`: the catalogue's listings (presets, optimizer
files, GPU profiles), built only when named (cli/_app.py's LAZY_COMMANDS).
"""

from __future__ import annotations

from typing import Annotated

import typer

from trainmem.catalog import load_model, load_optimizers, model_presets
from trainmem.hardware import GIB, gpu_aliases, load_gpus
from trainmem.report import EXIT_CODES, json_text


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
                "vision_tower": m.vision.kind if m.vision is not None else None,
                "source": source,
            }
        )
    if as_json:
        typer.echo(json_text(rows))
        return
    width = max([20, *(len(r["name"]) + 1 for r in rows)])
    typer.echo(
        f"{'name':<{width}}{'family':<9}{'parameters':>18}{'layers':>8}{'hidden':>8}{'heads':>7}"
    )
    for r in rows:
        family = "vlm" if r["vision_tower"] else r["family"]  # a decoder with a vision tower
        typer.echo(
            f"{r['name']:<{width}}{family:<9}{r['num_parameters']:>18,}"
            f"{r['num_hidden_layers']:>8}{r['hidden_size']:>8}"
            f"{r['num_attention_heads']:>4}/{r['num_key_value_heads']:<3}"
            + ("" if r["source"] == "built-in" else f"  {r['source']}")
        )


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
            "paged": o.paged,
            "step_bytes_per_parameter": o.step_bytes_per_parameter,
            "description": o.description,
            "source": o.path,
        }
        for o in load_optimizers(optimizers_dir).values()
    ]
    if as_json:
        typer.echo(json_text(rows))
        return
    width = max(14, *(len(r["name"]) + 1 for r in rows))
    typer.echo(f"{'name':<{width}}{'states':>7}{'dtype':>12}{'temps':>6}  source")
    for r in rows:
        dtype = (
            "8-bit block"
            if r["eight_bit_blockwise"]
            else (f"{r['state_bytes']:g} B" if r["state_bytes"] else "param dtype")
        )
        typer.echo(
            f"{r['name']:<{width}}{r['num_states']:>7g}{dtype:>12}{r['step_temp_states']:>6g}  "
            f"{r['source']}"
        )
    typer.echo(
        "(adafactor keeps factored moments; adamw-fused adds a device step per tensor; paged-* "
        "keep the states of large tensors in unified memory, outside torch's allocator; "
        "adamw-loop and adamw-hf step one tensor at a time: 2 and 1 temporaries of the "
        "largest tensor instead)"
    )


def gpus_cmd(
    hardware_dir: Annotated[
        str | None, typer.Option(help="Folder of extra GPU TOML files.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The GPU profiles: memory, usable memory, dense bf16 and fp4 throughput, price."""
    gpus = load_gpus(hardware_dir)
    aliases = gpu_aliases(gpus)
    rows = [
        {
            "name": g.name,
            "memory_bytes": g.memory_bytes,
            "usable_bytes": g.usable_bytes,
            "bf16_flops": g.bf16_flops,
            "fp4_flops": g.fp4_flops,
            "price_per_hour_usd": g.price_per_hour_usd,
            "price_date": g.price_date,
            "path": g.path,
            "aliases": [alias for alias, target in aliases.items() if target == g.name],
        }
        for g in sorted(gpus.values(), key=lambda g: g.name)
    ]
    if as_json:
        typer.echo(json_text(rows))
        return
    typer.echo(
        f"{'name':<18}{'memory GiB':>11}{'usable GiB':>11}{'bf16 TFLOP/s':>13}"
        f"{'fp4 TFLOP/s':>12}{'$/h':>7}  aliases"
    )
    for r in rows:
        fp4 = f"{r['fp4_flops'] / 1e12:.1f}" if r["fp4_flops"] > 0 else "-"  # no fp4 cores
        typer.echo(
            f"{r['name']:<18}{r['memory_bytes'] / GIB:>11.2f}{r['usable_bytes'] / GIB:>11.2f}"
            f"{r['bf16_flops'] / 1e12:>13.1f}{fp4:>12}{r['price_per_hour_usd']:>7.2f}  "
            f"{', '.join(r['aliases'])}".rstrip()
        )


def register(app: typer.Typer) -> None:
    """Add `models`, `optimizers` and `gpus` to the CLI app."""
    app.command("models", epilog=EXIT_CODES)(models_cmd)
    app.command("optimizers", epilog=EXIT_CODES)(optimizers_cmd)
    app.command("gpus", epilog=EXIT_CODES)(gpus_cmd)
