"""The network as it measured itself: bus bandwidth by collective, node count, ranks per
node and message size, and how the plan reads a call's bandwidth from it.

A network is not one bandwidth. nccl-tests on H100 nodes over EFA give an all-reduce 147
GB/s of bus bandwidth at 32 MiB on 2 nodes and 66 at 32 nodes, against 478 and 321 at 8 GiB;
data-parallel gradient buckets (25-50 MB) sit where the curve is lowest. So a network can
be described by what it measured: one row per (collective, nodes, ranks per node, bytes)
with nccl-tests' busbw (algbw x 2(n-1)/n for an all-reduce, x (n-1)/n for an all-gather or a
reduce-scatter, n ranks; Jeaugey, nccl-tests doc/PERFORMANCE.md). A call of S bytes then takes
S x that factor / busbw(S), whatever algorithm NCCL chose at that size: the table measured it.

One format for every source (a preset's table, `calibrate --links`, imported nccl-tests logs,
`hardware.network=PATH`): a CSV of `collective,nodes,ranks_per_node,bytes,busbw_gbps`, lines
starting with `#` saying where it comes from (parse and render here; its file is
network_table.py's).

How a table is read (`BusTable.busbw`):
- between two measured sizes: log busbw linear in log size;
- below the smallest size of a node count where a smaller node count measured that size
  (p5's 32-node curve starts at 32 MiB, its 2-16-node curves at 8 B): no faster than the
  largest such node count at that size (more nodes only add latency at one size), where the
  line below would say faster;
- otherwise below the smallest or above the largest size of a node count: the
  latency-plus-bandwidth line (Hockney's alpha-beta) through the two nearest measured points,
  so small calls pay the latency the table's edge shows and large ones approach the bandwidth
  it tends to;
- between two measured node counts: log busbw linear in log node count, at the same size;
- beyond the measured node counts: not here (None); plan/collectives.py carries the edge's
  curve with NCCL's ring and tree terms fitted to it, and says so.
A collective the table lacks is read from its all-reduce (a ring all-reduce is a
reduce-scatter and an all-gather, each at the same bus bandwidth); ranks per node the table
lacks, from the nearest it has. Every such reading says what it rests on.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from orchestrator.core.errors import ConfigError

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
COLUMNS = ("collective", "nodes", "ranks_per_node", "bytes", "busbw_gbps")
MAX_BUSBW_GBPS = 10_000.0  # ten times NVLink 5's bus bandwidth: past this a figure is not a measurement
MIN_BUSBW_GBPS = 1e-6  # a kilobyte a second: below it (1e-320) a figure plans an infinite call, not a slow one
# Whole-number fields past these are not a measurement (a 1e30-byte message, 1e400 nodes).
MAX_FIELDS = {"nodes": 100_000, "ranks_per_node": 1_024, "bytes": 2**44}  # 16 TiB: far past any nccl-tests run


@dataclass(frozen=True)
class BusRow:
    collective: str
    nodes: int
    ranks_per_node: int
    bytes: int
    busbw_gbps: float


@dataclass(frozen=True)
class Reading:
    busbw: float  # bytes/s
    note: str = ""  # empty where the table measured this size and node count, else what the figure rests on


class BusTable:
    """Measured curves, one per (collective, nodes, ranks per node). Hashed by identity: a
    plan's Network carries it as a cache key, and one file is loaded once (`load`)."""

    def __init__(self, rows: list[BusRow], source: str):
        self.source = source
        self.rows = tuple(rows)
        curves: dict[tuple[str, int, int], list[tuple[int, float]]] = {}
        for r in rows:
            curves.setdefault((r.collective, r.nodes, r.ranks_per_node), []).append((r.bytes, r.busbw_gbps * 1e9))
        self.curves = {k: tuple(sorted(v)) for k, v in curves.items()}
        self._fastest: dict[tuple[str, int], float] = {}  # (collective, ranks per node): the most busbw measured
        for (op, _, rpn), curve in self.curves.items():
            self._fastest[(op, rpn)] = max(self._fastest.get((op, rpn), 0.0), max(b for _, b in curve))

    def node_counts(self, op: str, ranks_per_node: int) -> list[int]:
        return sorted(n for (o, n, r) in self.curves if o == op and r == ranks_per_node)

    def resolve(self, op: str, ranks_per_node: int) -> tuple[str, int, str]:
        """(the collective and ranks per node to read, and what that rests on)."""
        notes = []
        if not any(o == op for o, _, _ in self.curves):
            notes.append(f"{op} read from all_reduce's curve")
            op = "all_reduce"
        have = sorted({r for o, _, r in self.curves if o == op})
        if not have:
            return op, ranks_per_node, ""
        nearest = min(have, key=lambda r: (abs(math.log(r / ranks_per_node)), r))
        if nearest != ranks_per_node:
            notes.append(f"measured at {nearest} rank(s) per node, not {ranks_per_node}")
        return op, nearest, "; ".join(notes)

    def busbw(self, op: str, nodes: int, ranks_per_node: int, nbytes: float) -> Reading | None:
        """The bus bandwidth of one call, or None where `nodes` lies outside the measured node
        counts (or the table has no curve for this collective at all)."""
        op, rpn, note = self.resolve(op, ranks_per_node)
        counts = self.node_counts(op, rpn)
        if not counts or not counts[0] <= nodes <= counts[-1]:
            return None
        i = bisect.bisect_left(counts, nodes)
        if counts[i] == nodes and (small := self.small_call(op, nodes, rpn, nbytes)) is not None:
            return Reading(small.busbw, "; ".join(x for x in (note, small.note) if x))
        if counts[i] == nodes:
            bw, size_note = curve_busbw(self.curves[(op, nodes, rpn)], nbytes)
        else:
            lo, hi = counts[i - 1], counts[i]
            (b_lo, n_lo), (b_hi, n_hi) = (curve_busbw(self.curves[(op, c, rpn)], nbytes) for c in (lo, hi))
            bw = _log_interpolate(nodes, lo, hi, b_lo, b_hi)
            size_note = n_lo or n_hi
            note = "; ".join(x for x in (note, f"between the {lo}- and {hi}-node curves") if x)
        return Reading(min(bw, self.fastest(op, rpn)), "; ".join(x for x in (note, size_note) if x))

    def fastest(self, op: str, ranks_per_node: int) -> float:
        """The most busbw any curve of this collective measured: what no reading may pass (a
        line drawn above a curve's largest size tends to 1 / its slope, which two close points
        can put at any figure)."""
        return self._fastest[(op, ranks_per_node)]

    def small_call(self, op: str, nodes: int, rpn: int, nbytes: float) -> Reading | None:
        """A call smaller than the `nodes` curve's smallest size, where a smaller node count
        measured that size: no faster than there (at one size, more nodes only add hops and
        latency), which the line through this curve's two smallest sizes (32 MiB and up, say)
        can miss by far for a call of a few kB. None where this curve reaches the size, no
        smaller multi-node curve does, or the line is already the slower reading."""
        own = self.curves[(op, nodes, rpn)]
        if nbytes >= own[0][0] or nodes == 1:
            return None
        fewer = [c for c in self.node_counts(op, rpn) if 1 < c < nodes and self.curves[(op, c, rpn)][0][0] <= nbytes]
        if not fewer:
            return None
        bound, _ = curve_busbw(self.curves[(op, fewer[-1], rpn)], nbytes)
        line, _ = curve_busbw(own, nbytes)
        if bound >= line:
            return None
        return Reading(
            bound,
            f"below the {nodes}-node curve's smallest size ({_mb(own[0][0])}): no faster than "
            f"the {fewer[-1]}-node curve at this size",
        )


def curve_busbw(curve: tuple[tuple[int, float], ...], nbytes: float) -> tuple[float, str]:
    """(busbw at `nbytes`, a note if it lies outside the measured sizes) on one measured curve."""
    sizes = [s for s, _ in curve]
    if len(curve) == 1:
        return curve[0][1], "" if nbytes == sizes[0] else f"one size measured ({_mb(sizes[0])})"
    if nbytes < sizes[0]:
        return alpha_beta(curve[0], curve[1], nbytes, below=True), f"below the smallest size measured ({_mb(sizes[0])})"
    if nbytes > sizes[-1]:
        return alpha_beta(
            curve[-1], curve[-2], nbytes, below=False
        ), f"above the largest size measured ({_mb(sizes[-1])})"
    i = bisect.bisect_left(sizes, nbytes)
    if sizes[i] == nbytes:
        return curve[i][1], ""
    (s0, b0), (s1, b1) = curve[i - 1], curve[i]
    return _log_interpolate(nbytes, s0, s1, b0, b1), ""


def alpha_beta(edge: tuple[int, float], inner: tuple[int, float], nbytes: float, below: bool) -> float:
    """busbw past a curve's edge on the line t = alpha + beta x bytes through its two outermost
    points (times per unit of the ring factor, which a curve shares). Bus bandwidth grows with
    size: never above the edge's below it, never below the edge's above it."""
    (s_e, b_e), (s_i, b_i) = edge, inner
    u_e, u_i = s_e / b_e, s_i / b_i  # seconds / factor
    beta = (u_e - u_i) / (s_e - s_i)
    u = u_e + beta * (nbytes - s_e)
    if beta <= 0 or u <= 0:  # no latency or no bandwidth term to extrapolate: the edge's figure
        return b_e
    return min(b_e, nbytes / u) if below else max(b_e, nbytes / u)


def _log_interpolate(x: float, x0: float, x1: float, y0: float, y1: float) -> float:
    w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))


def _mb(nbytes: float) -> str:
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes:g} B"


# --- the file -----------------------------------------------------------------------------


def parse(text: str, where: str) -> BusTable:
    """A table from its CSV text; anything else exits 2 naming `where`, the row and the field."""
    lines = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)]
    source = " ".join(line.lstrip("#").strip() for _, line in lines if line.startswith("#"))
    data = [(n, line) for n, line in lines if line and not line.startswith("#")]
    if not data or [c.strip() for c in data[0][1].lstrip("\ufeff").split(",")] != list(COLUMNS):
        raise ConfigError(
            "hardware.network",
            where,
            f"a network table: a CSV whose header is {','.join(COLUMNS)}"
            + (f" (line {data[0][0]} is {data[0][1][:80]!r})" if data else " (the file has no rows)"),
        )
    rows = [_row(line, n, where) for n, line in data[1:]]
    if not rows:
        raise ConfigError("hardware.network", where, "a network table with at least one row under its header")
    last: dict[tuple[str, int, int], tuple[int, int]] = {}
    for (n, _), r in zip(data[1:], rows):
        key = (r.collective, r.nodes, r.ranks_per_node)
        if key in last and r.bytes <= last[key][0]:
            raise ConfigError(
                f"{where} line {n}: bytes",
                r.bytes,
                f"sizes that increase within one curve "
                f"({r.collective}, {r.nodes} node(s), {r.ranks_per_node} rank(s) per node): line "
                f"{last[key][1]} has {last[key][0]}",
            )
        last[key] = (r.bytes, n)
    return BusTable(rows, source or where)


def _row(line: str, n: int, where: str) -> BusRow:
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != len(COLUMNS):
        raise ConfigError(
            f"{where} line {n}", line[:80], f"{len(COLUMNS)} fields ({','.join(COLUMNS)}), found {len(cells)}"
        )
    values = dict(zip(COLUMNS, cells))
    for name, value in values.items():
        if value == "":
            raise ConfigError(f"{where} line {n}: {name}", "(empty)", "a value in every field: a table has no gaps")
    if values["collective"] not in COLLECTIVES:
        raise ConfigError(f"{where} line {n}: collective", values["collective"], f"one of {', '.join(COLLECTIVES)}")
    ints: dict[str, int] = {}
    for name, high in MAX_FIELDS.items():
        text = values[name]
        whole = int(text) if text.isascii() and text.isdigit() and len(text) <= 20 else None
        if whole is None or not 1 <= whole <= high:
            raise ConfigError(f"{where} line {n}: {name}", text[:40], f"a whole number from 1 to {high:,}")
        ints[name] = whole
    try:
        busbw = float(values["busbw_gbps"])
    except ValueError:
        busbw = math.nan
    if not MIN_BUSBW_GBPS <= busbw <= MAX_BUSBW_GBPS:
        raise ConfigError(
            f"{where} line {n}: busbw_gbps",
            values["busbw_gbps"],
            f"a bus bandwidth in GB/s from {MIN_BUSBW_GBPS:g} to {MAX_BUSBW_GBPS:g}",
        )
    return BusRow(values["collective"], ints["nodes"], ints["ranks_per_node"], ints["bytes"], busbw)


def render(table: BusTable) -> str:
    head = "".join(f"# {line}\n" for line in table.source.splitlines() if line.strip())
    body = "".join(
        f"{r.collective},{r.nodes},{r.ranks_per_node},{r.bytes},{r.busbw_gbps:.6g}\n"
        for r in sorted(table.rows, key=lambda r: (COLLECTIVES.index(r.collective), r.nodes, r.ranks_per_node, r.bytes))
    )
    return head + ",".join(COLUMNS) + "\n" + body
