"""parse_fleet takes a fleet in memory (the tables a fleet TOML file parses to), checked as the
file is: the HTTP service plans inline pools without writing a file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trainmem.hardware import load_gpus, parse_fleet

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

GPUS = load_gpus()
TOML = """\
[[pool]]
gpu = "h100-sxm-80gb"
nodes = 2

[[pool]]
gpu = "a100-sxm-80gb"
nodes = 3
gpus_per_node = 4
price_per_hour_usd = 1.5
host_memory_gib = 512
"""


def test_the_tables_in_memory_equal_the_file(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(TOML, encoding="utf-8")
    from_file = parse_fleet(path, GPUS)
    tables = tomllib.loads(TOML)
    assert parse_fleet(tables, GPUS) == from_file  # {"pool": [...]}, as the file parses to
    assert parse_fleet(tables["pool"], GPUS) == from_file  # or the list of pool tables
    assert parse_fleet(tuple(tables["pool"]), GPUS) == from_file
    assert from_file.num_gpus == 2 * 8 + 3 * 4


@pytest.mark.parametrize(
    ("fleet", "message"),
    [
        ({"pools": []}, "fleet: unknown key 'pools'; allowed: [[pool]] tables"),
        ([], "fleet: expected one or more [[pool]] tables"),
        ([{"gpu": "h100-sxm-80gb"}], "fleet: pool 1: missing key 'nodes'"),
        ([{"gpu": "h100-sxm-80gb", "nodes": 0}], "fleet: pool 1: nodes must be a whole number"),
        ([{"gpu": "h100-sxm-80gb", "nodes": 1, "gpu_count": 8}], "fleet: pool 1: unknown key"),
        ([{"gpu": "no-such-gpu", "nodes": 1}], "fleet: pool 1: unknown gpu 'no-such-gpu'"),
    ],
)
def test_bad_tables_are_one_line_naming_the_pool(fleet: object, message: str) -> None:
    with pytest.raises(ValueError) as error:
        parse_fleet(fleet, GPUS)  # type: ignore[arg-type]
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_the_same_check_from_a_file(tmp_path: Path) -> None:
    """A file's errors are named by the file, as before."""
    path = tmp_path / "mine.toml"
    path.write_text('[[pool]]\ngpu = "h100-sxm-80gb"\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"^fleet: mine\.toml: pool 1: missing key 'nodes'$"):
        parse_fleet(path, GPUS)
