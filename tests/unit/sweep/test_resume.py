"""Kill-and-resume and concurrent runs on one folder, with real processes: no point lost, doubled
or orphaned (every stored point's trial COMPLETE), the study holds exactly its total, no
temporary or staged file is left. Optuna runs both on SQLite and in memory (the default: the
resumed study is rebuilt from the stored points)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from trainmem.results._store import HOST_TAG, clean_temporaries
from trainmem.sweep._exhaustive import run_exhaustive
from trainmem.sweep._optuna import mask_url, run_optuna
from trainmem.sweep._space import AXES

TESTS = str(Path(__file__).parent)
TRIALS, BATCH = 20, 4
CONFIG = ["gpu", *[a for a in AXES if a != "pool"]]

CHILD = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from test_search import small_space
from trainmem.results import _store
from trainmem.sweep import _exhaustive, _optuna

calls = [0]

def kill_on(module, name, nth):
    real = getattr(module, name)

    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    setattr(module, name, wrapped)

{inject}
{run}
"""
OPTUNA = (
    "_optuna.run_optuna(small_space(), out={out!r}, study='o', trials={trials}, seed={seed}, "
    "batch_size={batch}, storage={storage!r})"
)
STORAGES = ("memory", "sqlite")
EXHAUSTIVE = "_exhaustive.run_exhaustive(small_space(), out={out!r}, study='x', chunk_size=400)"


def _url(out: Path, storage: str) -> str | None:
    """None (the default: in memory) or the SQLite file OUT/optuna.db."""
    return f"sqlite:///{out / 'optuna.db'}" if storage == "sqlite" else None


def _spawn(
    out: Path, *, run: str, inject: str = "", seed: int = 0, storage: str = "sqlite"
) -> subprocess.Popen:
    code = CHILD.format(
        tests=TESTS,
        inject=inject,
        run=run.format(
            out=str(out), trials=TRIALS, seed=seed, batch=BATCH, storage=_url(out, storage)
        ),
    )
    return subprocess.Popen([sys.executable, "-c", code])


def _wait(*procs: subprocess.Popen) -> list[int]:
    try:
        return [p.wait(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def _check_optuna(out: Path, *, inner_points: int, result=None) -> None:
    """Exactly TRIALS complete trials, none running, each with its inner points stored once,
    and no point of any other trial (in memory: the resumed run's study, rebuilt from the
    points, holds TRIALS complete trials)."""
    import optuna

    folder = out / "points" / "study=o"
    frame = pl.read_parquet(sorted(folder.glob("part-*.parquet")))
    if result is None:
        st = optuna.load_study(study_name="o", storage=f"sqlite:///{out / 'optuna.db'}")
        states = [t.state.name for t in st.get_trials(deepcopy=False)]
        assert states.count("COMPLETE") == TRIALS
        assert "RUNNING" not in states
        trials = st.get_trials(deepcopy=False)
        complete = sorted(t.number for t in trials if t.state.name == "COMPLETE")
        assert sorted(frame["trial"].unique().to_list()) == complete  # none orphaned, none lost
    else:
        assert result.extra["storage"] == ":memory:"
        assert result.extra["complete_trials"] == TRIALS
        assert frame["trial"].n_unique() == TRIALS
    assert len(frame) == TRIALS * inner_points
    assert frame.select("trial", *CONFIG).unique().height == len(frame)  # none doubled
    assert _leftovers(folder) == []


@pytest.fixture(scope="module")
def inner_points(tmp_path_factory) -> int:
    """Points per trial (the inner axes' product), from an uninterrupted run."""
    out = tmp_path_factory.mktemp("whole")
    result = run_optuna(_small_space(), out=out, study="o", trials=2, seed=0, batch_size=2)
    return result.num_points // 2


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> pl.DataFrame:
    out = tmp_path_factory.mktemp("whole-x")
    run_exhaustive(_small_space(), out=out, study="x", chunk_size=400)
    return _points(out, "x")


def _small_space():
    sys.path.insert(0, TESTS)
    from test_search import small_space

    return small_space()


def _points(out: Path, study: str) -> pl.DataFrame:
    frame = pl.read_parquet(sorted((out / "points" / f"study={study}").glob("part-*.parquet")))
    return frame.sort(CONFIG)


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize(
    ("module", "name", "nth", "when"),
    [
        ("_optuna", "_within_total", 3, "after the third ask: RUNNING trials, no points"),
        ("_store", "publish_points", 3, "told, points staged: not yet published"),
        ("optuna.study.Study", "tell", 10, "mid-batch: two of four trials told"),
        ("os", "fsync", 4, "mid-write: a temporary file left"),
    ],
)
def test_optuna_killed_then_resumed_holds_exactly_the_total(
    tmp_path, inner_points, module, name, nth, when, storage
) -> None:
    target = {"_optuna": "_optuna", "_store": "_optuna", "os": "_store.os"}.get(module, module)
    inject = f"import optuna\nkill_on({target}, {name!r}, {nth})"
    proc = _spawn(tmp_path, run=OPTUNA, inject=inject, storage=storage)
    assert _wait(proc) == [-signal.SIGKILL], when
    result = _resume(tmp_path, storage)
    _check_optuna(tmp_path, inner_points=inner_points, result=result)


def _resume(out: Path, storage: str):
    """Rerun the study to TRIALS; its result when in memory (None: check the SQLite study)."""
    result = run_optuna(
        _small_space(),
        out=out,
        study="o",
        trials=TRIALS,
        seed=0,
        batch_size=BATCH,
        storage=_url(out, storage),
    )
    return result if storage == "memory" else None


@pytest.mark.parametrize("storage", STORAGES)
def test_optuna_killed_from_outside_then_resumed(tmp_path, inner_points, storage) -> None:
    """SIGKILL at an arbitrary moment (after the first published part)."""
    import time

    folder = tmp_path / "points" / "study=o"
    proc = _spawn(tmp_path, run=OPTUNA, storage=storage)
    try:
        deadline = time.monotonic() + 30
        while not list(folder.glob("part-*.parquet")) and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        _wait(proc)
    result = _resume(tmp_path, storage)
    _check_optuna(tmp_path, inner_points=inner_points, result=result)


def test_two_optuna_runs_on_one_folder_hold_exactly_the_total(tmp_path, inner_points) -> None:
    url = _url(tmp_path, "sqlite")
    run_optuna(_small_space(), out=tmp_path, study="o", trials=1, seed=0, storage=url)
    a = _spawn(tmp_path, run=OPTUNA, seed=0)
    b = _spawn(tmp_path, run=OPTUNA, seed=1)
    assert _wait(a, b) == [0, 0]
    _check_optuna(tmp_path, inner_points=inner_points)


def test_exhaustive_killed_mid_write_then_resumed_equals_uninterrupted(
    tmp_path, uninterrupted
) -> None:
    proc = _spawn(tmp_path, run=EXHAUSTIVE, inject="kill_on(_store.os, 'fsync', 7)")
    assert _wait(proc) == [-signal.SIGKILL]
    folder = tmp_path / "points" / "study=x"
    assert any(p.name.startswith(".tmp-") for p in folder.iterdir())  # the killed write's
    run_exhaustive(_small_space(), out=tmp_path, study="x", chunk_size=400)
    assert_frame_equal(_points(tmp_path, "x"), uninterrupted)
    assert _leftovers(folder) == []


def test_two_exhaustive_runs_on_one_folder_equal_one(tmp_path, uninterrupted) -> None:
    assert _wait(_spawn(tmp_path, run=EXHAUSTIVE), _spawn(tmp_path, run=EXHAUSTIVE)) == [0, 0]
    assert_frame_equal(_points(tmp_path, "x"), uninterrupted)
    assert _leftovers(tmp_path / "points" / "study=x") == []


def test_only_dead_writers_temporaries_are_removed(tmp_path) -> None:
    folder = tmp_path / "points" / "study=t"
    folder.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = {
        "mine": f".tmp-{HOST_TAG}-{os.getpid()}-a.parquet",
        "dead": f".tmp-{HOST_TAG}-{dead.pid}-b.parquet",
        "other-host": f".tmp-{'0' * 8 if HOST_TAG != '0' * 8 else '1' * 8}-1-c.parquet",
        "unnamed": ".tmp-abc123.parquet",
    }
    for name in names.values():
        (folder / name).touch()
    assert clean_temporaries(tmp_path, study="t", before=0.0) == 1
    assert not (folder / names["dead"]).exists()
    assert clean_temporaries(tmp_path, study="t") == 1  # unnamed, older than now
    assert sorted(p.name for p in folder.iterdir()) == sorted([names["mine"], names["other-host"]])


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("postgresql://user:s3cret@db.example:5432/optuna", "postgresql://user:***@db.example:5432/optuna"),
        ("postgresql+psycopg://u:p%40ss@h/db?sslmode=require", "postgresql+psycopg://u:***@h/db?sslmode=require"),
        ("postgresql://h/db?user=u&password=pw&x=1", "postgresql://h/db?user=u&password=***&x=1"),
        ("sqlite:////tmp/out/optuna.db", "sqlite:////tmp/out/optuna.db"),
        ("no 'mysql://root:pw@h/db': refused", "no 'mysql://root:***@h/db': refused"),
    ],
)  # fmt: skip
def test_storage_urls_are_masked(text, masked) -> None:
    assert mask_url(text) == masked


def test_storage_errors_do_not_echo_the_password(tmp_path, monkeypatch) -> None:
    import optuna
    from sqlalchemy.exc import ArgumentError

    url = "postgresql://user:s3cret@localhost/db"

    def refuse(**_kwargs):
        raise ArgumentError(f"Could not parse SQLAlchemy URL from string '{url}'")

    monkeypatch.setattr(optuna, "create_study", refuse)
    with pytest.raises(ValueError, match=r"storage: .*postgresql://user:\*\*\*@localhost/db"):
        run_optuna(_small_space(), out=tmp_path, study="e", trials=1, storage=url)


def test_optuna_killed_while_taking_an_enqueued_trial_names_its_owner(tmp_path, inner_points):
    """SIGKILL right after a warm-start trial is claimed (set RUNNING): the trial already names
    its (now dead) owner, so the resume fails and reruns it at once; an ownerless RUNNING trial
    would be waited for an hour (FOREIGN_TRIAL_AGE_S) as another machine's."""
    import optuna

    from trainmem.sweep._optuna import OWNER_ATTR

    storage = "optuna.storages._cached_storage._CachedStorage"
    # A claim: owner set, RUNNING, owner set again; the kill is at the second owner write.
    inject = f"import optuna\nkill_on({storage}, 'set_trial_user_attr', 2)"
    proc = _spawn(tmp_path, run=OPTUNA, inject=inject, storage="sqlite")
    assert _wait(proc) == [-signal.SIGKILL]
    st = optuna.load_study(study_name="o", storage=_url(tmp_path, "sqlite"))
    running = [t for t in st.get_trials(deepcopy=False) if t.state.name == "RUNNING"]
    assert running and all(OWNER_ATTR in t.user_attrs for t in running)
    assert _resume(tmp_path, "sqlite") is None
    _check_optuna(tmp_path, inner_points=inner_points)
