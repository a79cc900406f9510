"""A build lock left by a killed process must not hang every later trial."""

import os
import time

from orchestrator.launchers.local import clear_stale_build_locks


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
