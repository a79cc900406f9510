"""`cluster=slurm` against a real single-node SLURM cluster on localhost (tests/slurm/cluster.sh).

munge, slurmctld, slurmd, slurmdbd (sacct) and MariaDB really run; submitit really
submits; each task really trains. Mocked: nothing (it is one node, as only one exists).
"""

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import submitit

from orchestrator.launchers import slurm
from tests.conftest import run_cli, sacct

pytestmark = pytest.mark.slow
SMALL = ["cluster=slurm", "hardware=cpu", "cluster.gpus_per_node=2", "cluster.cpus_per_task=1", "run.steps=3",
         "run.warmup_steps=1", "logger.mode=disabled"]


def results(base: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(base.rglob("result.json"))]


def wait(base: Path) -> subprocess.CompletedProcess:
    return run_cli("wait", str(base), "--timeout", "600", timeout=650)


def test_a_sweep_submits_returns_at_once_and_wait_collects_it(slurm_cluster, tmp_path):
    start = time.monotonic()
    proc = run_cli("run", "-m", "--out", str(tmp_path), *SMALL, "zero=stage0,stage2",
                   'cluster.srun_args=["--cpu-bind=cores"]')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert time.monotonic() - start < 60 and not results(tmp_path)  # submitted, not waited for
    jobs = [json.loads(p.read_text())["job_id"] for p in sorted(tmp_path.rglob("slurm.json"))]
    assert len(jobs) == 2 and all("_" in j for j in jobs) and len({j.split("_")[0] for j in jobs}) == 1  # one array
    status = run_cli("status", str(tmp_path))
    assert status.returncode == 0 and jobs[0] in status.stdout
    done = wait(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for r in results(tmp_path):
        assert r["status"] == "ok" and r["slurm"]["state"] == "COMPLETED"
        assert r["env"]["world_size"] == 2 and r["metrics"]["tokens_per_sec_per_gpu"] > 0
        cores = [tuple(c) for c in r["env"]["affinity"].values()]
        assert len(cores) == 2 and len(set(cores)) == 2 and all(len(c) == 1 for c in cores)  # a core of its own


def test_a_dp_sweep_submits_jobs_with_their_own_task_counts_and_each_node_times_its_kernels(slurm_cluster, tmp_path):
    proc = run_cli("run", "-m", "--out", str(tmp_path), *SMALL, "parallel.dp=1,2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs = [json.loads(p.read_text()) for p in sorted(tmp_path.rglob("slurm.json"))]
    assert len(jobs) == 2 and not any(j["array"] for j in jobs)  # different resources: separate jobs
    assert wait(tmp_path).returncode == 0
    assert sorted(r["env"]["world_size"] for r in results(tmp_path)) == [1, 2]
    for result in sorted(tmp_path.rglob("result.json")):
        r, submitted = json.loads(result.read_text()), json.loads((result.parent / "plan-at-submit.json").read_text())
        # hardware=cpu times its kernels: not on the submitting host but on the node, before the ranks
        assert "until the kernels are timed on the allocated node" in submitted["sources"]["compute"]
        assert f"in SLURM job {r['slurm']['job_id']}" in r["plan"]["sources"]["compute"]
        assert r["plan"]["time"]["micro_batch"]["timed"] and not submitted["time"]["micro_batch"]["timed"]
    for job in jobs:
        tasks = subprocess.run(["sacct", "-j", f"{job['job_id']}.0", "-n", "-P", "-o", "NTasks"], capture_output=True,
                               text=True, timeout=60).stdout.split()
        assert tasks and int(tasks[0]) in (1, 2)


def test_a_failure_on_rank_1_only_is_reported(slurm_cluster, tmp_path):
    assert run_cli("run", "--out", str(tmp_path), *SMALL, "run.fail_at_step=1", "run.fail_rank=1").returncode == 0
    done = wait(tmp_path)
    assert done.returncode == 1
    (r,) = results(tmp_path)
    assert r["status"] == "failed" and r["error"]["rank"] == 1 and "injected failure" in r["error"]["message"]
    assert r["slurm"]["state"] != "COMPLETED"


def test_a_cancelled_job_is_recorded_as_failed_with_the_reason(slurm_cluster, tmp_path):
    assert run_cli("run", "--out", str(tmp_path), *SMALL, "run.steps=100000").returncode == 0
    job = json.loads((tmp_path / "slurm.json").read_text())["job_id"]
    deadline = time.monotonic() + 120
    while "running" not in run_cli("status", str(tmp_path)).stdout and time.monotonic() < deadline:
        time.sleep(1)
    subprocess.run(["scancel", job], check=True, timeout=30)
    assert wait(tmp_path).returncode == 1
    (r,) = results(tmp_path)
    assert r["status"] == "failed" and "cancelled" in r["error"]["message"] and r["slurm"]["state"] == "CANCELLED"


def _history_is_whole(r: dict, steps: int) -> None:
    m = r["metrics"]
    assert [h["step"] for h in m["history"]] == list(range(steps))  # no step lost, none repeated
    assert m["steps"] == steps and m["tokens"] == (steps - 1) * 8 * 128  # as an uninterrupted run (1 warm-up)


@pytest.mark.parametrize("engine", [["engine=deepspeed"], ["engine=fsdp", "zero=stage3"]], ids=["deepspeed", "fsdp2"])
def test_scontrol_requeue_resumes_from_the_last_checkpoint(slurm_cluster, tmp_path, engine):
    steps = 40
    assert run_cli("run", "--out", str(tmp_path), *SMALL, *engine, f"run.steps={steps}",
                   "run.checkpoint_every=2").returncode == 0
    job = json.loads((tmp_path / "slurm.json").read_text())["job_id"]
    latest = tmp_path / "checkpoint" / "latest.json"
    deadline = time.monotonic() + 180
    while not (latest.is_file() and json.loads(latest.read_text())["step"] >= 4):
        assert time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.5)
    subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)
    done = wait(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (r,) = results(tmp_path)
    assert r["status"] == "ok" and r["metrics"]["restarts"] >= 1 and r["metrics"]["resumed_at_steps"][0] >= 4
    assert r["metrics"]["engine"]["engine"] == ("fsdp2" if "engine=fsdp" in engine else "deepspeed")
    _history_is_whole(r, steps)


def test_a_time_limit_checkpoints_requeues_and_finishes(slurm_cluster, tmp_path):
    # A 1-minute limit: the ranks save on SIGUSR2, submitit requeues, the next allocation
    # resumes and finishes. slurmctld checks limits every 30 s, so the warning comes up to
    # 30 s early (sbatch(1): "up to 60 seconds"): asked for 5 s before the end, it comes
    # 25-55 s into an allocation, so the first allocation trains at most ~45 s and every
    # allocation (start-up included) at least ~15 s. A step sleeps 0.1 s on top of its
    # ~0.03-0.13 s of compute (fp32; quiet or busy machine), which bounds the speed both
    # ways: 450 steps take at least 58 s (a requeue is certain) and at most ~105 s (3-4
    # allocations on a busy machine).
    steps = 450
    proc = run_cli("run", "--out", str(tmp_path), *SMALL, "run.bf16=false", f"run.steps={steps}", "cluster.time=1",
                   "cluster.signal_delay_s=5", "run.checkpoint_every=100", "cluster.max_requeues=10",
                   "run.step_sleep_s=0.1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    done = wait(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (r,) = results(tmp_path)
    assert r["status"] == "ok" and r["metrics"]["restarts"] >= 1
    assert r["metrics"]["checkpoints_on_warning"]  # saved on SIGUSR2, not only every 500 steps
    _history_is_whole(r, steps)
    # Once the warning's checkpoint is complete the allocation ends promptly: the requeue's
    # SIGTERM reaches the ranks within seconds (3-5 s here, most of it scontrol's requeue on a
    # busy 2-core machine). Before, a save made before submitit's handler ran was missed
    # and waited out (save_wait_s, 5 s here and 70 s by default), then tasks that ignored
    # SIGTERM waited for KillWait (5 s here, 30 s by default): 10 s or more.
    # (Rank 0's record of the SIGTERM, kept in errors/earlier, dates each end; a rank
    # SIGKILLed before it could write one leaves none, so each record is matched to the
    # last save before it.)
    ended = sorted(json.loads(p.read_text())["time"] for p in (tmp_path / "errors" / "earlier").glob("rank0.*.json"))
    saved = r["metrics"]["resumed_from_saved_at"]
    assert ended and len(saved) == r["metrics"]["restarts"]
    # An allocation that ended before any save never reached its first step (on a busy
    # machine DeepSpeed's start-up can outlast the warning): it had nothing to save.
    for end in [e for e in ended if e >= min(saved)]:
        complete = max(t for t in saved if t <= end)
        assert end - complete < 8, (complete, end)


def test_cluster_wait_blocks_until_the_result(slurm_cluster, tmp_path):
    proc = run_cli("run", "--out", str(tmp_path), *SMALL, "cluster.wait=true", timeout=450)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (r,) = results(tmp_path)
    assert r["status"] == "ok" and "1 ok" in proc.stdout and "tokens/s/GPU" in proc.stdout


def test_a_request_beyond_every_node_is_refused_before_submission(slurm_cluster, tmp_path):
    proc = run_cli("run", "--out", str(tmp_path), *SMALL, "cluster.cpus_per_task=8")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    said = " ".join((proc.stdout + proc.stderr).split())
    assert "cluster.cpus_per_task=8" in said and "the most that fits is cluster.cpus_per_task=1" in said
    assert "Traceback" not in said and not (tmp_path / "slurm.json").exists()  # nothing was submitted
    (r,) = results(tmp_path)
    assert r["status"] == "refused" and "cluster.cpus_per_task" in r["error"]["message"]


def test_a_job_slurm_can_never_start_ends_at_once_with_the_reason(slurm_cluster, tmp_path):
    # run.force=true gets it past the sinfo check: SLURM accepts it and would keep it
    # PENDING (PartitionConfig) for ever.
    assert run_cli("run", "--out", str(tmp_path), *SMALL, "cluster.cpus_per_task=8", "run.force=true").returncode == 0
    job = json.loads((tmp_path / "slurm.json").read_text())["job_id"]
    done = run_cli("wait", str(tmp_path), "--timeout", "120", timeout=180)
    assert done.returncode == 1, done.stdout + done.stderr
    (r,) = results(tmp_path)
    assert r["status"] == "failed" and r["error"]["type"] == "SlurmNeverStarts"
    assert "PartitionConfig" in r["error"]["message"] and r["slurm"]["reason"] == "PartitionConfig"
    deadline = time.monotonic() + 30
    while not sacct(job, "State")[0][0].startswith("CANCELLED"):  # and it no longer waits in the queue
        assert time.monotonic() < deadline
        time.sleep(1)


def test_status_shows_why_a_trial_is_still_pending(slurm_cluster, tmp_path):
    blocker = subprocess.run(["sbatch", "--parsable", "--cpus-per-task=2", "--wrap", "sleep 300"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    try:
        assert run_cli("run", "--out", str(tmp_path), *SMALL).returncode == 0
        deadline, shown = time.monotonic() + 60, ""
        while "pending (Resources)" not in shown:  # the node is busy: SLURM's reason, shown as it says it
            assert time.monotonic() < deadline, shown
            time.sleep(1)
            shown = " ".join(run_cli("status", str(tmp_path)).stdout.split())
    finally:
        subprocess.run(["scancel", blocker], timeout=30)
    assert wait(tmp_path).returncode == 0  # and it runs once the node is free


# --- faults: a rank killed outright, secrets in setup lines, a job that ends badly after
# every step ran, submitit's own cause of an end -------------------------------------------


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


def test_tune_runs_its_rounds_as_slurm_jobs_and_waits_for_each(slurm_cluster, tmp_path):
    out = tmp_path / "tune"
    proc = run_cli("tune", "--out", str(out), "--trials", "3", *SMALL, "zero=stage0,stage1,stage2",
                   "batch.micro_batch_size=1", "recompute=none", "zero.reduce_bucket_size=1e6",
                   "zero.allgather_bucket_size=1e6", "zero.offload_optimizer=none", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = json.loads((out / "tune.json").read_text())
    assert state["ran"] == 3 and state["winner"] and state["rounds"] >= 2  # a later round waited for the first
    done = results(out)
    assert len(done) == 3 and all(r["status"] == "ok" and r["slurm"]["state"] == "COMPLETED" for r in done)
    best = max(r["metrics"]["tokens_per_sec_per_gpu"] for r in done)
    assert state["winner"]["measured_tokens_per_sec_per_gpu"] == pytest.approx(best)


def test_submitits_cause_is_surfaced(tmp_path):
    job = {"job_id": "77", "logs": str(tmp_path)}
    paths = submitit.core.utils.JobPaths(tmp_path, job_id="77", task_id=0)
    with submitit.core.utils.temporary_save_path(paths.result_pickle) as tmp:
        submitit.core.utils.cloudpickle_dump(("error", "Traceback ...\nsubmitit.core.utils.UncompletedJobError: "
                                              "Job not requeued because: timed-out too many times."), tmp)
    assert slurm._submitit_cause(job).endswith("Job not requeued because: timed-out too many times.")
    assert slurm._submitit_cause({"job_id": "78", "logs": str(tmp_path)}) is None
