"""Load on `trainmem serve`: requests per second and p50 / p99 latency for each endpoint, at a
given concurrency, over loopback, against a fresh server process (the console script, as users
start it), with the status codes seen and the server's memory before and after.

Run: python -m bench.serve_load [--concurrency 16] [--requests 400] [--endpoint NAME ...]

Each endpoint is driven apart: `--concurrency` client threads, each with its own keep-alive
connection, share `--requests` requests. The server keeps the answers it has computed
(serve/_answers.py), so `estimate` (one job asked again and again, as a scheduler polls it)
measures the HTTP layer; `estimate-distinct` asks a different job each time (its `tokens`, the
training length, is 10^9 + the request's index), so every answer is computed in a worker (on
the engine's warm per-shape terms: a shape never seen costs some ms more, once). Printed per
endpoint: requests/s (completed requests over the wall time of the burst), p50 and p99 latency
in ms, the count of 2xx / 4xx / 5xx and transport errors; then the server's resident memory
(MiB, /proc) before and after and the `trainmem-fleet-*` folders left in the temp directory.
The last line is `worst_p99_ms=<number> errors_5xx=<n>`.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.startup import trainmem_command

JOB = {"model": "llama-3.1-8b", "gpu": "h100-sxm-80gb", "num_gpus": 8, "zero": 3}
Body = dict[str, Any] | Callable[[int], dict[str, Any]] | None


def distinct_job(index: int) -> dict[str, Any]:
    """Request `index`'s job: JOB without advice, trained on 10^9 + index tokens (no two
    alike, one shape)."""
    return {**JOB, "advice": False, "tokens": 1e9 + index}


ENDPOINTS: dict[str, tuple[str, str, Body]] = {
    "healthz": ("GET", "/healthz", None),
    "models": ("GET", "/v1/models", None),
    "estimate": ("POST", "/v1/estimate", {**JOB, "advice": False}),
    "estimate-distinct": ("POST", "/v1/estimate", distinct_job),
    "estimate+advice": ("POST", "/v1/estimate", JOB),
    "fit": ("POST", "/v1/fit", JOB),
}
"""name -> (method, path, JSON body or a function of the request's index): the lists, one
job's report without and with its advice (the advice recomputes what-ifs), the report of a
different job each time, and fit's micro-batch search."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    """Resident memory of process `pid` (MiB), from /proc (nan where there is none)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def fleet_folders() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("trainmem-fleet-*")}


@contextlib.contextmanager
def server(port: int, *, max_concurrent: int | None) -> Iterator[subprocess.Popen[bytes]]:
    """A `trainmem serve` process on 127.0.0.1:`port`, ready (healthz answered), ended on exit."""
    argv = [*trainmem_command(), "serve", "--host", "127.0.0.1", "--port", str(port)]
    if max_concurrent:
        argv += ["--max-concurrent", str(max_concurrent)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60.0
        while True:
            try:
                status, _ = request(http.client.HTTPConnection("127.0.0.1", port), "healthz")
                if status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve did not start on port {port} (exit {proc.poll()})")
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def request(conn: http.client.HTTPConnection, name: str, index: int = 0) -> tuple[int, float]:
    """(status, seconds) of request `index` of endpoint `name` on a kept-alive connection."""
    method, path, body = ENDPOINTS[name]
    if callable(body):
        body = body(index)
    payload = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if payload is not None else {}
    start = time.perf_counter()
    conn.request(method, path, body=payload, headers=headers)
    response = conn.getresponse()
    response.read()
    return response.status, time.perf_counter() - start


def burst(port: int, name: str, *, requests: int, concurrency: int) -> dict[str, Any]:
    """`requests` requests of endpoint `name` over `concurrency` threads: rate, latencies and
    status counts."""
    latencies: list[float] = []
    counts = {"2xx": 0, "4xx": 0, "5xx": 0, "transport": 0}
    lock = threading.Lock()
    remaining = [requests]

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            with lock:
                if remaining[0] <= 0:
                    break
                remaining[0] -= 1
                index = remaining[0]
            try:
                status, seconds = request(conn, name, index)
            except (OSError, http.client.HTTPException):
                with lock:
                    counts["transport"] += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                continue
            with lock:
                latencies.append(seconds)
                counts[f"{status // 100}xx" if status // 100 in (2, 4, 5) else "transport"] += 1
        conn.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ordered = sorted(latencies) or [float("nan")]
    return {
        "endpoint": name,
        "requests_per_second": len(latencies) / wall,
        "p50_ms": 1e3 * statistics.median(ordered),
        "p99_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        **counts,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=400, help="per endpoint")
    parser.add_argument(
        "--endpoint", action="append", choices=sorted(ENDPOINTS), help="default: all"
    )
    parser.add_argument("--max-concurrent", type=int, default=None, help="serve's own option")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = parser.parse_args(argv)
    names = args.endpoint or list(ENDPOINTS)
    port = free_port()
    folders_before = fleet_folders()
    with server(port, max_concurrent=args.max_concurrent) as proc:
        rss_before = rss_mib(proc.pid)
        rows = [burst(port, n, requests=args.requests, concurrency=args.concurrency) for n in names]
        rss_after = rss_mib(proc.pid)
    left = sorted(fleet_folders() - folders_before)
    summary = {
        "cpus": os.cpu_count(),
        "concurrency": args.concurrency,
        "server_rss_mib_before": rss_before,
        "server_rss_mib_after": rss_after,
        "fleet_folders_left": left,
        "endpoints": rows,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"trainmem serve on {os.cpu_count()} CPUs, {args.concurrency} concurrent clients")
    print(f"{'endpoint':<16} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}  2xx  4xx  5xx  transport")
    for r in rows:
        print(
            f"{r['endpoint']:<16} {r['requests_per_second']:8.1f} {r['p50_ms']:8.1f} "
            f"{r['p99_ms']:8.1f} {r['2xx']:4d} {r['4xx']:4d} {r['5xx']:4d} {r['transport']:4d}"
        )
    print(f"server RSS: {rss_before:.0f} MiB before, {rss_after:.0f} MiB after")
    print(f"trainmem-fleet-* folders left: {len(left)}")
    worst = max(r["p99_ms"] for r in rows)
    print(f"worst_p99_ms={worst:.1f} errors_5xx={sum(r['5xx'] for r in rows)}")


if __name__ == "__main__":
    main()
