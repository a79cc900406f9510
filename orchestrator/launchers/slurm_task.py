"""What runs inside one SLURM task, on a compute node: one rank of a trial.

Both ways to submit a trial end here, so both start the same ranks: submitit pickles a
SlurmTask on the submitting host and srun runs it once per task; `sbatch launch.sh` (what
`translate` writes) runs `srun python -m orchestrator.launchers.slurm_task TRIAL_DIR`,
which builds the same SlurmTask from the trial directory (`main`). The task sets up
torch.distributed's variables from SLURM's (submitit's TorchDistributedEnvironment) and
runs the workload as a child process, as under torchrun, so that a rank's crash, OOM or
os._exit cannot take the task's own bookkeeping with it. After srun, launch.sh's last
line (`--result`) writes result.json as `orchestrator wait` does for a submitit job. The
submitting side (parameters, submission, state) is in slurm.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import submitit

from orchestrator.config import KernelSource
from orchestrator.core.files import atomic_write_json, read_json
from orchestrator.core.process import clear_stale_build_locks, freeze_at_exit
from orchestrator.launchers.binding import trial_binding
from orchestrator.launchers.local import WORKLOAD_MODULE, accelerate_launch, rank_environment
from orchestrator.measure import host_load
from orchestrator.records.trial_dir import TrialPaths
from orchestrator.spec import TrialSpec, load_spec
from orchestrator.workload.placement import one_gpu_task

NODE_PLAN_WAIT_S = 600  # the longest the other ranks wait for rank 0 to time the kernels
TASK_MODULE = "orchestrator.launchers.slurm_task"
NODE_PLAN_MODULE = "orchestrator.run.node_plan"  # started by its name: launch imports no orchestration


def task_python(spec: TrialSpec) -> list[str]:
    """The interpreter each task runs (cluster.python), as words: this one by default."""
    return shlex.split(spec.cfg.cluster.python) if spec.cfg.cluster.python else [sys.executable]


def accelerate_node_launch(spec: TrialSpec, trial_dir: Path) -> list[str]:
    """engine=accelerate on SLURM: what each node's task runs before its place among the
    machines and the module, as accelerate runs on several machines (accelerate's SLURM
    example: one `accelerate launch` a node; SlurmTask._command adds --machine_rank and the
    first node's address, which only the node knows)."""
    return [
        *task_python(spec),
        *accelerate_launch(trial_dir, trial_binding(spec)),
        "--num_machines",
        str(spec.nodes),
        "--num_processes",
        str(spec.world_size),
    ]


def task_environment() -> dict[str, str]:
    """torch.distributed's variables for this task, from SLURM's environment.

    CUDA_VISIBLE_DEVICES stays as SLURM set it: submitit's default would narrow it to
    str(LOCAL_RANK), a physical index the job may not hold, after which cuda:LOCAL_RANK
    is out of range for every local rank but 0. The rank picks its GPU from SLURM's list
    (orchestrator.workload.placement); a task bound to one GPU is local rank 0 of 1, so that
    every engine's own choice (cuda:LOCAL_RANK) is that GPU.
    """
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    os.environ.update(one_gpu_task(os.environ))
    names = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    return {name: os.environ[name] for name in names}


class SlurmTask(submitit.helpers.Checkpointable):
    """One SLURM task = one rank. Checkpointable: on SLURM's warning before a time limit
    or preemption, submitit asks task 0 for `checkpoint()`, then requeues the job; the
    requeued ranks resume from the workload's last checkpoint."""

    def __init__(
        self,
        trial_dir: str,
        env: dict[str, str],
        save_wait_s: float = 60,
        node_launcher: list[str] | None = None,
        ranks_per_node: int = 1,
    ):
        """node_launcher: engine=accelerate's `accelerate launch ...` (accelerate_node_launch):
        then this is the node's one task, and it starts the node's ranks through it, told its
        node's place (--machine_rank) and the first node's address, as accelerate runs on
        several machines; None: this task is one rank."""
        self.trial_dir, self.env, self.save_wait_s = trial_dir, env, save_wait_s
        self.node_launcher, self.ranks_per_node = node_launcher, ranks_per_node
        self._proc: subprocess.Popen | None = None
        self._terminated = False  # SLURM sent SIGTERM (requeue, scancel, time limit)
        self._attempt_started = time.time()

    def __call__(self) -> dict:
        freeze_at_exit()  # submitit's process ends after this call: its exit walks nothing
        task = task_environment()
        argv, env, rank = self._command(task)
        paths = TrialPaths(Path(self.trial_dir))
        error = paths.rank_error(rank)
        if error.exists():  # from an attempt before a requeue
            paths.earlier_errors.mkdir(parents=True, exist_ok=True)
            error.replace(paths.earlier_rank_error(rank, time.time()))
        started = self._attempt_started = time.time()
        clear_stale_build_locks()  # a requeue that killed an op build mid-way left its lock
        plan_on_the_node(paths, rank, self.env)
        if rank == 0:  # the node's load before timing, as a local trial records its host's
            load = host_load.measure()
            atomic_write_json(paths.node_load, {**load.as_dict(), "host": socket.gethostname()})
        # submitit ignores SIGTERM ("bypass"), so a requeue or scancel waited for SLURM's
        # SIGKILL (KillWait later, 30 s by default) after the warning's checkpoint: end now.
        signal.signal(signal.SIGTERM, self._on_sigterm)
        # SIGUSR2 blocked for the rank's life (workload/warning.py): it polls for it at
        # step boundaries, and nothing it spawns can die of it.
        self._proc = subprocess.Popen(argv, env=env, preexec_fn=_block_warning)
        code = self._proc.wait()
        if self._terminated:
            raise RuntimeError(f"rank {rank} was ended by SLURM (SIGTERM: requeue, scancel or time limit)")
        if code != 0:
            if code == -signal.SIGKILL:  # not SLURM: it sends SIGTERM first, and we would have seen it
                message = (
                    f"rank {rank} was killed by SIGKILL without a warning (the kernel's OOM killer does this "
                    "when the node runs out of memory; or kill -9)"
                )
            else:
                message = f"rank {rank} exited with code {code} without a Python error"
            if not error.exists():  # it died without a Python error: say so
                atomic_write_json(
                    error,
                    {
                        "type": "Killed" if code == -signal.SIGKILL else "ProcessExit",
                        "silent": True,
                        "rank": rank,
                        "oom": False,
                        "time": started,
                        "message": message,
                        "host": socket.gethostname(),
                    },
                )
            raise RuntimeError(message)
        return {"rank": rank}

    def _command(self, task: dict[str, str]) -> tuple[list[str], dict[str, str], int]:
        """(argv, environment, first rank) of what this task starts: the workload as its rank,
        or accelerate launch for its node (whose ranks torchrun numbers: this task's variables,
        which count nodes, are left out of their environment)."""
        env = {**os.environ, **self.env}
        if self.node_launcher is None:
            return [sys.executable, "-m", WORKLOAD_MODULE, self.trial_dir], env, int(task["RANK"])
        node = int(task["RANK"])  # one task a node: submitit's rank is the node's index
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            env.pop(name, None)
        place = [
            "--machine_rank",
            str(node),
            "--main_process_ip",
            task["MASTER_ADDR"],
            "--main_process_port",
            task["MASTER_PORT"],
        ]
        argv = [*self.node_launcher, *place, "--module", WORKLOAD_MODULE, self.trial_dir]
        return argv, env, node * self.ranks_per_node

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
        self.wait_for_save()
        return super().checkpoint(*args, **kwargs)

    def wait_for_save(self) -> None:
        latest = TrialPaths(Path(self.trial_dir)).checkpoint_latest
        deadline = time.time() + self.save_wait_s
        while time.time() < deadline and self._proc is not None and self._proc.poll() is None:
            # A save flagged as asked for by the warning, in this attempt: the ranks often
            # save before this handler even runs, so "after the handler started" missed
            # it and every allocation waited out save_wait_s before the requeue.
            if (
                latest.is_file()
                and latest.stat().st_mtime >= self._attempt_started
                and json.loads(latest.read_text())["signalled"]
            ):
                break
            time.sleep(0.1)

    @classmethod
    def for_trial(cls, spec: TrialSpec, trial_dir: Path) -> SlurmTask:
        """The task of one trial, the same from submitit and from launch.sh."""
        launcher = accelerate_node_launch(spec, trial_dir) if spec.cfg.engine.name == "accelerate" else None
        return cls(
            str(trial_dir),
            rank_environment(spec, spec.threads_per_rank),
            save_wait_s=save_wait_s(spec),
            node_launcher=launcher,
            ranks_per_node=spec.gpus_per_node,
        )

    def __getstate__(self) -> dict:  # the running child does not travel with the requeued job
        return {**self.__dict__, "_proc": None}


def plan_on_the_node(paths: TrialPaths, rank: int, env: dict[str, str]) -> None:
    """hardware.kernels=measured: the submitting host could not time the node's kernels, so
    before the ranks start rank 0 times them here and re-plans into plan.json (the result
    compares the measured step with this plan), keeping the submitted one beside it. The
    other ranks wait for it, so nothing runs on the node beside the timing. Once per
    trial: a requeued job finds it done.

    The timing runs in a process of its own with the ranks' environment (their threads):
    its CUDA context and buffers end with it, so rank 0 finds its GPU as whole as the
    others do (and an EXCLUSIVE_PROCESS GPU free to open)."""
    spec = load_spec(paths.root)
    if spec.cfg.hardware.kernels != KernelSource.measured or paths.plan_at_submit.exists():
        return
    if rank != 0:
        deadline = time.monotonic() + NODE_PLAN_WAIT_S
        while not paths.plan_at_submit.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        return
    submitted = read_json(paths.plan)
    try:  # a plan that failed or ran out of time leaves the submitted one; its cause is in the task's log
        subprocess.run(
            [sys.executable, "-m", NODE_PLAN_MODULE, str(paths.root)],
            env={**os.environ, **env},
            timeout=NODE_PLAN_WAIT_S - 10,
            check=False,
        )
    except subprocess.TimeoutExpired:
        print(f"the node's plan took over {NODE_PLAN_WAIT_S - 10} s; the submitted plan stays", file=sys.stderr)
    finally:  # the other ranks go on either way
        atomic_write_json(paths.plan_at_submit, submitted)


def _block_warning() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})


def save_wait_s(spec: TrialSpec) -> float:
    """How long task 0 gives the ranks to save after SLURM's warning: the save must end
    before the job does, so 20 s before signal_delay_s runs out."""
    return max(5, spec.cfg.cluster.signal_delay_s - 20)


# --- `sbatch launch.sh`: the same task without submitit ----------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m {TASK_MODULE}",
        description="One SLURM task of a trial: what launch.sh's srun runs in each task.",
    )
    parser.add_argument("trial_dir", type=Path)
    parser.add_argument(
        "--result",
        type=int,
        metavar="SRUN_EXIT_CODE",
        help="after srun, in the batch script: write result.json from how the job's ranks ended",
    )
    parser.add_argument(
        "--started", type=float, default=None, help="when the batch script began (seconds since the epoch)"
    )
    args = parser.parse_args(argv)
    paths = TrialPaths(args.trial_dir.resolve())
    if args.result is not None:
        sys.exit(write_job_result(paths, args.result, args.started))
    spec = load_spec(paths.root)
    os.environ.setdefault("SUBMITIT_EXECUTOR", "slurm")  # how submitit's environment knows it is under SLURM
    task = SlurmTask.for_trial(spec, paths.root)
    # SLURM's warning (--signal=USR2@S) reaches every process of the step: its default
    # action would end this task; task 0 instead waits for the ranks' save and requeues.
    signal.signal(signal.SIGUSR2, lambda *_: _requeue_on_warning(task, paths, spec.cfg.cluster.max_requeues))
    try:
        task()
    except RuntimeError as exc:  # recorded in errors/ already; srun's --kill-on-bad-exit ends the others
        print(exc, file=sys.stderr)
        sys.exit(1)


def _requeue_on_warning(task: SlurmTask, paths: TrialPaths, max_requeues: int) -> None:
    """What submitit's task 0 does on the warning: let the ranks save, then requeue the job,
    at most max_requeues times (after that the time limit ends it: status timeout)."""
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    if os.environ.get("SLURM_PROCID") != "0" or restarts >= max_requeues:
        return
    task.wait_for_save()
    job = os.environ["SLURM_JOB_ID"]
    atomic_write_json(paths.requeue_asked, {"job_id": job, "restart_count": restarts})
    subprocess.run(["scontrol", "requeue", job], check=False, timeout=60)


def write_job_result(paths: TrialPaths, srun_code: int, started: float | None) -> int:
    """result.json of a job that `sbatch launch.sh` ran, from its ranks' records and srun's
    exit code, as `orchestrator wait` writes one for a submitit job; the exit code to leave
    with. Nothing while the job is being requeued: its next run writes it."""
    from orchestrator.records.results import Status, now, outcome_status, write_result

    asked = read_json(paths.requeue_asked) or {}
    if asked.get("restart_count") == int(os.environ.get("SLURM_RESTART_COUNT", "0")) and asked.get(
        "job_id"
    ) == os.environ.get("SLURM_JOB_ID"):
        return 0
    spec = load_spec(paths.root)
    status, error = outcome_status(paths.root, srun_code, timed_out=False)
    start = now() if started is None else dt.datetime.fromtimestamp(started, dt.UTC).isoformat(timespec="seconds")
    write_result(
        paths.root,
        spec,
        read_json(paths.plan),
        status,
        start,
        error,
        slurm={
            "job_id": os.environ.get("SLURM_JOB_ID"),
            "state": "COMPLETED" if srun_code == 0 else "FAILED",
            "reason": f"srun exit code {srun_code}",
            "submitted_by": "sbatch launch.sh",
        },
        host_load=read_json(paths.node_load),
    )
    return 0 if status == Status.OK else 1


if __name__ == "__main__":
    main()
