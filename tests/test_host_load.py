"""Before a local trial times anything: how busy the host is, and whether its ranks fit in
the memory the host has free (orchestrator/measure/host_load.py, trial.py). Real /proc readings."""

import os
import subprocess
import sys
import time

from orchestrator.config import GIB
from orchestrator.measure import host_load
from orchestrator.measure.host_load import by_node, cpu_ticks, node_load
from orchestrator.run.trial import host_memory_refusal
from orchestrator.spec import build_spec


def test_a_busy_process_is_seen_and_named():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    # Every process already running but the spinner is left out, so the other tests' trials
    # beside this one (xdist) cannot outrank it among the three named: what is tested is the
    # reading of /proc and the naming, not which process this machine's load made busiest.
    others = {int(pid) for pid in os.listdir("/proc") if pid.isdigit()} - {spinner.pid}
    try:
        load = host_load.measure(window_s=1.0, exclude=others)
    finally:
        spinner.kill()
        spinner.wait()
    assert any(f"pid {spinner.pid}," in who for who in load.busiest), load.busiest
    assert 0 < load.busy_share <= 1 and load.cores >= 1
    # a host this busy (or busier, under the other tests) warns, naming the process
    busy = host_load.HostLoad(busy_share=0.9, cores=2, load_average=2.0, busiest=load.busiest)
    assert f"pid {spinner.pid}" in busy.warning() and "90% of its 2 cores" in busy.warning()
    assert host_load.HostLoad(busy_share=0.05, cores=2, load_average=0.1, busiest=[]).warning() is None


def test_the_ranks_together_must_fit_in_the_memory_the_host_has_free():
    import dataclasses

    from orchestrator.run.planning import plan_trial

    assert host_load.available_bytes() > 0
    cpu = build_spec(["hardware=cpu", "hardware.kernels=preset", "parallel.dp=2"])
    plan = plan_trial(cpu)
    two_gib = dataclasses.replace(plan, memory=dataclasses.replace(plan.memory, total=2 * GIB))
    why = host_memory_refusal(cpu, two_gib, 3 * GIB)
    assert "3.00 GiB free" in why and "needs 4.00 GiB (2 rank(s) x 2.00 GiB)" in why and "run.force=true" in why
    assert host_memory_refusal(cpu, two_gib, 5 * GIB) is None
    # a SLURM GPU trial: its node is not this host, and nothing said what the node grants
    gpu = build_spec(["hardware=h100-sxm", "cluster=slurm", "cluster.gpus_per_node=8", "parallel.dp=8"])
    assert host_memory_refusal(gpu, plan_trial(gpu), 1 * GIB) is None


def test_a_sigkilled_rank_is_oom_only_where_its_cgroup_counted_an_oom_kill(tmp_path):
    """torchrun's failure summary as it writes it; whether the OOM killer acted comes from
    the memory cgroup's count (orchestrator/measure/memory_cgroup.py), read before and after."""
    from orchestrator.measure import memory_cgroup
    from orchestrator.records.results import outcome_status
    from orchestrator.records.trial_dir import TrialPaths

    log = TrialPaths(tmp_path).launcher_log
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-25_17:00:00\n"
        "  host      : localhost\n  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 4242)\n"
    )
    status, error = outcome_status(tmp_path, 1, False, oom_killed=False)
    assert status == "failed" and error["rank"] == 1 and "no OOM kill counted" in error["message"]
    status, error = outcome_status(tmp_path, 1, False, oom_killed=True)
    assert status == "oom" and error["type"] == "OutOfMemory" and "OOM killer" in error["message"]
    assert memory_cgroup.oom_kills() is not None  # this machine's kind has a counter to read
    # torchrun names the peer whose collective broke (exit code 1, a Python error); the rank
    # the OOM killer ended left its running marker and no error of its own
    log.write_text(log.read_text().replace("rank      : 1", "rank      : 0").replace("-9 (pid", "1 (pid"))
    paths = TrialPaths(tmp_path)
    paths.errors.mkdir(parents=True, exist_ok=True)
    paths.rank_error(0).write_text(
        '{"rank": 0, "type": "DistBackendError", "message": "Connection reset by peer", "time": 1.0, "oom": false}'
    )
    paths.rank_running(1).write_text("")
    status, error = outcome_status(tmp_path, 1, False, oom_killed=True)
    assert status == "oom" and error["rank"] == 1 and "OOM killer" in error["message"], error
    status, error = outcome_status(tmp_path, 1, False, oom_killed=False)
    assert status == "failed" and error["rank"] == 1 and error["type"] == "ProcessExit", error


def test_the_free_memory_a_trial_is_checked_against_is_its_cgroups_where_that_is_less(tmp_path):
    """Under SLURM or a container a job's cgroup limit is below the host's MemAvailable: the
    tightest limit over the cgroup and its parents, less what they use, is what a trial has."""
    from orchestrator.measure.memory_cgroup import headroom_bytes

    job = tmp_path / "system.slice" / "slurmstepd.scope" / "job_42"
    job.mkdir(parents=True)
    (job / "memory.max").write_text("8589934592\n")  # the job: 8 GiB, 6 GiB of it used
    (job / "memory.current").write_text(str(6 * 2**30))
    (job.parent / "memory.max").write_text("max\n")  # its parent: no limit
    (job.parent / "memory.current").write_text(str(50 * 2**30))
    v2 = "0::/system.slice/slurmstepd.scope/job_42\n"
    assert headroom_bytes(root=tmp_path, proc_cgroup=v2) == 2 * 2**30
    (job.parent / "memory.max").write_text(str(51 * 2**30))  # a parent nearer its limit binds first
    assert headroom_bytes(root=tmp_path, proc_cgroup=v2) == 1 * 2**30
    v1_dir = tmp_path / "memory" / "docker" / "abc"
    v1_dir.mkdir(parents=True)
    (v1_dir / "memory.limit_in_bytes").write_text(str(4 * 2**30))
    (v1_dir / "memory.usage_in_bytes").write_text(str(3 * 2**30))
    assert headroom_bytes(root=tmp_path, proc_cgroup="4:memory:/docker/abc\n") == 2**30
    (v1_dir / "memory.limit_in_bytes").write_text("9223372036854771712")  # v1's "no limit"
    assert headroom_bytes(root=tmp_path, proc_cgroup="4:memory:/docker/abc\n") is None


def test_plan_says_what_run_would_say_of_a_local_cpu_trial_its_host_cannot_hold(cli, monkeypatch):
    """`plan` exited 0 where `run` refused the same point for the host's free memory: both now
    take the same verdict (trial.refusal), with what this host has free."""
    import orchestrator.commands as commands
    from tests.conftest import PRESET_KERNELS

    monkeypatch.setattr(commands, "available_bytes", lambda: 64 * 2**20)  # this host: 64 MiB free (faked)
    proc = cli("plan", "hardware=cpu", PRESET_KERNELS)
    assert proc.returncode == 3 and "the host has 0.06 GiB free" in proc.stderr, proc.stderr


def test_a_busy_rank_reads_its_node_busy_and_its_memory_in_use():
    since = cpu_ticks()
    end = time.process_time() + 0.3
    while time.process_time() < end:  # this process keeps a core busy
        pass
    load = node_load(since)
    assert 1 / load["cores"] * 0.5 < load["cpu_busy_share"] <= 1
    assert load["memory_used_bytes"] > 0


def test_the_ranks_of_a_node_are_one_node_and_its_figure_the_median_of_their_readings():
    def rank(r, host, busy):
        return {"rank": r, "host": host, "node_load": {"cpu_busy_share": busy, "cores": 2, "memory_used_bytes": 10}}

    nodes = by_node([rank(0, "a", 0.5), rank(1, "a", 0.7), rank(2, "b", 0.1), {"rank": 3, "host": "b"}])
    assert nodes["a"] == {"ranks": [0, 1], "cpu_busy_share": 0.6, "cores": 2, "memory_used_bytes": 10}
    assert nodes["b"]["ranks"] == [2]  # a rank that read nothing (another version) is left out
