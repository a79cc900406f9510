"""`sbatch launch.sh`, as `translate ... cluster=slurm` writes it, on the real SLURM test cluster
(tests/conftest.py: CLUSTER_SHAPE): the job a user submits by hand starts the same ranks as
`orchestrator run cluster=slurm` (submitit), and writes its result.json.

Each trial is translated, then submitted with sbatch itself; the jobs run side by side
(`submitted`). cluster.cpus_per_task reaching every rank and the node's plan is
tests/test_multinode.py's dp sweep. Mocked: nothing.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.records.trial_dir import TrialPaths
from tests.conftest import FP32, PRESET_KERNELS, history_is_whole, run_in_process, sacct
from tests.test_slurm_faults import rank_pid

pytestmark = pytest.mark.slow
# Two nodes of two ranks each (four CPUs a node would be needed for two CPUs a task).
TWO_BY_TWO = [
    "cluster=slurm",
    "hardware=cpu",
    PRESET_KERNELS,
    FP32,
    "cluster.gpus_per_node=2",
    "parallel.dp=4",
    "cluster.cpus_per_task=1",
    "run.steps=3",
    "run.warmup_steps=1",
    "logger.mode=disabled",
]
REQUEUED_STEPS = 30
TRIALS = {
    # First, so that they hold their nodes no longer than their tests need: one runs until its
    # test kills its rank on the second node (it sleeps between steps meanwhile); one is warned
    # (as SLURM warns before a time limit) once it trains, saves, requeues itself and resumes.
    "killed": [
        *TWO_BY_TWO,
        "cluster.gpus_per_node=1",
        "parallel.dp=2",
        "run.steps=100000",
        "run.step_sleep_s=0.5",
        "run.checkpoint_every=2",
    ],
    "requeued": [
        *TWO_BY_TWO,
        "cluster.gpus_per_node=1",
        "parallel.dp=1",
        f"run.steps={REQUEUED_STEPS}",
        "run.step_sleep_s=0.3",
        "run.checkpoint_every=2",
    ],
    "deepspeed": [*TWO_BY_TWO, "zero=stage2"],
    "fsdp": [*TWO_BY_TWO, "engine=fsdp", "zero=stage3"],
    # one task a node, which starts its two ranks through accelerate launch (--machine_rank)
    "accelerate": [*TWO_BY_TWO, "engine=accelerate", "zero=stage2"],
}


def sbatch(trial: Path) -> str:
    proc = subprocess.run(
        ["sbatch", "--parsable", str(trial / "launch.sh")], capture_output=True, text=True, timeout=60, cwd=trial
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def result_of(trial: Path, timeout: float = 600) -> dict:
    """The result.json the batch script's last line writes."""
    deadline = time.monotonic() + timeout
    while not (trial / "result.json").is_file():
        assert time.monotonic() < deadline, f"no result.json in {trial}: {list((trial / 'logs').glob('*'))}"
        time.sleep(1)
    return json.loads((trial / "result.json").read_text())


@pytest.fixture(scope="module")
def submitted(slurm_cluster, tmp_path_factory) -> dict[str, tuple[Path, str]]:
    base = tmp_path_factory.mktemp("sbatch")
    jobs = {}
    for name, overrides in TRIALS.items():
        proc = run_in_process("translate", *overrides, "--out", str(base / name))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        jobs[name] = (base / name, sbatch(base / name))
    return jobs


def test_a_rank_killed_on_the_second_node_ends_the_job_within_seconds(submitted):
    trial, job = submitted["killed"]
    pid = rank_pid(trial, 1)
    killed = time.time()
    os.kill(pid, signal.SIGKILL)  # as the kernel's OOM killer does it
    r = result_of(trial, timeout=300)
    ended = time.time()
    # Seconds here; the bound is loose for a machine 2-3x slower under the other tests' load,
    # and far below what the peers would otherwise wait in their collective (gloo's 30 minutes,
    # NCCL's 10).
    assert ended - killed < 120, f"the job outlived its rank by {ended - killed:.0f} s"
    assert r["status"] == "failed" and r["error"]["rank"] == 1
    nodes = subprocess.run(
        ["scontrol", "show", "hostnames", sacct(job, "NodeList")[0][0]], capture_output=True, text=True, timeout=30
    ).stdout.split()
    assert r["error"]["host"] == nodes[1] and "SIGKILL" in r["error"]["message"]
    # --exclusive: one task of one CPU a node, and the job held both nodes' CPUs all the same
    assert sacct(job, "AllocCPUS")[0][0] == "4"


def test_slurms_warning_saves_requeues_and_the_job_finishes_whole(submitted):
    trial, job = submitted["requeued"]
    latest, deadline = trial / "checkpoint" / "latest.json", time.monotonic() + 300
    while not (latest.is_file() and json.loads(latest.read_text())["step"] >= 2):
        assert time.monotonic() < deadline and not (trial / "result.json").exists(), "it never trained"
        time.sleep(0.5)
    # what SLURM sends at --signal=USR2@DELAY: USR2 to every process of the job's steps
    subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
    r = result_of(trial, timeout=420)
    assert r["status"] == "ok", r["error"]  # the first allocation's end wrote no result: the requeue's did
    assert r["metrics"]["restarts"] >= 1 and json.loads(TrialPaths(trial).requeue_asked.read_text())["job_id"] == job
    history_is_whole(r, REQUEUED_STEPS, ranks=1)


@pytest.mark.parametrize("engine", ["deepspeed", "fsdp", "accelerate"])
def test_sbatch_launch_sh_trains_two_nodes_of_two_ranks(submitted, engine):
    trial, job = submitted[engine]
    r = result_of(trial)
    assert r["status"] == "ok", r["error"]
    assert r["env"]["world_size"] == 4 and r["env"]["slurm_job_id"] == job
    hosts = {x["rank"]: x["host"] for x in r["env"]["ranks"]}
    assert len(set(hosts.values())) == 2 and hosts[0] == hosts[1] != hosts[2] == hosts[3]  # two a node, in order
    assert all(x["host_peak_bytes"] > 2**20 for x in r["env"]["ranks"])  # each rank's host peak, measured
    assert (
        r["metrics"]["engine"]["engine"] == {"deepspeed": "deepspeed", "fsdp": "fsdp2"}.get(engine, engine)
        and r["metrics"]["tokens_per_sec_per_gpu"] > 0
    )
    assert r["slurm"]["job_id"] == job and r["slurm"]["state"] == "COMPLETED"
    assert (trial / "logs" / f"sbatch-{job}.out").is_file()  # sbatch --output, in the trial's logs
    if engine == "accelerate":  # as accelerate runs on several machines: its DeepSpeed, not one process alone
        assert r["metrics"]["engine"]["distributed_type"] == "DistributedType.DEEPSPEED"
        assert dict(sacct(job, "JobID", "NTasks"))[f"{job}.0"] == "2"  # the ranks' step: one task a node
