"""GPU names resolve in one place, in any case: profile names and aliases, for `get_gpu`, fleet
shorthand (`8xH100`), fleet files and in-memory pools alike (issue 27: `--gpu H100` suggested
`v100`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmem.hardware import ENV_VAR, get_gpu, load_gpus, parse_fleet, resolve_gpu_name

H100_TOML = (Path(__file__).parents[3] / "hardware" / "gpus" / "h100-sxm-80gb.toml").read_text()


@pytest.fixture(autouse=True)
def _no_user_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("H100", "h100-sxm-80gb"),
        ("h100", "h100-sxm-80gb"),
        ("H100-SXM-80GB", "h100-sxm-80gb"),
        ("A100", "a100-sxm-80gb"),
        ("RTX4090", "rtx-4090-24gb"),
        ("Rtx-3090", "rtx-3090-24gb"),
        ("MI300X", "mi300x-192gb"),
        ("L40S", "l40s-48gb"),
    ],
)
def test_names_and_aliases_resolve_in_any_case(name: str, profile: str) -> None:
    assert resolve_gpu_name(name, load_gpus()) == profile
    assert get_gpu(name).name == profile


def test_an_unknown_name_is_one_line_naming_the_field_and_the_allowed_names() -> None:
    with pytest.raises(ValueError) as info:
        get_gpu("H10")
    message = str(info.value)
    assert message.startswith("unknown gpu 'H10'; ") and "\n" not in message
    assert "allowed: a100-pcie-80gb," in message
    # the hint is matched in lower case as the name is: an H100, not a V100
    assert "did you mean 'h100'?" in message
    assert resolve_gpu_name("H10", load_gpus()) is None


@pytest.mark.parametrize("text", ["8xH100", "8XH100", "8xh100", "8xH100-SXM-80GB"])
def test_fleet_shorthand_in_any_case(text: str) -> None:
    fleet = parse_fleet(text, load_gpus())
    assert [(p.gpu, p.num_nodes, p.gpus_per_node) for p in fleet.pools] == [("h100-sxm-80gb", 1, 8)]


def test_fleet_files_and_pools_in_memory_in_any_case(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(
        '[[pool]]\ngpu = "H100"\nnodes = 2\n\n[[pool]]\ngpu = "A100-SXM-80GB"\nnodes = 1\n'
    )
    assert parse_fleet(path, load_gpus()).gpu_names == ("h100-sxm-80gb", "a100-sxm-80gb")
    in_memory = parse_fleet([{"gpu": "L4", "nodes": 1}], load_gpus())
    assert in_memory.gpu_names == ("l4-24gb",)


def test_an_unknown_fleet_gpu_still_names_the_token() -> None:
    with pytest.raises(ValueError, match=r"^fleet: pool '8xQ100': unknown gpu 'Q100'; "):
        parse_fleet("8xQ100", load_gpus())


def test_a_user_profile_answers_to_any_case(tmp_path: Path) -> None:
    """Profile names are lower-case by rule, so the lower-cased lookup finds every profile."""
    text = H100_TOML.replace('name = "h100-sxm-80gb"', 'name = "my-gpu"')
    (tmp_path / "my-gpu.toml").write_text(text)
    assert get_gpu("MY-GPU", tmp_path).name == "my-gpu"
    (tmp_path / "My-GPU.toml").write_text(text.replace('"my-gpu"', '"My-GPU"'))
    with pytest.raises(ValueError, match="name must be lower-case"):
        load_gpus(tmp_path)
