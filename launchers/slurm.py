"""SLURM launch through submitit: one task per GPU, nodes = ceil(dp / gpus_per_node).

This module turns a trial into submitit's executor parameters and the equivalent sbatch
and srun options (for a user who wants to submit by hand), submits trials (one job
array per set of equal resources) and returns at once, and later turns a finished job
into result.json from the ranks' records and sacct's state.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import submitit

from launchers.binding import Binding
from launchers.local import WORKLOAD_MODULE, clear_stale_build_locks, rank_environment
from orchestrator.files import atomic_write_json
from orchestrator.results import now
from orchestrator.spec import TrialSpec


def timeout_minutes(time: str) -> int:
    """SLURM's MM, HH:MM:SS or D-HH:MM:SS as whole minutes (rounded up)."""
    days, _, clock = time.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if len(parts) == 1:
        seconds = parts[0] * 60
    else:
        parts = [0] * (3 - len(parts)) + parts
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return int(days or 0) * 1440 + math.ceil(seconds / 60)


def submitit_parameters(spec: TrialSpec, bind: Binding) -> dict:
    c = spec.cfg.cluster
    params = {"nodes": spec.nodes, "tasks_per_node": spec.gpus_per_node, "cpus_per_task": c.cpus_per_task,
              "timeout_min": timeout_minutes(c.time), "slurm_signal_delay_s": c.signal_delay_s,
              "slurm_setup": list(c.setup),
              "slurm_srun_args": [*bind.srun_args, *c.srun_args],
              "slurm_additional_parameters": dict(bind.sbatch_options)}
    if spec.cfg.hardware.device == "cuda":
        params["gpus_per_node"] = spec.gpus_per_node
    for name in ("partition", "account", "qos", "constraint"):
        if getattr(c, name):
            params[f"slurm_{name}"] = getattr(c, name)
    return params


def sbatch_options(spec: TrialSpec, bind: Binding) -> list[str]:
    c = spec.cfg.cluster
    opts = [f"--nodes={spec.nodes}", f"--ntasks-per-node={spec.gpus_per_node}", f"--cpus-per-task={c.cpus_per_task}",
            f"--time={c.time}"]
    if spec.cfg.hardware.device == "cuda":
        opts.append(f"--gpus-per-node={spec.gpus_per_node}")
    opts += [f"--{name}={getattr(c, name)}" for name in ("partition", "account", "qos", "constraint") if getattr(c, name)]
    return opts + [f"--{k}={v}" for k, v in bind.sbatch_options.items()]


def srun_options(spec: TrialSpec, bind: Binding) -> list[str]:
    return [*bind.srun_args, *spec.cfg.cluster.srun_args]


def task_command(trial_dir: Path) -> list[str]:
    """What each SLURM task runs: the workload, rank and world from SLURM's environment."""
    return [sys.executable, "-m", WORKLOAD_MODULE, str(trial_dir)]


# --- submission (login node) ------------------------------------------------------------

JOB_FILE = "slurm.json"


class SlurmTask(submitit.helpers.Checkpointable):
    """One SLURM task = one rank (pickled by submitit, run by srun on the node).

    torch.distributed's variables come from SLURM's (submitit's TorchDistributedEnvironment);
    the rank runs the workload as a child process, as under torchrun, so that a rank's
    crash, OOM or os._exit cannot take submitit's own bookkeeping with it. Checkpointable:
    on SLURM's warning before a time limit or preemption, submitit asks task 0 for
    `checkpoint()`, then requeues the job; the requeued ranks resume from the workload's
    last checkpoint.
    """

    def __init__(self, trial_dir: str, env: dict[str, str], save_wait_s: float = 60):
        self.trial_dir, self.env, self.save_wait_s = trial_dir, env, save_wait_s
        self._proc: subprocess.Popen | None = None

    def __call__(self) -> dict:
        dist = submitit.helpers.TorchDistributedEnvironment().export()
        errors = Path(self.trial_dir) / "errors"
        if (errors / f"rank{dist.rank}.json").exists():  # from an attempt before a requeue
            (errors / "earlier").mkdir(parents=True, exist_ok=True)
            (errors / f"rank{dist.rank}.json").replace(errors / "earlier" / f"rank{dist.rank}.{time.time():.0f}.json")
        started = time.time()
        clear_stale_build_locks()  # a requeue that killed an op build mid-way left its lock
        # SIGUSR2 blocked for the rank's life (workload/warning.py): it polls for it at
        # step boundaries, and nothing it spawns can die of it.
        self._proc = subprocess.Popen([sys.executable, "-m", WORKLOAD_MODULE, self.trial_dir],
                                      env={**os.environ, **self.env}, preexec_fn=_block_warning)
        code = self._proc.wait()
        if code in (-signal.SIGTERM, -signal.SIGKILL):  # SLURM ended the job (requeue, cancel, time limit)
            raise RuntimeError(f"rank {dist.rank} was ended by SLURM (signal {-code})")
        if code != 0:
            if not (errors / f"rank{dist.rank}.json").exists():  # it died without a Python error: say so
                atomic_write_json(errors / f"rank{dist.rank}.json", {
                    "type": "ProcessExit", "silent": True, "rank": dist.rank, "oom": False, "time": started,
                    "message": f"rank {dist.rank} exited with code {code} without a Python error",
                    "host": socket.gethostname()})
            raise RuntimeError(f"rank {dist.rank} failed with exit code {code}")
        return {"rank": dist.rank}

    def checkpoint(self, *args, **kwargs):
        """Called on SLURM's warning: give the ranks time to save (they got SIGUSR2 too)."""
        from orchestrator.workload.checkpoint import DIRECTORY, LATEST

        latest = Path(self.trial_dir) / DIRECTORY / LATEST
        asked = time.time()
        deadline = asked + self.save_wait_s
        while time.time() < deadline and self._proc is not None and self._proc.poll() is None:
            if latest.is_file() and latest.stat().st_mtime >= asked and json.loads(latest.read_text())["signalled"]:
                break  # the ranks saved after the warning
            time.sleep(0.5)
        return super().checkpoint(*args, **kwargs)

    def __getstate__(self) -> dict:  # the running child does not travel with the requeued job
        return {**self.__dict__, "_proc": None}


def _block_warning() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})


def submit(trials: list[tuple[TrialSpec, Path]], logs: Path) -> list[str]:
    """Submit every trial; trials with the same resources go out as one job array.

    Returns at once; each trial directory gets slurm.json with its job id.
    """
    groups: dict[str, list[tuple[TrialSpec, Path]]] = {}
    for spec, trial_dir in trials:
        params = submitit_parameters(spec, trial_binding_of(spec))
        key = json.dumps([params, spec.cfg.cluster.max_requeues], sort_keys=True)
        groups.setdefault(key, []).append((spec, trial_dir))
    job_ids = []
    for key, members in groups.items():
        params, max_requeues = json.loads(key)
        executor = submitit.AutoExecutor(folder=logs / "%j", cluster="slurm", slurm_max_num_timeout=max_requeues)
        executor.update_parameters(name="orchestrator", **params)
        # The ranks' save after SLURM's warning must end before the job does: leave 20 s.
        tasks = [SlurmTask(str(d), rank_environment(s, s.cfg.cluster.cpus_per_task),
                           save_wait_s=max(5, s.cfg.cluster.signal_delay_s - 20)) for s, d in members]
        if len(tasks) > 1:
            with executor.batch():
                jobs = [executor.submit(task) for task in tasks]
        else:
            jobs = [executor.submit(tasks[0])]
        for (spec, trial_dir), job in zip(members, jobs):
            atomic_write_json(trial_dir / JOB_FILE, {"job_id": job.job_id, "logs": str(job.paths.folder),
                                                     "array": len(members) > 1, "submitted_at": now()})
            job_ids.append(job.job_id)
    return job_ids


def trial_binding_of(spec: TrialSpec):
    from orchestrator.translate import trial_binding

    return trial_binding(spec)


# --- state and results (login node) -------------------------------------------------------

RUNNING = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING", "REQUEUE_HOLD",
           "REQUEUE_FED", "SIGNALING", "STAGE_OUT"}
ENDED = {"TIMEOUT": ("timeout", "the SLURM time limit ended it"), "CANCELLED": ("failed", "cancelled (scancel)"),
         "NODE_FAIL": ("failed", "a node failed"), "PREEMPTED": ("preempted", "preempted by SLURM"),
         "OUT_OF_MEMORY": ("oom", "SLURM killed it for exceeding its memory"),
         "BOOT_FAIL": ("failed", "the node failed to boot"), "DEADLINE": ("timeout", "past its deadline")}


def job_state(job_id: str) -> tuple[str, str]:
    """(SLURM state, reason) from sacct; ("UNKNOWN", "") before sacct has the job."""
    out = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State,Reason"],
                         capture_output=True, text=True, timeout=60).stdout
    for line in out.splitlines():
        jid, state, reason = (line.split("|") + ["", ""])[:3]
        if jid == job_id:
            return state.split()[0] if state else "UNKNOWN", reason
    return "UNKNOWN", ""


def finalize(trial_dir: Path) -> dict | None:
    """result.json for a submitted trial whose job has ended (None while it has not)."""
    from orchestrator.results import outcome_status, write_result
    from orchestrator.spec import load_spec

    job = json.loads((trial_dir / JOB_FILE).read_text())
    state, reason = job_state(job["job_id"])
    if state in RUNNING or state == "UNKNOWN":
        return None
    spec = load_spec(trial_dir)
    plan = json.loads((trial_dir / "plan.json").read_text()) if (trial_dir / "plan.json").is_file() else None
    if state == "COMPLETED":
        status, error = outcome_status(trial_dir, 0, timed_out=False)
    elif state in ENDED:
        status, cause = ENDED[state]
        error = {"type": f"Slurm{state.title().replace('_', '')}", "message": f"{cause} (sacct: {state} {reason})",
                 "rank": None, "log_tail": ""}
    else:  # FAILED and anything else: the ranks' own records say why
        status, error = outcome_status(trial_dir, 1, timed_out=False)
        if error and error["type"] == "ProcessExit" and error["rank"] is None:
            error["message"] = f"the job failed (sacct: {state} {reason})"
    if status == "ok" and state != "COMPLETED":  # never report as completed what did not complete
        status = "failed"
    return write_result(trial_dir, spec, plan, status, job["submitted_at"], error,
                        slurm={"job_id": job["job_id"], "state": state, "reason": reason})
