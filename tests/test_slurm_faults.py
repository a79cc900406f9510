"""Faults under SLURM, on the real local cluster: a rank killed outright, secrets in setup
lines, a job that ends badly after every step ran, submitit's own cause of an end."""

import hashlib
import os
import signal
import time
from pathlib import Path

import pytest
import submitit

from orchestrator.launchers import slurm
from tests.conftest import run_cli
from tests.test_slurm import SMALL, results, wait

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]


def rank_pid(trial_dir: Path, rank: int, timeout: float = 180) -> int:
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


def test_a_rank_killed_by_sigkill_is_named_with_its_host(slurm_cluster, tmp_path):
    # As the kernel's OOM killer does it: SIGKILL to one rank, no SIGTERM before.
    assert run_cli("run", "--out", str(tmp_path), *SMALL, "run.steps=100000", "run.checkpoint_every=5").returncode == 0
    os.kill(rank_pid(tmp_path, 1), signal.SIGKILL)
    assert wait(tmp_path).returncode == 1
    (r,) = results(tmp_path)
    assert r["status"] == "failed" and r["error"]["rank"] == 1, r["error"]
    assert "SIGKILL" in r["error"]["message"] and r["error"]["host"]


def test_a_secret_export_reaches_the_job_but_no_file(slurm_cluster, tmp_path):
    secret = "abc123secret"
    setup = f"cluster.setup=['export TOKEN={secret}','echo token-md5=$(echo $TOKEN | md5sum)']"
    assert run_cli("run", "--out", str(tmp_path), *SMALL, setup).returncode == 0
    assert wait(tmp_path).returncode == 0
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not leaks  # trial files, sbatch script, submitit's pickles and logs
    logs = " ".join(p.read_text(errors="replace") for p in (tmp_path / "slurm-logs").rglob("*.out"))
    assert "token-md5=" + hashlib.md5(f"{secret}\n".encode()).hexdigest() in logs  # the job had it, from sbatch's environment


def test_a_trial_that_ran_every_step_is_never_reported_failed(slurm_cluster, tmp_path):
    assert run_cli("run", "--out", str(tmp_path), *SMALL).returncode == 0
    assert wait(tmp_path).returncode == 0
    (tmp_path / "result.json").unlink()
    # As after a last warning with no requeue left: submitit fails task 0, sacct says FAILED,
    # although rank 0 wrote the figures of every step.
    r = slurm.finalize(tmp_path, "FAILED", "NonZeroExitCode")
    assert r["status"] == "ok" and r["slurm"]["state"] == "FAILED"


def test_submitits_cause_is_surfaced(tmp_path):
    job = {"job_id": "77", "logs": str(tmp_path)}
    paths = submitit.core.utils.JobPaths(tmp_path, job_id="77", task_id=0)
    with submitit.core.utils.temporary_save_path(paths.result_pickle) as tmp:
        submitit.core.utils.cloudpickle_dump(("error", "Traceback ...\nsubmitit.core.utils.UncompletedJobError: "
                                              "Job not requeued because: timed-out too many times."), tmp)
    assert slurm._submitit_cause(job).endswith("Job not requeued because: timed-out too many times.")
    assert slurm._submitit_cause({"job_id": "78", "logs": str(tmp_path)}) is None
