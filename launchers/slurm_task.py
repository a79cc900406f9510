"""What runs inside one SLURM task, on a compute node: one rank of a trial.

submitit pickles a SlurmTask on the submitting host and srun runs it once per task. The
task sets up torch.distributed's variables from SLURM's (submitit's
TorchDistributedEnvironment) and runs the workload as a child process, as under
torchrun, so that a rank's crash, OOM or os._exit cannot take submitit's own bookkeeping
with it. The submitting side (parameters, submission, state) is in slurm.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import submitit

from orchestrator import host_load
from orchestrator.config import KernelSource
from orchestrator.files import atomic_write_json, read_json
from orchestrator.launchers.local import WORKLOAD_MODULE
from orchestrator.process import clear_stale_build_locks, freeze_at_exit
from orchestrator.plan.planner import make_plan
from orchestrator.spec import load_spec
from orchestrator.trial_dir import TrialPaths

NODE_PLAN_WAIT_S = 600  # the longest the other ranks wait for rank 0 to time the kernels


def task_environment() -> dict[str, str]:
    """torch.distributed's variables for this task, from SLURM's environment.

    CUDA_VISIBLE_DEVICES stays as SLURM set it: submitit's default would narrow it to
    str(LOCAL_RANK), a physical index the job may not hold, after which cuda:LOCAL_RANK
    is out of range for every local rank but 0. The rank picks its GPU from SLURM's list
    (orchestrator.workload.placement).
    """
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    names = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    return {name: os.environ[name] for name in names}


class SlurmTask(submitit.helpers.Checkpointable):
    """One SLURM task = one rank. Checkpointable: on SLURM's warning before a time limit
    or preemption, submitit asks task 0 for `checkpoint()`, then requeues the job; the
    requeued ranks resume from the workload's last checkpoint."""

    def __init__(self, trial_dir: str, env: dict[str, str], save_wait_s: float = 60):
        self.trial_dir, self.env, self.save_wait_s = trial_dir, env, save_wait_s
        self._proc: subprocess.Popen | None = None
        self._terminated = False  # SLURM sent SIGTERM (requeue, scancel, time limit)
        self._attempt_started = time.time()

    def __call__(self) -> dict:
        freeze_at_exit()  # submitit's process ends after this call: its exit walks nothing
        rank = int(task_environment()["RANK"])
        paths = TrialPaths(Path(self.trial_dir))
        error = paths.rank_error(rank)
        if error.exists():  # from an attempt before a requeue
            paths.earlier_errors.mkdir(parents=True, exist_ok=True)
            error.replace(paths.earlier_rank_error(rank, time.time()))
        started = self._attempt_started = time.time()
        clear_stale_build_locks()  # a requeue that killed an op build mid-way left its lock
        plan_on_the_node(paths, rank)
        if rank == 0:  # the node's load before timing, as a local trial records its host's
            load = host_load.measure()
            atomic_write_json(paths.node_load, {**load.as_dict(), "host": socket.gethostname()})
        # submitit ignores SIGTERM ("bypass"), so a requeue or scancel waited for SLURM's
        # SIGKILL (KillWait later, 30 s by default) after the warning's checkpoint: end now.
        signal.signal(signal.SIGTERM, self._on_sigterm)
        # SIGUSR2 blocked for the rank's life (workload/warning.py): it polls for it at
        # step boundaries, and nothing it spawns can die of it.
        self._proc = subprocess.Popen([sys.executable, "-m", WORKLOAD_MODULE, self.trial_dir],
                                      env={**os.environ, **self.env}, preexec_fn=_block_warning)
        code = self._proc.wait()
        if self._terminated:
            raise RuntimeError(f"rank {rank} was ended by SLURM (SIGTERM: requeue, scancel or time limit)")
        if code != 0:
            if code == -signal.SIGKILL:  # not SLURM: it sends SIGTERM first, and we would have seen it
                message = (f"rank {rank} was killed by SIGKILL without a warning (the kernel's OOM killer does this "
                           "when the node runs out of memory; or kill -9)")
            else:
                message = f"rank {rank} exited with code {code} without a Python error"
            if not error.exists():  # it died without a Python error: say so
                atomic_write_json(error, {
                    "type": "Killed" if code == -signal.SIGKILL else "ProcessExit", "silent": True, "rank": rank,
                    "oom": False, "time": started, "message": message, "host": socket.gethostname()})
            raise RuntimeError(message)
        return {"rank": rank}

    def _on_sigterm(self, signum, frame) -> None:
        """SLURM ends the job: end the rank (it records the signal and closes its W&B run), then this task."""
        self._terminated = True
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()

    def checkpoint(self, *args, **kwargs):
        """Called on SLURM's warning: give the ranks time to save (they got SIGUSR2 too)."""
        latest = TrialPaths(Path(self.trial_dir)).checkpoint_latest
        deadline = time.time() + self.save_wait_s
        while time.time() < deadline and self._proc is not None and self._proc.poll() is None:
            # A save flagged as asked for by the warning, in this attempt: the ranks often
            # save before this handler even runs, so "after the handler started" missed
            # it and every allocation waited out save_wait_s before the requeue.
            if latest.is_file() and latest.stat().st_mtime >= self._attempt_started \
                    and json.loads(latest.read_text())["signalled"]:
                break
            time.sleep(0.1)
        return super().checkpoint(*args, **kwargs)

    def __getstate__(self) -> dict:  # the running child does not travel with the requeued job
        return {**self.__dict__, "_proc": None}


def plan_on_the_node(paths: TrialPaths, rank: int) -> None:
    """hardware.kernels=measured: the submitting host could not time the node's kernels, so
    before the ranks start rank 0 times them here and re-plans into plan.json (the result
    compares the measured step with this plan), keeping the submitted one beside it. The
    other ranks wait for it, so nothing runs on the node beside the timing. Once per
    trial: a requeued job finds it done."""
    spec = load_spec(paths.root)
    if spec.cfg.hardware.kernels != KernelSource.measured or paths.plan_at_submit.exists():
        return
    if rank != 0:
        deadline = time.monotonic() + NODE_PLAN_WAIT_S
        while not paths.plan_at_submit.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        return
    submitted = read_json(paths.plan)
    try:
        atomic_write_json(paths.plan, make_plan(spec, on_the_node=True).as_dict())
    finally:  # the other ranks go on either way; a plan that failed leaves the submitted one
        atomic_write_json(paths.plan_at_submit, submitted)


def _block_warning() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
