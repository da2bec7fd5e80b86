"""`load_gpus` / `get_gpu`: user folders, the environment variable, and bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmem.hardware import ENV_VAR, get_gpu, gpu_aliases, load_gpus

H100_TOML = (Path(__file__).parents[3] / "hardware" / "gpus" / "h100-sxm-80gb.toml").read_text()


@pytest.fixture(autouse=True)
def _no_user_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def _h100_as(name: str, **replace: str) -> str:
    """The shipped H100 file renamed to `name`, with `key = value` lines replaced."""
    text = H100_TOML.replace('name = "h100-sxm-80gb"', f'name = "{name}"')
    lines = text.splitlines()
    for key, value in replace.items():
        lines = [f"{key} = {value}" if line.startswith(f"{key} =") else line for line in lines]
    return "\n".join(lines) + "\n"


def test_user_folder_overrides_builtin_and_adds_new(tmp_path: Path) -> None:
    _write(tmp_path, "h100-sxm-80gb", _h100_as("h100-sxm-80gb", price_per_hour_usd="2.0"))
    _write(tmp_path, "my-h100", _h100_as("my-h100"))
    gpus = load_gpus(tmp_path)
    assert gpus["h100-sxm-80gb"].price_per_hour_usd == 2.0
    assert gpus["h100-sxm-80gb"].path == str(tmp_path / "h100-sxm-80gb.toml")
    assert "my-h100" in gpus
    assert "a100-sxm-80gb" in gpus
    # The built-in cache is not modified by an override.
    assert load_gpus()["h100-sxm-80gb"].price_per_hour_usd == 4.76


def test_environment_variable_names_the_user_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path / "env", "env-gpu", _h100_as("env-gpu"))
    _write(tmp_path / "arg", "arg-gpu", _h100_as("arg-gpu"))
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env"))
    assert get_gpu("env-gpu").name == "env-gpu"
    # The argument wins over the environment variable.
    gpus = load_gpus(tmp_path / "arg")
    assert "arg-gpu" in gpus and "env-gpu" not in gpus


def test_empty_environment_variable_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "")
    assert len(load_gpus()) == 24


def test_missing_user_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a directory"):
        load_gpus(tmp_path / "nowhere")


def test_missing_key_is_named(tmp_path: Path) -> None:
    text = "\n".join(
        line for line in _h100_as("x").splitlines() if not line.startswith("fp8_flops")
    )
    _write(tmp_path, "x", text)
    with pytest.raises(ValueError, match=r"^x\.toml: missing keys: fp8_flops$"):
        load_gpus(tmp_path)


def test_unknown_key_is_named(tmp_path: Path) -> None:
    _write(tmp_path, "x", "tdp_watts = 700\n" + _h100_as("x"))
    with pytest.raises(ValueError, match=r"^x\.toml: unknown keys: tdp_watts$"):
        load_gpus(tmp_path)


def test_negative_number_is_named(tmp_path: Path) -> None:
    _write(tmp_path, "x", _h100_as("x", hbm_bandwidth_bytes_per_s="-3.35e12"))
    with pytest.raises(ValueError, match=r"x\.toml: hbm_bandwidth_bytes_per_s must be finite"):
        load_gpus(tmp_path)


def test_wrong_type_is_named(tmp_path: Path) -> None:
    _write(tmp_path, "x", _h100_as("x", memory_bytes='"80GB"'))
    with pytest.raises(ValueError, match=r"x\.toml: memory_bytes must be an integer"):
        load_gpus(tmp_path)


def test_integer_written_for_a_float_field_is_accepted(tmp_path: Path) -> None:
    _write(tmp_path, "x", _h100_as("x", price_per_hour_usd="5"))
    gpu = load_gpus(tmp_path)["x"]
    assert gpu.price_per_hour_usd == 5.0 and isinstance(gpu.price_per_hour_usd, float)


def test_broken_toml_names_the_file(tmp_path: Path) -> None:
    _write(tmp_path, "x", 'name = "x\nmemory_bytes = = 3\n')
    with pytest.raises(ValueError, match=r"^x\.toml: invalid TOML"):
        load_gpus(tmp_path)


def test_name_must_equal_file_stem(tmp_path: Path) -> None:
    _write(tmp_path, "x", _h100_as("y"))
    with pytest.raises(ValueError, match=r"x\.toml: name 'y' must equal the file stem 'x'"):
        load_gpus(tmp_path)


def test_unknown_gpu_lists_allowed_names_on_one_line() -> None:
    with pytest.raises(ValueError) as info:
        get_gpu("zz-unknown")
    message = str(info.value)
    assert "\n" not in message
    prefix = "unknown gpu 'zz-unknown'; allowed: "
    assert message.startswith(prefix)
    names = message.removeprefix(prefix).split(", ")
    assert names == sorted(names) and len(names) == 24 and "h100-sxm-80gb" in names


def test_unknown_gpu_suggests_the_closest_name_before_the_allowed_list() -> None:
    with pytest.raises(
        ValueError,
        match=r"^unknown gpu 'h100-sxm'; did you mean 'h100-sxm-80gb'\? "
        r"allowed: a100-pcie-80gb, ",
    ):
        get_gpu("h100-sxm")


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("h100", "h100-sxm-80gb"),
        ("a100", "a100-sxm-80gb"),
        ("h200", "h200-sxm-141gb"),
        ("b200", "b200-180gb"),
        ("mi300x", "mi300x-192gb"),
        ("mi325x", "mi325x-256gb"),
        ("l40s", "l40s-48gb"),
        ("l4", "l4-24gb"),
        ("t4", "t4-16gb"),
        ("a10g", "a10g-24gb"),
        ("v100", "v100-sxm2-32gb"),
        ("rtx4090", "rtx-4090-24gb"),
        ("rtx-4090", "rtx-4090-24gb"),  # the product's own spelling, without the memory
        ("4090", "rtx-4090-24gb"),
        ("rtx3090", "rtx-3090-24gb"),
        ("rtx5090", "rtx-5090-32gb"),
        ("rtx-3090", "rtx-3090-24gb"),
        ("rtx-5090", "rtx-5090-32gb"),
        ("a6000", "rtx-a6000-48gb"),
    ],
)
def test_alias_resolves_to_one_profile(alias: str, name: str) -> None:
    assert get_gpu(alias).name == name
    assert gpu_aliases(load_gpus())[alias] == name


def test_every_alias_names_a_builtin_profile_and_no_profile_name_is_an_alias() -> None:
    gpus = load_gpus()
    table = gpu_aliases(gpus)
    assert len(table) == 21
    assert set(table.values()) <= set(gpus) and not set(table) & set(gpus)


def test_a_user_profile_named_like_an_alias_wins(tmp_path: Path) -> None:
    _write(tmp_path, "h100", _h100_as("h100"))
    assert get_gpu("h100", tmp_path).name == "h100"
    assert "h100" not in gpu_aliases(load_gpus(tmp_path))


def test_cuda_context_from_the_file_wins_over_the_architecture_rule(tmp_path: Path) -> None:
    # A V100-like profile (sm70: 1,343 MiB by the rule) whose file names its own measurement.
    from trainmem.report import estimate_report

    text = _h100_as("my-v100", arch='"sm70"') + "cuda_context_bytes = 700_000_000\n"
    _write(tmp_path, "my-v100", text)
    assert load_gpus(tmp_path)["my-v100"].cuda_context_bytes == 700_000_000
    _write(tmp_path, "rule-v100", _h100_as("rule-v100", arch='"sm70"'))
    assert load_gpus(tmp_path)["rule-v100"].cuda_context_bytes is None  # optional key
    job = {"model": "llama-3.2-1b", "seq_len": 1024, "hardware_dir": str(tmp_path)}
    own = estimate_report(gpu="my-v100", **job)["peak_device_bytes"]
    rule = estimate_report(gpu="rule-v100", **job)["peak_device_bytes"]
    assert rule - own == 1343 * 2**20 - 700_000_000  # 708,237,568 B, to the byte
    # --overhead wins over the file.
    flag = estimate_report(gpu="my-v100", overhead=["cuda_context_bytes=1e9"], **job)
    assert flag["peak_device_bytes"] - own == 1e9 - 700_000_000


@pytest.mark.parametrize("value", ["0", "-5", "1.5e8", '"800MB"', "true", "90_000_000_000"])
def test_a_bad_cuda_context_is_refused_naming_file_and_key(tmp_path: Path, value: str) -> None:
    # 90 GB is over the 80 GiB card's memory_bytes; the others are not whole bytes >= 1.
    _write(tmp_path, "x", _h100_as("x") + f"cuda_context_bytes = {value}\n")
    with pytest.raises(ValueError) as error:
        load_gpus(tmp_path)
    message = str(error.value)
    assert message == (
        "x.toml: cuda_context_bytes must be an integer >= 1 and < memory_bytes "
        "(or left out: the architecture's default)"
    )
    assert "\n" not in message
