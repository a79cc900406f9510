"""`orchestrator calibrate --nccl-tests FILE...`: nccl-tests' standard output read as it is.

One file per run of `all_reduce_perf`, `all_gather_perf` or `reduce_scatter_perf` (NVIDIA's
nccl-tests) on one node count. What is read:
- the header (`# nccl-tests version ...`, `# Collective test starting: NAME`, `# nThread ...
  nGpus ...`): which collective, where newer versions say it;
- the rank lines (`#  Rank  3 Group  0 Pid 1234 on HOST device  3 [0000:0c:00] NVIDIA H100`):
  the ranks, and the node count as the number of distinct hosts;
- the table: size (bytes), count (elements), type, redop, root (blank in newer versions),
  then time, algbw, busbw and #wrong out-of-place and in-place (only in-place in a trace
  replay). The out-of-place time is taken where there is one, as published tables quote
  it, and busbw computed from it (size x 2(n-1)/n / time for an all-reduce, x (n-1)/n for
  the others): the printed busbw is rounded to 0.01 GB/s, 0 for small sizes;
- the footer (`# Out of bounds values`, `# Avg bus bandwidth`): a run without one was cut
  short, and its complete rows are used, with a warning.
Where a log does not name its collective, the table does: an all-gather's redop is `none`
and its size is count x type x ranks; a reduce-scatter reduces and has that size too; an
all-reduce's size is count x type. NCCL's own debug lines (`NCCL INFO`, `NCCL WARN`) are
skipped; any other line is not nccl-tests output and exits 2 naming the file and line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.files import read_text
from orchestrator.plan.bus_table import BusRow, BusTable
from orchestrator.plan.collectives import bus_factor

TYPE_BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "half": 2, "float": 4,
              "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
PROGRAMS = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather", "reduce_scatter_perf": "reduce_scatter"}
LOG_LIMIT = 16 * 2**20  # bytes: a run of every size from 8 B to 16 GB on 1,024 ranks is under 200 kB
_RANK = re.compile(r"#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+")
_PROGRAM = re.compile(r"#\s*Collective test starting:\s*(\S+)")
_NCCL_DEBUG = re.compile(r"\bNCCL (INFO|WARN)\b")
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?$")


@dataclass(frozen=True)
class Row:
    bytes: int
    count: int
    type: str
    redop: str
    time_us: float


@dataclass(frozen=True)
class Run:
    """One file: its collective, where it ran, its rows, and whether it ended."""

    path: str
    collective: str
    ranks: int
    nodes: int
    rows: tuple[Row, ...]
    complete: bool  # the footer was there

    @property
    def ranks_per_node(self) -> int:
        return self.ranks // self.nodes


def read_run(path: Path) -> Run:
    try:
        text = read_text(path, limit=LOG_LIMIT)
    except (OSError, ValueError) as exc:
        raise ConfigError("--nccl-tests", str(path), f"an nccl-tests log that can be read ({exc})") from None
    return parse_run(text, str(path))


def parse_run(text: str, where: str) -> Run:
    program, hosts, rows, complete = None, {}, [], False
    lines = text.splitlines()
    for n, raw in enumerate(lines, 1):
        line = raw.strip().lstrip("\ufeff")
        if not line or _NCCL_DEBUG.search(line):
            continue
        if line.startswith("#"):
            if (m := _RANK.match(line)) is not None:
                hosts[int(m.group(1))] = m.group(2)
            elif (m := _PROGRAM.match(line)) is not None:
                if program is not None:
                    raise ConfigError(f"{where} line {n}", line[:80], "one nccl-tests run per file: a second "
                                      "'Collective test starting' line starts another")
                program = m.group(1)
            complete = complete or line.startswith("# Avg bus bandwidth")
            continue
        row = _row(line)
        if row is None:
            if n == len(lines) and not complete and rows:  # the run was cut mid-line
                continue
            raise ConfigError(f"{where} line {n}", line[:80], "nccl-tests output: '#' lines, and rows of size, count, "
                              "type, redop, root, then time, algbw, busbw and #wrong out-of-place and in-place")
        rows.append(row)
    return _run(where, program, hosts, rows, complete)


def _row(line: str) -> Row | None:
    """A table row, or None if the line is not one."""
    fields = line.split()
    if len(fields) < 8 or not (fields[0].isdigit() and fields[1].isdigit()) or fields[2] not in TYPE_BYTES:
        return None
    rest = fields[4:]
    if len(rest) in (5, 9):  # older versions print root (-1) for every collective
        rest = rest[1:]
    if len(rest) not in (4, 8) or not all(_NUMBER.match(x) for i, x in enumerate(rest) if i % 4 != 3):
        return None
    time_us = float(rest[0])  # out-of-place; an in-place-only row (a trace replay) has only the in-place four
    return Row(int(fields[0]), int(fields[1]), fields[2], fields[3], time_us)


def _run(where: str, program: str | None, hosts: dict[int, str], rows: list[Row], complete: bool) -> Run:
    if not hosts:
        raise ConfigError("--nccl-tests", where, "an nccl-tests log with its '#  Rank N Group G Pid P on HOST device "
                          "D' lines: the node count is read from them")
    if not rows:
        raise ConfigError("--nccl-tests", where, "an nccl-tests log with at least one row of its table")
    ranks, nodes = len(hosts), len(set(hosts.values()))
    if ranks % nodes:
        raise ConfigError("--nccl-tests", where, f"the same number of ranks on every node ({ranks} ranks on "
                          f"{nodes} hosts)")
    collective = _collective(where, program, rows[0], ranks)
    for previous, row in zip(rows, rows[1:]):
        if row.bytes <= previous.bytes:
            raise ConfigError(f"{where}: size", row.bytes, f"sizes that increase down the table (after {previous.bytes})")
    return Run(where, collective, ranks, nodes, tuple(r for r in rows if r.time_us > 0), complete)


def _collective(where: str, program: str | None, row: Row, ranks: int) -> str:
    if program is not None:
        name = re.sub(r"_mpi$", "", Path(program).name)
        if name not in PROGRAMS:
            raise ConfigError("--nccl-tests", where, f"a log of {', '.join(PROGRAMS)}; this one is {name}")
        return PROGRAMS[name]
    per_rank = row.count * TYPE_BYTES[row.type]
    if row.redop == "none" and row.bytes == per_rank * ranks:
        return "all_gather"
    if row.redop != "none" and row.bytes == per_rank * ranks and ranks > 1:
        return "reduce_scatter"
    if row.redop != "none" and row.bytes == per_rank:
        return "all_reduce"
    raise ConfigError("--nccl-tests", where, "a log of all_reduce_perf, all_gather_perf or reduce_scatter_perf "
                      f"(its first row, {row.bytes} B of {row.count} {row.type} '{row.redop}' on {ranks} ranks, is "
                      "none of them)")


def table_of(runs: list[Run]) -> BusTable:
    """The runs as one table: one curve per collective, node count and ranks per node."""
    seen: dict[tuple[str, int, int], str] = {}
    rows = []
    for run in runs:
        key = (run.collective, run.nodes, run.ranks_per_node)
        if key in seen:
            raise ConfigError("--nccl-tests", run.path, f"one file per collective and node count: {seen[key]} is "
                              f"also {run.collective} on {run.nodes} node(s) x {run.ranks_per_node} rank(s)")
        seen[key] = run.path
        # busbw from the time: the log rounds its busbw to 0.01 GB/s, 0 for small sizes
        factor = bus_factor(run.collective, run.ranks)
        rows += [BusRow(run.collective, run.nodes, run.ranks_per_node, r.bytes, r.bytes * factor / r.time_us / 1e3)
                 for r in run.rows]
    return BusTable(rows, "nccl-tests logs: " + ", ".join(Path(r.path).name for r in runs))
