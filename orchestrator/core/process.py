"""Process plumbing shared by the launchers and the ranks they start.

- `PROGRESS`: the prefix of the one line per step rank 0 writes to its launcher's pipe.
- `die_with_parent`: a child ends when the process that started it dies, even by SIGKILL.
- `redirect_output`: a rank's stdout and stderr into its log file, file descriptors and all.
- `flush` / `leave`: write out what is buffered; exit without C++ static destructors once it is.
- `start_ticks`: when a process started (so a pid that was reused is told apart).
- `end_group` / `run_group`: a launcher (torchrun, srun) and everything it started end
  together, in order (SIGTERM, then SIGKILL), when the command that started it stops.
- `clear_stale_build_locks`: the lock a killed op build left, which would hang every later
  one (before a trial's ranks start, and before the plan times the engine).
- `collector_paused` / `freeze_at_exit`: Python's cyclic collector kept from walking what
  importing torch, transformers and DeepSpeed made, while they import and when a process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

PROGRESS = "ORCH|"


@contextlib.contextmanager
def collector_paused():
    """The cyclic collector off inside, then as it was. Importing torch, transformers and
    DeepSpeed makes millions of objects that no cycle frees, and each collection during the
    imports walks every one made so far: 7.7 CPU-s with it off against 9.0-9.3 on, importing
    what a rank imports alone (the 2-core AMD EPYC; docs/measurements.md, "Imports and exits
    the collector does not walk")."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def freeze_at_exit() -> None:
    """At exit, after the atexit handlers registered later, every object goes to the
    collector's permanent generation, so the interpreter's last collections walk none of
    them: 1.3-1.4 CPU-s at the exit of a process that imported torch, transformers and
    DeepSpeed, 0.1-0.4 s of a command that imported none of them (the same measurements).
    Objects are still freed by their counts and the handlers that flush and close still run;
    what is left unwalked is garbage in reference cycles, which the system takes back with
    the process (a file left open in such a cycle is no longer flushed at exit: close files,
    as files.py's writers do). Called once, where a program starts."""
    atexit.register(gc.freeze)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send `sig` to this process when its parent (torchrun, the SLURM task,
    the orchestrator) dies (prctl PR_SET_PDEATHSIG); elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the request: nobody will send it
        os.kill(os.getpid(), sig)


def start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat's 22nd field),
    or None where it is not running or /proc cannot say. A pid and this together name one
    process: a pid reused by a later process has a later start."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # the name, in parentheses, may hold spaces
        return None if fields[0] == b"Z" else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def redirect_output(log: Path) -> None:
    """stdout and stderr (fds 1 and 2, so C++ and child output too) appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def flush(*streams) -> None:
    """`streams`, then stdout and stderr, written out."""
    for stream in (*streams, sys.stdout, sys.stderr):
        stream.flush()


def leave(code: int, *streams) -> None:
    """Exit without running C++ static destructors: gloo's and DeepSpeed's threads can abort
    a process at interpreter exit ("terminate called without an active exception") after
    the work is done. Everything worth keeping is flushed (and written atomically) first."""
    flush(*streams)
    os._exit(code)


class Child(Protocol):
    """A started process as end_group needs it: subprocess.Popen, or a forked launcher."""

    pid: int

    def wait(self, timeout: float | None = None) -> int: ...


def end_group(proc: Child) -> None:
    """SIGTERM to `proc`'s whole process group (torchrun forwards it to its ranks, srun to its
    tasks), SIGKILL to what is left after 15 s. torchrun starts each rank in a session of
    its own, outside the group, and returns once it has signalled them: a rank inside a
    long kernel (Python runs its handler only after it) would outlive it, so the launcher's
    descendants are found first and any still running at the end are killed."""
    started = {pid: start_ticks(pid) for pid in descendants(proc.pid)}
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    for pid, ticks in started.items():
        if ticks is not None and start_ticks(pid) == ticks:  # the same process, not a reused pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, theirs, ...), from /proc; [] where there is none."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        found.append(todo.pop())
        todo.extend(children.get(found[-1], []))
    return found


def run_group(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    """subprocess.run(argv) with its output captured, in its own process group (which dies
    with this process, even by SIGKILL): a signal, an exception or the timeout here ends the
    group, never leaving its ranks running."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:  # the timeout, Ctrl-C, SIGTERM (Interrupted)
        end_group(proc)
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def clear_stale_build_locks(min_age_s: float = 60) -> list[Path]:
    """Remove torch-extension build locks that no build holds any more.

    DeepSpeed JIT-builds ops (CPU Adam for an offloaded optimizer) under a lock file in
    torch's extension directory; a process killed while building leaves the file behind
    and every later build waits on it forever. A lock older than a minute while no
    compiler runs is such a leftover. torch builds an op in ROOT/OP/ where
    TORCH_EXTENSIONS_DIR names the root, else in ROOT/py311_cpu/OP/ (its Python and
    accelerator) under the user's cache: both are looked at.
    """
    root = Path(
        os.environ.get("TORCH_EXTENSIONS_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_extensions"
    )
    locks = [p for p in [*root.glob("*/lock"), *root.glob("*/*/lock")] if _age_s(p) > min_age_s]
    if not locks or _compiler_running():
        return []
    for lock in locks:
        lock.unlink(missing_ok=True)
    return locks


def _age_s(path: Path) -> float:
    """Seconds since `path` was modified; 0 where it is gone (a build that ended between
    the glob and the stat released its lock: nothing to clear)."""
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _compiler_running() -> bool:
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv0 = cmdline.read_bytes().split(b"\0", 1)[0]
        except OSError:
            continue
        if argv0.rsplit(b"/", 1)[-1] in (b"ninja", b"c++", b"g++", b"cc1plus", b"gcc"):
            return True
    return False
