"""`trainmem check`'s core (trainmem.stacks): files parsed, origins kept, flags over files,
trainmem's defaults for the rest, the model resolved offline, bad input in one line, `--fix`.

The stack here is a small one made for the test (`toy`), so that these tests say what the core
does whatever the real readers (tests/unit/stacks/test_<stack>.py) read.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import trainmem
from trainmem.cli import main
from trainmem.stacks import _stacks, check_report, normalise, parse, read_job, resolve_model
from trainmem.stacks._reading import Doc, Reading, as_bool, as_int
from trainmem.stacks._stacks import Stack

TOY_KEYS = {"model": "model", "mb": "micro_batch_size", "seq": "seq_len", "gpus": "num_gpus"}


def _toy_read(doc: Doc, reading: Reading) -> None:
    for key, name in TOY_KEYS.items():
        if key in doc.data:
            value = doc.data[key] if name == "model" else as_int(doc, key, doc.data[key], ge=1)
            reading.put(name, value, doc, key)
    if "ckpt" in doc.data:
        reading.put(
            "recompute", "full" if as_bool(doc, "ckpt", doc.data["ckpt"]) else "none", doc, "ckpt"
        )
    if "packed" in doc.data:
        reading.unmodelled_key(doc, "packed", "packing")
    reading.default("precision", "bf16", "toy/recipe.py")


def _aux_read(doc: Doc, reading: Reading) -> None:
    reading.put("micro_batch_size", as_int(doc, "mb", doc.data["mb"]), doc, "mb")
    reading.put("zero", as_int(doc, "stage", doc.data["stage"]), doc, "stage")


TOY = Stack(
    name="toy",
    version="1.0",
    framework="torchtune",
    read=_toy_read,
    detect=lambda d: 10 if isinstance(d.data, dict) and "seq" in d.data else 0,
)
AUX = Stack(
    name="aux",
    version="2.0",
    framework="deepspeed",
    read=_aux_read,
    auxiliary=True,
    detect=lambda d: 10 if isinstance(d.data, dict) and "stage" in d.data else 0,
)


@pytest.fixture(autouse=True)
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_stacks, "_STACKS", {"toy": TOY, "aux": AUX})
    monkeypatch.setattr(_stacks, "AUXILIARY_ORDER", ("aux",))
    monkeypatch.setattr("trainmem.stacks._check.AUXILIARY_ORDER", ("aux",))
    monkeypatch.setattr("trainmem.stacks._check.STACK_CHOICES", ("auto", "toy", "aux"))


JOB = "model: meta-llama/Llama-3.2-1B-Instruct\nmb: 4\nseq: 4096\nckpt: true\n"


def test_origins_of_every_field() -> None:
    r = check_report({"job.yaml": JOB})
    read = r["read"]
    assert read["model"] == {"value": "llama-3.2-1b", "from": "file:model", "file": "job.yaml"}
    assert read["micro_batch_size"] == {"value": 4, "from": "file:mb", "file": "job.yaml"}
    assert read["recompute"] == {"value": "full", "from": "file:ckpt", "file": "job.yaml"}
    assert read["precision"] == {"value": "bf16", "from": "stack-default:toy/recipe.py"}
    assert read["framework"]["value"] == "torchtune"
    assert read["framework"]["from"].startswith("stack-default:")
    assert read["tp"] == {"value": 1, "from": "trainmem-default"}
    assert read["gpu"] == {"value": "h100-sxm-80gb", "from": "trainmem-default"}
    assert (r["stack"], r["stack_version"], r["unmodelled"]) == ("toy", "1.0", [])
    # Every estimate key is there, and the numbers are estimate's for the same fields.
    expected = trainmem.estimate(
        model="llama-3.2-1b",
        micro_batch_size=4,
        seq_len=4096,
        recompute="full",
        precision="bf16",
        framework="torchtune",
    )
    assert set(expected) <= set(r)
    assert r["peak_device_bytes"] == expected["peak_device_bytes"]


def test_flags_override_files_and_say_so() -> None:
    r = check_report({"job.yaml": JOB}, micro_batch_size=2, num_gpus=None)
    assert r["read"]["micro_batch_size"] == {"value": 2, "from": "flag"}
    assert r["config"]["micro_batch_size"] == 2
    r = check_report({"job.yaml": JOB}, fleet="8xa100-sxm-80gb")
    assert r["read"]["num_gpus"] == {"value": 8, "from": "flag"}
    assert r["gpu"]["name"] == "a100-sxm-80gb"
    with pytest.raises(ValueError, match="^fleet: give --fleet or --gpu"):
        check_report({"job.yaml": JOB}, fleet="8xa100-sxm-80gb", gpu="h100-sxm-80gb")


def test_auxiliary_file_fills_and_conflicts_warn() -> None:
    reading = read_job({"ds.json": '{"mb": 8, "stage": 2}', "job.yaml": JOB})
    assert reading.fields["zero"].value == 2 and reading.fields["zero"].file == "ds.json"
    assert reading.fields["micro_batch_size"].value == 4  # the main file is read first
    (warning,) = reading.warnings
    assert warning.startswith("micro_batch_size: ds.json:mb says 8, job.yaml:mb says 4")
    alone = read_job({"ds.json": '{"mb": 8, "stage": 2}'})
    assert alone.stack == "aux" and alone.fields["framework"].value == "deepspeed"


def test_unmodelled_keys_are_listed_and_warned() -> None:
    r = check_report({"job.yaml": JOB + "packed: true\n"})
    assert r["unmodelled"] == ["job.yaml:packed"]
    assert "job.yaml:packed: not modelled (packing)" in r["warnings"]


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"job.yaml": "model: [unclosed\n"}, "^job.yaml: not valid YAML \\(line 2"),
        ({"job.json": "{nope"}, "^job.json: not valid JSON \\(line 1"),
        ({"job.toml": "[a\n"}, "^job.toml: not valid TOML"),
        ({"job.yaml": "- a\n- b\n"}, "^job.yaml: expected a mapping of keys at the top level"),
        ({"job.yaml": JOB.replace("mb: 4", "mb: four")}, "^job.yaml: mb: expected an integer"),
        ({"job.yaml": JOB.replace("mb: 4", "mb: 0")}, "^job.yaml: mb: expected an integer >= 1"),
        ({"job.yaml": "seq: 1024\nmb: 1\n"}, "^model: the files name no model; give --model"),
        ({"job.yaml": "model: nosuch/Model-9B\nseq: 1\n"}, "^model: cannot resolve 'nosuch"),
        ({"x.yaml": "learning_rate: 1\n"}, "^x.yaml: cannot tell which stack"),
        ({}, "^files: give at least one config file"),
        (
            {"job.yaml": JOB.replace("seq: 4096", "seq: 99999999")},
            r"^seq_len \(job.yaml:seq\): must be in \[1, 4194304\], got 99999999",
        ),
    ],
)
def test_bad_files_are_one_line(files: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        check_report(files)
    assert "\n" not in str(info.value)


def test_cli_exit_codes_and_nothing_written(tmp_path: Any, capsys: Any) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    assert main(["check", str(job), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fits"] and report["read"]["seq_len"]["file"] == str(job)
    big = tmp_path / "big.yaml"
    big.write_text(JOB.replace("mb: 4", "mb: 256"))
    assert main(["check", str(big), "--fix"]) == 1
    out = capsys.readouterr().out
    assert "read as toy 1.0:" in out and "DOES NOT FIT" in out
    assert "fix: micro-batch 256 -> " in out and f"{big}: mb: 256 -> " in out
    assert main(["check", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: no such file" in capsys.readouterr().err
    assert main(["check", str(job), "--stack", "nope"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.yaml", "job.yaml"]


def test_fix_is_the_smallest_change_that_fits() -> None:
    r = check_report({"job.yaml": JOB.replace("mb: 4", "mb: 256")}, fix=True)
    assert not r["fits"]
    fix = r["fix"]
    (edit,) = fix["edits"]
    assert (edit["file"], edit["key"], edit["from"]) == ("job.yaml", "mb", 256)
    fits = trainmem.estimate(
        model="llama-3.2-1b",
        micro_batch_size=edit["to"],
        seq_len=4096,
        recompute="full",
        precision="bf16",
        framework="torchtune",
    )
    over = trainmem.estimate(
        model="llama-3.2-1b",
        micro_batch_size=edit["to"] + 1,
        seq_len=4096,
        recompute="full",
        precision="bf16",
        framework="torchtune",
    )
    assert fits["fits"] and not over["fits"]  # the largest micro-batch that fits
    assert fix["peak_device_bytes"] == fits["peak_device_bytes"]
    assert check_report({"job.yaml": JOB}, fix=True)["fix"] is None  # it fits: nothing to fix


def test_python_api_takes_paths_or_texts(tmp_path: Any) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    by_path = trainmem.check(job)
    by_text = trainmem.check({"job.yaml": JOB})
    assert by_path["peak_device_bytes"] == by_text["peak_device_bytes"]
    assert trainmem.check([str(job)], seq_len=1024)["read"]["seq_len"]["from"] == "flag"


def test_local_config_json_is_used_unless_over_http(tmp_path: Any) -> None:
    folder = tmp_path / "my-ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_config("llama-3.2-1b")))
    job = {"job.yaml": f"model: {folder}\nseq: 1024\n"}
    assert check_report(job)["read"]["model"]["value"] == str(folder / "config.json")
    with pytest.raises(ValueError, match="^model: cannot resolve"):
        check_report(job, local_paths=False)


def _config(name: str) -> dict[str, Any]:
    from trainmem.catalog import model_config_dict

    return {k: v for k, v in model_config_dict(name).items() if not k.startswith("_")}


@pytest.mark.parametrize(
    ("name", "preset"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("/tmp/Meta-Llama-3-8B-Instruct/", "llama-3-8b"),
        ("checkpoints/meta-llama/Llama-2-7b-hf", "llama-2-7b"),
        ("llama3_1_8b", "llama-3.1-8b"),
        ("llama3_2_1b", "llama-3.2-1b"),
        ("qwen2_5_7b", "qwen2.5-7b"),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b"),
        ("google/gemma-2-9b-it", "gemma-2-9b"),
        ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", "tinyllama-1.1b"),
        ("microsoft/Phi-3-mini-4k-instruct", "phi-3-mini"),
        ("unsloth/llama-3-8b-bnb-4bit", "llama-3-8b"),
        ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"),
        ("Qwen/Qwen3-8B", "qwen3-8b"),
        ("llama-3.1-8b", "llama-3.1-8b"),
    ],
)
def test_model_names_resolve_offline(name: str, preset: str) -> None:
    assert resolve_model(name) == preset


def test_normalise_keeps_sizes() -> None:
    assert normalise("Llama-3.2-3B-Instruct") == "llama-3.2-3b"
    assert normalise("Phi-3.5-mini-instruct") == "phi-3.5-mini"


def test_syntax_sniffed_without_suffix() -> None:
    assert parse("config", '{"a": 1}').syntax == "json"
    assert parse("config", "[training]\nseq_len = 1\n").syntax == "toml"
    assert parse("config", "a: 1\nb: 2\n").syntax == "yaml"
    assert parse("run", "#!/bin/bash\ntorchrun --nproc_per_node 8 train.py\n").syntax == "shell"


def test_docs_fix_example_is_what_check_prints() -> None:
    """docs/check.md shows `--fix` in a text block (it exits 1, so the README test cannot run
    it): its lines are what the command prints."""
    from pathlib import Path

    from trainmem.cli._check import human_check
    from trainmem.stacks import read_files

    _stacks._STACKS.clear()  # the real readers, not the toy
    page = (Path(__file__).parents[3] / "docs" / "check.md").read_text()
    block = page.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    argv = block[0].removeprefix("$ trainmem check ").split()
    path = argv[0]
    report = check_report(read_files([path]), gpu="a10g", fix=True)
    printed = human_check(report).splitlines()
    for line in (x for x in block[1:] if x != "..."):
        assert line in printed, line


def test_no_function_over_60_lines_in_stacks() -> None:
    """House style (as engine/'s): each reader is small functions, one per group of keys."""
    import ast
    from pathlib import Path

    folder = Path(__file__).parents[3] / "stacks"
    long = [
        f"{path.name}:{node.name} {node.end_lineno - node.lineno + 1}"
        for path in sorted(folder.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > 60
    ]
    assert long == []
