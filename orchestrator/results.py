"""result.json: what one trial did, written atomically, also when it failed or was refused.

Keys (DESIGN.md): status (ok | failed | oom | refused | timeout | preempted), exit_code,
config (resolved), plan, metrics, env, error {type, message, rank, log_tail} or null,
started_at, finished_at. The workload's rank 0 supplies metrics and env (metrics.json);
a failing rank supplies its error (errors/rank{R}.json); the launcher's outcome says
how it ended.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

from orchestrator.files import atomic_write_json
from orchestrator.spec import TrialSpec

EXIT_CODES = {"ok": 0, "failed": 1, "oom": 1, "timeout": 1, "preempted": 1, "refused": 3}
LOG_TAIL_LINES = 40


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_result(trial_dir: Path, spec: TrialSpec, plan: dict | None, status: str, started_at: str,
                 error: dict | None = None) -> dict:
    measured = _read_json(trial_dir / "metrics.json") or {}
    result = {"status": status, "exit_code": EXIT_CODES[status], "config": spec.resolved(),
              "overrides": list(spec.overrides), "choices": spec.choices, "plan": plan,
              "metrics": measured.get("metrics"), "env": measured.get("env"), "error": error,
              "started_at": started_at, "finished_at": now()}
    atomic_write_json(trial_dir / "result.json", result)
    return result


def outcome_status(trial_dir: Path, returncode: int, timed_out: bool) -> tuple[str, dict | None]:
    """(status, error) from how the launch ended and what the ranks left behind."""
    if timed_out:
        return "timeout", {"type": "Timeout", "message": "the trial ran past run.timeout_min", "rank": None,
                           "log_tail": _tail(trial_dir / "logs" / "launcher.log")}
    errors = sorted((_read_json(p) for p in (trial_dir / "errors").glob("rank*.json")), key=lambda e: e["time"])
    if returncode == 0 and not errors and (trial_dir / "metrics.json").is_file():
        return "ok", None
    if errors:
        first = errors[0]  # the first rank to fail is the cause; the others were ended after it
        return ("oom" if first["oom"] else "failed"), {
            "type": first["type"], "message": first["message"], "rank": first["rank"],
            "log_tail": _tail(trial_dir / "logs" / f"rank{first['rank']}.log")}
    rank = _rank_from_launcher_log(trial_dir / "logs" / "launcher.log")
    log = trial_dir / "logs" / (f"rank{rank}.log" if rank is not None else "launcher.log")
    return "failed", {"type": "ProcessExit", "rank": rank, "log_tail": _tail(log),
                      "message": f"rank {rank if rank is not None else '?'} exited without a Python error "
                                 f"(launcher exit code {returncode})"}


def _rank_from_launcher_log(log: Path) -> int | None:
    """torchrun's failure summary names the root-cause rank: 'rank : 1 (local_rank: 1)'."""
    m = re.search(r"rank\s*:\s*(\d+)\s*\(local_rank", log.read_text(errors="replace")) if log.is_file() else None
    return int(m.group(1)) if m else None


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    if not path.is_file():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
