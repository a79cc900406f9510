"""result.json: what one trial did, written atomically, also when it failed or was refused.

Keys (docs/architecture.md, "Files of record"): status (ok | failed | oom | refused | timeout |
preempted | interrupted), exit_code, config (resolved), plan, metrics, env, error {type, message,
rank, host, log_tail} or null, started_at, finished_at. The workload's rank 0 supplies metrics and
env (metrics.json); a failing rank supplies its error (errors/rank{R}.json); the launcher's outcome
says how it ended.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
from enum import StrEnum
from pathlib import Path

from orchestrator.config import OBJECTIVES
from orchestrator.core.files import atomic_write_json, read_json, read_text, real_number
from orchestrator.core.redact import redact
from orchestrator.records.trial_dir import TrialPaths, disk_full, release
from orchestrator.spec import TrialSpec


class Status(StrEnum):
    """How a trial ended, as result.json's `status` says it (a str: it compares and
    serialises as its value)."""

    OK = "ok"
    FAILED = "failed"  # a rank raised or died; error names it
    OOM = "oom"  # a rank ran out of (device) memory
    TIMEOUT = "timeout"  # past run.timeout_min, or out of SLURM requeues
    PREEMPTED = "preempted"  # SLURM took the nodes back, and no requeue followed
    REFUSED = "refused"  # never launched: the plan (exit 3) or the config (exit 2) said no
    INTERRUPTED = "interrupted"  # Ctrl-C, SIGTERM, or the orchestrator was killed

    def __str__(self) -> str:
        return self.value


EXIT_CODES = {
    Status.OK: 0,
    Status.FAILED: 1,
    Status.OOM: 1,
    Status.TIMEOUT: 1,
    Status.PREEMPTED: 1,
    Status.REFUSED: 3,
    Status.INTERRUPTED: 130,
}


def read_result(trial_dir: Path) -> dict | None:
    """A trial's result.json as every reader takes it: read as a file of record is
    (files.read_text: a regular file, bounded), a JSON object with a string status. None
    where there is none yet; OSError or ValueError, saying why, where the file there is not
    one (the reader names it and goes on; nothing is written)."""
    path = TrialPaths(trial_dir).result
    if not (path.exists() or path.is_symlink()):
        return None
    result = json.loads(read_text(path))
    if not isinstance(result, dict) or not isinstance(result.get("status"), str):
        raise ValueError("not a result (no status)")
    return result


def result_or_none(trial_dir: Path) -> dict | None:
    """read_result, with a file that is not a result read as none (where the reader has
    nothing to say of it)."""
    try:
        return read_result(trial_dir)
    except (OSError, ValueError, RecursionError):
        return None


def exit_code_of(result: dict) -> int:
    """A result's exit code: its own where it holds a whole number, else its status's (a
    hand-written or older result.json may lack either; an unknown status is a failure)."""
    code = result.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool):
        return code
    try:
        return EXIT_CODES[Status(str(result.get("status")))]
    except ValueError:
        return 1


def error_record(type_: str, message: str, rank: int | None = None, log: Path | None = None, **extra) -> dict:
    """result.json's `error`: {type, message, rank, log_tail} (+ host, signal, ...), built here only."""
    return {"type": type_, "message": message, "rank": rank, "log_tail": log_tail(log) if log else "", **extra}


PER_STEP_KEYS = ("history", "step_times_s", "losses", "global_batch_sizes")  # dropped when the disk is full
LOG_TAIL_LINES = 40
DISK_FULL_BYTES = 1 << 20


def objective_value(result: dict, objective: str) -> float | None:
    """run.objective read from a result: None unless the trial ended ok with that figure."""
    if result.get("status") != "ok":
        return None
    node: object = result
    for key in OBJECTIVES[objective][0]:
        node = node.get(key) if isinstance(node, dict) else None
    return real_number(node)


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def write_result(
    trial_dir: Path,
    spec: TrialSpec | None,
    plan: dict | None,
    status: str,
    started_at: str,
    error: dict | None = None,
    exit_code: int | None = None,
    **extra,
) -> dict:
    """extra: more top-level keys (slurm: the job id, its final state and reason). spec is
    None only for a trial interrupted before its config was written.

    The space reserved at the start (trial_dir.reserve) is given back first; if the file
    system is still too full, the result is written without its per-step lists."""
    paths = TrialPaths(trial_dir)
    measured = read_json(paths.metrics) or {}
    result = {
        "status": Status(status).value,
        "exit_code": EXIT_CODES[Status(status)] if exit_code is None else exit_code,
        "config": spec.resolved() if spec else None,
        "overrides": list(spec.overrides) if spec else [],
        "choices": spec.choices if spec else {},
        "plan": plan,
        "metrics": measured.get("metrics"),
        "env": measured.get("env"),
        "error": error,
        "started_at": started_at,
        "finished_at": now(),
        **extra,
    }
    result = redact(result)  # the plan's text and the error's message hold what users named: masked
    release(trial_dir)
    try:
        atomic_write_json(paths.result, result)
    except OSError as exc:
        if not disk_full(exc):
            raise
        result["metrics"] = {k: v for k, v in (result["metrics"] or {}).items() if k not in PER_STEP_KEYS} or None
        result["disk_full"] = (
            "the file system was full: written without the per-step lists (metrics.json has them, if written)"
        )
        atomic_write_json(paths.result, result)
    return result


def outcome_status(
    trial_dir: Path, returncode: int, timed_out: bool, oom_killed: bool = False
) -> tuple[Status, dict | None]:
    """(status, error) from how the launch ended and what the ranks left behind. oom_killed:
    the kernel's OOM killer ended a process of the trial's memory cgroup meanwhile
    (memory_cgroup.py), which is what a rank's SIGKILL then was."""
    paths = TrialPaths(trial_dir)
    if timed_out:
        return Status.TIMEOUT, error_record("Timeout", "the trial ran past run.timeout_min", log=paths.launcher_log)
    errors = {e["rank"]: e for e in (read_json(p) for p in paths.errors.glob("rank*.json")) if e}
    if returncode == 0 and not errors and paths.metrics.is_file():
        return Status.OK, None
    # Which rank caused it: a rank that died without a Python error (os._exit, a signal
    # other than the launcher's SIGTERM, the OOM killer) if there is one, else the first
    # Python error by time. The ranks ended after it often fail too (a closed connection).
    exits = _exit_codes(paths.launcher_log)
    silent = [r for r, code in exits.items() if r not in errors and code not in (1, -15)]
    # torchrun names one failure of forked ranks: the one that died first may be missing
    silent += sorted(r for r in paths.ranks_still_running() if r not in errors and r not in silent)
    silent += [r for r, e in errors.items() if e.get("silent")]  # recorded by a SLURM task for its rank
    rank: int | None
    if silent:
        rank = silent[0]
    elif errors:
        rank = min(errors.values(), key=lambda e: e["time"])["rank"]
    else:
        rank = next(iter(exits), None)
    if rank in errors:
        first = errors[rank]
        return (Status.OOM if first["oom"] else Status.FAILED), error_record(
            first["type"], first["message"], rank, paths.rank_log(rank), host=first.get("host")
        )
    log = paths.rank_log(rank)
    code = f"exit code {exits[rank]}" if rank in exits else f"launcher exit code {returncode}"
    who = f"rank {rank}" if rank is not None else "a rank (the launcher's log does not say which)"
    message = f"{who} exited without a Python error ({code})"
    # SIGKILL, or a rank torchrun's summary left out (it names one failure, often the peer whose
    # collective broke): the OOM killer where the memory cgroup counted a kill meanwhile
    if rank is not None and (exits.get(rank) == -9 or rank not in exits):
        if oom_killed:
            how = "SIGKILL" if rank in exits else "it died without leaving through Python"
            return Status.OOM, error_record(
                "OutOfMemory",
                f"rank {rank} was killed by the kernel's OOM killer ({how}, and its memory cgroup counted an OOM kill)",
                rank,
                log,
            )
        if rank in exits:
            message += "; SIGKILL with no OOM kill counted in its memory cgroup: killed by another process or a person"
    if (free := shutil.disk_usage(trial_dir).free) < DISK_FULL_BYTES:  # it could not even write its error
        return Status.FAILED, error_record(
            "DiskFull", f"the file system holding {trial_dir} is full ({free:,} bytes free): {message}", rank, log
        )
    return Status.FAILED, error_record("ProcessExit", message, rank, log)


def _exit_codes(log: Path) -> dict[int, int]:
    """Rank -> exit code from torchrun's failure summary ('rank : 1 (local_rank: 1)' / 'exitcode : 3')."""
    if not log.is_file():
        return {}
    pairs = re.findall(
        r"rank\s*:\s*(\d+)\s*\(local_rank[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", log.read_text(errors="replace")
    )
    return {int(rank): int(code) for rank, code in pairs}


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    if not path.is_file():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
