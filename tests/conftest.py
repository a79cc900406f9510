"""Shared test helpers. Tests run against the checkout's conf/ and the installed package."""

import logging
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

CLUSTER = Path(__file__).parent / "slurm" / "cluster.sh"


@pytest.fixture(autouse=True)
def _no_wandb_credentials(monkeypatch, tmp_path_factory):
    """No test may see the developer's W&B key or ~/.netrc, nor touch the network."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path_factory.mktemp("home") / ".netrc"))
    monkeypatch.setenv("WANDB_MODE", "offline")


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    """A test that runs `main([...])` in-process lets Hydra configure logging (process-wide,
    as it must for a real command); the handlers it leaves write to that test's captured
    stream, closed once the test ends. Each test starts from the logging it found."""
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    saved = {lg: (lg.level, list(lg.handlers), lg.propagate, lg.disabled) for lg in loggers}
    yield
    for lg in [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]:
        level, handlers, propagate, disabled = saved.get(lg, (logging.NOTSET, [], True, False))
        lg.setLevel(level)
        lg.handlers[:] = handlers
        lg.propagate, lg.disabled = propagate, disabled


def run_cli(*args: str, env: dict | None = None, timeout: float = 120, cwd=None) -> subprocess.CompletedProcess:
    """`python -m orchestrator ARGS` in a fresh process, as a user would type it."""
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd)


@contextmanager
def running_cluster(*shape: str):
    """A real SLURM cluster of this shape (tests/slurm/cluster.sh start SHAPE) for the
    duration; stopped afterwards if this call started it (or changed its shape)."""
    if not (os.geteuid() == 0 and shutil.which("apt-get")):
        if os.environ.get("CI") == "true":
            pytest.fail("CI must run the SLURM tests, but this machine cannot host the cluster (root + apt needed)")
        pytest.skip("a local SLURM cluster needs root and apt-get (Debian); run tests/slurm/cluster.sh start")
    proc = subprocess.run(["bash", str(CLUSTER), "start", *shape], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    started = "already up" not in proc.stdout
    try:
        yield
    finally:
        if started:
            subprocess.run(["bash", str(CLUSTER), "stop"], capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The single-node cluster on localhost, for the session. Every test on it is in
    tests/test_slurm.py, and --dist loadfile runs a file on one worker, so one worker owns it."""
    with running_cluster():
        yield


def sacct(job_id: str, *fields: str) -> list[list[str]]:
    out = subprocess.run(["sacct", "-j", job_id, "-n", "-P", "-o", ",".join(fields)], capture_output=True, text=True,
                         timeout=60).stdout
    return [line.split("|") for line in out.splitlines()]
