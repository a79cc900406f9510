"""The communication model (orchestrator/plan/comm.py) against a real multi-node cluster.

    .venv/bin/python bench/comm_check.py collectives [--link-mbit 400] [--reps 3]
    .venv/bin/python bench/comm_check.py trials OUT_DIR [--link-mbit 100]

Starts the test cluster shaped (tests/slurm/cluster.sh start --nodes 4 --cpus-per-node 4
--link-mbit R: four nodes in network namespaces, every node's link limited to R Mbit/s
both ways by tc tbf) and prints predicted beside measured.

collectives: all-reduce, reduce-scatter and all-gather over gloo at 1-16 MB, world sizes
2-4 on 1-4 nodes (srun, bench/collective_worker.py). The prediction is the ring model with
a hardware description of these links: inter-node bandwidth = the tbf rate, intra-node
bandwidth and latency fitted on the one-node rows, inter-node latency from a 4-byte
all-reduce across two nodes. Those rows are marked "fit"; the others are checked (15 %).

trials: whole `orchestrator run cluster=slurm` trials that are communication-bound (a
small model on a slow link), ZeRO 0-3 across reduce bucket sizes and dp 2 and 4 (one rank
per node), planned with the same link description (`hardware.inter_node.*`). Prints the
step time predicted / measured (25 %) and, per dp, the ranking of bucket sizes both ways.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from orchestrator.plan.comm import Links, ring_rounds, ring_time

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "tests" / "slurm" / "cluster.sh"
LAYOUTS = [(2, 1), (4, 1), (2, 2), (4, 2), (3, 3), (4, 4)]  # (ranks, nodes), block placement
SIZES = [4, 2**20, 4 * 2**20, 16 * 2**20]  # the 4-byte one probes latency
PROBE = 2**16
OPS = ("all_reduce", "reduce_scatter", "all_gather")
COLLECTIVE_TOLERANCE, STEP_TOLERANCE = 0.15, 0.25


def start_cluster(link_mbit: int, cpus_per_node: int = 4) -> None:
    subprocess.run(["bash", str(CLUSTER), "start", "--nodes", "4", "--cpus-per-node", str(cpus_per_node),
                    "--link-mbit", str(link_mbit)], check=True, timeout=600)


def measure_collectives(reps: int) -> list[dict]:
    out = []
    for ranks, nodes in LAYOUTS:
        argv = ["srun", "--export=ALL,SUBMITIT_EXECUTOR=slurm", f"--nodes={nodes}", f"--ntasks={ranks}", f"--ntasks-per-node={math.ceil(ranks / nodes)}",
                "--cpus-per-task=1", sys.executable, str(ROOT / "bench" / "collective_worker.py"),
                ",".join(map(str, SIZES)), str(reps)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
        if proc.returncode or not lines:
            raise RuntimeError(f"{ranks} ranks on {nodes} nodes failed:\n{proc.stderr[-2000:]}")
        out.append(json.loads(lines[-1]))
        print(f"  measured {ranks} ranks on {nodes} node(s)", file=sys.stderr)
    return out


def ring_terms(op: str, nbytes: float, n: int) -> tuple[float, float]:
    """(latency hops, bytes over the slowest link) of one gloo ring collective: t = hops*lat + bytes/bw."""
    rounds = ring_rounds(op, "gloo")
    return rounds * (n - 1), rounds * (n - 1) * nbytes / n


def fit_link(rows: list[tuple[str, int, int, float]]) -> tuple[float, float]:
    """(bandwidth B/s, latency s) minimising the relative error of t = hops*lat + bytes/bw."""
    a = np.array([ring_terms(op, b, n) for op, b, n, _ in rows])
    t = np.array([s for *_, s in rows])
    (lat, inv_bw), *_ = np.linalg.lstsq(a / t[:, None], np.ones(len(t)), rcond=None)
    return 1 / inv_bw, max(lat, 0.0)


def collectives(args) -> None:
    start_cluster(args.link_mbit)
    runs = measure_collectives(args.reps)
    flat = [(r["world"], r["nodes"], row) for r in runs for row in r["rows"]]
    one_node = [(row["op"], row["bytes"], w, row["seconds"]) for w, k, row in flat if k == 1 and row["bytes"] >= PROBE]
    intra_bw, intra_lat = fit_link(one_node)
    probe = next(row["seconds"] for w, k, row in flat if (w, k) == (2, 2) and row["op"] == "all_reduce"
                 and row["bytes"] < PROBE)
    inter_lat = probe / ring_terms("all_reduce", 0, 2)[0]
    inter_bw = args.link_mbit * 1e6 / 8
    print(f"links: intra-node {intra_bw / 1e9:.2f} GB/s, {intra_lat * 1e6:.0f} us per hop (fitted on the one-node "
          f"rows); inter-node {inter_bw / 1e6:.1f} MB/s (tbf {args.link_mbit} Mbit/s), {inter_lat * 1e6:.0f} us per "
          "hop (4-byte all-reduce, 2 nodes)")
    print("\n| ranks | nodes | op | MB | measured s | predicted s | pred/meas | |")
    print("|---|---|---|---|---|---|---|---|")
    checked = []
    for w, k, row in flat:
        if row["bytes"] < PROBE:  # the latency probes: a few bytes, not a size the model is checked at
            continue
        links = Links(ranks=w, nodes=k, intra_bw=intra_bw, intra_lat=intra_lat, inter_bw=inter_bw,
                      inter_lat=inter_lat, backend="gloo")
        predicted = ring_time(row["op"], row["bytes"], links)
        ratio = predicted / row["seconds"]
        role = "fit" if k == 1 else ("ok" if abs(ratio - 1) <= COLLECTIVE_TOLERANCE else "MISS")
        if k > 1:
            checked.append(ratio)
        print(f"| {w} | {k} | {row['op']} | {row['bytes'] / 2**20:.0f} | {row['seconds']:.4f} | {predicted:.4f} | "
              f"{ratio:.2f} | {role} |")
    inside = sum(abs(r - 1) <= COLLECTIVE_TOLERANCE for r in checked)
    print(f"\nmulti-node rows within {COLLECTIVE_TOLERANCE:.0%}: {inside} of {len(checked)} "
          f"(pred/meas {min(checked):.2f}-{max(checked):.2f}, median {statistics.median(checked):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("collectives")
    c.add_argument("--link-mbit", type=int, default=400)
    c.add_argument("--reps", type=int, default=3)
    c.set_defaults(handler=collectives)
    args = parser.parse_args()
    args.handler(args)


if __name__ == "__main__":
    main()
