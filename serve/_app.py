"""`trainmem serve`: the HTTP JSON API for schedulers (optional extra `trainmem[serve]`).

    GET  /healthz          liveness and version
    GET  /v1/models        preset names;  GET /v1/gpus: GPU profiles
    POST /v1/estimate      the estimate flags as JSON fields -> `trainmem estimate --json`
    POST /v1/fit           the fit flags -> `trainmem fit --json`
    POST /v1/recommend     the recommend flags -> `trainmem recommend --format json`
                           (+ `launch`: the rendered config when `format` is not json)
    GET  /openapi.json     the schema (FastAPI), /docs its browsable form

The request models are generated from the commands' declared options (trainmem.report.Option:
the training configuration's fields and each command's own; names, types, defaults, help,
choices, bounds): one declaration of the fields for the CLI, the API and HTTP. The bounds are
wider than any real job and narrow enough that no product of them overflows int64 in the engine
(seq_len^2 x micro-batch x heads < 2^63). Choices become enums (unknown model,
GPU, precision... -> 422 naming the field), numbers are bounded, unknown fields are refused.
Paths are not: a request cannot name a file on the server (model presets, GPUs and optimizers
come from the folders the server was started with).

Bounded work (`Limits`): request bodies up to `max_body_bytes`, fit grids up to `max_grid_rows`
candidates, recommend searches up to `max_points` points, at most `max_concurrent` computations
at once and `timeout_s` per request; a request over a limit gets 422 (its input asks for too
much work), a server at its concurrency limit 503 with Retry-After. Binds to loopback
(127.0.0.1) unless told otherwise.

Deliberately no `from __future__ import annotations`: FastAPI reads the endpoint annotations, which
name request models built at run time.
"""

import concurrent.futures
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from trainmem.catalog import load_optimizers, model_presets
from trainmem.engine import OPTIMIZERS
from trainmem.hardware import load_gpus
from trainmem.report import (
    ESTIMATE_OPTIONS,
    MINIMIZE,
    OUTPUT_FIELDS,
    VOCABULARIES,
    Option,
    estimate_report,
    jsonable,
)
from trainmem.sweep import FIT_OPTIONS, fit_report

SERVER_FIELDS = ("hardware_dir", "models_dir", "optimizers_dir")
"""Command options the server fixes at start-up; a request cannot name a path."""
FILE_FIELDS = ("profile_file",)
"""Command options that name a file: not offered over HTTP (their default, None, applies)."""

INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Limits:
    """Work one request may ask for."""

    max_body_bytes: int = 64 * 1024
    max_grid_rows: int = 65_536
    """fit: micro-batch or GPU-count candidates evaluated in one grid."""
    max_points: int = 2_000_000
    """recommend: points of the exhaustive search space (~10 s on one core)."""
    timeout_s: float = 30.0
    max_concurrent: int = 2


DEFAULT_LIMITS = Limits()


MAX_STRING_CHARS = 4096
MAX_LIST_ITEMS = 64


class WorkLimit(ValueError):
    """The request asks for more work than the server's limits allow (answered with 422)."""


class Busy(RuntimeError):
    """Every computation slot is taken (answered with 503 and Retry-After)."""


def _choices(*, hardware_dir: str | None, models_dir: str | None, optimizers_dir: str | None):
    user_optimizers = tuple(load_optimizers(optimizers_dir)) if optimizers_dir else ()
    return {
        "model": tuple(model_presets(models_dir)),
        "gpu": tuple(load_gpus(hardware_dir)),
        **VOCABULARIES,
        "optimizer": tuple(dict.fromkeys((*OPTIMIZERS, *user_optimizers))),
        "minimize": MINIMIZE,
    }


def request_model(
    name: str,
    options: Sequence[Option],
    *,
    choices: Mapping[str, tuple[str, ...]],
) -> Any:
    """A pydantic model of a command's declared options (report.Option): same names, defaults,
    help, choices and bounds; options that name a server path or only change printing are left
    out (`http` False)."""
    from pydantic import ConfigDict, Field, create_model

    fields: dict[str, Any] = {}
    for option in options:
        if not option.http or option.name in (*OUTPUT_FIELDS, *SERVER_FIELDS, *FILE_FIELDS):
            continue
        base = option.type
        bounds = {k: getattr(option, k) for k in ("ge", "le", "gt", "lt")}
        kwargs: dict[str, Any] = {k: v for k, v in bounds.items() if v is not None}
        allowed = choices.get(option.name, option.choices)
        if allowed is not None:
            base = Literal[allowed]  # type: ignore[valid-type]
            if option.default is None:
                base = base | None
        elif base is int or base == (int | None):
            kwargs.setdefault("ge", -INT32_MAX)
            kwargs.setdefault("le", INT32_MAX)
        elif base is float or base == (float | None):
            kwargs["allow_inf_nan"] = False
        elif base is str or base == (str | None):
            kwargs["max_length"] = MAX_STRING_CHARS
        elif base == (list[str] | None):
            base = list[Annotated[str, Field(max_length=MAX_STRING_CHARS)]] | None
            kwargs["max_length"] = MAX_LIST_ITEMS
        fields[option.name] = (base, Field(option.default, description=option.help, **kwargs))
    return create_model(name, __config__=ConfigDict(extra="forbid"), **fields)


class _Runner:
    """At most `max_concurrent` computations, each waited for at most `timeout_s`."""

    def __init__(self, limits: Limits) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(limits.max_concurrent)
        self._slots = threading.BoundedSemaphore(limits.max_concurrent)
        self._timeout_s = limits.timeout_s

    def __call__(self, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        if not self._slots.acquire(timeout=1.0):
            raise Busy("all computation slots are busy; retry shortly")
        future = self._pool.submit(work)
        future.add_done_callback(lambda _: self._slots.release())
        try:
            return future.result(timeout=self._timeout_s)
        except concurrent.futures.TimeoutError:
            raise WorkLimit(
                f"work limit: the request took longer than {self._timeout_s:g} s; narrow it"
            ) from None


def _error_line(errors: list[dict[str, Any]]) -> str:
    """pydantic's first error as one line naming the field: 'seq_len: Input should be ...'."""
    if not errors:
        return "invalid request"
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    field = ".".join(loc) or "body"
    # pydantic's message already lists an enum's allowed values ("Input should be 'a' or 'b'").
    message = " ".join(str(first.get("msg", "invalid value")).split())
    return f"{field}: {message}"


def create_app(
    *,
    hardware_dir: str | None = None,
    models_dir: str | None = None,
    optimizers_dir: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Any:
    """The FastAPI application (ASGI): what `trainmem serve` runs under uvicorn."""
    try:
        from fastapi import FastAPI, Request
        from fastapi.exceptions import RequestValidationError
        from fastapi.responses import JSONResponse
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ValueError(
            f"serve: needs fastapi and uvicorn ({exc.name} missing); "
            "install them with: pip install 'trainmem[serve]'"
        ) from None

    from trainmem.results import tool_version as version

    dirs = {
        "hardware_dir": hardware_dir,
        "models_dir": models_dir,
        "optimizers_dir": optimizers_dir,
    }
    choices = _choices(**dirs)
    EstimateRequest = request_model("EstimateRequest", ESTIMATE_OPTIONS, choices=choices)
    FitRequest = request_model("FitRequest", FIT_OPTIONS, choices=choices)
    run = _Runner(limits)

    app = FastAPI(
        title="trainmem",
        version=version(),
        description="Per-GPU training memory, fit and plans for schedulers (see README).",
    )

    @app.middleware("http")
    async def _limit_body(request: Request, call_next: Any) -> Any:
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limits.max_body_bytes:
            return JSONResponse(
                {"error": f"body: larger than {limits.max_body_bytes} bytes"}, status_code=413
            )
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> Any:
        errors = jsonable([{k: v for k, v in e.items() if k != "url"} for e in exc.errors()])
        return JSONResponse(
            {"error": _error_line(errors), "detail": _plain(errors)}, status_code=422
        )

    @app.exception_handler(ValueError)
    async def _bad_value(_request: Request, exc: ValueError) -> Any:
        return JSONResponse({"error": str(exc).splitlines()[0]}, status_code=422)

    @app.exception_handler(Busy)
    async def _busy(_request: Request, exc: Busy) -> Any:
        return JSONResponse({"error": str(exc)}, status_code=503, headers={"Retry-After": "1"})

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        """Liveness: the server answers."""
        return {"status": "ok", "version": version()}

    @app.get("/v1/models")
    def models() -> dict[str, list[str]]:
        """Model preset names accepted in `model`."""
        return {"models": list(choices["model"])}

    @app.get("/v1/gpus")
    def gpus() -> dict[str, list[str]]:
        """GPU profile names accepted in `gpu` (and in fleets)."""
        return {"gpus": list(choices["gpu"])}

    def estimate(body: EstimateRequest) -> dict[str, Any]:  # type: ignore[valid-type]
        """`trainmem estimate --json` for the configuration in the body."""
        fields = {**body.model_dump(), **dirs}  # type: ignore[attr-defined]
        return run(lambda: jsonable(estimate_report(**fields)))

    def fit(body: FitRequest) -> dict[str, Any]:  # type: ignore[valid-type]
        """`trainmem fit --json`: the largest micro-batch (or fewest GPUs) that fits."""
        fields = {**body.model_dump(), **dirs}  # type: ignore[attr-defined]
        rows = fields["max_micro_batch_size"]
        if fields["minimize"] == "num-gpus":
            step = max(fields["tp"] * fields["pp"] * fields["cp"], 1)
            rows = fields["max_num_gpus"] // step
        if rows > limits.max_grid_rows:
            raise WorkLimit(
                f"work limit: fit would evaluate {rows} candidates (limit "
                f"{limits.max_grid_rows}); lower max_micro_batch_size or max_num_gpus"
            )
        return run(lambda: fit_report(**fields))

    app.post("/v1/estimate")(estimate)
    app.post("/v1/fit")(fit)
    _add_recommend(app, choices=choices, dirs=dirs, limits=limits, run=run)
    return app


def _plain(value: Any) -> Any:
    """pydantic error contexts may hold exceptions: strings for JSON."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _add_recommend(
    app: Any,
    *,
    choices: Mapping[str, tuple[str, ...]],
    dirs: Mapping[str, str | None],
    limits: Limits,
    run: Callable[[Callable[[], dict[str, Any]]], dict[str, Any]],
) -> None:
    from trainmem.plan import (
        RECOMMEND_OPTIONS,
        check_format,
        recommend_report,
        render,
        space_points,
    )

    RecommendRequest = request_model("RecommendRequest", RECOMMEND_OPTIONS, choices=choices)
    from trainmem.plan import DEFAULT_FRAMEWORK, FORMATS

    def recommend(
        body: RecommendRequest,  # type: ignore[valid-type]
        format: Literal[FORMATS] = "json",  # type: ignore[valid-type]  # noqa: A002
    ) -> dict[str, Any]:
        """`trainmem recommend --format json`; with `?format=deepspeed|torchrun|slurm|accelerate`
        also `launch`, the rendered launch configuration."""
        fields = {**body.model_dump(), **dirs}  # type: ignore[attr-defined]
        if format != "json":  # the launch format decides the framework, as on the CLI
            check_format(format, fields["framework"] or DEFAULT_FRAMEWORK[format])
            fields["framework"] = fields["framework"] or DEFAULT_FRAMEWORK[format]
        points = space_points(**fields)
        if points > limits.max_points:
            raise WorkLimit(
                f"work limit: recommend would search {points:,} points (limit "
                f"{limits.max_points:,}); narrow fleet, max_pp, max_cp or max_micro_batch_size"
            )
        report = run(lambda: jsonable(recommend_report(**fields)))
        if format != "json":
            report = {**report, "format": format, "launch": render(report, format)}
        return report

    app.post("/v1/recommend")(recommend)


def serve(
    *,
    host: str,
    port: int,
    hardware_dir: str | None = None,
    models_dir: str | None = None,
    optimizers_dir: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> None:
    """Run the API under uvicorn until interrupted."""
    try:
        import uvicorn
    except ImportError:  # pragma: no cover - depends on the environment
        raise ValueError(
            "serve: needs fastapi and uvicorn; install them with: pip install 'trainmem[serve]'"
        ) from None
    app = create_app(
        hardware_dir=hardware_dir,
        models_dir=models_dir,
        optimizers_dir=optimizers_dir,
        limits=limits,
    )
    uvicorn.run(app, host=host, port=port, log_level="warning")
