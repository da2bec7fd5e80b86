"""`trainmem serve`: the HTTP JSON API for schedulers (optional extra `trainmem[serve]`).

    GET  /healthz          liveness and version
    GET  /v1/models        preset names;  GET /v1/gpus: GPU profiles
    POST /v1/estimate      the estimate flags as JSON fields -> `trainmem estimate --json`
    POST /v1/fit           the fit flags -> `trainmem fit --json`
    POST /v1/recommend     the recommend flags -> `trainmem recommend --format json`
                           (+ `launch`: the rendered config when `format` is not json)
    POST /v1/check         {"files": {NAME: TEXT}} + any check flag -> `trainmem check --json`
                           (HTTP 200 whether it fits or not: read `fits`)
    GET  /openapi.json     the schema (FastAPI)
    GET  /, /docs          the offline page and API docs (serve/_page.py; not in the schema)

The request models are generated from the commands' declared options (trainmem.report.Option:
the training configuration's fields and each command's own; names, types, defaults, help,
choices, bounds): one declaration of the fields for the CLI, the API and HTTP. The bounds are
wider than any real job and narrow enough that no product of them overflows int64 in the engine
(seq_len^2 x micro-batch x heads < 2^63). Choices become enums (unknown model,
GPU, precision... -> 422 naming the field), numbers are bounded, unknown fields are refused,
and a value is taken in its JSON type only (strict: true or "2048" is no integer, 1 no boolean).
A GPU is named as on the CLI (an alias, any case): a validator before the enum check maps it to
the profile name, the schema's enum staying the profile names (serve/_fleet.py canonical_gpu).
A POST body must be sent as JSON (else 415, serve/_asgi.py).
Paths are not: a request cannot name a file on the server (model presets, GPUs and optimizers
come from the folders the server was started with; `fleet` is inline text or JSON pools,
serve/_fleet.py). Errors never echo the input (no `input` in `detail`, text cut to 300 chars).

Bounded work (`Limits`): request bodies up to `max_body_bytes`, fit grids up to `max_grid_rows`
candidates, recommend searches up to `max_points` points, at most `max_concurrent` computations
at once and `timeout_s` per request; a request over a limit gets 422 (its input asks for too
much work), a server at its concurrency limit with a full waiting line (serve/_work.py
MAX_WAITING_PER_SLOT) 503 with Retry-After. Equal estimate and fit requests are answered from
the answers kept (serve/_answers.py). The body limit holds for chunked uploads too, and a
computation past `timeout_s` is killed with its worker process (serve/_asgi.py,
serve/_work.py). Binds to loopback (127.0.0.1) unless told otherwise.

Deliberately no `from __future__ import annotations`: FastAPI reads the endpoint annotations, which
name request models built at run time.
"""

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from trainmem.catalog import load_optimizers, model_presets
from trainmem.engine import OPTIMIZERS, Overheads
from trainmem.hardware import load_gpus
from trainmem.report import (
    ESTIMATE_OPTIONS,
    MINIMIZE,
    OUTPUT_FIELDS,
    VOCABULARIES,
    Option,
)
from trainmem.sweep import FIT_OPTIONS

from ._address import check_address, limit_problems
from ._answers import Answers, answer_key
from ._asgi import Guard, logger
from ._fleet import MAX_POOLS, canonical_gpu, inline_pools, pool_model
from ._page import add_page
from ._work import (
    Busy,
    Runner,
    WorkerFault,
    WorkLimit,
    check_work,
    encoded,
    estimate_work,
    fit_work,
    json_bytes,
    recommend_work,
    with_precision_given,
)

SERVER_FIELDS = ("hardware_dir", "models_dir", "optimizers_dir")
"""Command options the server fixes at start-up; a request cannot name a path."""
FILE_FIELDS = ("profile_file",)
"""Command options that name a file: not offered over HTTP (their default, None, applies)."""

INT32_MAX = 2**31 - 1
JSON = "application/json"
"""Every answer's media type."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Work one request may ask for."""

    max_body_bytes: int = 64 * 1024
    """Request body, counted as it arrives (Content-Length or chunked): 413 past it."""
    max_grid_rows: int = 65_536
    """fit: micro-batch or GPU-count candidates evaluated in one grid."""
    max_points: int = 2_000_000
    """recommend: points of the exhaustive search space (~10 s on one core)."""
    timeout_s: float = 30.0
    """Computing time per request; past it the computation's worker process is killed (422)."""
    max_concurrent: int = 2
    """Computations at once, one worker process each (503 with Retry-After when all are busy)."""

    def __post_init__(self) -> None:
        problems = limit_problems({name: getattr(self, name) for name in self.__dataclass_fields__})
        if problems:
            raise ValueError("; ".join(problems))


DEFAULT_LIMITS = Limits()


MAX_STRING_CHARS = 4096
MAX_LIST_ITEMS = 64


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
    types: Mapping[str, Any] | None = None,
) -> Any:
    """A pydantic model of a command's declared options (report.Option): same names, defaults,
    help, choices and bounds; options that name a server path or only change printing are left
    out (`http` False). `gpu` also takes aliases and any case (`canonical_gpu`), its schema
    still the enum of profile names."""
    from pydantic import BeforeValidator, ConfigDict, Field, create_model

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
            if option.name == "gpu":
                base = Annotated[base, BeforeValidator(canonical_gpu(allowed))]
        elif base is int or base == (int | None):
            kwargs.setdefault("ge", -INT32_MAX)
            kwargs.setdefault("le", INT32_MAX)
            kwargs["strict"] = True  # true, "2048" and 2048.5 are not integers
        elif base is float or base == (float | None):
            kwargs.update(allow_inf_nan=False, strict=True)  # a JSON number (an int too)
        elif base is bool or base == (bool | None):
            kwargs["strict"] = True  # "true", 1 and "yes" are not true
        elif base is str or base == (str | None):
            kwargs.update(max_length=MAX_STRING_CHARS, strict=True)
        elif base == (list[str] | None):
            base = list[Annotated[str, Field(max_length=MAX_STRING_CHARS)]] | None
            kwargs["max_length"] = MAX_LIST_ITEMS
        if types and option.name in types:
            base, kwargs = types[option.name], {}
        fields[option.name] = (base, Field(option.default, description=option.help, **kwargs))
    return create_model(name, __config__=ConfigDict(extra="forbid"), **fields)


MAX_ERROR_CHARS = 300
"""Error text is cut to this: an answer never echoes a large input back."""
MAX_OVERHEAD_BYTES = 2.0**50
"""An overhead in bytes up to 1 PiB: beyond any device, below any overflow (fractions: the
engine's own range, [0, 1))."""
MAX_OVERHEAD_FRACTION = 1.0


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _error_line(errors: list[dict[str, Any]]) -> str:
    """pydantic's first error as one line naming the field: 'seq_len: Input should be ...'."""
    if not errors:
        return "invalid request"
    first = errors[0]
    if first.get("type") == "json_invalid":  # loc: ("body", character); ctx: json's reason
        reason = str(first.get("ctx", {}).get("error", "JSON decode error"))
        return _short(f"body: not valid JSON at character {first['loc'][-1]}: {reason}")
    if tuple(first.get("loc", ())) == ("body",) and first.get("type") in _BODY_ERRORS:
        return _BODY_ERRORS[str(first["type"])]
    if first.get("loc", ())[:2] == ("body", "fleet"):  # a union: the most specific branch
        first = max(errors, key=lambda e: len(e.get("loc", ())))
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and p not in _UNION_TAGS]
    # pydantic's message already lists an enum's allowed values ("Input should be 'a' or 'b'").
    return _short(f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid value')}")


_BODY_ERRORS = {
    "missing": "body: empty; send the fields as a JSON object ({} for every default)",
    "model_attributes_type": "body: expected a JSON object of the request's fields",
}
"""pydantic's errors about the whole body, said as what to send."""
_UNION_TAGS = ("constrained-str", "FleetPool", "list[FleetPool]")
"""pydantic's names of the `fleet` union's branches in error locations."""


def _error_detail(errors: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """pydantic's errors without `input` and `ctx` (never echoed), locations and messages cut."""
    return [
        {
            "type": str(e.get("type", "")),
            "loc": [p if isinstance(p, int) else _short(str(p))[:64] for p in e.get("loc", ())],
            "msg": _short(str(e.get("msg", ""))),
        }
        for e in errors[:MAX_POOLS]
    ]


def check_overheads(items: Sequence[str] | None) -> None:
    """`overhead` KEY=BYTES items: a known key and a finite number in range, else ValueError
    naming the key (inf, nan, 1e400 and negatives would overflow or mislead the engine)."""
    names = Overheads.names()
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in names:
            raise ValueError(
                f"overhead: expected KEY=BYTES with KEY one of {', '.join(names)}, "
                f"got '{_short(item)[:64]}'"
            )
        high = MAX_OVERHEAD_FRACTION if key.endswith("_fraction") else MAX_OVERHEAD_BYTES
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not 0 <= number <= high:  # also false for nan
            raise ValueError(
                f"overhead: {key} must be a number from 0 to {high:g}, got '{_short(value)[:32]}'"
            )


def create_app(
    *,
    hardware_dir: str | None = None,
    models_dir: str | None = None,
    optimizers_dir: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Any:
    """The FastAPI application (ASGI): what `trainmem serve` runs under uvicorn.

    The routes are added in groups (lists, estimate and fit, recommend, check), in the order
    the OpenAPI schema lists them."""
    try:
        from fastapi import FastAPI
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ValueError(
            f"serve: needs fastapi and uvicorn ({exc.name} missing); "
            "install them with: pip install 'trainmem[serve]'"
        ) from None

    import anyio.to_thread

    from trainmem.results import tool_version as version

    dirs = {
        "hardware_dir": hardware_dir,
        "models_dir": models_dir,
        "optimizers_dir": optimizers_dir,
    }
    choices = _choices(**dirs)
    run = Runner(max_concurrent=limits.max_concurrent, timeout_s=limits.timeout_s)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        await anyio.to_thread.run_sync(run.start)
        yield
        run.close()  # the worker processes end with the server

    app = FastAPI(
        lifespan=lifespan,
        title="trainmem",
        version=version(),
        description="Per-GPU training memory, fit and plans for schedulers (see README).",
        docs_url=None,  # FastAPI's /docs and /redoc load from a CDN; serve/_page.py's do not
        redoc_url=None,
    )
    app.add_middleware(Guard, max_body_bytes=limits.max_body_bytes)
    _add_error_handlers(app)
    _add_lists(app, choices=choices, version=version)
    app.state.answers = Answers()  # kept 200 answers (serve/_answers.py)
    _add_estimate_fit(
        app, choices=choices, dirs=dirs, limits=limits, run=run, answers=app.state.answers
    )
    _add_recommend(app, choices=choices, dirs=dirs, limits=limits, run=run)
    _add_check(app, choices=choices, dirs=dirs, run=run)
    add_page(app)
    return app


def _add_error_handlers(app: Any) -> None:
    """Every error as {"error": one line} (422 bad input, 503 busy, 500 a failed worker), never
    echoing the input: the shape a scheduler reads whatever went wrong."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> Any:
        errors = list(exc.errors())
        return JSONResponse(
            {"error": _error_line(errors), "detail": _error_detail(errors)}, status_code=422
        )

    @app.exception_handler(ValueError)
    async def _bad_value(_request: Request, exc: ValueError) -> Any:
        return JSONResponse(
            {"error": _short(str(exc).splitlines()[0] if str(exc) else "invalid")}, status_code=422
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> Any:
        if exc.status_code == 400:  # FastAPI could not parse the body (too deeply nested, ...)
            return JSONResponse({"error": "body: not valid JSON"}, status_code=422)
        return JSONResponse(
            {"error": _short(str(exc.detail))}, status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(Busy)
    async def _busy(_request: Request, exc: Busy) -> Any:
        return JSONResponse({"error": str(exc)}, status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(WorkerFault)
    async def _fault(request: Request, exc: WorkerFault) -> Any:
        logger.error("%s %s: computation failed\n%s", request.method, request.url.path, exc)
        return JSONResponse({"error": "internal error; see the server log"}, status_code=500)


def _add_lists(
    app: Any, *, choices: Mapping[str, tuple[str, ...]], version: Callable[[], str]
) -> None:
    """GET /healthz, /v1/models and /v1/gpus: fixed answers, encoded once at start-up and
    sent from the event loop."""
    from fastapi.responses import Response

    bodies = {
        "healthz": json_bytes({"status": "ok", "version": version()}),
        "models": json_bytes({"models": list(choices["model"])}),
        "gpus": json_bytes({"gpus": list(choices["gpu"])}),
    }

    @app.get("/healthz", response_model=dict[str, str])
    async def healthz() -> Response:
        """Liveness: the server answers."""
        return Response(bodies["healthz"], media_type=JSON)

    @app.get("/v1/models", response_model=dict[str, list[str]])
    async def models() -> Response:
        """Model preset names accepted in `model`."""
        return Response(bodies["models"], media_type=JSON)

    @app.get("/v1/gpus", response_model=dict[str, list[str]])
    async def gpus() -> Response:
        """GPU profile names accepted in `gpu` (and in fleets)."""
        return Response(bodies["gpus"], media_type=JSON)


MAX_INLINE_LENGTHS = 65_536
"""Entries of an inline `lengths` or `lengths_histogram` (the body limit binds first)."""


def _risk_types() -> dict[str, Any]:
    """The dataset over HTTP: `lengths` a list of token counts, `lengths_histogram` a list of
    [length, count] pairs, inline (never a path on the server)."""
    from pydantic import Field

    length = Annotated[int, Field(ge=1, le=1 << 40)]
    count = Annotated[int, Field(ge=0, le=1 << 40)]
    return {
        "lengths": Annotated[
            list[length] | None,  # type: ignore[valid-type]
            Field(max_length=MAX_INLINE_LENGTHS),
        ],
        "lengths_histogram": Annotated[
            list[tuple[length, count]] | None,  # type: ignore[valid-type]
            Field(max_length=MAX_INLINE_LENGTHS),
        ],
    }


def _add_estimate_fit(
    app: Any,
    *,
    choices: Mapping[str, tuple[str, ...]],
    dirs: Mapping[str, str | None],
    limits: Limits,
    run: Runner,
    answers: Answers,
) -> None:
    """POST /v1/estimate and /v1/fit; a fit grid over `max_grid_rows` is refused before any
    work starts. The answer is encoded in the worker and sent as it comes (`encoded`); an
    equal request is answered from `answers` (serve/_answers.py)."""
    from fastapi.responses import Response

    types = _risk_types()
    EstimateRequest = request_model(
        "EstimateRequest", ESTIMATE_OPTIONS, choices=choices, types=types
    )
    FitRequest = request_model("FitRequest", FIT_OPTIONS, choices=choices, types=types)

    async def estimate(body: EstimateRequest) -> Response:  # type: ignore[valid-type]
        """`trainmem estimate --json` for the configuration in the body."""
        fields = {**body.model_dump(), **dirs}  # type: ignore[attr-defined]
        check_overheads(fields["overhead"])
        fields = with_precision_given(fields, body)
        body_bytes = await answers.get(
            answer_key("estimate", fields), lambda: run.call(encoded, estimate_work, fields)
        )
        return Response(body_bytes, media_type=JSON)

    async def fit(body: FitRequest) -> Response:  # type: ignore[valid-type]
        """`trainmem fit --json`: the largest micro-batch (or fewest GPUs) that fits."""
        fields = {**body.model_dump(), **dirs}  # type: ignore[attr-defined]
        check_overheads(fields["overhead"])
        rows = fields["max_micro_batch_size"]
        if fields["minimize"] == "num-gpus":
            step = max(fields["tp"] * fields["pp"] * fields["cp"], 1)
            rows = fields["max_num_gpus"] // step
        if rows > limits.max_grid_rows:
            raise WorkLimit(
                f"work limit: fit would evaluate {rows} candidates (limit "
                f"{limits.max_grid_rows}); lower max_micro_batch_size or max_num_gpus"
            )
        fields = with_precision_given(fields, body)
        body_bytes = await answers.get(
            answer_key("fit", fields), lambda: run.call(encoded, fit_work, fields)
        )
        return Response(body_bytes, media_type=JSON)

    app.post("/v1/estimate", response_model=dict[str, Any])(estimate)
    app.post("/v1/fit", response_model=dict[str, Any])(fit)


MAX_FILES = 16
MAX_FILE_NAME_CHARS = 256


def _add_check(
    app: Any, *, choices: Mapping[str, tuple[str, ...]], dirs: Mapping[str, str | None], run: Runner
) -> None:
    from fastapi.responses import Response
    from pydantic import Field

    from trainmem.stacks._options import CHECK_OPTIONS

    files_type = Annotated[
        dict[Annotated[str, Field(min_length=1, max_length=MAX_FILE_NAME_CHARS)], str],
        Field(min_length=1, max_length=MAX_FILES),
    ]
    files_option = Option(name="files", type=dict, default=..., help="File name -> its text.")
    CheckRequest = request_model(
        "CheckRequest", [files_option, *CHECK_OPTIONS], choices=choices, types={"files": files_type}
    )

    async def check(body: CheckRequest) -> Response:  # type: ignore[valid-type]
        """`trainmem check --json` of the job's config files (their names and texts): the
        estimate, what was read and from where, `unmodelled`, `warnings` (and `fix`)."""
        fields = {**body.model_dump(), **dirs}  # type: ignore[attr-defined]
        check_overheads(fields["overhead"])
        fields = with_precision_given(fields, body)
        return Response(await run.call(encoded, check_work, fields), media_type=JSON)

    app.post("/v1/check", response_model=dict[str, Any])(check)


def _add_recommend(
    app: Any,
    *,
    choices: Mapping[str, tuple[str, ...]],
    dirs: Mapping[str, str | None],
    limits: Limits,
    run: Runner,
) -> None:
    from fastapi.responses import JSONResponse
    from pydantic import Field

    from trainmem.plan import (
        FORMATS,
        RECOMMEND_OPTIONS,
        format_framework,
        render,
        replan_note,
        replans,
    )

    per_node = {name: p.gpus_per_node for name, p in load_gpus(dirs["hardware_dir"]).items()}
    Pool = pool_model(choices["gpu"])
    fleet_type = (
        Annotated[str, Field(max_length=MAX_STRING_CHARS)]
        | Pool
        | Annotated[list[Pool], Field(min_length=1, max_length=MAX_POOLS)]  # type: ignore[valid-type]
    )
    RecommendRequest = request_model(
        "RecommendRequest",
        RECOMMEND_OPTIONS,
        choices=choices,
        types={"fleet": fleet_type, **_risk_types()},  # the dataset inline, never a path
    )

    async def recommend(
        body: RecommendRequest,  # type: ignore[valid-type]
        format: Literal[FORMATS] = "json",  # type: ignore[valid-type]  # noqa: A002
    ) -> JSONResponse:
        """`trainmem recommend --format json`; with `?format=` another of FORMATS (deepspeed,
        torchrun, slurm, accelerate, torchtitan, verl, trl) also `launch`, the rendered launch
        configuration. `fleet`: COUNTxGPU[,COUNTxGPU...] or
        inline pools (JSON objects), never a path."""
        fields = {k: getattr(body, k) for k in RecommendRequest.model_fields} | dict(dirs)
        check_overheads(fields["overhead"])
        fields = with_precision_given(fields, body)
        pools, label = inline_pools(fields.pop("fleet"), per_node)
        # The launch format decides the framework, as on the CLI (json: the search's default).
        launched = None if format == "json" else format
        given = fields["framework"]
        fields["framework"] = format_framework(launched, given, fields.get("rl"))
        report: dict[str, Any] = await run.call(
            recommend_work, fields, pools=pools, label=label, max_points=limits.max_points
        )
        if launched is not None and replans(launched, given):  # as the CLI: said in the JSON
            before = await run.call(
                recommend_work,
                {**fields, "framework": given},
                pools=pools,
                label=label,
                max_points=limits.max_points,
            )
            report = {**report, "replanned_for_format": replan_note(before, report, launched)}
        if format != "json":
            report = {**report, "format": format, "launch": render(report, format)}
        return JSONResponse(report)

    app.post("/v1/recommend", response_model=dict[str, Any])(recommend)


def serve(
    *,
    host: str,
    port: int,
    hardware_dir: str | None = None,
    models_dir: str | None = None,
    optimizers_dir: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Run the API under uvicorn until interrupted; one log line per request on stderr.

    The address is checked first (`check_address`: the host resolves, the port binds), then the
    app is built (the folders read); `on_ready` runs after both (the CLI's banner), before
    uvicorn starts."""
    check_address(host, port)
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
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    if on_ready is not None:
        on_ready()
    uvicorn.run(app, host=host, port=port, log_level="warning")
