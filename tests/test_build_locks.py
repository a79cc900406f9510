"""A build lock left by a killed process must not hang every later trial."""

import os
import time

import pytest

from orchestrator.core import process
from orchestrator.core.process import clear_stale_build_locks


@pytest.fixture(autouse=True)
def _no_build_elsewhere(monkeypatch):
    """Another test's DeepSpeed build (a compiler running) would keep every lock, rightly."""
    monkeypatch.setattr(process, "_compiler_running", lambda: False)


def test_a_stale_lock_is_removed_and_a_fresh_one_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    stale = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    fresh = tmp_path / "py311_cpu" / "other_op" / "lock"
    for lock in (stale, fresh):
        lock.parent.mkdir(parents=True)
        lock.touch()
    past = time.time() - 600
    os.utime(stale, (past, past))
    assert clear_stale_build_locks() == [stale]
    assert not stale.exists() and fresh.exists()  # a build may hold a young lock


def test_a_lock_is_found_where_torch_extensions_dir_names_the_ops_folder_directly(tmp_path, monkeypatch):
    # TORCH_EXTENSIONS_DIR set: torch builds in ROOT/OP/, one folder down (unset: ROOT/py311_cpu/OP/).
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    stale = tmp_path / "deepspeed_shm_comm" / "lock"
    stale.parent.mkdir()
    stale.touch()
    past = time.time() - 600
    os.utime(stale, (past, past))
    assert clear_stale_build_locks() == [stale] and not stale.exists()


def test_the_plan_clears_a_stale_lock_before_it_times_the_engine(tmp_path, monkeypatch):
    # The engine's timing process would build DeepSpeed's op first and wait on a leftover lock.
    from orchestrator.measure import engine_timing

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    stale = tmp_path / "deepspeed_shm_comm" / "lock"
    stale.parent.mkdir()
    stale.touch()
    os.utime(stale, (time.time() - 600,) * 2)
    seen = []

    def started(*args, **kwargs):
        seen.append(stale.exists())
        raise FileNotFoundError("stand-in: no process started")

    monkeypatch.setattr(engine_timing.subprocess, "Popen", started)
    with pytest.raises(FileNotFoundError):
        engine_timing.time_engine({"engine": "deepspeed"})
    assert seen == [False]  # gone before the timing process started


def test_a_lock_released_between_the_search_and_its_age_is_passed_over(tmp_path, monkeypatch):
    # A build ending while the folders are searched removes its lock after the glob found it:
    # the launcher must go on, not fail on the stat.
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    stale, released = tmp_path / "op_a" / "lock", tmp_path / "op_b" / "lock"
    for lock in (stale, released):
        lock.parent.mkdir()
        lock.touch()
        past = time.time() - 600
        os.utime(lock, (past, past))
    real_age = process._age_s

    def age_after_release(path):
        if path == released:
            released.unlink()  # the build ends here, between the glob and the stat
        return real_age(path)

    monkeypatch.setattr(process, "_age_s", age_after_release)
    assert clear_stale_build_locks() == [stale] and not stale.exists()
