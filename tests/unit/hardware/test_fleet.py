"""parse_fleet: shorthand and TOML fleets; bad input is one line naming the token or field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainmem.hardware import Fleet, Pool, load_gpus, parse_fleet

GPUS = load_gpus()


def test_shorthand_fills_whole_nodes() -> None:
    fleet = parse_fleet("64xh100-sxm-80gb", GPUS)
    assert fleet == Fleet(pools=(Pool(gpu="h100-sxm-80gb", num_nodes=8, gpus_per_node=8),))
    assert fleet.num_gpus == 64


def test_shorthand_several_pools_in_order() -> None:
    fleet = parse_fleet(" 64xh100-sxm-80gb, 32xa100-sxm-80gb ", GPUS)
    assert [(p.gpu, p.num_nodes, p.gpus_per_node) for p in fleet.pools] == [
        ("h100-sxm-80gb", 8, 8),
        ("a100-sxm-80gb", 4, 8),
    ]
    assert fleet.gpu_names == ("h100-sxm-80gb", "a100-sxm-80gb")
    assert fleet.num_gpus == 96


def test_fewer_gpus_than_a_node_is_one_partial_node() -> None:
    (pool,) = parse_fleet("2xa100-sxm-80gb", GPUS).pools
    assert (pool.num_nodes, pool.gpus_per_node) == (1, 2)


def test_price_defaults_to_the_profile_and_can_be_overridden() -> None:
    profile = GPUS["h100-sxm-80gb"]
    (pool,) = parse_fleet("8xh100-sxm-80gb", GPUS).pools
    assert pool.price_per_gpu_hour(profile) == profile.price_per_hour_usd
    cheap = Pool(gpu="h100-sxm-80gb", num_nodes=1, gpus_per_node=8, price_per_hour_usd=2.5)
    assert cheap.price_per_gpu_hour(profile) == 2.5


def test_toml_fleet(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(
        '[[pool]]\ngpu = "h100-sxm-80gb"\nnodes = 8\nprice_per_hour_usd = 2.5\n\n'
        '[[pool]]\ngpu = "a100-sxm-80gb"\nnodes = 2\ngpus_per_node = 4\n'
    )
    fleet = parse_fleet(path, GPUS)
    assert fleet.pools == (
        Pool(gpu="h100-sxm-80gb", num_nodes=8, gpus_per_node=8, price_per_hour_usd=2.5),
        Pool(gpu="a100-sxm-80gb", num_nodes=2, gpus_per_node=4),
    )
    assert parse_fleet(str(path), GPUS) == fleet


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "fleet: empty"),
        ("64h100-sxm-80gb", "bad pool '64h100-sxm-80gb'; expected COUNTxGPU"),
        ("64xh100-sxm-80gb,,8xa100-sxm-80gb", "bad pool ''"),
        ("0xh100-sxm-80gb", "COUNT must be >= 1"),
        ("64xh900", "unknown gpu 'h900'; did you mean 'h200'? allowed: a100-pcie-80gb"),
        ("12xh100-sxm-80gb", "12 GPUs do not fill whole nodes of 8"),
        ("-8xh100-sxm-80gb", "bad pool '-8xh100-sxm-80gb'"),
    ],
)
def test_bad_shorthand_names_the_token(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        parse_fleet(text, GPUS)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[[pool]]\nnodes = 1\n", "pool 1: missing key 'gpu'"),
        ('[[pool]]\ngpu = "h100-sxm-80gb"\n', "pool 1: missing key 'nodes'"),
        (
            '[[pool]]\ngpu = "h900"\nnodes = 1\n',
            "pool 1: unknown gpu 'h900'; did you mean 'h200'? allowed:",
        ),
        ('[[pool]]\ngpu = "h100-sxm-80gb"\nnodes = 0\n', "nodes must be a whole number >= 1"),
        ('[[pool]]\ngpu = "h100-sxm-80gb"\nnodes = 1.5\n', "nodes must be a whole number"),
        (
            '[[pool]]\ngpu = "h100-sxm-80gb"\nnodes = 1\ngpus_per_node = 0\n',
            "gpus_per_node must be a whole number >= 1",
        ),
        (
            '[[pool]]\ngpu = "h100-sxm-80gb"\nnodes = 1\nprice_per_hour_usd = -1\n',
            "price_per_hour_usd must be a finite number >= 0",
        ),
        (
            '[[pool]]\ngpu = "h100-sxm-80gb"\nnodes = 1\nprice = 2\n',
            "pool 1: unknown key 'price'; allowed: gpu, nodes, gpus_per_node",
        ),
        ('[[pool]]\ngpu = "h100-sxm-80gb"\nnodes = 1\n[[pool]]\nnodes = 2\n', "pool 2: missing"),
        ("gpu = 1\n", "unknown key 'gpu'; allowed: [[pool]] tables"),
        ("", "expected one or more [[pool]] tables"),
        ("[[pool]\n", "invalid TOML"),
    ],
)
def test_bad_toml_names_the_file_pool_and_field(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(body)
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        parse_fleet(path, GPUS)
    assert str(info.value).startswith("fleet: fleet.toml: ")
    assert "\n" not in str(info.value)


def test_missing_toml_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="^fleet: .*absent.toml: no such file$"):
        parse_fleet(tmp_path / "absent.toml", GPUS)


def test_specs_validate_when_built() -> None:
    with pytest.raises(ValueError, match="num_nodes must be a whole number >= 1"):
        Pool(gpu="h100-sxm-80gb", num_nodes=0, gpus_per_node=8)
    with pytest.raises(ValueError, match="needs at least one pool"):
        Fleet(pools=())


def test_shorthand_takes_a_gpu_alias() -> None:
    fleet = parse_fleet("8xh100,2x4090", load_gpus())
    assert [(p.gpu, p.num_nodes, p.gpus_per_node) for p in fleet.pools] == [
        ("h100-sxm-80gb", 1, 8),
        ("rtx-4090-24gb", 1, 2),
    ]


def test_unknown_gpu_in_a_fleet_suggests_the_closest_name() -> None:
    with pytest.raises(
        ValueError, match=r"unknown gpu 'h100-sxm'; did you mean 'h100-sxm-80gb'\? "
    ):
        parse_fleet("8xh100-sxm", load_gpus())


def test_a_shorthand_longer_than_a_file_name_is_read_as_pools() -> None:
    """The OS refuses to look up a name over 255 bytes (ENAMETOOLONG): such a shorthand is
    pools, not a path."""
    types = ["h100-sxm-80gb", "a100-sxm-80gb", "h200-sxm-141gb", "b200-180gb", "mi300x-192gb"]
    text = ",".join(f"16384x{t}" for t in types * 3)
    assert len(text) > 255
    fleet = parse_fleet(text, GPUS)
    assert len(fleet.pools) == 15 and fleet.num_gpus == 15 * 16384
