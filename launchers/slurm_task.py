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

from orchestrator.files import atomic_write_json
from orchestrator.launchers.local import WORKLOAD_MODULE, clear_stale_build_locks


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

    def __call__(self) -> dict:
        rank = int(task_environment()["RANK"])
        errors = Path(self.trial_dir) / "errors"
        if (errors / f"rank{rank}.json").exists():  # from an attempt before a requeue
            (errors / "earlier").mkdir(parents=True, exist_ok=True)
            (errors / f"rank{rank}.json").replace(errors / "earlier" / f"rank{rank}.{time.time():.0f}.json")
        started = time.time()
        clear_stale_build_locks()  # a requeue that killed an op build mid-way left its lock
        # SIGUSR2 blocked for the rank's life (workload/warning.py): it polls for it at
        # step boundaries, and nothing it spawns can die of it.
        self._proc = subprocess.Popen([sys.executable, "-m", WORKLOAD_MODULE, self.trial_dir],
                                      env={**os.environ, **self.env}, preexec_fn=_block_warning)
        code = self._proc.wait()
        if code in (-signal.SIGTERM, -signal.SIGKILL):  # SLURM ended the job (requeue, cancel, time limit)
            raise RuntimeError(f"rank {rank} was ended by SLURM (signal {-code})")
        if code != 0:
            if not (errors / f"rank{rank}.json").exists():  # it died without a Python error: say so
                atomic_write_json(errors / f"rank{rank}.json", {
                    "type": "ProcessExit", "silent": True, "rank": rank, "oom": False, "time": started,
                    "message": f"rank {rank} exited with code {code} without a Python error",
                    "host": socket.gethostname()})
            raise RuntimeError(f"rank {rank} failed with exit code {code}")
        return {"rank": rank}

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
