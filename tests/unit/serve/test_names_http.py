"""The stumbles of issue 27 over HTTP, each sent as written: `"gpu": "h100"` and `"fleet":
"8xh100"` (aliases, any case) are the H100 as on the CLI while /openapi.json keeps its enum of
profile names; a POST without a JSON content type is a 415 saying to send application/json; a
malformed JSON body stays a 422 that says so."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip(
    "fastapi", reason="trainmem[serve] not installed: pip install 'trainmem[serve]'"
)

from fastapi.testclient import TestClient  # noqa: E402

from trainmem.hardware import gpu_aliases, load_gpus  # noqa: E402
from trainmem.serve._app import create_app  # noqa: E402

JOB = {"model": "gpt2", "seq_len": 1024}
SEARCH = {**JOB, "global_batch_size": 32, "max_pp": 1, "max_cp": 1, "max_micro_batch_size": 4}


@pytest.fixture(scope="module")
def http() -> Iterator[TestClient]:
    with TestClient(create_app()) as client:
        yield client


def _ok(http: TestClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    got = http.post(path, json=body)
    assert got.status_code == 200, got.text
    answer: dict[str, Any] = got.json()
    return answer


@pytest.mark.parametrize("path", ["/v1/estimate", "/v1/fit"])
@pytest.mark.parametrize("gpu", ["h100", "H100", "H100-SXM-80GB"])
def test_gpu_aliases_in_any_case(http: TestClient, path: str, gpu: str) -> None:
    canonical = _ok(http, path, {**JOB, "gpu": "h100-sxm-80gb"})
    assert _ok(http, path, {**JOB, "gpu": gpu}) == canonical


def test_check_takes_a_gpu_alias(http: TestClient) -> None:
    files = {"ds.json": '{"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}}'}
    answer = _ok(http, "/v1/check", {"files": files, "model": "llama-3.2-1b", "gpu": "H100"})
    assert answer["gpu"]["name"] == "h100-sxm-80gb"


@pytest.mark.parametrize(
    ("fleet", "label"),
    [
        ("8xh100", "8xh100"),  # the text sent
        ("8xH100", "8xH100"),
        ({"gpu": "h100", "count": 8}, "8xh100-sxm-80gb"),  # objects: the profile's name
        ([{"gpu": "H100", "num_nodes": 1}], "8xh100-sxm-80gb"),
    ],
)
def test_fleet_aliases_in_any_case(http: TestClient, fleet: Any, label: str) -> None:
    canonical = _ok(http, "/v1/recommend", {**SEARCH, "fleet": "8xh100-sxm-80gb"})
    answer = _ok(http, "/v1/recommend", {**SEARCH, "fleet": fleet})
    assert answer["fleet"] == label
    assert {**answer, "fleet": None} == {**canonical, "fleet": None}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"gpu": "h10"}, "gpu: Input should be 'a100-pcie-80gb'"),
        ({"gpu": 100}, "gpu: Input should be 'a100-pcie-80gb'"),
        ({"fleet": "8xq100"}, "fleet: unknown gpu 'q100'; the accepted names: GET /v1/gpus"),
        ({"fleet": {"gpu": "Q100", "count": 8}}, "fleet.gpu: Input should be 'a100-pcie-80gb'"),
    ],
)
def test_an_unknown_gpu_is_still_a_422_naming_the_field(
    http: TestClient, body: dict[str, Any], message: str
) -> None:
    path = "/v1/recommend" if "fleet" in body else "/v1/estimate"
    got = http.post(path, json={**SEARCH, **body} if "fleet" in body else body)
    assert got.status_code == 422 and got.json()["error"].startswith(message)


def test_the_schema_lists_the_profile_names_only(http: TestClient) -> None:
    schemas = http.get("/openapi.json").json()["components"]["schemas"]
    names = sorted(load_gpus())
    assert sorted(schemas["EstimateRequest"]["properties"]["gpu"]["enum"]) == names
    assert sorted(schemas["FleetPool"]["properties"]["gpu"]["enum"]) == names
    assert not set(gpu_aliases(load_gpus())) & set(names)


@pytest.mark.parametrize("path", ["/v1/estimate", "/v1/fit", "/v1/recommend", "/v1/check"])
@pytest.mark.parametrize(
    "headers", [{}, {"content-type": "text/plain"}, {"content-type": "application/x-www-form"}]
)
def test_a_body_not_sent_as_json_is_415(
    http: TestClient, path: str, headers: dict[str, str]
) -> None:
    got = http.post(path, content=b'{"model": "gpt2"}', headers=headers)
    assert got.status_code == 415
    error = got.json()["error"]
    assert "application/json" in error and "\n" not in error
    assert "valid dictionary" not in error


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON"]
)
def test_json_content_types_are_answered(http: TestClient, content_type: str) -> None:
    body = b'{"model": "gpt2", "seq_len": 1024}'
    got = http.post("/v1/estimate", content=body, headers={"content-type": content_type})
    assert got.status_code == 200


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "body: not valid JSON at character 1: "),
        (b'{"model": "gpt2",}', "body: not valid JSON at character 17: "),
        (b"", "body: empty; send the fields as a JSON object"),
        (b"[1, 2]", "body: expected a JSON object"),
    ],
)
def test_a_malformed_json_body_is_422_saying_so(
    http: TestClient, content: bytes, message: str
) -> None:
    got = http.post("/v1/estimate", content=content, headers={"content-type": "application/json"})
    assert got.status_code == 422 and got.json()["error"].startswith(message), got.text
