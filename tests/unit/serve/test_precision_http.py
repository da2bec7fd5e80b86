"""A precision the request names is the user's choice, as `--precision` is on the command line:
a GPU without it refuses it (HTTP 422, one line naming the field and the precisions the GPU
runs); left out of the body, the default bf16 precision runs as its fp16 counterpart on a GPU
without bf16, with a warning. The Python API follows the same rule (a keyword or a dict key
names it; a TrainingConfig's precision counts as a default)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import trainmem

pytest.importorskip(
    "fastapi", reason="trainmem[serve] not installed: pip install 'trainmem[serve]'"
)

from fastapi.testclient import TestClient  # noqa: E402

from trainmem.serve._app import create_app  # noqa: E402

JOB = {"model": "gpt2", "seq_len": 1024, "gpu": "v100-sxm2-16gb"}
SEARCH = {"model": "gpt2", "seq_len": 1024, "fleet": "8xv100-sxm2-16gb", "global_batch_size": 32}
SEARCH.update(max_pp=1, max_cp=1, max_micro_batch_size=4)
REFUSAL = (
    "precision: {p} needs bf16 matmuls and gpu v100-sxm2-16gb has none (bf16_flops = 0); "
    "allowed on v100-sxm2-16gb: fp32, fp16, amp-fp16, mixed-fp16"
)
DS = '{"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": true}}'


@pytest.fixture(scope="module")
def http() -> Iterator[TestClient]:
    with TestClient(create_app()) as client:
        yield client


CASES = [
    ("/v1/estimate", JOB, "mixed-bf16"),
    ("/v1/estimate", JOB, "amp-bf16"),
    ("/v1/estimate", JOB, "bf16"),
    ("/v1/fit", JOB, "mixed-bf16"),
    ("/v1/recommend", SEARCH, "mixed-bf16"),
    ("/v1/check", {"files": {"ds.json": DS}, **JOB, "seq_len": 512}, "amp-bf16"),
]


@pytest.mark.parametrize(("path", "job", "precision"), CASES)
def test_a_named_precision_the_gpu_lacks_is_a_422(http, path, job, precision) -> None:
    got = http.post(path, json={**job, "precision": precision})
    assert got.status_code == 422, got.text
    assert got.json()["error"] == REFUSAL.format(p=precision)
    assert "\n" not in got.json()["error"]


@pytest.mark.parametrize(("path", "job"), [(p, j) for p, j, _ in (CASES[0], CASES[3], CASES[4])])
def test_a_precision_left_out_is_swapped_with_a_warning(http, path, job) -> None:
    got = http.post(path, json=job)
    assert got.status_code == 200, got.text
    answer = got.json()
    assert any(w.startswith("precision: v100-sxm2-16gb has no bf16") for w in answer["warnings"])
    if path == "/v1/estimate":
        assert answer["config"]["precision"] == "mixed-fp16"
        # The same fields with the precision named answer differently: never from the store.
        assert http.post(path, json={**job, "precision": "mixed-bf16"}).status_code == 422
        assert http.post(path, json=job).status_code == 200


def test_a_named_precision_the_gpu_runs_is_answered(http) -> None:
    got = http.post("/v1/estimate", json={**JOB, "precision": "mixed-fp16"})
    assert got.status_code == 200, got.text
    assert got.json()["config"]["precision"] == "mixed-fp16" and "warnings" not in got.json()


def test_the_python_api_refuses_a_named_precision_and_swaps_a_default() -> None:
    options = {"model": "gpt2", "gpu": "v100-sxm2-16gb", "seq_len": 1024, "advice": False}
    for call in (
        lambda: trainmem.estimate(precision="amp-bf16", **options),
        lambda: trainmem.estimate({"precision": "mixed-bf16"}, **options),
        lambda: trainmem.fit(precision="mixed-bf16", model="gpt2", gpu="v100-sxm2-16gb"),
    ):
        with pytest.raises(ValueError, match="precision: .*-bf16 needs bf16 matmuls"):
            call()
    assert trainmem.estimate(**options)["config"]["precision"] == "amp-fp16"
    config = trainmem.TrainingConfig(precision="amp-bf16")  # every field: a default
    assert trainmem.estimate(config, **options)["config"]["precision"] == "amp-fp16"
