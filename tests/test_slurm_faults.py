"""Trials that end badly on the real SLURM test cluster: a rank killed outright, and a secret
that must reach the job but no file. The two are submitted together (`submitted`), so their
jobs run side by side. A rank that raises and a job cancelled are tests/test_multinode.py's
(across two nodes). Mocked: nothing."""

import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import CLUSTER, ONE_RANK, results_below, submit, wait_cli
from tests.conftest import SLURM_SMALL as SMALL

pytestmark = pytest.mark.slow
SECRET = "abc123secret"
# The password of a URL under a name that says nothing (a database URL): a secret all the same.
URL = "postgres://u:abc/456secret@db/x"


@pytest.fixture(scope="module")
def submitted(slurm_cluster, tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("slurm-faults")
    # The one that runs until the test ends it sleeps between steps: idle, not training, so
    # it leaves the machine's cores to the other tests meanwhile.
    runs = {
        "sigkill": ["run.steps=100000", "run.step_sleep_s=0.5", "run.checkpoint_every=5"],
        "secret": [
            *ONE_RANK,
            f"cluster.setup=['export TOKEN={SECRET}','export DATABASE_URL={URL}',"
            "'echo token-md5=$(echo $TOKEN | md5sum) url-md5=$(echo $DATABASE_URL | md5sum)']",
        ],
    }
    for name, extra in runs.items():
        submit(base / name, *SMALL, *extra)
    return {name: base / name for name in runs}


def rank_pid(trial_dir: Path, rank: int, timeout: float = 300) -> int:
    """The pid of the workload process of `rank` of this trial, once it trains."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for environ in Path("/proc").glob("[0-9]*/environ"):
            try:
                cmdline = (environ.parent / "cmdline").read_bytes()
                if b"orchestrator.workload.train" in cmdline and str(trial_dir).encode() in cmdline:
                    training = (trial_dir / "checkpoint" / "latest.json").is_file()  # a few steps in
                    if training and f"RANK={rank}".encode() in environ.read_bytes().split(b"\0"):
                        return int(environ.parent.name)
            except OSError:
                continue
        time.sleep(0.5)
    raise AssertionError(f"rank {rank} of {trial_dir} never started")


def test_a_rank_killed_by_sigkill_is_named_with_its_host(submitted):
    # As the kernel's OOM killer does it: SIGKILL to one rank, no SIGTERM before.
    out = submitted["sigkill"]
    os.kill(rank_pid(out, 1), signal.SIGKILL)
    assert wait_cli(out).returncode == 1
    (r,) = results_below(out)
    assert r["status"] == "failed" and r["error"]["rank"] == 1, r["error"]
    assert "SIGKILL" in r["error"]["message"] and r["error"]["host"]


def test_a_secret_export_reaches_the_job_but_no_file(submitted):
    out = submitted["secret"]
    assert wait_cli(out).returncode == 0
    leaks = [
        p
        for p in out.rglob("*")
        if p.is_file() and (SECRET.encode() in p.read_bytes() or b"456secret" in p.read_bytes())
    ]
    assert not leaks  # trial files, sbatch script, submitit's pickles and logs
    logs = " ".join(p.read_text(errors="replace") for p in (out / "slurm-logs").rglob("*.out"))
    # the job had both, from sbatch's environment
    assert "token-md5=" + hashlib.md5(f"{SECRET}\n".encode()).hexdigest() in logs
    assert "url-md5=" + hashlib.md5(f"{URL}\n".encode()).hexdigest() in logs


def test_the_test_clusters_stop_ends_only_what_it_started(tmp_path):
    """cluster.sh stop ends the daemons by the pids it recorded, never by name: processes
    named slurmctld, slurmd, slurmdbd and munged that it did not start (a host's own SLURM)
    live on. Run against a state directory of its own, which started nothing, so the
    suite's cluster (another state) is not touched either."""
    decoys = []
    for name in ("slurmctld", "slurmd", "slurmdbd", "munged", "slurmstepd"):
        shutil.copy("/bin/sleep", tmp_path / name)
        decoys.append(subprocess.Popen([str(tmp_path / name), "600"]))
    try:
        proc = subprocess.run(
            ["bash", str(CLUSTER), "stop"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "ORCH_SLURM_STATE": str(tmp_path / "state")},
        )
        assert proc.returncode == 0, proc.stderr
        assert all(d.poll() is None for d in decoys), "cluster.sh stop ended a process it did not start"
    finally:
        for d in decoys:
            d.send_signal(signal.SIGKILL)
            d.wait()
