"""Shared test helpers. Tests run against the checkout's conf/ and the installed package."""

import os
import subprocess
import sys

import pytest


@pytest.fixture(autouse=True)
def _no_wandb_credentials(monkeypatch, tmp_path_factory):
    """No test may see the developer's W&B key or ~/.netrc, nor touch the network."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path_factory.mktemp("home") / ".netrc"))
    monkeypatch.setenv("WANDB_MODE", "offline")


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m orchestrator ARGS` in a fresh process, as a user would type it."""
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
