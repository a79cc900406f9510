"""The time of one collective call, as NCCL (or gloo) runs it.

Each call costs a latency and its bytes over a bandwidth (the alpha-beta model of Thakur
et al., 2005), with the terms NCCL's own tuning model uses to choose between its
algorithms (NCCL, src/graph/tuning.cc, Simple protocol; the constants below are its):

- **ring** (every collective). An all-reduce is 2(n-1) steps, a reduce-scatter or an
  all-gather n-1, each moving 1/n of the buffer; the bandwidth term is the buffer times
  2(n-1)/n (or (n-1)/n) over the bus bandwidth of the slowest level the ring crosses. Its
  latency is the sum of its steps' hops: of an all-reduce's steps, 2 per node cross the
  network and the rest stay inside a node, so it grows linearly with the ranks.
- **tree** (all-reduce across nodes only). A reduce up a tree and a broadcast down it:
  2 x (the node's ranks - 1) hops inside a node and 2 x log2(nodes) across the network, so
  its latency grows with the logarithm of the node count; its bandwidth term is 2 x the
  buffer over 0.92 of the bus bandwidth.

Each algorithm runs in one of NCCL's protocols. **Simple** moves data at the bus bandwidth
and pays the level's hop latency (the preset's `latency_us`). **LL** (low latency) sends
each 8 bytes with a 4-byte flag, so a receiver polls its memory rather than waiting on a
fence: its hops cost NCCL's LL latencies (0.6 us over NVLink, 2.7 us a ring hop and 5.0 us a
tree level across the network), at half a ring's bus bandwidth (a tree's at 1/3.8), capped
at NCCL's `llMaxBw` (src/graph/tuning.cc). So a small call runs in LL and a large one in
Simple; this is what sets the cost of a small call (a ZeRO-3 persistent parameter, a small
bucket) on a network with no measured table.

NCCL runs the fastest algorithm and protocol for a call's size and node count, and so does the plan.
A hop's latency is the level's `latency_us` for a ring; a tree moves its data in chunks
and waits for a whole chunk per level (NCCL charges 28 us), so a tree hop costs at least
that. The bus bandwidth of each level is what nccl-tests reports as busbw at large sizes:
NCCL spreads a call over several channels (rings or trees, each on its own NVLink lanes and
NIC), so busbw is all of a node's channels and NICs at work, not one link's nominal rate.
It is the hardware preset's, with its source, or `orchestrator calibrate --links`'s.

gloo (the CPU backend) has rings only, advances them in lock step (each step waits for the
slowest link) and reduce-scatters with an all-reduce's traffic (bench/RESULTS.md).

A network described by what it measured (plan/bus_table.py: busbw by collective, node count
and size) replaces all of this where it has a curve: a call takes its bytes x the ring factor
over the table's busbw at that size. Beyond the node counts it measured, the edge's curve is
carried by this model: the inter-node level fitted to the edge node count's curve (least
squares on log time), then busbw(N, S) = busbw(edge, S) x model(N, S) / model(edge, S).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from orchestrator.plan.bus_table import BusTable, Reading

ALGORITHMS = ("ring", "tree")
RING_BASE_US = 8.4  # NCCL's base latency of a ring call (Simple protocol)
TREE_HOP_US = 28.0  # NCCL's latency of a tree level (Simple): one 256 kB chunk in flight
TREE_BANDWIDTH_SHARE = 0.92  # NCCL: a tree reaches 0.92 of the bus bandwidth a ring does
# NCCL's LL protocol (src/graph/tuning.cc): base latencies of a ring and a tree call, hop
# latencies over NVLink and the network, its share of the bus bandwidth, and its cap
# (llMaxBws: 39 GB/s on one or two nodes, 20.4 beyond, Intel hosts).
LL_RING_BASE_US, LL_TREE_BASE_US = 6.6, 6.8
LL_NVLINK_HOP_US, LL_NET_RING_HOP_US, LL_NET_TREE_HOP_US = 0.6, 2.7, 5.0
LL_RING_SHARE, LL_TREE_SHARE = 0.5, 1 / 3.8
NET_OVERHEAD_US = 1.0  # NCCL: each inter-node ring step posts a network send, at least this a hop
FIT_POINTS = 48  # sizes of a measured curve an edge level is fitted to (nccl-tests' -f 2 from 8 B to 8 GiB: 31)


@dataclass(frozen=True)
class Level:
    """One level of the network (inside a node, or between nodes)."""

    busbw: float  # bytes/s per rank: nccl-tests' busbw at large sizes
    latency: float  # seconds per ring hop


@dataclass(frozen=True)
class Network:
    """Where a collective runs: its ranks, nodes and the two levels between them."""

    ranks: int
    nodes: int
    intra: Level
    inter: Level
    backend: str = "nccl"  # nccl | gloo
    call: float = 0.0  # seconds of fixed cost per call the engine issues (flatten, launch, copy back)
    table: BusTable | None = None  # the network's measured curves, where it has them (plan/bus_table.py)

    @property
    def ranks_per_node(self) -> int:
        return max(1, self.ranks // max(1, self.nodes))

    @property
    def ring_busbw(self) -> float:
        """A ring crossing nodes moves at the slower level's rate."""
        return self.intra.busbw if self.nodes == 1 else min(self.intra.busbw, self.inter.busbw)

    @property
    def level(self) -> str:
        return "intra" if self.nodes == 1 else "inter"


@dataclass(frozen=True)
class CallTime:
    seconds: float
    algorithm: str  # ring | tree | measured (a table's curve) | none (a single rank: nothing to do)
    busbw: float  # bytes/s the bandwidth term used
    note: str = ""  # where a table's figure is not a measured point: what it rests on
    protocol: str = "Simple"  # NCCL's protocol of a modelled call: Simple | LL


def ring_steps(op: str, ranks: int, backend: str = "nccl") -> int:
    """Steps around the ring; gloo reduce-scatters with an all-reduce's traffic."""
    passes = 2 if op == "all_reduce" or (op == "reduce_scatter" and backend == "gloo") else 1
    return passes * (ranks - 1)


def ring_time(op: str, nbytes: float, net: Network) -> float:
    n = net.ranks
    steps = ring_steps(op, n, net.backend)
    data = nbytes * steps / n / net.ring_busbw  # every rank sends steps/n of the buffer
    if net.backend == "gloo":  # lock step: every step waits for the slowest link's latency
        latency = steps * (net.inter.latency if net.nodes > 1 else net.intra.latency)
        return net.call + latency + data
    if net.nodes == 1:
        inter_steps = 0
    else:
        inter_steps = 2 * net.nodes if op == "all_reduce" else net.nodes - 1
    inter_steps = min(inter_steps, steps)
    latency = RING_BASE_US * 1e-6 + (steps - inter_steps) * net.intra.latency + inter_steps * net.inter.latency
    return net.call + latency + data


def tree_time(nbytes: float, net: Network) -> float:
    """An all-reduce as NCCL's tree: up and down, 2 hops per level."""
    hop_intra = max(TREE_HOP_US * 1e-6, net.intra.latency)
    hop_inter = max(TREE_HOP_US * 1e-6, net.inter.latency)
    latency = 2 * ((net.ranks_per_node - 1) * hop_intra + math.log2(net.nodes) * hop_inter)
    return net.call + latency + 2 * nbytes / (TREE_BANDWIDTH_SHARE * net.ring_busbw)


def ll_cap(net: Network) -> float:
    return (39.0 if net.nodes <= 2 else 20.4) * 1e9


def ll_ring_time(op: str, nbytes: float, net: Network) -> float:
    """A ring in NCCL's LL protocol: short hops, half the bus bandwidth (capped)."""
    n = net.ranks
    steps = ring_steps(op, n)
    inter_steps = 0 if net.nodes == 1 else min(steps, 2 * (net.nodes - 1) if op == "all_reduce" else net.nodes - 1)
    intra_hop = LL_NVLINK_HOP_US if net.nodes == 1 else max(LL_NVLINK_HOP_US, NET_OVERHEAD_US)
    latency = LL_RING_BASE_US + (steps - inter_steps) * intra_hop + inter_steps * LL_NET_RING_HOP_US
    busbw = min(LL_RING_SHARE * net.ring_busbw, ll_cap(net))
    return net.call + latency * 1e-6 + nbytes * steps / n / busbw


def ll_tree_time(nbytes: float, net: Network) -> float:
    """An all-reduce as NCCL's tree in the LL protocol."""
    latency = LL_TREE_BASE_US + 2 * (
        (net.ranks_per_node - 1) * LL_NVLINK_HOP_US + math.log2(net.nodes) * LL_NET_TREE_HOP_US
    )
    busbw = min(LL_TREE_SHARE * TREE_BANDWIDTH_SHARE * net.ring_busbw, ll_cap(net))
    return net.call + latency * 1e-6 + 2 * nbytes / busbw


def algorithms(op: str, net: Network) -> tuple[str, ...]:
    """What the backend can run for this collective here."""
    if net.backend == "nccl" and op == "all_reduce" and net.nodes > 1:
        return ALGORITHMS
    return ("ring",)


@functools.lru_cache(maxsize=65536)
def call_time(op: str, nbytes: float, net: Network) -> CallTime:
    """The time of one call of `op` on an `nbytes` buffer: from the network's measured curve
    where it has one, else by the fastest algorithm there (cached: a step's buckets repeat a
    few sizes, and a sweep or a fit repeats networks)."""
    if net.ranks <= 1 or nbytes <= 0:
        return CallTime(0.0, "none", 0.0)
    if net.table is not None and (measured := table_time(op, nbytes, net)) is not None:
        return measured
    return modelled_time(op, nbytes, net)


def modelled_time(op: str, nbytes: float, net: Network) -> CallTime:
    """NCCL's algorithms and protocols (gloo's ring) on the parametric levels: the fastest."""
    times = {
        (a, "Simple"): ring_time(op, nbytes, net) if a == "ring" else tree_time(nbytes, net)
        for a in algorithms(op, net)
    }
    if net.backend == "nccl":
        times.update(
            {
                (a, "LL"): ll_ring_time(op, nbytes, net) if a == "ring" else ll_tree_time(nbytes, net)
                for a in algorithms(op, net)
            }
        )
    algorithm, protocol = min(times, key=lambda way: times[way])
    share = TREE_BANDWIDTH_SHARE if algorithm == "tree" else 1.0
    busbw = net.ring_busbw * share
    if protocol == "LL":
        busbw = min((LL_TREE_SHARE if algorithm == "tree" else LL_RING_SHARE) * busbw, ll_cap(net))
    return CallTime(times[(algorithm, protocol)], algorithm, busbw, protocol=protocol)


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw: the share of the buffer each rank's links carry."""
    return (2 if op == "all_reduce" else 1) * (ranks - 1) / ranks


def table_time(op: str, nbytes: float, net: Network) -> CallTime | None:
    """One call timed from the network's measured curves; None where they cannot say (one
    node and no one-node curve, or a table measured on one node only for a call across nodes)."""
    if net.table is None:
        return None
    reading = net.table.busbw(op, net.nodes, net.ranks_per_node, nbytes)
    if reading is None:
        reading = beyond_the_table(op, nbytes, net)
    if reading is None:
        return None
    return CallTime(
        net.call + nbytes * bus_factor(op, net.ranks) / reading.busbw, "measured", reading.busbw, reading.note
    )


def beyond_the_table(op: str, nbytes: float, net: Network) -> Reading | None:
    """busbw at a node count the table did not measure: its edge's curve, carried by the model."""
    table, rpn = net.table, net.ranks_per_node
    if table is None:
        return None
    read_op, read_rpn, _ = table.resolve(op, rpn)
    counts = table.node_counts(read_op, read_rpn)
    if not counts or net.nodes == 1:  # one node is another level (NVLink): not extrapolated from the network
        return None
    edge = counts[0] if net.nodes < counts[0] else counts[-1]
    if edge == 1:
        return None
    at_edge = table.busbw(op, edge, rpn, nbytes)
    if at_edge is None:  # an edge of the table's own node counts is read there
        return None
    inter = edge_level(table, read_op, edge, read_rpn, net.intra, net.backend)

    def model(nodes: int) -> float:
        at = replace(net, ranks=nodes * rpn, nodes=nodes, inter=inter, call=0.0, table=None)
        return nbytes * bus_factor(op, at.ranks) / modelled_time(op, nbytes, at).seconds

    side = "beyond the largest" if net.nodes > edge else "below the smallest"
    return Reading(
        min(at_edge.busbw * model(net.nodes) / model(edge), table.fastest(read_op, read_rpn)),
        f"extrapolated {side} node count measured ({edge}) by NCCL's ring and tree terms fitted to it"
        + (f"; {at_edge.note}" if at_edge.note else ""),
    )


@functools.lru_cache(maxsize=256)
def edge_level(table: BusTable, op: str, nodes: int, rpn: int, intra: Level, backend: str) -> Level:
    """The inter-node level whose ring-or-tree times best match one measured curve (least
    squares on log time: a grid in log space, then a finer one around its best point)."""
    curve = table.curves[(op, nodes, rpn)]
    step = max(1, len(curve) // FIT_POINTS)  # a long curve thinned: the fit's cost may not grow with the table
    ranks = nodes * rpn
    measured = [(s, math.log(s * bus_factor(op, ranks) / b)) for s, b in curve[::step]]

    def error(busbw: float, latency: float) -> float:
        net = Network(ranks=ranks, nodes=nodes, intra=intra, inter=Level(busbw, latency), backend=backend)
        return sum((math.log(modelled_time(op, float(s), net).seconds) - t) ** 2 for s, t in measured)

    best_bw, best_lat = max(b for _, b in curve), 10e-6
    span = (math.log(1e3), math.log(1e3))  # x1000 each way of the curve's peak busbw and 10 us
    for _ in range(3):
        grid = [
            (best_bw * math.exp(i / 8 * span[0]), best_lat * math.exp(j / 8 * span[1]))
            for i in range(-8, 9)
            for j in range(-8, 9)
        ]
        best_bw, best_lat = min(grid, key=lambda p: error(*p))
        span = (span[0] / 6, span[1] / 6)
    return Level(best_bw, best_lat)


def small_call_note(net: Network) -> str:
    """What one small call costs this trial's ranks, and what that figure rests on: the
    latency a bucket, a persistent parameter or a norm pays whatever its size."""
    if net.ranks <= 1:
        return ""
    t = call_time("all_reduce", 8.0, net)
    source = (
        (t.note or "measured")
        if t.algorithm == "measured"
        else f"NCCL's {t.algorithm} in its {t.protocol} protocol on the levels above, not measured"
        if net.backend == "nccl"
        else "gloo's ring on the levels above"
    )
    return f"an 8-byte all-reduce across the {net.ranks} ranks costs {t.seconds * 1e6:,.1f} us ({source})"


def network(
    ranks: int,
    nodes: int,
    intra_busbw_gbps: float,
    intra_latency_us: float,
    inter_busbw_gbps: float,
    inter_latency_us: float,
    backend: str = "nccl",
    call_us: float = 0.0,
    table: BusTable | None = None,
) -> Network:
    """A Network from a hardware preset's units (GB/s, microseconds)."""
    return Network(
        ranks=ranks,
        nodes=nodes,
        intra=Level(intra_busbw_gbps * 1e9, intra_latency_us * 1e-6),
        inter=Level(inter_busbw_gbps * 1e9, inter_latency_us * 1e-6),
        backend=backend,
        call=call_us * 1e-6,
        table=table,
    )
