"""This process's memory cgroup: whether the kernel's OOM killer ended a process of it (a
rank it kills gets SIGKILL and leaves no Python error, so only the cgroup's own count tells
an out-of-memory death from a `kill -9`), and how much memory its limit leaves (a job's
cgroup under SLURM or a container is smaller than the host: MemAvailable does not see it).

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


def headroom_bytes(pid: int | str = "self", root: Path = ROOT, proc_cgroup: str | None = None) -> int | None:
    """What the tightest memory limit over this process's cgroup and its parents leaves
    (limit less usage: cgroup v2's memory.max and memory.current, v1's memory.limit_in_bytes
    and memory.usage_in_bytes), or None where no limit is set or none can be read.
    proc_cgroup: /proc/PID/cgroup's text (read where not given)."""
    try:
        lines = (proc_cgroup if proc_cgroup is not None else Path(f"/proc/{pid}/cgroup").read_text()).splitlines()
    except OSError:
        return None
    left = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            pairs, base = ("memory.max", "memory.current"), root
        elif "memory" in controllers.split(","):
            pairs, base = ("memory.limit_in_bytes", "memory.usage_in_bytes"), root / "memory"
        else:
            continue
        parts = [p for p in path.strip("/").split("/") if p]
        for depth in range(len(parts), -1, -1):  # the cgroup itself, then each parent up to the root
            folder = base.joinpath(*parts[:depth])
            try:
                limit, usage = ((folder / name).read_text().strip() for name in pairs)
                if limit != "max" and int(limit) < 2**62:  # v1 writes "no limit" as a huge number
                    left.append(max(0, int(limit) - int(usage)))
            except (OSError, ValueError):
                continue
    return min(left) if left else None
