"""`trainmem serve`: the HTTP JSON API (trainmem.serve) under uvicorn."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from trainmem.serve import DEFAULT_LIMITS, Limits, serve


def serve_cmd(
    host: Annotated[
        str, typer.Option(help="Address to bind (loopback by default; 0.0.0.0 exposes it).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    hardware_dir: Annotated[
        str | None, typer.Option(help="Folder of extra GPU TOML files (or TRAINMEM_HARDWARE_DIR).")
    ] = None,
    models_dir: Annotated[
        str | None, typer.Option(help="Folder of extra model presets (or TRAINMEM_MODELS_DIR).")
    ] = None,
    optimizers_dir: Annotated[
        str | None, typer.Option(help="Folder of extra optimizers (or TRAINMEM_OPTIMIZERS_DIR).")
    ] = None,
    max_points: Annotated[
        int, typer.Option(help="Largest recommend search space per request (points).")
    ] = DEFAULT_LIMITS.max_points,
    max_grid_rows: Annotated[
        int, typer.Option(help="Most fit candidates per request.")
    ] = DEFAULT_LIMITS.max_grid_rows,
    timeout_s: Annotated[float, typer.Option(help="Seconds one request may compute.")] = (
        DEFAULT_LIMITS.timeout_s
    ),
    max_concurrent: Annotated[
        int, typer.Option(help="Computations at once (one worker process each).")
    ] = DEFAULT_LIMITS.max_concurrent,
    max_body_bytes: Annotated[
        int, typer.Option(help="Largest request body, any transfer encoding (413 above).")
    ] = DEFAULT_LIMITS.max_body_bytes,
) -> None:
    """HTTP JSON API for schedulers: /v1/estimate, /v1/fit, /v1/recommend (the serve extra).

    No authentication: keep it on loopback or behind a proxy that authenticates (docs/serve.md).
    One log line per request on stderr.
    """
    if not 0 < port < 65536:
        raise ValueError(f"port: must be 1-65535, got {port}")
    if min(max_points, max_grid_rows, max_concurrent, max_body_bytes) < 1 or not timeout_s > 0:
        raise ValueError(
            "max-points, max-grid-rows, max-concurrent, max-body-bytes and timeout-s must be > 0"
        )
    limits = Limits(
        max_body_bytes=max_body_bytes,
        max_points=max_points,
        max_grid_rows=max_grid_rows,
        timeout_s=timeout_s,
        max_concurrent=max_concurrent,
    )
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: serving on {host}: reachable beyond this machine, without authentication"
            " (docs/serve.md, Authentication)",
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
    )


def register(app: typer.Typer) -> None:
    """Add `serve` to the CLI app."""
    app.command("serve")(serve_cmd)
