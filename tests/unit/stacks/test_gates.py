"""The scheduler gates of docs/check.md run against a real `trainmem serve` on localhost: the
sbatch wrapper (docs/gates/sbatch-gate.sh) and the Kubernetes validating admission webhook
(docs/gates/admission_webhook.py), each given a job that fits and one that does not."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import trainmem
from trainmem.report import jsonable

pytest.importorskip("uvicorn", reason="trainmem[serve] not installed")

ROOT = Path(__file__).resolve().parents[3]
GATES = ROOT / "docs" / "gates"
TORCHTUNE = ROOT / "tests" / "data" / "stacks" / "torchtune"
FITS = TORCHTUNE / "llama3_2_1B_lora_single_device.yaml"
TOO_BIG = TORCHTUNE / "llama3_1_8B_full.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def service() -> Iterator[str]:
    """`trainmem serve` as a user starts it, in its own process, until the tests end."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainmem.cli", "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail("trainmem serve exited")
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _gate(
    service: str, tmp_path: Path, *files: Path, fleet: str = ""
) -> subprocess.CompletedProcess:
    stub = tmp_path / "sbatch"
    stub.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/submitted\necho "Submitted batch job 7"\n')
    stub.chmod(0o755)
    argv = ["bash", str(GATES / "sbatch-gate.sh")]
    argv += ["--fleet", fleet] if fleet else []
    argv += [*map(str, files), "--", "--nodes=1", "train.sbatch"]
    env = {**os.environ, "TRAINMEM_URL": service, "SBATCH": str(stub)}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


def test_sbatch_gate_submits_a_job_that_fits(service: str, tmp_path: Path) -> None:
    done = _gate(service, tmp_path, FITS)
    assert done.returncode == 0, done.stderr
    assert "Submitted batch job 7" in done.stdout
    assert "sbatch-gate: fits (peak " in done.stderr
    assert (tmp_path / "submitted").read_text().split() == ["--nodes=1", "train.sbatch"]


def test_sbatch_gate_refuses_a_job_that_does_not_fit(service: str, tmp_path: Path) -> None:
    done = _gate(service, tmp_path, TOO_BIG, fleet="2xa10g")
    assert done.returncode == 1, done.stderr
    assert "sbatch-gate: refused, the job does not fit (peak " in done.stderr
    assert "; fix: fsdp_cpu_offload None -> True" in done.stderr
    assert not (tmp_path / "submitted").exists()  # never queued


def test_sbatch_gate_bad_file_is_exit_2(service: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    done = _gate(service, tmp_path, bad)
    assert done.returncode == 2
    assert "sbatch-gate: bad.yaml: not valid YAML" in done.stderr


def _webhook_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "admission_webhook", GATES / "admission_webhook.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def webhook(service: str) -> Iterator[str]:
    module = _webhook_module()
    server = ThreadingHTTPServer(("127.0.0.1", 0), module.make_handler(service))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _admission(webhook: str, annotations: dict[str, str] | None) -> dict[str, Any]:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"}}
    if annotations is not None:
        job["metadata"]["annotations"] = annotations
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "object": job},
    }
    request = urllib.request.Request(
        webhook, json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        answer: dict[str, Any] = json.loads(reply.read())
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    return answer["response"]


def test_webhook_allows_a_job_that_fits(webhook: str) -> None:
    files = {FITS.name: FITS.read_text()}
    response = _admission(webhook, {"trainmem.io/config": json.dumps(files)})
    assert response["allowed"] is True
    assert response["warnings"][0].startswith("trainmem: fits, peak ")


def test_webhook_refuses_a_job_that_does_not_fit(webhook: str) -> None:
    files = {TOO_BIG.name: TOO_BIG.read_text()}
    annotations = {"trainmem.io/config": json.dumps(files), "trainmem.io/fleet": "2xa10g"}
    response = _admission(webhook, annotations)
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["message"].startswith("trainmem: does not fit, peak ")


def test_webhook_leaves_other_objects_and_refuses_bad_files(webhook: str) -> None:
    assert _admission(webhook, None) == {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "allowed": True,
    }
    bad = {"trainmem.io/config": json.dumps({"job.yaml": "model: [unclosed\n"})}
    response = _admission(webhook, bad)
    assert response["allowed"] is False and response["status"]["code"] == 400
    assert "job.yaml: not valid YAML" in response["status"]["message"]


def _post(service: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{service}/v1/check", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_http_check_is_the_cli_json(service: str) -> None:
    """POST /v1/check answers what `trainmem check --json` prints for the same files/flags."""
    status, answer = _post(
        service, {"files": {FITS.name: FITS.read_text()}, "gpu": "a10g-24gb", "fix": True}
    )
    assert status == 200
    direct = trainmem.check({FITS.name: FITS.read_text()}, gpu="a10g-24gb", fix=True)
    assert answer == json.loads(json.dumps(jsonable(direct)))
    assert answer["read"]["micro_batch_size"] == {
        "value": 4, "from": "file:batch_size", "file": FITS.name
    }  # fmt: skip
    assert answer["fix"]["edits"][0]["key"] == "batch_size"


def test_http_check_bad_input_is_422_one_line(service: str, tmp_path: Path) -> None:
    status, answer = _post(service, {"files": {"job.yaml": "model: [unclosed\n"}})
    assert status == 422
    assert answer["error"].startswith("job.yaml: not valid YAML (line 2: ")
    status, answer = _post(service, {"files": {}})
    assert status == 422 and answer["error"].startswith("files:")
    status, answer = _post(service, {"files": {"a.yaml": "x"}, "nope": 1})
    assert status == 422 and answer["error"].startswith("nope:")
    # A model name never reads a server file, even a folder that holds a config.json (the
    # same files on the command line read it).
    (tmp_path / "config.json").write_text(_llama_config())
    job = {"sft.yaml": f"model_name_or_path: {tmp_path}\nper_device_train_batch_size: 1\n"}
    assert trainmem.check(job)["read"]["model"]["value"] == str(tmp_path / "config.json")
    status, answer = _post(service, {"files": job})
    assert status == 422 and answer["error"].startswith("model: cannot resolve")


def _llama_config() -> str:
    from trainmem.catalog import model_config_dict

    config = model_config_dict("llama-3.2-1b")
    return json.dumps({k: v for k, v in config.items() if not k.startswith("_")})
