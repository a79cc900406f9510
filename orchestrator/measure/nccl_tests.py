"""`orchestrator calibrate --nccl-tests FILE...`: nccl-tests' standard output read as it is.

Runs of `all_reduce_perf`, `all_gather_perf` or `reduce_scatter_perf` (NVIDIA's nccl-tests),
one or several to a file, as clusters write them. What is read:
- the header (`# nccl-tests version ...`, `# Collective test starting: NAME`, `# nThread ...
  nGpus ...`): which program ran. Where a log does not say (older versions), the file's name
  must (`all_gather_perf-16n.log`): the table cannot tell an all-gather from an alltoall, or
  an all-reduce from a sendrecv, so a log that names no program is refused, not guessed;
- the rank lines (`#  Rank  3 Group  0 Pid 1234 on HOST device  3 [0000:0c:00] NVIDIA H100`,
  `Group` absent in older versions): the ranks, and the node count as the number of distinct
  hosts, each holding as many ranks as the others;
- the table: size (bytes), count (elements), type, redop, root (blank in newer versions),
  then time, algbw, busbw and #wrong out-of-place and in-place (only in-place in a trace
  replay). The out-of-place time is taken where there is one, as published tables quote
  it, and busbw computed from it (size x 2(n-1)/n / time for an all-reduce, x (n-1)/n for
  the others): the printed busbw is rounded to 0.01 GB/s, 0 for small sizes. A row whose
  #wrong is not 0 measured a wrong result, and the log is refused;
- the footer (`# Out of bounds values : 0 OK`, `# Avg bus bandwidth`, `# Collective test
  concluded`): a run without one was cut short, and its complete rows are used, with a
  warning; a footer that says FAILED refuses the log.
A second `Collective test starting` line starts the file's next run. What launchers add is
read through: mpirun's `--tag-output` prefix (`[1,0]<stdout>:`), srun's `-l` (`0: `), a
timestamp or a host name before the line, NCCL's banner (`NCCL version 2.21.5+cuda12.4`)
and its debug lines (`NCCL INFO`, `NCCL WARN`), hwloc's X11 probe (`Authorization required, ...`);
any other line is not nccl-tests output and
exits 2 naming the file and line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.errors import ConfigError
from orchestrator.core.files import read_text
from orchestrator.plan.bus_table import MAX_BUSBW_GBPS, MIN_BUSBW_GBPS, BusRow, BusTable
from orchestrator.plan.collectives import bus_factor

TYPE_BYTES = {
    "int8": 1,
    "uint8": 1,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "half": 2,
    "float": 4,
    "double": 8,
    "bfloat16": 2,
    "f8e4m3": 1,
    "f8e5m2": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
PROGRAMS = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather", "reduce_scatter_perf": "reduce_scatter"}
LOG_LIMIT = 16 * 2**20  # bytes: a run of every size from 8 B to 16 GB on 1,024 ranks is under 200 kB
_RANK = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+", re.ASCII)
_PROGRAM = re.compile(r"#\s*Collective test starting:\s*(\S+)")
# NCCL's own lines, and hwloc's X11 probe, which real logs carry on stderr (nccl-tests issue #131)
_NCCL_OWN = re.compile(r"\bNCCL (INFO|WARN)\b|^NCCL version\b|^Authorization required, but no authorization protocol")
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?$", re.ASCII)
# What a launcher puts before nccl-tests' own line: mpirun --tag-output, srun -l, a timestamp, a host.
_PREFIX = re.compile(
    r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\d+:\s|\[?\d{4}-\d\d-\d\d[T ][\d:.,]+Z?\]?\s|"
    r"[A-Za-z][\w.-]*:\s)",
    re.ASCII,
)
_NAMED = re.compile(r"(all_?reduce|all_?gather|reduce_?scatter)", re.IGNORECASE)


@dataclass(frozen=True)
class Row:
    bytes: int
    count: int
    type: str
    redop: str
    time_us: float
    wrong: tuple[str, ...] = ()  # the #wrong columns as printed


@dataclass(frozen=True)
class Run:
    """One run: its collective, where it ran, its rows, and whether it ended."""

    path: str
    collective: str
    ranks: int
    nodes: int
    rows: tuple[Row, ...]
    complete: bool  # the footer was there

    @property
    def ranks_per_node(self) -> int:
        return self.ranks // self.nodes


def read_runs(path: Path) -> list[Run]:
    try:
        text = read_text(path, limit=LOG_LIMIT)
    except (OSError, ValueError) as exc:
        raise ConfigError("--nccl-tests", str(path), f"an nccl-tests log that can be read ({exc})") from None
    return parse_runs(text, str(path))


def parse_run(text: str, where: str) -> Run:
    """The one run of a log (ConfigError if it holds several)."""
    runs = parse_runs(text, where)
    if len(runs) > 1:
        raise ConfigError("--nccl-tests", where, f"one run, but it holds {len(runs)}")
    return runs[0]


def unprefixed(raw: str) -> str:
    """The line nccl-tests printed, without what a launcher put before it (at most three layers)."""
    line = raw.strip().lstrip("\ufeff")
    for _ in range(3):
        if line.startswith("#") or not (m := _PREFIX.match(line)):
            break
        line = line[m.end() :].strip()
    return line


def parse_runs(text: str, where: str) -> list[Run]:
    """Every run in one log, in order."""
    segments: list[dict] = [{"program": None, "hosts": {}, "rows": [], "complete": False, "line": 1}]
    lines = text.splitlines()
    for n, raw in enumerate(lines, 1):
        line = unprefixed(raw)
        if not line or _NCCL_OWN.search(line):
            continue
        run = segments[-1]
        if line.startswith("#"):
            if (m := _PROGRAM.match(line)) is not None:
                if run["program"] is not None or run["rows"]:
                    run = {"program": None, "hosts": {}, "rows": [], "complete": False, "line": n}
                    segments.append(run)
                run["program"] = m.group(1)
            elif (m := _RANK.match(line)) is not None:
                run["hosts"][int(m.group(1))] = m.group(2)
            elif "FAILED" in line:
                raise ConfigError(
                    f"{where} line {n}", line[:80], "a run whose results nccl-tests found right; this one says FAILED"
                )
            run["complete"] = run["complete"] or line.startswith("# Avg bus bandwidth")
            continue
        row = _row(line)
        if row is None:
            if n == len(lines) and not run["complete"] and run["rows"]:  # the run was cut mid-line
                continue
            raise ConfigError(
                f"{where} line {n}",
                line[:80],
                "nccl-tests output: '#' lines, and rows of size, count, "
                "type, redop, root, then time, algbw, busbw and #wrong out-of-place and in-place",
            )
        if any(w not in ("0", "N/A") for w in row.wrong):
            raise ConfigError(
                f"{where} line {n}: #wrong",
                "/".join(row.wrong),
                "0: nccl-tests checked this size's result and found it wrong",
            )
        run["rows"].append(row)
    found = [s for s in segments if s["rows"] or s["program"] or s["hosts"]] or segments
    for previous, segment in zip(found, found[1:]):  # a later run of the same job may not print its ranks again
        segment["hosts"] = segment["hosts"] or previous["hosts"]
    return [_run(where, s["program"], s["hosts"], s["rows"], s["complete"], len(found) == 1) for s in found]


def _row(line: str) -> Row | None:
    """A table row, or None if the line is not one."""
    fields = line.split()
    if len(fields) < 8 or not all(f.isascii() and f.isdigit() for f in fields[:2]) or fields[2] not in TYPE_BYTES:
        return None
    rest = fields[4:]
    if len(rest) in (5, 9):  # older versions print root (-1) for every collective
        rest = rest[1:]
    if len(rest) not in (4, 8) or not all(_NUMBER.match(x) for i, x in enumerate(rest) if i % 4 != 3):
        return None
    time_us = float(rest[0])  # out-of-place; an in-place-only row (a trace replay) has only the in-place four
    return Row(int(fields[0]), int(fields[1]), fields[2], fields[3], time_us, tuple(rest[3::4]))


def _run(where: str, program: str | None, hosts: dict[int, str], rows: list[Row], complete: bool, alone: bool) -> Run:
    if not hosts:
        raise ConfigError(
            "--nccl-tests",
            where,
            "an nccl-tests log with its '#  Rank N Group G Pid P on HOST device "
            "D' lines: the node count is read from them",
        )
    if not rows:
        raise ConfigError("--nccl-tests", where, "an nccl-tests log with at least one row of its table")
    ranks, nodes = len(hosts), len(set(hosts.values()))
    per_host = {h: list(hosts.values()).count(h) for h in set(hosts.values())}
    if len(set(per_host.values())) > 1:
        raise ConfigError(
            "--nccl-tests",
            where,
            "the same number of ranks on every node; this run has "
            + ", ".join(f"{c} on {h}" for h, c in sorted(per_host.items())),
        )
    if ranks < 2:
        raise ConfigError(
            "--nccl-tests",
            where,
            "a run of at least 2 ranks: one rank moves nothing between GPUs, so it has no bus bandwidth",
        )
    collective = _collective(where, program, alone)
    for previous, row in zip(rows, rows[1:]):
        if row.bytes <= previous.bytes:
            raise ConfigError(
                f"{where}: size", row.bytes, f"sizes that increase down the table (after {previous.bytes})"
            )
    timed = tuple(r for r in rows if r.time_us > 0 and r.bytes > 0)
    if not timed:
        raise ConfigError("--nccl-tests", where, "a log with at least one row of a size above 0 timed above 0 us")
    for r in timed:  # what the network table's own loader would refuse, refused here, before anything is written
        if not MIN_BUSBW_GBPS <= busbw_gbps(collective, ranks, r) <= MAX_BUSBW_GBPS:
            raise ConfigError(
                f"{where}: {r.bytes} B in {r.time_us:g} us",
                f"{busbw_gbps(collective, ranks, r):.3g} GB/s",
                f"a bus bandwidth from {MIN_BUSBW_GBPS:g} to {MAX_BUSBW_GBPS:g} GB/s",
            )
    return Run(where, collective, ranks, nodes, timed, complete)


def busbw_gbps(collective: str, ranks: int, r: Row) -> float:
    """busbw from the time: the log rounds its own busbw to 0.01 GB/s, 0 for small sizes."""
    return r.bytes * bus_factor(collective, ranks) / r.time_us / 1e3


def _collective(where: str, program: str | None, alone: bool) -> str:
    """The program the log names, or, for a file of one run that names none, the file's name."""
    if program is None and alone and (m := _NAMED.search(Path(where).name)):
        program = re.sub(r"(all|reduce)_?(reduce|gather|scatter)", r"\1_\2", m.group(1).lower()) + "_perf"
    if program is None:
        raise ConfigError(
            "--nccl-tests",
            where,
            "a log that says which program ran (its '# Collective test "
            "starting: NAME' line), or a file named after it (all_reduce_perf..., all_gather_perf..., "
            "reduce_scatter_perf...): the table alone cannot tell an all-gather from an alltoall",
        )
    name = re.sub(r"_mpi$", "", Path(program).name)
    if name not in PROGRAMS:
        raise ConfigError("--nccl-tests", where, f"a log of {', '.join(PROGRAMS)}; this one is {name}")
    return PROGRAMS[name]


def table_of(runs: list[Run]) -> BusTable:
    """The runs as one table: one curve per collective, node count and ranks per node."""
    seen: dict[tuple[str, int, int], str] = {}
    rows = []
    for run in runs:
        key = (run.collective, run.nodes, run.ranks_per_node)
        if key in seen:
            raise ConfigError(
                "--nccl-tests",
                run.path,
                f"one file per collective and node count: {seen[key]} is "
                f"also {run.collective} on {run.nodes} node(s) x {run.ranks_per_node} rank(s)",
            )
        seen[key] = run.path
        rows += [
            BusRow(run.collective, run.nodes, run.ranks_per_node, r.bytes, busbw_gbps(run.collective, run.ranks, r))
            for r in run.rows
        ]
    return BusTable(rows, "nccl-tests logs: " + ", ".join(Path(r.path).name for r in runs))
