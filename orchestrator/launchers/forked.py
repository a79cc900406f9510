"""torchrun whose ranks are forks of one process that has imported what they import.

A rank's first seconds are imports: torch, transformers' model module and the engine
(DeepSpeed, FSDP2), 6-7 s of CPU on a 2-core AMD EPYC, paid again by every rank of every
trial (docs/measurements.md, "Ranks forked from one launcher"). On a CPU host the launcher
imports them once, then runs torchrun itself (`torch.distributed.run.main`, what the
`torchrun` command runs) with torchrun's own flags `--start-method=fork --run-path`: each
rank is a fork of the launcher that runs the workload's file (workload/train.py) with its
imports already done. The rest is torchrun's: the rendezvous, each rank's environment,
ending the others when one fails, the failure summary.

`python -m orchestrator.launchers.forked TORCHRUN_FLAGS... TRIAL_DIR` is the launcher as a
program (translate's launch.sh). `orchestrator run` starts the same launcher as a fork of a
`LauncherServer`: a process of its own that imports the libraries once, so the second and
later CPU trials of a sweep import nothing (docs/measurements.md, "A sweep's launchers
forked from one server"); it ends with the process that started it. The server never
computes: a process forked after torch ran a parallel kernel hangs in its next one (GNU
OpenMP's threads do not survive a fork), so the server imports, forks and waits, nothing else.

Only where the trial's device is a CPU: CUDA may not be used in a child whose parent
initialised it, and importing DeepSpeed on a GPU host asks CUDA for its devices; there the
ranks start as new interpreters (torchrun's default).
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import socket
import subprocess
import sys
import traceback
from pathlib import Path

from orchestrator.core.process import collector_paused, die_with_parent, flush

SERVE = "--serve"
_MESSAGE_BYTES = 1 << 20  # a request is its arguments and environment: a few kB


def torchrun_argv(argv: list[str]) -> list[str]:
    """torchrun's arguments for `argv` (its flags, the trial directory last): the workload's
    file run in each forked rank, the trial directory its one argument."""
    from orchestrator.workload import train

    *flags, trial_dir = argv
    return [*flags, "--start-method=fork", "--run-path", train.__file__, trial_dir]


def import_trial_libraries(trial_dir: Path) -> None:
    """What the trial's ranks import, the collector paused, then frozen (workload/train.py
    says why). A failure is left to the ranks: each imports again and records the cause as
    its own failure."""
    from orchestrator.spec import load_spec
    from orchestrator.workload.wandb_compat import import_wandb

    with collector_paused():
        try:
            spec = load_spec(trial_dir)
            import_wandb(spec.cfg.logger.mode)  # before torch, where it costs a fifth (wandb_compat)
            from orchestrator.workload.engines import import_libraries

            import_libraries(spec)
            if "deepspeed" in sys.modules:
                from orchestrator.workload.deepspeed_compat import probe_ops

                probe_ops()  # once here, not in every rank
        except Exception:  # noqa: BLE001 - see above
            pass
        gc.freeze()


def run_torchrun(argv: list[str]) -> int:
    """torchrun's `main` on `argv` here; its exit code (a failure's traceback on stderr)."""
    from torch.distributed.run import main as torchrun

    from orchestrator.workload.torch_compat import cheap_rendezvous_records

    cheap_rendezvous_records()  # its records' names read off each frame's source: 0.5 CPU-s a trial here
    try:
        torchrun(torchrun_argv(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception:  # noqa: BLE001 - ChildFailedError and the like: said as a program would
        traceback.print_exc()
        return 1
    return 0


def main(argv: list[str]) -> None:
    import_trial_libraries(Path(argv[-1]))
    sys.exit(run_torchrun(argv))


# --- the server: one per process and environment, each trial's launcher a fork of it ----------


class LauncherServer:
    """A process that imported a CPU trial's libraries and forks a launcher per request.

    Started with the first trial's directory and the environment its imports read
    (DS_ACCELERATOR, glibc's MALLOC_MMAP_THRESHOLD_, PYTHONPATH); a later trial whose
    engine or model needs more imports the rest in its own launcher. It dies with the
    process that started it (and its launchers with it), or when `close` ends it."""

    def __init__(self, trial_dir: Path, env: dict[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one request per message
        with theirs:
            # A session of its own: a terminal's Ctrl-C reaches the orchestrator, which ends
            # the ranks in order (launchers/local.py); DeepSpeed's import warnings go nowhere.
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__, SERVE, str(theirs.fileno()), str(trial_dir)],
                env=env,
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self.socket = ours

    def launch(self, argv: list[str], env: dict[str, str], output_fd: int) -> ForkedLauncher:
        """`python -m orchestrator.launchers.forked ARGV` as a fork of the server, its
        stdout and stderr on `output_fd`, in a session of its own (as Popen's
        start_new_session), with `env` and this process's working directory."""
        request = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd()}).encode()
        socket.send_fds(self.socket, [request], [output_fd])
        reply = self.reply(None)
        return ForkedLauncher(self, reply["pid"])

    def reply(self, timeout: float | None) -> dict:
        """The server's next message (a launcher's pid, then its exit code)."""
        self.socket.settimeout(timeout)
        data = self.socket.recv(_MESSAGE_BYTES)
        if not data:
            code = self.process.wait()
            raise ServerEnded(f"the launcher server ended (exit code {code}) with a launcher running")
        return json.loads(data)

    def close(self) -> None:
        self.socket.close()  # the server reads the end of its requests and exits
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


# The server of the last environment asked for (threads are set in each launcher, so trials
# of different dp share one). It lives as long as this process: one command's, or, where
# commands are called in one process (`cli.main([...])`), theirs while the environment stays.
_server: tuple[frozenset, LauncherServer] | None = None


def launcher_server(trial_dir: Path, env: dict[str, str]) -> LauncherServer:
    """The server for `env`, started (importing trial_dir's libraries) if none runs for it."""
    global _server
    key = frozenset((k, v) for k, v in env.items() if k != "OMP_NUM_THREADS")
    if _server is not None and (_server[0] != key or _server[1].process.poll() is not None):
        _server[1].close()
        _server = None
    if _server is None:
        _server = (key, LauncherServer(trial_dir, env))
    return _server[1]


def close_server() -> None:
    """End the server, if one runs, and wait for it."""
    global _server
    if _server is not None:
        _server[1].close()
        _server = None


atexit.register(close_server)  # a command leaves no process of its own behind once it has exited


class ServerEnded(RuntimeError):
    """The launcher server died (killed) while a launcher of it ran."""


class ForkedLauncher:
    """A launcher forked by the server, waited for as a subprocess.Popen is: `pid`,
    `returncode` (negative: the signal that ended it), `wait(timeout)`."""

    def __init__(self, server: LauncherServer, pid: int):
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self.returncode = int(self.server.reply(timeout)["returncode"])
            except TimeoutError:
                raise subprocess.TimeoutExpired(f"launcher {self.pid}", timeout or 0.0) from None
            except ServerEnded:
                self.returncode = 1
        return self.returncode


def serve(sock: socket.socket, trial_dir: Path) -> None:
    """The server's loop: import, then one launcher at a time, forked, waited for, its exit
    code sent back. Ends when the other side closes."""
    die_with_parent()
    import_trial_libraries(trial_dir)
    importlib.import_module("torch.distributed.run")  # torchrun's own modules, for every launcher

    while True:
        data, fds, _, _ = socket.recv_fds(sock, _MESSAGE_BYTES, 1)
        if not data:
            return
        request, (output_fd,) = json.loads(data), fds
        pid = os.fork()
        if pid == 0:
            sock.close()
            _launcher(request, output_fd)
        os.close(output_fd)
        sock.send(json.dumps({"pid": pid}).encode())
        _, status = os.waitpid(pid, 0)
        sock.send(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())


def _launcher(request: dict, output_fd: int) -> None:
    """In the forked launcher: become what Popen would have started, run torchrun, exit."""
    code = 1
    try:
        os.setsid()
        die_with_parent()
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        os.close(output_fd)
        print(f"launcher {os.getpid()}: forked from the launcher server {os.getppid()}", flush=True)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _threads_from_environment()
        gc.enable()
        import_trial_libraries(Path(request["argv"][-1]))  # what this trial needs beyond the first's
        code = run_torchrun(request["argv"])
    except BaseException:  # noqa: BLE001 - said on the launcher's output, then the exit code
        traceback.print_exc()
    finally:
        flush()
        os._exit(code)


def _threads_from_environment() -> None:
    """OMP_NUM_THREADS as a new interpreter would read it: torch read the server's at import."""
    import torch

    if threads := os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(threads))


if __name__ == "__main__":
    if sys.argv[1:2] == [SERVE]:
        serve(socket.socket(fileno=int(sys.argv[2])), Path(sys.argv[3]))
        os._exit(0)  # nothing to write out; the interpreter's teardown of torch would take a second
    else:
        main(sys.argv[1:])
