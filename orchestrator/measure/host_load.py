"""How busy this host is before a local trial starts timing, and how much memory it has
free: a benchmark on a shared machine measures its neighbours too, so the trial says so
(in its output and result.json) rather than reporting their noise as its speed.

Read from /proc (Linux): the share of all cores busy over a short window, and the
processes that used the most of it; MemAvailable for the memory a new trial can take.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass

from orchestrator.measure import memory_cgroup

# A host whose cores are more than this busy before a trial starts is said to be busy: the
# idle 2-core CI machine read 0-1 %, the same with a two-rank trial running 51-99 %.
BUSY_SHARE = 0.25
WINDOW_S = 0.5


@dataclass(frozen=True)
class HostLoad:
    busy_share: float  # of all cores, over the window
    cores: int
    load_average: float  # the kernel's 1-minute figure, for the record
    busiest: list[str]  # "name (pid, % of a core)" of the processes that used the most

    def warning(self, threshold: float = BUSY_SHARE) -> str | None:
        if self.busy_share <= threshold:
            return None
        who = f" (busiest: {', '.join(self.busiest)})" if self.busiest else ""
        return (
            f"the host was busy before the trial started: {self.busy_share:.0%} of its {self.cores} cores in use"
            f"{who}; its timings include that load"
        )

    def as_dict(self) -> dict:
        return {**asdict(self), "warning": self.warning()}


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all this host's cores since boot: two readings give the share
    busy between them."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _process_ticks() -> dict[int, tuple[str, int]]:
    """pid -> (name, user + system jiffies) of every process that can be read."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:
            continue  # gone, or not ours to read
        name = text[text.index("(") + 1 : text.rindex(")")]
        rest = text[text.rindex(")") + 2 :].split()
        out[int(entry)] = (name, int(rest[11]) + int(rest[12]))  # utime, stime
    return out


def measure(window_s: float = WINDOW_S, exclude: set[int] | None = None) -> HostLoad:
    """The host's load over `window_s`: this process (and `exclude`) not counted among the busiest."""
    skip = {os.getpid(), *(exclude or set())}
    busy0, total0 = cpu_ticks()
    procs0 = _process_ticks()
    time.sleep(window_s)
    busy1, total1 = cpu_ticks()
    procs1 = _process_ticks()
    hz = os.sysconf("SC_CLK_TCK")
    used = sorted(
        (
            (ticks - procs0[pid][1], name, pid)
            for pid, (name, ticks) in procs1.items()
            if pid in procs0 and pid not in skip and ticks > procs0[pid][1]
        ),
        reverse=True,
    )
    busiest = [
        f"{name} (pid {pid}, {100 * d / hz / window_s:.0f}% of a core)"
        for d, name, pid in used[:3]
        if d / hz / window_s >= 0.1
    ]
    return HostLoad(
        busy_share=(busy1 - busy0) / max(total1 - total0, 1),
        cores=os.cpu_count() or 1,
        load_average=os.getloadavg()[0],
        busiest=busiest,
    )


def _meminfo() -> dict[str, int]:
    """/proc/meminfo's figures in bytes ({} where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:]}
    except (OSError, ValueError):
        return {}


def available_bytes() -> int | None:
    """Memory a new process can take without swapping: MemAvailable, or less where this
    process's cgroup limit leaves less (a SLURM job's or a container's); None where unknown."""
    known = [b for b in (_meminfo().get("MemAvailable"), memory_cgroup.headroom_bytes()) if b is not None]
    return min(known) if known else None


def node_load(since: tuple[int, int]) -> dict:
    """This node's load since the ticks `since` (cpu_ticks): the share of its cores busy and
    the memory in use now (MemTotal less MemAvailable), what each rank reports of its node."""
    busy, total = cpu_ticks()
    info = _meminfo()
    used = info["MemTotal"] - info["MemAvailable"] if {"MemTotal", "MemAvailable"} <= set(info) else None
    return {
        "cpu_busy_share": (busy - since[0]) / max(total - since[1], 1),
        "cores": os.cpu_count() or 1,
        "memory_used_bytes": used,
    }


def by_node(records: list[dict]) -> dict[str, dict]:
    """Each node's load, from the ranks' records ({"host", "rank", "node_load"}): the ranks on
    a node read the same node, so the figures are the median of theirs (they differ only by
    when each rank read them), with the node's ranks."""
    nodes: dict[str, list[dict]] = {}
    for r in records:
        if isinstance(r.get("node_load"), dict):
            nodes.setdefault(str(r.get("host")), []).append(r)
    out = {}
    for host, ranks in sorted(nodes.items()):
        loads = [r["node_load"] for r in ranks]
        memory = [x["memory_used_bytes"] for x in loads if x.get("memory_used_bytes") is not None]
        out[host] = {
            "ranks": sorted(r["rank"] for r in ranks),
            "cpu_busy_share": statistics.median(x["cpu_busy_share"] for x in loads),
            "cores": loads[0].get("cores"),
            "memory_used_bytes": statistics.median(memory) if memory else None,
        }
    return out
