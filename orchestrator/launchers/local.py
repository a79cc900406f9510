"""Local launch: dp processes on this machine through torchrun (or accelerate launch).

This module builds the command as an argument list (never a shell string, so no config
value can reach a shell) with the environment it needs, runs it, streams rank 0's
progress lines to the caller and keeps everything else in logs/launcher.log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from orchestrator.config import DeviceType
from orchestrator.core.process import PROGRESS, clear_stale_build_locks, die_with_parent, end_group
from orchestrator.launchers import forked
from orchestrator.launchers.binding import Binding
from orchestrator.measure import cpu_allocator
from orchestrator.records.trial_dir import TrialPaths, disk_full
from orchestrator.spec import TrialSpec

WORKLOAD_MODULE = "orchestrator.workload.train"
FORKED_LAUNCHER = "orchestrator.launchers.forked"


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def rank_environment(spec: TrialSpec, threads: int) -> dict[str, str]:
    """What every rank's environment needs, whichever launcher starts it."""
    env = {"OMP_NUM_THREADS": str(threads)}
    if not spec.cfg.hardware.device.is_gpu:
        env["DS_ACCELERATOR"] = DeviceType.cpu.value  # DeepSpeed would otherwise look for CUDA
        env.update(cpu_allocator.rank_environment())  # the resident peak is the live tensors' (cpu_allocator.py)
    elif spec.cfg.run.expandable_segments:
        # the caching allocator grows segments instead of keeping many of fixed sizes: less
        # fragmentation at the peak (PyTorch's CUDA semantics notes, "expandable_segments")
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return env


def local_command(spec: TrialSpec, trial_dir: Path, bind: Binding) -> Command:
    env = rank_environment(spec, spec.threads_per_rank)
    if spec.cfg.engine.name == "accelerate":
        argv = [sys.executable, *accelerate_launch(trial_dir, bind), "--module", WORKLOAD_MODULE, str(trial_dir)]
    elif spec.cfg.hardware.device.is_gpu:
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *_torchrun_flags(spec, bind),
            "--module",
            WORKLOAD_MODULE,
            str(trial_dir),
        ]
    else:  # each rank a fork of one process that imported the ranks' libraries (forked.py)
        argv = [sys.executable, "-m", FORKED_LAUNCHER, *_torchrun_flags(spec, bind), str(trial_dir)]
    return Command(argv=argv, env=env)


def accelerate_launch(trial_dir: Path, bind: Binding) -> list[str]:
    """`accelerate launch` with the trial's config and binding, up to the module it runs (after
    an interpreter; on SLURM each node's task adds its place among the machines)."""
    return [
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(TrialPaths(trial_dir).accelerate_config),
        *bind.accelerate_args,
    ]


def _torchrun_flags(spec: TrialSpec, bind: Binding) -> list[str]:
    # --standalone: a c10d rendezvous on localhost at a free port, picked by torchrun.
    return ["--standalone", "--nnodes=1", f"--nproc-per-node={spec.world_size}", *bind.torchrun_args]


def environment(command: Command) -> dict[str, str]:
    return {**os.environ, **command.env}


@dataclass(frozen=True)
class LocalExit:
    returncode: int
    timed_out: bool
    seconds: float
    log: Path  # the launcher's own output (torchrun / accelerate messages)


def run_local(
    command: Command, trial_dir: Path, timeout_s: float | None, on_progress: Callable[[dict], None]
) -> LocalExit:
    """Run the ranks and wait. A rank's crash ends torchrun (max restarts 0), which ends
    the other ranks; a timeout ends the whole process group."""
    log = TrialPaths(trial_dir).launcher_log
    log.parent.mkdir(parents=True, exist_ok=True)
    clear_stale_build_locks()
    start = time.monotonic()
    with _LauncherLog(log) as sink:
        read_end, write_end = os.pipe()
        try:
            proc = _start(command, trial_dir, write_end)
        finally:
            os.close(write_end)  # the launcher and its ranks hold it: the reader sees their end
        output = open(read_end, encoding="utf-8", errors="replace")
        reader = threading.Thread(target=_pump, args=(output, sink, on_progress), daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            end_group(proc)
        except BaseException:  # Ctrl-C: take the ranks down with us
            end_group(proc)
            raise
        reader.join(timeout=10)
        if not reader.is_alive():
            output.close()
    # None only where the launcher outlived end_group's SIGKILL (a process stuck in the kernel).
    returncode = -signal.SIGKILL if proc.returncode is None else proc.returncode
    return LocalExit(returncode=returncode, timed_out=timed_out, seconds=time.monotonic() - start, log=log)


def _start(command: Command, trial_dir: Path, output_fd: int) -> subprocess.Popen | forked.ForkedLauncher:
    """The launcher, its stdout and stderr on `output_fd`: in a session of its own (a
    terminal's Ctrl-C reaches the orchestrator only, which ends the ranks in order), and
    SIGTERM when the orchestrator dies, even by SIGKILL. A CPU trial's launcher is a fork of
    this command's launcher server (forked.py), which imported the ranks' libraries once."""
    env = environment(command)
    if command.argv[1:3] == ["-m", FORKED_LAUNCHER]:
        return forked.launcher_server(trial_dir, env).launch(command.argv[3:], env, output_fd)
    return subprocess.Popen(
        command.argv, env=env, stdout=output_fd, stderr=output_fd, start_new_session=True, preexec_fn=die_with_parent
    )


class _LauncherLog:
    """The launcher's log, written line by line. A full disk loses lines, never the run:
    its result, written into the space reserved for it, says what filled up."""

    def __init__(self, path: Path):
        self._file: TextIO | None
        try:
            self._file = open(path, "a", buffering=1)
        except OSError as exc:
            if not disk_full(exc):
                raise
            self._file = None

    def write(self, line: str) -> None:
        try:
            if self._file:
                self._file.write(line)
        except OSError:
            pass

    def __enter__(self) -> _LauncherLog:
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._file:
                self._file.close()
        except OSError:  # what was left in its buffer
            pass


def _pump(stream, sink, on_progress: Callable[[dict], None]) -> None:
    """Read the launcher's output to its end, whatever happens to the log: a pipe left
    unread would block the ranks on their next write."""
    for line in stream:
        if line.startswith(PROGRESS):
            try:
                on_progress(json.loads(line[len(PROGRESS) :]))
                continue
            except ValueError:
                pass
        sink.write(line)
