"""`trainmem serve`: the HTTP JSON API (trainmem.serve) under uvicorn."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from trainmem.serve import DEFAULT_LIMITS, Limits, serve

# The options, one alias each (the help text beside the type), so that the command's signature
# reads as the option list: names, order and defaults (the limits' defaults are Limits').
_Host = Annotated[
    str, typer.Option(help="Address to bind (loopback by default; 0.0.0.0 exposes it).")
]
_Port = Annotated[int, typer.Option(help="TCP port.")]
_HardwareDir = Annotated[
    str | None, typer.Option(help="Folder of extra GPU TOML files (or TRAINMEM_HARDWARE_DIR).")
]
_ModelsDir = Annotated[
    str | None, typer.Option(help="Folder of extra model presets (or TRAINMEM_MODELS_DIR).")
]
_OptimizersDir = Annotated[
    str | None, typer.Option(help="Folder of extra optimizers (or TRAINMEM_OPTIMIZERS_DIR).")
]
_MaxPoints = Annotated[
    int, typer.Option(help="Largest recommend search space per request (points).")
]
_MaxGridRows = Annotated[int, typer.Option(help="Most fit candidates per request.")]
_TimeoutS = Annotated[float, typer.Option(help="Seconds one request may compute.")]
_MaxConcurrent = Annotated[
    int, typer.Option(help="Computations at once (one worker process each).")
]
_MaxBodyBytes = Annotated[
    int, typer.Option(help="Largest request body, any transfer encoding (413 above).")
]


def serve_cmd(
    host: _Host = "127.0.0.1",
    port: _Port = 8000,
    hardware_dir: _HardwareDir = None,
    models_dir: _ModelsDir = None,
    optimizers_dir: _OptimizersDir = None,
    max_points: _MaxPoints = DEFAULT_LIMITS.max_points,
    max_grid_rows: _MaxGridRows = DEFAULT_LIMITS.max_grid_rows,
    timeout_s: _TimeoutS = DEFAULT_LIMITS.timeout_s,
    max_concurrent: _MaxConcurrent = DEFAULT_LIMITS.max_concurrent,
    max_body_bytes: _MaxBodyBytes = DEFAULT_LIMITS.max_body_bytes,
) -> None:
    """HTTP JSON API for schedulers: /v1/estimate, /v1/fit, /v1/recommend (the serve extra).

    No authentication: keep it on loopback or behind a proxy that authenticates (docs/serve.md).
    One log line per request on stderr.
    """
    limits = Limits(
        max_body_bytes=max_body_bytes,
        max_points=max_points,
        max_grid_rows=max_grid_rows,
        timeout_s=timeout_s,
        max_concurrent=max_concurrent,
    )

    def banner() -> None:
        if host not in ("127.0.0.1", "localhost", "::1"):
            print(
                f"warning: serving on {host}: reachable beyond this machine, without "
                "authentication (docs/serve.md, Authentication)",
                file=sys.stderr,
            )
        print(f"trainmem serve: http://{host}:{port} (OpenAPI at /openapi.json)", file=sys.stderr)

    serve(
        host=host,
        port=port,
        hardware_dir=hardware_dir,
        models_dir=models_dir,
        optimizers_dir=optimizers_dir,
        limits=limits,
        on_ready=banner,
    )


def register(app: typer.Typer) -> None:
    """Add `serve` to the CLI app."""
    app.command("serve")(serve_cmd)
