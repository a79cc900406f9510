"""Whether the kernel's OOM killer ended a process of this memory cgroup: a rank it kills
gets SIGKILL and leaves no Python error, so only the cgroup's own count tells an
out-of-memory death from a `kill -9`.

The count is cgroup v2's `oom_kill` in memory.events, or v1's in memory.oom_control
(Linux 4.13 and later); the kernel adds to it for a kill at the cgroup's limit and for one
the whole host's memory forced, where the victim was in it. The ranks a local trial starts
are in the orchestrator's cgroup, so its count before and after the trial says.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _files(proc_cgroup: str) -> list[Path]:
    """The counters that may hold this process's OOM kills, v2 first."""
    files = []
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        path = path.lstrip("/")
        if controllers == "":  # v2: the unified hierarchy, at the root or under unified/
            files += [ROOT / path / "memory.events", ROOT / "unified" / path / "memory.events"]
        elif "memory" in controllers.split(","):
            files.append(ROOT / "memory" / path / "memory.oom_control")
    return files


def oom_kills(pid: int | str = "self") -> int | None:
    """OOM kills counted in the process's memory cgroup, or None where no counter can be read."""
    try:
        files = _files(Path(f"/proc/{pid}/cgroup").read_text())
    except OSError:
        return None
    for path in files:
        try:
            for line in path.read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None
