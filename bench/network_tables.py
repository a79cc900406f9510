"""Build the network tables the plan reads from published nccl-tests measurements.

    .venv/bin/python bench/network_tables.py [--shared DIR]

DIR is the project's shared folder of published measurements (beside the checkout by
default); the tables are read from its perf/network/ folder.

Writes, in the project's own format (orchestrator/plan/bus_table.py):

- `conf/hardware/h100-p5.network.csv`, the h100-p5 preset's network: nccl-tests
  all_reduce_perf on AWS p5.48xlarge (8 x H100, 32 x EFA per node), out-of-place busbw.
  From 32 MiB to 8 GiB on 2, 4, 8, 16 and 32 nodes: the SageMaker HyperPod runs
  (github.com/crazyguitar/aws-gpu-communication-benchmark, NCCL 2.28). Below 32 MiB on
  2-16 nodes, and every size on one node: The Smol Training Playbook's runs on p5 (Hugging
  Face, 2025; busbw from their time column, since the busbw column is rounded to 0.01
  GB/s), which agree with HyperPod's where both measured (32 MiB: 149 / 147 GB/s on 2
  nodes, 85 / 87 on 8, 71 / 75 on 16). On 32 nodes below 32 MiB nothing was measured: the plan extrapolates
  from the 32 and 64 MiB points (bus_table.alpha_beta) and says so.
- `bench/data/network/ultrascale-cluster.csv`: the Ultra-Scale Playbook's cluster as it
  measured itself at 256 MB (its figure "Communication Bandwidth by Number of Nodes": the
  median all-reduce, all-gather and reduce-scatter on 1-64 nodes), each figure carried to
  every size by the p5 all-reduce curve of the same node count (64 nodes: the 32-node
  curve): the p5 curve's latency term kept, its bandwidth term replaced by the one that
  gives the cluster's figure at 256 MB (`with_bandwidth`). The source does not say whether
  its figure is algbw or busbw; at one node its all-reduce (436 GB/s) matches
  p5's busbw at 256 MiB (423), so it is read as busbw.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from orchestrator.network_table import write
from orchestrator.plan.bus_table import BusRow, BusTable, curve_busbw

ROOT = Path(__file__).resolve().parent.parent
P5_TABLE = ROOT / "conf" / "hardware" / "h100-p5.network.csv"
CLUSTER_TABLE = ROOT / "bench" / "data" / "network" / "ultrascale-cluster.csv"
GPUS_PER_NODE = 8
HYPERPOD_FROM = 32 * 2**20  # bytes: HyperPod's runs start at 32 MiB
REFERENCE = 256 * 2**20  # the size the playbook's cluster measured itself at


def rows_of(path: Path) -> list[dict]:
    return list(csv.DictReader(line for line in path.open() if not line.startswith("#")))


def p5_table(shared: Path) -> BusTable:
    hyperpod = rows_of(shared / "p5-hyperpod-all-reduce.csv")
    smol = rows_of(shared / "p5-smol-playbook-nccl-tests.csv")
    hyperpod_nodes = sorted({int(r["Nodes"]) for r in hyperpod})
    rows = [
        BusRow(
            "all_reduce", int(r["Nodes"]), GPUS_PER_NODE, int(float(r["size_MB"]) * 2**20), float(r["out_busbw_GBps"])
        )
        for r in hyperpod
    ]
    for r in smol:
        nodes, size = int(r["nodes"]), int(r["message_bytes"])
        if r["op"] == "all_reduce" and (nodes == 1 or (nodes in hyperpod_nodes and size < HYPERPOD_FROM)):
            # busbw from the time column: the busbw column is rounded to 0.01 GB/s (0 below 4 KB)
            ranks = nodes * GPUS_PER_NODE
            busbw = size * 2 * (ranks - 1) / ranks / (float(r["time_us"]) * 1e-6) / 1e9
            rows.append(BusRow("all_reduce", nodes, GPUS_PER_NODE, size, busbw))
    source = (
        "nccl-tests all_reduce_perf on AWS p5.48xlarge (8x H100, 32x EFA per node), out-of-place busbw: "
        "32 MiB-8 GiB on 2-32 nodes from SageMaker HyperPod (github.com/crazyguitar/aws-gpu-communication-"
        "benchmark, NCCL 2.28.7); below 32 MiB on 2-16 nodes and all sizes on 1 node from The Smol Training "
        "Playbook (Hugging Face, 2025). Built by bench/network_tables.py."
    )
    return BusTable(sorted(rows, key=lambda r: (r.nodes, r.bytes)), source)


def cluster_table(shared: Path, p5: BusTable) -> BusTable:
    measured = rows_of(shared / "ultrascale-cluster-256mb.csv")
    p5_nodes = p5.node_counts("all_reduce", GPUS_PER_NODE)
    rows = []
    for r in measured:
        nodes = int(r["nodes"])
        shape = p5.curves[("all_reduce", max(n for n in p5_nodes if n <= nodes), GPUS_PER_NODE)]
        rows += [
            BusRow(r["op"], nodes, GPUS_PER_NODE, size, busbw / 1e9)
            for size, busbw in with_bandwidth(shape, REFERENCE, float(r["center_GBps"]) * 1e9)
        ]
    source = (
        "The Ultra-Scale Playbook's cluster as it measured itself (8x H100 per node, AWS EFA): its median "
        "all-reduce, all-gather and reduce-scatter at 256 MB on 1-64 nodes, each a bandwidth term under the "
        "latency term of the p5 nccl-tests all-reduce curve of the same node count (64 nodes: 32's). Built by "
        "bench/network_tables.py."
    )
    return BusTable(rows, source)


def with_bandwidth(curve: tuple[tuple[int, float], ...], size: int, busbw: float) -> list[tuple[int, float]]:
    """`curve`'s latency term under another bandwidth term, the one that gives `busbw` at `size`.

    A call's time per unit of the ring factor is S / busbw(S) = latency(S) + S / B: the
    curve's latency term is what it takes beyond its own bandwidth term (B: its largest busbw),
    and the new curve keeps it: latency is the fabric's and NCCL's, the bandwidth term the
    cluster's. Scaling the whole curve by busbw / curve(size) instead would make the latency
    of a network grow as its bandwidth falls."""
    top = max(b for _, b in curve)
    latency = {s: s / b - s / top for s, b in curve}
    at_size, _ = curve_busbw(curve, size)
    rest = size / busbw - (size / at_size - size / top)
    if rest <= 0:  # faster than the curve's own latency allows at that size: scale instead
        return [(s, b * busbw / at_size) for s, b in curve]
    bandwidth = size / rest
    return [(s, s / (latency[s] + s / bandwidth)) for s, _ in curve]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    args = parser.parse_args()
    network = args.shared / "perf" / "network"
    p5 = p5_table(network)
    write(P5_TABLE, p5)
    write(CLUSTER_TABLE, cluster_table(network, p5))
    print(f"wrote {P5_TABLE} ({len(p5.rows)} rows) and {CLUSTER_TABLE}")


if __name__ == "__main__":
    main()
