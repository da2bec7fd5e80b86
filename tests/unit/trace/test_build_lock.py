"""The fake-cuda extension's build survives a killed builder: torch's own `lock` file, which a
builder killed mid-build leaves and cpp_extension.load would wait on forever, is taken over
under trainmem's flock (issue 31 item 3: 5 of 5 traces hung after one kill)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from trainmem.trace._fake_cuda import _cache_dir  # noqa: E402

CODE = (
    "from trainmem.trace._fake_cuda import fake_cuda_unavailable_reason as r; "
    "import sys; reason = r(); print(reason or 'ok'); sys.exit(0 if not reason else 3)"
)


def test_a_stale_torch_lock_does_not_hang_the_next_build(tmp_path: Path) -> None:
    # A cache holding a finished build (copied, when this machine has one) and the `lock` file
    # a killed builder left: the next trace loads the extension instead of waiting forever.
    built = sorted(_cache_dir().glob("trainmem_fake_cuda_*"))
    cache = tmp_path / "cache"
    for folder in built:
        shutil.copytree(folder, cache / folder.name)
    env = {**os.environ, "TRAINMEM_CACHE_DIR": str(cache)}
    if not built:  # this machine's first build: make it in the test's cache first
        first = subprocess.run(
            [sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=600
        )
        assert first.returncode == 0, first.stdout + first.stderr
    for folder in cache.glob("trainmem_fake_cuda_*"):
        (folder / "lock").write_text("")
    assert any(cache.glob("trainmem_fake_cuda_*/lock"))
    # Bounded: a regression hangs in FileBaton.wait(), which the timeout turns into a failure.
    done = subprocess.run(
        [sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not any(cache.glob("trainmem_fake_cuda_*/lock"))


def test_the_build_lock_is_released_when_its_holder_dies(tmp_path: Path) -> None:
    # The flock is the kernel's: a holder SIGKILLed while it holds it leaves nothing to wait on.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from trainmem.trace._fake_cuda import _build_lock; "
            f"cm = _build_lock(Path({str(tmp_path)!r})); cm.__enter__(); "
            "print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait(timeout=30)
    (tmp_path / "lock").write_text("")  # what a killed cpp_extension build leaves
    taker = subprocess.run(
        [
            sys.executable,
            "-c",
            "from pathlib import Path; from trainmem.trace._fake_cuda import _build_lock; "
            f"cm = _build_lock(Path({str(tmp_path)!r})); cm.__enter__(); print('taken')",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert taker.stdout.strip() == "taken", taker.stderr
    assert not (tmp_path / "lock").exists()
