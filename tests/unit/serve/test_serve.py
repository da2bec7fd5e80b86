"""`trainmem serve`: a real server on a free loopback port, spoken to over HTTP.

The answers equal the CLI's JSON for the same fields (one code path, sweep/_api.py); bad input
gets 422 naming the field; work is bounded; schemathesis fuzzes every operation from the
server's own /openapi.json and no answer may be a 5xx.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

pytest.importorskip(
    "fastapi", reason="trainmem[serve] not installed: pip install 'trainmem[serve]'"
)
pytest.importorskip("uvicorn", reason="trainmem[serve] not installed")

import httpx  # noqa: E402
import uvicorn  # noqa: E402

from trainmem.cli import main  # noqa: E402
from trainmem.serve._app import Limits, create_app  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Server:
    """uvicorn in a thread of the test process, on 127.0.0.1."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.port = _free_port()
        self.app = create_app(limits=limits or Limits())
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_level="error",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> _Server:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    with _Server() as s:
        yield s


@pytest.fixture(scope="module")
def http(server: _Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def _cli_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_healthz_and_lists(http: httpx.Client) -> None:
    assert http.get("/healthz").json()["status"] == "ok"
    assert "llama-3.1-8b" in http.get("/v1/models").json()["models"]
    assert "h100-sxm-80gb" in http.get("/v1/gpus").json()["gpus"]


def test_openapi_names_every_endpoint(http: httpx.Client) -> None:
    schema = http.get("/openapi.json").json()
    assert {"/healthz", "/v1/estimate", "/v1/fit", "/v1/recommend"} <= set(schema["paths"])
    body = schema["components"]["schemas"]["EstimateRequest"]["properties"]
    # The request model is the CLI's estimate flags: same names and defaults.
    assert body["seq_len"]["default"] == 2048
    assert "amp-bf16" in body["precision"]["enum"]


def test_estimate_equals_the_cli(http: httpx.Client, capsys: pytest.CaptureFixture[str]) -> None:
    fields = {
        "model": "llama-3.1-8b",
        "num_gpus": 8,
        "zero": 3,
        "micro_batch_size": 2,
        "seq_len": 4096,
        "recompute": "full",
    }
    got = http.post("/v1/estimate", json=fields)
    assert got.status_code == 200
    want = _cli_json(
        [
            "estimate",
            "--model",
            "llama-3.1-8b",
            "--num-gpus",
            "8",
            "--zero",
            "3",
            "--micro-batch-size",
            "2",
            "--seq-len",
            "4096",
            "--recompute",
            "full",
            "--json",
        ],
        capsys,
    )
    assert got.json() == want


def test_fit_equals_the_cli(http: httpx.Client, capsys: pytest.CaptureFixture[str]) -> None:
    got = http.post("/v1/fit", json={"num_gpus": 8, "zero": 3, "seq_len": 2048})
    assert got.status_code == 200
    want = _cli_json(
        ["fit", "--num-gpus", "8", "--zero", "3", "--seq-len", "2048", "--json"], capsys
    )
    assert got.json() == want
    assert got.json()["max_micro_batch_size"] >= 1


OVERHEAD_ITEMS = ["cuda_context_bytes=2000000000", "fragmentation_fraction=0.3"]
"""Inline overheads (a calibration's keys, what --overhead-file holds on the command line)."""


def test_fit_and_recommend_take_inline_overheads(
    http: httpx.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    """`overhead` (KEY=BYTES items, as /v1/estimate's) on /v1/fit and /v1/recommend: the
    CLI's answer with the same --overhead items; never a file over HTTP."""
    flags = [a for item in OVERHEAD_ITEMS for a in ("--overhead", item)]
    fit = http.post("/v1/fit", json={"overhead": OVERHEAD_ITEMS})
    assert fit.status_code == 200
    assert fit.json() == _cli_json(["fit", *flags, "--json"], capsys)
    assert fit.json() != _cli_json(["fit", "--json"], capsys)
    job = {"model": "llama-3.2-1b", "max_pp": 2, "max_cp": 1, "max_micro_batch_size": 4}
    plan = http.post("/v1/recommend", json={**job, "overhead": OVERHEAD_ITEMS})
    assert plan.status_code == 200
    want = _cli_json(
        ["recommend", "--model", "llama-3.2-1b", "--max-pp", "2", "--max-cp", "1"]
        + ["--max-micro-batch-size", "4", *flags, "--json"],
        capsys,
    )
    assert plan.json()["peak_device_bytes"] == want["peak_device_bytes"]
    assert plan.json()["estimate_command"].endswith(" ".join(flags))
    for path in ("/v1/fit", "/v1/recommend"):
        got = http.post(path, json={"overhead_file": "/etc/passwd"})
        assert got.status_code == 422 and "overhead_file" in got.json()["error"]
        got = http.post(path, json={"overhead": ["cuda_context_bytes=inf"]})
        assert got.status_code == 422 and "cuda_context_bytes" in got.json()["error"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "no-such-model"}, "model"),
        ({"gpu": "tpu-v9"}, "gpu"),
        ({"precision": "fp4"}, "precision"),
        ({"seq_len": 0}, "seq_len"),
        ({"seq_len": "long"}, "seq_len"),
        ({"headroom": 1.5}, "headroom"),
        ({"zero": 4}, "zero"),
        ({"num_gpus": 8, "tp": 3}, "tp"),  # layout check from the engine
        ({"seqlen": 4096}, "seqlen"),  # a typo is refused, not ignored
        ({"models_dir": "/etc"}, "models_dir"),  # no paths over HTTP
        ({"profile_file": "/etc/passwd"}, "profile_file"),
    ],
)
def test_bad_input_is_422_naming_the_field(http: httpx.Client, body: dict, field: str) -> None:
    got = http.post("/v1/estimate", json=body)
    assert got.status_code == 422
    assert field in got.json()["error"]


def test_not_json_is_422(http: httpx.Client) -> None:
    got = http.post(
        "/v1/estimate", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert got.status_code == 422


def test_work_is_bounded() -> None:
    limits = Limits(max_body_bytes=2048, max_grid_rows=100, max_points=1000)
    with _Server(limits) as s, httpx.Client(base_url=s.url, timeout=60) as http:
        big = http.post("/v1/estimate", json={"overhead": ["x" * 4000]})
        assert big.status_code == 413
        fit = http.post("/v1/fit", json={"max_micro_batch_size": 101})
        assert fit.status_code == 422 and "max_micro_batch_size" in fit.json()["error"]
        assert http.post("/v1/fit", json={"max_micro_batch_size": 100}).status_code == 200
        plan = http.post("/v1/recommend", json={"fleet": "64xh100-sxm-80gb"})
        assert plan.status_code == 422 and "work limit" in plan.json()["error"]


def test_slow_work_times_out_with_422() -> None:
    with _Server(Limits(timeout_s=1e-4)) as s, httpx.Client(base_url=s.url, timeout=60) as http:
        got = http.post("/v1/fit", json={"max_micro_batch_size": 4096})
        assert got.status_code == 422
        assert "longer than" in got.json()["error"]


def test_a_timed_out_computation_is_killed() -> None:
    """Past timeout_s the worker process is killed (its computation stops), and the slot gets a
    fresh worker for the next request."""
    import asyncio
    import os

    from trainmem.serve._work import Runner, WorkLimit

    run = Runner(max_concurrent=1, timeout_s=0.5)

    async def scenario() -> None:
        pid = await run.call(os.getpid)
        started = time.monotonic()
        with pytest.raises(WorkLimit, match="longer than 0.5 s"):
            await run.call(time.sleep, 60)
        assert time.monotonic() - started < 10
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # gone, not computing on in the background
        assert await run.call(os.getpid) != pid

    try:
        asyncio.run(scenario())
    finally:
        run.close()


def test_a_full_waiting_line_sheds_with_503_and_a_cancelled_call_is_killed() -> None:
    """With every slot computing, requests wait in arrival order, up to `max_waiting` of them:
    one more is Busy (503) at once. A call whose request goes away (cancelled) kills its
    worker, so that its late answer never reaches the next request."""
    import asyncio
    import os

    from trainmem.serve._work import Busy, Runner

    run = Runner(max_concurrent=1, timeout_s=30, max_waiting=1)

    async def scenario() -> None:
        pid = await run.call(os.getpid)
        slow = asyncio.ensure_future(run.call(time.sleep, 5))
        await asyncio.sleep(0.2)
        waiting = asyncio.ensure_future(run.call(os.getpid))
        await asyncio.sleep(0)
        started = time.monotonic()
        with pytest.raises(Busy):
            await run.call(os.getpid)
        assert time.monotonic() - started < 0.5  # shed at once, not after a wait
        assert not waiting.done()
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed with the cancelled computation
        fresh = await waiting  # the waiting request, served by a fresh worker
        assert fresh != pid and await run.call(os.getpid) == fresh  # no stale answer

    try:
        asyncio.run(scenario())
    finally:
        run.close()


def test_an_equal_request_is_answered_from_memory() -> None:
    """A 200 answer is kept: the same job asked again gets the same bytes without a worker;
    an error is never kept; the store is bounded (least recently used first)."""
    import asyncio

    from trainmem.serve._answers import Answers, answer_key

    with _Server() as s, httpx.Client(base_url=s.url, timeout=60) as http:
        answers = s.app.state.answers
        job = {"model": "llama-3.2-1b", "advice": False}
        first = http.post("/v1/estimate", json=job)
        assert first.status_code == 200 and len(answers) == 1
        again = http.post("/v1/estimate", json={**job, "gpu": "H100"})  # an alias: one job
        assert again.content == first.content and len(answers) == 1
        assert http.post("/v1/estimate", json={**job, "tp": 3}).status_code == 422
        assert len(answers) == 1

    async def fill() -> Answers:
        kept = Answers(max_bytes=300)

        async def body() -> bytes:
            return b"x" * 100

        async def fails() -> bytes:
            raise ValueError("no")

        for name in ("a", "b", "a", "c"):
            await kept.get(answer_key("estimate", {"n": name}), body)
        with pytest.raises(ValueError):
            await kept.get(answer_key("estimate", {"n": "e"}), fails)
        return kept

    kept = asyncio.run(fill())
    assert kept.num_bytes <= 300 and len(kept) == 2  # "b", least recently used, went
    assert set(kept._kept) == {answer_key("estimate", {"n": n}) for n in ("a", "c")}


# ---- adversarial input: 4xx with a short answer, never a 5xx --------------------------------


def _short_answer(got: httpx.Response) -> str:
    assert got.status_code < 500, got.text
    assert len(got.content) < 2_000  # never an echo of the input
    return str(got.json()["error"])


def test_a_chunked_body_is_cut_at_the_limit(http: httpx.Client) -> None:
    """40 MiB without Content-Length (chunked): 413 at 64 KiB, nothing parsed, nothing echoed."""
    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        yield b'{"overhead": ["'
        for _ in range(40):
            sent += 2**20
            yield b"x" * 2**20
        yield b'"]}'

    try:
        got = http.post(
            "/v1/estimate", content=chunks(), headers={"content-type": "application/json"}
        )
    except httpx.TransportError:  # the server may close before the client has sent it all
        assert sent < 40 * 2**20
        return
    assert got.status_code == 413
    assert "larger than" in _short_answer(got)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400", "-1", "1e300", "many"])
def test_overheads_out_of_range_are_422_naming_the_key(http: httpx.Client, value: str) -> None:
    got = http.post("/v1/estimate", json={"overhead": [f"cuda_context_bytes={value}"]})
    assert got.status_code == 422
    assert "cuda_context_bytes" in _short_answer(got)


def test_overheads_at_their_bounds_are_answered(http: httpx.Client) -> None:
    """Bytes up to the GPU's memory (the default H100's 80 GiB): above it nothing could fit."""
    keys = ("cuda_context_bytes", "nccl_bytes_per_communicator")
    extremes = [f"{k}={80 * 2**30}" for k in keys]
    body = {"overhead": [*extremes, "fragmentation_fraction=0.999"], "num_gpus": 8, "pp": 2}
    assert http.post("/v1/estimate", json={**body, "per_stage": True}).status_code == 200


@pytest.mark.parametrize("value", [80 * 2**30 + 1, 2**50])
def test_overheads_above_the_gpus_memory_are_422(http: httpx.Client, value: int) -> None:
    got = http.post("/v1/estimate", json={"overhead": [f"cuda_context_bytes={value}"]})
    assert got.status_code == 422
    assert "cuda_context_bytes" in _short_answer(got) and "memory" in _short_answer(got)


@pytest.mark.parametrize(
    "fleet",
    [
        "/etc/passwd",
        "../x.toml",
        "8xh100-sxm-80gb.toml",
        "pyproject.toml",
        "~/.ssh/id_rsa",
        "/nonexistent/fleet.toml",
        "file:///etc/passwd",
        "",
        {"gpu": "/etc/passwd", "count": 8},
    ],
)
def test_a_fleet_is_never_a_path(http: httpx.Client, fleet: object) -> None:
    """A path-like fleet gets a 422 that says what is accepted and nothing about the server's
    files: an existing file and a missing one answer alike."""
    got = http.post("/v1/recommend", json={"fleet": fleet})
    assert got.status_code == 422
    error = _short_answer(got)
    assert error.startswith("fleet")
    for leak in ("No such file", "cannot read", "invalid TOML", "unknown key", "root:"):
        assert leak not in got.text


@pytest.mark.parametrize("stack", ["llamafactory", "axolotl", "hf", "accelerate"])
def test_check_of_a_script_forced_to_a_mapping_stack_is_422(http: httpx.Client, stack: str) -> None:
    """A file that is no mapping of keys, read as a YAML stack's config: a 422 naming the file
    (was a 500: the reader took `doc.data` None for a mapping; found by the schema fuzzing)."""
    got = http.post("/v1/check", json={"files": {"x": ""}, "stack": stack})
    assert got.status_code == 422
    assert _short_answer(got).startswith(f"x: stack {stack} reads a mapping of keys")


def test_existing_and_missing_files_answer_alike(http: httpx.Client) -> None:
    answers = {
        http.post("/v1/recommend", json={"fleet": path}).text
        for path in ("/etc/passwd", "/etc/no-such-file", "pyproject.toml", "no-such.toml")
    }
    assert len(answers) == 1, answers


def test_inline_fleet_objects(http: httpx.Client) -> None:
    """Pools as JSON objects plan like the same fleet as text."""
    fields = {"seq_len": 4096, "global_batch_size": 256}
    text = http.post("/v1/recommend", json={**fields, "fleet": "16xh100-sxm-80gb"}).json()
    pools = http.post(
        "/v1/recommend", json={**fields, "fleet": {"gpu": "h100-sxm-80gb", "num_nodes": 2}}
    ).json()
    assert pools == text
    priced = http.post(
        "/v1/recommend",
        json={
            **fields,
            "fleet": [
                {"gpu": "a100-sxm-80gb", "count": 12, "gpus_per_node": 4, "price_per_hour_usd": 1.5}
            ],
        },
    )
    assert priced.status_code == 200
    assert priced.json()["fleet"] == "3x4xa100-sxm-80gb@1.5/h"
    assert "/tmp" not in priced.text and "fleet.toml" not in priced.text
    both = {"gpu": "h100-sxm-80gb", "num_nodes": 1, "count": 8}
    assert "exactly one" in _short_answer(http.post("/v1/recommend", json={"fleet": both}))


@pytest.mark.parametrize(
    "body",
    [
        {"model": "x" * 10_000},
        {"overhead": ["x" * 10_000]},
        {"x" * 10_000: 1},
        {"fleet": "x" * 10_000},
        {"fleet": "8x" + "h" * 9_998},
        {"job_name": "x" * 10_000},
        {"time_limit": "9" * 10_000},
    ],
)
def test_long_strings_are_not_echoed(http: httpx.Client, body: dict) -> None:
    path = "/v1/recommend" if set(body) & {"fleet", "job_name", "time_limit"} else "/v1/estimate"
    got = http.post(path, json=body)
    assert got.status_code == 422
    _short_answer(got)
    assert "x" * 400 not in got.text and "h" * 400 not in got.text


@pytest.mark.parametrize("depth", [100, 30_000])
def test_deeply_nested_json_is_422(http: httpx.Client, depth: int) -> None:
    content = b'{"overhead": ' + b"[" * depth + b"]" * depth + b"}"
    got = http.post("/v1/estimate", content=content, headers={"content-type": "application/json"})
    assert got.status_code == 422
    _short_answer(got)


def test_requests_are_logged_without_bodies(
    http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    import time

    def logged() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "trainmem.serve"]

    def seen(lines: list[str]) -> bool:
        return any(
            line.startswith("POST /v1/estimate 422 ") and "client=127.0.0.1:" in line
            for line in lines
        )

    with caplog.at_level("INFO", logger="trainmem.serve"):
        http.post("/v1/estimate", json={"model": "gpt2", "overhead": ["secret=1"]})
        # The server's thread logs after the response has gone out: under load the client can
        # read it first (a flake seen in full runs), so wait a little for the line.
        deadline = time.monotonic() + 5.0
        while not seen(logged()) and time.monotonic() < deadline:
            time.sleep(0.02)
    lines = logged()
    assert seen(lines), lines
    assert not any("secret" in line or "gpt2" in line for line in lines)


def test_serve_binds_loopback_by_default() -> None:
    import inspect

    from trainmem.cli._serve import serve_cmd

    assert inspect.signature(serve_cmd).parameters["host"].default == "127.0.0.1"


def test_serve_command_defaults_are_the_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """`trainmem serve` with no flags starts uvicorn on 127.0.0.1:8000 with the default limits."""
    import trainmem.cli._serve as serve_module

    seen: dict = {}
    monkeypatch.setattr(serve_module, "serve", lambda **kw: seen.update(kw))
    assert main(["serve"]) == 0
    assert (seen["host"], seen["port"]) == ("127.0.0.1", 8000)
    assert seen["limits"] == Limits()


def test_serve_rejects_a_bad_port(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--port", "70000"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


# ---- fuzzing from the server's own schema ---------------------------------------------------


def test_fuzz_no_server_error(server: _Server) -> None:
    """Every operation of /openapi.json, fed schemathesis' generated requests: never a 5xx.

    Driven through hypothesis directly rather than schemathesis' pytest plugin (its fixture
    integration breaks with pytest >= 9.2). Only the 5xx check: schema-valid bodies may still be
    rejected (422) by layout rules the schema cannot express (tp must divide the heads). Edge
    values the generators rarely reach: test_fuzz_edge_values_no_server_error.
    """
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error

    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= {
        "POST /v1/estimate",
        "POST /v1/fit",
        "POST /v1/recommend",
        "GET /healthz",
    }
    # Schema-valid requests and deliberately invalid ones (wrong types, out of range, missing).
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    for operation, mode in itertools.product(operations, modes):
        if mode == modes[1] and operation.method.upper() == "GET":
            continue  # nothing to get wrong: the GET endpoints take no input

        @given(case=operation.as_strategy(mode))
        @settings(
            # each example is an HTTP round trip: half the profile's count (ci 15, deep 500)
            max_examples=max(1, settings.default.max_examples // 2),
            suppress_health_check=list(HealthCheck),
        )
        def no_server_error(case) -> None:  # type: ignore[no-untyped-def]
            case.call_and_validate(base_url=server.url, checks=[not_a_server_error])

        no_server_error()


EDGE_VALUES = (
    # raw JSON: Python's parser also takes NaN, Infinity and 1e400 (= inf)
    "NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e308", "-1e308", "5e-324",
    str(2**63), str(-(2**63)), str(2**31), "-1", "0", "0.5", "true", "null", "[]", "{}",
    '""', '" "', '"/etc/passwd"', '"../x.toml"', '"8xh100-sxm-80gb.toml"', '"0x"',
    '"99999999x' + 'h' * 60 + '"', '"' + "x" * 10_000 + '"', "[" * 50 + "]" * 50,
    '["cuda_context_bytes=Infinity"]', '["fragmentation_fraction=1e400"]', '["=", "a=b=c"]',
    '["gemm_efficiency_max=nan"]', '{"gpu": "h100-sxm-80gb", "count": 1e400}',
    '[{"gpu": "h100-sxm-80gb", "num_nodes": 1000000, "gpus_per_node": 1024}]',
)  # fmt: skip


def test_fuzz_edge_values_no_server_error(http: httpx.Client) -> None:
    """Every body field of every POST operation set to edge values (infinities, huge and
    negative numbers, paths, 10,000-char strings, nesting), a few fields at a time: never a 5xx.
    The field names come from the server's own schema."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    schema = http.get("/openapi.json").json()
    for path in ("/v1/estimate", "/v1/fit", "/v1/recommend"):
        ref = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        name = ref["schema"]["$ref"].rsplit("/", 1)[-1]
        names = sorted(schema["components"]["schemas"][name]["properties"])
        fields = st.dictionaries(st.sampled_from(names), st.sampled_from(EDGE_VALUES), max_size=4)

        @given(fields=fields, path=st.just(path))
        @settings(
            max_examples=max(4, settings.default.max_examples * 2),
            suppress_health_check=list(HealthCheck),
        )
        def no_server_error(fields: dict[str, str], path: str) -> None:
            body = "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
            got = http.post(path, content=body, headers={"content-type": "application/json"})
            assert got.status_code < 500, (path, body[:300], got.text[:300])
            assert len(got.content) < 2_000 or got.status_code == 200

        no_server_error()
        for field in names:  # and each field alone at every edge value
            for value in EDGE_VALUES:
                body = f'{{"{field}": {value}}}'
                got = http.post(path, content=body, headers={"content-type": "application/json"})
                assert got.status_code < 500, (path, body[:300], got.text[:300])


def test_recommend_equals_the_cli(http: httpx.Client, capsys: pytest.CaptureFixture[str]) -> None:
    fields = {
        "model": "llama-3.1-8b",
        "fleet": "8xh100-sxm-80gb",
        "seq_len": 4096,
        "global_batch_size": 256,
    }
    got = http.post("/v1/recommend", json=fields)
    assert got.status_code == 200
    want = _cli_json(
        [
            "recommend",
            "--model",
            "llama-3.1-8b",
            "--fleet",
            "8xh100-sxm-80gb",
            "--seq-len",
            "4096",
            "--global-batch-size",
            "256",
            "--format",
            "json",
        ],
        capsys,
    )
    assert got.json() == want
    plan = got.json()
    assert plan["micro_batch_size"] * plan["grad_accum_steps"] * plan["dp"] == 256


def test_recommend_renders_the_launch_format(
    http: httpx.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    fields = {"fleet": "8xh100-sxm-80gb", "seq_len": 4096, "global_batch_size": 256}
    got = http.post("/v1/recommend", params={"format": "deepspeed"}, json=fields)
    assert got.status_code == 200
    config = json.loads(got.json()["launch"])
    # The format chose the framework (deepspeed), as `trainmem recommend --format deepspeed`.
    capsys.readouterr()
    assert (
        main(
            [
                "recommend",
                "--fleet",
                "8xh100-sxm-80gb",
                "--seq-len",
                "4096",
                "--global-batch-size",
                "256",
                "--format",
                "deepspeed",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert config == json.loads(captured.out)
    assert config["train_batch_size"] == 256
    # The re-plan for the format (deepspeed, not the summary's megatron) is in the JSON, as the
    # CLI says it on stderr (issue 27 item 1).
    note = got.json()["replanned_for_format"]
    assert note["format"] == "deepspeed"
    assert note["changed"]["framework"] == ["megatron", "deepspeed"]
    assert captured.err.startswith("note: --format deepspeed plans for deepspeed")
    plain = http.post("/v1/recommend", json=fields).json()
    assert "replanned_for_format" not in plain
    bad = http.post("/v1/recommend", params={"format": "helm"}, json=fields)
    assert bad.status_code == 422 and "format" in bad.json()["error"]
    # verl renders an RL job only: refused before any search, as on the CLI
    no_rl = http.post("/v1/recommend", params={"format": "verl"}, json=fields)
    assert no_rl.status_code == 422
    assert no_rl.json()["error"] == (
        "format verl: an RL job (--rl grpo|ppo) renders as a verl recipe"
    )
    # trl likewise: GRPO or DPO only (TRL's PPO is not what it renders)
    ppo = http.post("/v1/recommend", params={"format": "trl"}, json={**fields, "rl": "ppo"})
    assert ppo.status_code == 422
    assert ppo.json()["error"].startswith("format trl: an RL job (--rl grpo|dpo)")


def test_concurrent_load_has_no_5xx_and_leaves_nothing(server: _Server) -> None:
    # A CI-sized load (bench/serve_load.py is the full one): 8 clients x 12 requests mixing
    # one job's report, fit, an inline fleet and a bad body; every answer a 200 or a 422, the
    # same report for every equal request, and no fleet folder left in the temp directory.
    import tempfile
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    job = {"model": "llama-3.2-1b", "gpu": "h100-sxm-80gb", "advice": False}
    bodies = [
        ("/v1/estimate", job),
        ("/v1/fit", {"model": "llama-3.2-1b", "gpu": "h100-sxm-80gb"}),
        ("/v1/recommend", {"model": "llama-3.2-1b", "fleet": "2xh100-sxm-80gb"}),
        ("/v1/estimate", {**job, "seq_len": -1}),
    ]
    before = set(Path(tempfile.gettempdir()).glob("trainmem-fleet-*"))

    def client(i: int) -> list[tuple[int, str]]:
        out = []
        with httpx.Client(base_url=server.url, timeout=120) as c:
            for k in range(12):
                path, body = bodies[(i + k) % len(bodies)]
                r = c.post(path, json=body)
                bad = "seq_len" in body
                out.append((r.status_code, r.text if path == "/v1/estimate" and not bad else ""))
                assert r.status_code == (422 if bad else 200), (path, r.text[:200])
        return out

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = [a for batch in pool.map(client, range(8)) for a in batch]
    codes = [code for code, _ in answers]
    assert len(codes) == 96 and set(codes) <= {200, 422}, sorted(set(codes))
    reports = {text for code, text in answers if code == 200 and text}
    assert len(reports) == 1  # one job, one answer, whatever the load
    assert set(Path(tempfile.gettempdir()).glob("trainmem-fleet-*")) <= before
