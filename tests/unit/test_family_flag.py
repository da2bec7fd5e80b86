"""`--family` (issue 14): a config.json whose model_type trainmem does not know is refused with
a one-line error that names it, lists the supported model_types and proposes the flag; with
`--family` it is read with that family's layout, in every command that reads a model, and the
commands that print a reproduce line carry the flag."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from trainmem.catalog import builtin_profiles, load_model, model_config_dict
from trainmem.cli import main
from trainmem.engine import FAMILIES, model_from_hf_config

OLMO2 = {  # a Llama-shaped config under a model_type no reader knows (here: OLMo-2-7B's shape)
    "model_type": "acme_decoder",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 100352,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


@pytest.fixture
def olmo(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(OLMO2))
    return str(path)


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_an_unknown_model_type_is_refused_with_the_flag_proposed(olmo: str) -> None:
    with pytest.raises(ValueError) as err:
        load_model(olmo)
    text = str(err.value)
    assert "model_type 'acme_decoder' is not supported" in text and "\n" not in text
    assert "--family llama|gpt-neox|falcon|gpt2|bert" in text


@pytest.mark.parametrize("model_type", ["t5", "mt5", "t5gemma"])
def test_a_t5_is_refused_with_the_shipped_t5_profiles_named(model_type: str) -> None:
    with pytest.raises(ValueError) as err:
        model_from_hf_config({"model_type": model_type, "d_model": 768}, name="t5")
    text = str(err.value)
    assert f"model_type '{model_type}' is not supported" in text and "\n" not in text
    assert "--profile t5-v1_1-base-amp-bf16 " in text
    assert "--family" not in text  # no decoder family reads an encoder-decoder
    for name in (
        "t5-v1_1-base-amp-bf16",
        "t5-v1_1-base-amp-bf16-recompute-full",
        "t5-base-amp-bf16",
    ):
        assert name in text and name in builtin_profiles()


def test_a_forced_family_reads_the_config_as_that_family(olmo: str) -> None:
    forced = load_model(olmo, family="llama")
    # The same shape as a Llama config: the same count, field for field.
    as_llama = model_from_hf_config({**OLMO2, "model_type": "llama"}, name="x")
    assert forced.num_parameters == as_llama.num_parameters
    assert forced.model_type == "acme_decoder"  # kept: outputs say what was read
    # A preset forced to its own family is unchanged.
    llama = model_config_dict("llama-3.1-8b")
    assert model_from_hf_config(llama, name="l", family="llama").num_parameters == (
        load_model("llama-3.1-8b").num_parameters
    )


def test_a_family_whose_fields_the_config_lacks_names_them(olmo: str) -> None:
    with pytest.raises(ValueError, match=r"missing required field\(s\): n_embd, n_layer, n_head"):
        load_model(olmo, family="gpt2")
    with pytest.raises(ValueError, match=r"^family: unknown value 'lama'; allowed: llama, "):
        load_model(olmo, family="lama")
    assert set(FAMILIES) == {"llama", "gpt-neox", "falcon", "gpt2", "bert"}


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "--json"],
        ["fit", "--json"],
        ["recommend", "--json"],
    ],
)
def test_every_model_command_takes_the_flag(
    argv: list[str], olmo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cmd = [argv[0], "--model", olmo, *argv[1:]]
    assert main(cmd) == 2
    assert "not supported" in capsys.readouterr().err
    out = _json(capsys, [*cmd, "--family", "llama"])
    report = out.get("estimate", out)
    assert report.get("num_parameters", 7_298_355_200) == 7_298_355_200


def test_sweep_takes_the_flag(
    olmo: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _json(capsys, ["sweep", "--model", olmo, "--family", "llama", "--out",
                         str(tmp_path / "o"), "--json"])  # fmt: skip
    assert out["best"]["fits"]


def test_the_reproduce_line_carries_the_flag(olmo: str, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _json(capsys, ["recommend", "--model", olmo, "--family", "llama", "--json"])
    argv = shlex.split(plan["estimate_command"])
    assert argv[argv.index("--family") + 1] == "llama"
    again = _json(capsys, [*argv[1:], "--json"])
    assert again["peak_device_bytes"] == plan["peak_device_bytes"]


def test_a_bad_family_is_one_line(
    olmo: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate", "--model", olmo, "--family", "t5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: family: unknown value 't5'") and err.count("\n") == 1
