"""Hypothesis profiles for the property tests.

ci (the default): 30 examples per test, derandomized (the same examples on every run, so a CI
verdict never flips), no deadline (the first call of a vectorized formula pays numpy's warm-up),
no example database.
deep: 1,000 fresh random examples per test, failures saved to .hypothesis/ and replayed first on
the next run; for searching harder locally. Select it with `pytest --hypothesis-profile=deep`
(hypothesis' own option, which wins) or TRAINMEM_HYPOTHESIS=deep.

A test that needs fewer examples (each one slow) scales settings.default.max_examples instead of
fixing a number, so that deep still searches it harder.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

PROFILE_ENV = "TRAINMEM_HYPOTHESIS"

settings.register_profile("ci", max_examples=30, derandomize=True, deadline=None, database=None)
settings.register_profile(
    "deep", max_examples=1_000, derandomize=False, deadline=None, print_blob=True
)
settings.load_profile(os.environ.get(PROFILE_ENV, "ci"))


@pytest.fixture(autouse=True, scope="session")
def _formula_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Generated formula kernels (engine/_fast/_formula_kernels.py) go to a folder of this run, not
    the user's cache, unless TRAINMEM_CACHE_DIR is set (to keep them between runs)."""
    if os.environ.get("TRAINMEM_CACHE_DIR"):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRAINMEM_CACHE_DIR", str(tmp_path_factory.mktemp("trainmem-cache")))
        yield
