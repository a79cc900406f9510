"""The communication model (orchestrator/plan/comm.py) against a real multi-node cluster.

    .venv/bin/python bench/comm_check.py collectives [--link-mbit 400] [--reps 3]
    .venv/bin/python bench/comm_check.py calibrate [--link-mbit 400]
    .venv/bin/python bench/comm_check.py trials OUT_DIR [--link-mbit 100] [--engines deepspeed,fsdp]

Starts the test cluster shaped (tests/slurm/cluster.sh start --nodes 4 --cpus-per-node 4
--link-mbit R: four nodes in network namespaces, every node's link limited to R Mbit/s
both ways by tc tbf) and prints predicted beside measured.

collectives: all-reduce, reduce-scatter and all-gather over gloo at 1-16 MB, world sizes
2-4 on 1-4 nodes (srun, orchestrator/workload/collective_timing.py). The prediction is the ring model with
a hardware description of these links: inter-node bandwidth = the tbf rate, intra-node
bandwidth and latency fitted on the one-node rows, inter-node latency from a 4-byte
all-reduce across two nodes. Those rows are marked "fit"; the others are checked (15 %).

calibrate: `orchestrator calibrate --links` on 2 and 4 nodes, one rank each (as
tests/test_links_multinode.py runs it), and the fitted inter-node bus bandwidth against the
tbf rate (15 %). The test asserts only what load cannot move (the fit never above the
link); how close it comes is this benchmark's, run alone.

trials: whole `orchestrator run cluster=slurm` trials that are communication-bound (a
small model on a slow link), DeepSpeed's ZeRO 0-3 across reduce bucket sizes and FSDP2
resharding or keeping parameters, at dp 2 and 4 (one rank per node), planned with the same link
description (`hardware.inter_node.*`) and a fixed cost per collective fitted on two one-node trials
(`hardware.collective_overhead_us`). Prints the step time predicted / measured (25 %) and, per dp,
the ranking of bucket sizes both ways.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from orchestrator.plan.collectives import Level, Network, ring_steps, ring_time
from orchestrator.run.planning import plan_trial
from orchestrator.spec import build_spec

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "tests" / "slurm" / "cluster.sh"
LAYOUTS = [(2, 1), (4, 1), (2, 2), (4, 2), (3, 3), (4, 4)]  # (ranks, nodes), block placement
SIZES = [4, 2**20, 4 * 2**20, 16 * 2**20]  # the 4-byte one probes latency
PROBE = 2**16
OPS = ("all_reduce", "reduce_scatter", "all_gather")
COLLECTIVE_TOLERANCE, STEP_TOLERANCE = 0.15, 0.25


def start_cluster(link_mbit: int, cpus_per_node: int = 4) -> None:
    subprocess.run(
        [
            "bash",
            str(CLUSTER),
            "start",
            "--nodes",
            "4",
            "--cpus-per-node",
            str(cpus_per_node),
            "--link-mbit",
            str(link_mbit),
        ],
        check=True,
        timeout=600,
    )


def measure_collectives(reps: int) -> list[dict]:
    out = []
    for ranks, nodes in LAYOUTS:
        argv = [
            "srun",
            "--export=ALL,SUBMITIT_EXECUTOR=slurm",
            f"--nodes={nodes}",
            f"--ntasks={ranks}",
            f"--ntasks-per-node={math.ceil(ranks / nodes)}",
            "--cpus-per-task=1",
            sys.executable,
            "-m",
            "orchestrator.workload.collective_timing",
            ",".join(map(str, SIZES)),
            str(reps),
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
        if proc.returncode or not lines:
            raise RuntimeError(f"{ranks} ranks on {nodes} nodes failed:\n{proc.stderr[-2000:]}")
        out.append(json.loads(lines[-1]))
        print(f"  measured {ranks} ranks on {nodes} node(s)", file=sys.stderr)
    return out


def ring_terms(op: str, nbytes: float, n: int) -> tuple[float, float]:
    """(latency hops, bytes over the slowest link) of one gloo ring collective: t = hops*lat + bytes/bw."""
    steps = ring_steps(op, n, "gloo")
    return steps, steps * nbytes / n


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
    probe = next(
        row["seconds"] for w, k, row in flat if (w, k) == (2, 2) and row["op"] == "all_reduce" and row["bytes"] < PROBE
    )
    inter_lat = probe / ring_terms("all_reduce", 0, 2)[0]
    inter_bw = args.link_mbit * 1e6 / 8
    print(
        f"links: intra-node {intra_bw / 1e9:.2f} GB/s, {intra_lat * 1e6:.0f} us per hop (fitted on the one-node "
        f"rows); inter-node {inter_bw / 1e6:.1f} MB/s (tbf {args.link_mbit} Mbit/s), {inter_lat * 1e6:.0f} us per "
        "hop (4-byte all-reduce, 2 nodes)"
    )
    print("\n| ranks | nodes | op | MB | measured s | predicted s | pred/meas | |")
    print("|---|---|---|---|---|---|---|---|")
    checked = []
    for w, k, row in flat:
        if row["bytes"] < PROBE:  # the latency probes: a few bytes, not a size the model is checked at
            continue
        net = Network(
            ranks=w, nodes=k, intra=Level(intra_bw, intra_lat), inter=Level(inter_bw, inter_lat), backend="gloo"
        )
        predicted = ring_time(row["op"], row["bytes"], net)
        ratio = predicted / row["seconds"]
        role = "fit" if k == 1 else ("ok" if abs(ratio - 1) <= COLLECTIVE_TOLERANCE else "MISS")
        if k > 1:
            checked.append(ratio)
        print(
            f"| {w} | {k} | {row['op']} | {row['bytes'] / 2**20:.0f} | {row['seconds']:.4f} | {predicted:.4f} | "
            f"{ratio:.2f} | {role} |"
        )
    inside = sum(abs(r - 1) <= COLLECTIVE_TOLERANCE for r in checked)
    print(
        f"\nmulti-node rows within {COLLECTIVE_TOLERANCE:.0%}: {inside} of {len(checked)} "
        f"(pred/meas {min(checked):.2f}-{max(checked):.2f}, median {statistics.median(checked):.2f})"
    )


# A GPT-2 shape of 5.8M parameters in fp32 and 243 gradient tensors (24 layers), one
# sequence per rank: 23 MB of gradients against ~1 s of compute, so a 100 Mbit/s link
# makes the step communication-bound, and the bucket size decides how many collectives
# DeepSpeed issues (a bucket holds whole tensors: 3e3 elements gives one per tensor).
TRIAL_MODEL = [
    "model.n_layers=24",
    "model.hidden=128",
    "model.heads=4",
    "model.kv_heads=4",
    "model.ffn_hidden=512",
    "model.vocab=8192",
    "run.bf16=false",
    "batch.micro_batch_size=1",
]
TRIAL_RUN = [
    "cluster=slurm",
    "hardware=cpu",
    "cluster.cpus_per_task=1",
    "run.steps=5",
    "run.warmup_steps=2",
    "logger.mode=disabled",
    "cluster.wait=true",
]
STAGES_AT = 1e6  # the reduce bucket of the ZeRO 0-3 step-time points
BUCKETS = (3e3, 1e5, 1e6, 1e7)  # the dp x bucket sweep, at ZeRO-2
FIT_BUCKETS = (3e3, 1e7)  # one node, two ranks: the fixed cost per collective, from the most and fewest calls


def calibrate_links(args) -> None:
    import tempfile

    import yaml

    start_cluster(args.link_mbit, cpus_per_node=2)
    with tempfile.TemporaryDirectory() as conf:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "calibrate",
                "--links",
                "--hardware",
                "cpu",
                "--nodes",
                "2,4",
                "--ranks-per-node",
                "1",
                "--max-mb",
                "8",
                "--reps",
                "3",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "ORCHESTRATOR_USER_CONF": conf},
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        preset = yaml.safe_load((Path(conf) / "hardware" / "cpu-calibrated.yaml").read_text())
    fitted, shaped = preset["inter_node"]["busbw_gbps"], args.link_mbit / 8000
    ratio = fitted / shaped
    print(
        f"inter-node busbw fitted {fitted:.4f} GB/s, links shaped to {shaped:.4f} GB/s: {ratio:.2f} "
        + ("(within 15 %)" if abs(ratio - 1) <= COLLECTIVE_TOLERANCE else "(MISS)")
    )


def trial_points(engines: list[str]) -> list[tuple[str, int, float, int, int]]:
    """(engine, stage, reduce bucket, dp, ranks per node): DeepSpeed's ZeRO 0-3 at dp 2 and 4
    and ZeRO-2's dp x bucket sweep; FSDP2 with parameters kept (stage 2) and resharded
    (stage 3) at dp 2 and 4 (no bucket: FSDP2 communicates per block); all one rank per
    node. Then the fit points (DeepSpeed, two ranks on one node), which every run needs."""
    points = []
    if "deepspeed" in engines:
        points += [("deepspeed", stage, STAGES_AT, dp, 1) for stage in range(4) for dp in (2, 4)]
        points += [("deepspeed", 2, b, dp, 1) for b in BUCKETS for dp in (2, 4) if b != STAGES_AT]
    if "fsdp" in engines:
        points += [("fsdp", stage, 0.0, dp, 1) for stage in (2, 3) for dp in (2, 4)]
    return points + [("deepspeed", 2, b, 2, 2) for b in FIT_BUCKETS]


def inter_node_latency(reps: int = 5) -> float:
    """Seconds per ring step across nodes: a 4-byte all-reduce between two nodes."""
    proc = subprocess.run(
        [
            "srun",
            "--export=ALL,SUBMITIT_EXECUTOR=slurm",
            "--nodes=2",
            "--ntasks=2",
            "--cpus-per-task=1",
            sys.executable,
            "-m",
            "orchestrator.workload.collective_timing",
            "4",
            str(reps),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    rows = json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])["rows"]
    return next(r["seconds"] for r in rows if r["op"] == "all_reduce") / ring_terms("all_reduce", 0, 2)[0]


def planned(overrides: list[str], extra: list[str]) -> dict:
    """This code's plan of a trial (not the one at launch), with `extra` in place of the
    launch's values for the same keys."""
    keys = {e.split("=", 1)[0] for e in extra}
    return plan_trial(build_spec([o for o in overrides if o.split("=", 1)[0] not in keys] + extra)).as_dict()


def calls_per_step(plan: dict) -> int:
    return sum(c["calls"] for c in plan["comm"]["collectives"])


def run_trials(out: Path, links: list[str], engines: list[str]) -> list[dict]:
    rows = []
    for engine, stage, bucket, dp, per_node in trial_points(engines):
        name = f"z{stage}-b{bucket:.0e}" if engine == "deepspeed" else f"fsdp2-z{stage}"
        trial = out / f"{name}-dp{dp}-{per_node}pn"
        sharding = [f"zero.reduce_bucket_size={bucket:g}"] if engine == "deepspeed" else []
        if not (trial / "result.json").is_file():
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "orchestrator",
                    "run",
                    "--out",
                    str(trial),
                    *TRIAL_MODEL,
                    *TRIAL_RUN,
                    *links,
                    f"cluster.gpus_per_node={per_node}",
                    f"engine={engine}",
                    f"zero=stage{stage}",
                    *sharding,
                    f"parallel.dp={dp}",
                ],
                capture_output=True,
                timeout=1800,
            )
            print(f"  ran {trial.name}", file=sys.stderr)
        r = json.loads((trial / "result.json").read_text())
        timed = [h["step_time_s"] for h in (r.get("metrics") or {}).get("history", []) if h["timed"]]
        rows.append(
            {
                "engine": engine,
                "stage": stage,
                "bucket": bucket,
                "dp": dp,
                "per_node": per_node,
                "status": r["status"],
                "overrides": r["overrides"],
                "measured": (r.get("metrics") or {}).get("step_time_s"),
                "spread": statistics.pstdev(timed) / statistics.mean(timed) if len(timed) > 1 else 0.0,
            }
        )
    return rows


def fit_call_cost(fit: list[dict], links: list[str]) -> float:
    """Seconds per collective, from two ZeRO-2 trials on one node that differ only in
    bucket size: the measured difference the ring model does not explain, per extra call."""
    plans = [planned(x["overrides"], links + ["hardware.collective_overhead_us=0"]) for x in fit]
    extra = (fit[0]["measured"] - fit[1]["measured"]) - (plans[0]["time"]["step_s"] - plans[1]["time"]["step_s"])
    return max(extra / (calls_per_step(plans[0]) - calls_per_step(plans[1])), 0.0)


def trials(args) -> None:
    start_cluster(args.link_mbit)
    latency = inter_node_latency()
    links = [
        f"hardware.inter_node.busbw_gbps={args.link_mbit / 8000:g}",
        f"hardware.inter_node.latency_us={latency * 1e6:.0f}",
    ]
    rows = run_trials(Path(args.out), links, args.engines.split(","))
    fit = [x for x in rows if x["per_node"] == 2]
    call = fit_call_cost(fit, links)
    links.append(f"hardware.collective_overhead_us={call * 1e6:.0f}")
    print(
        f"links: inter-node {args.link_mbit / 8:.1f} MB/s (tbf {args.link_mbit} Mbit/s), {latency * 1e6:.0f} us per "
        f"ring step (4-byte all-reduce, 2 nodes); {call * 1e3:.2f} ms per collective (fitted: ZeRO-2, two ranks on "
        f"one node, buckets {FIT_BUCKETS[0]:.0e} against {FIT_BUCKETS[1]:.0e})"
    )
    for x in rows:
        plan = planned(x["overrides"], links)
        x.update(predicted=plan["time"]["step_s"], exposed=plan["time"]["exposed_comm_s"], calls=calls_per_step(plan))
    print(
        "\n| engine | ZeRO | reduce bucket | dp | nodes | collectives per step | measured step s | predicted s | "
        "of which comm exposed | pred/meas | |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for x in rows:
        ratio = x["predicted"] / x["measured"] if x["measured"] else float("nan")
        verdict = "fit" if x["per_node"] == 2 else "ok" if abs(ratio - 1) <= STEP_TOLERANCE else "MISS"
        if x["per_node"] == 1:
            ratios.append(ratio)
        bucket = f"{x['bucket']:.0e}" if x["engine"] == "deepspeed" else "per block"
        print(
            f"| {x['engine']} | {x['stage']} | {bucket} | {x['dp']} | {x['dp'] // x['per_node']} | {x['calls']} | "
            f"{x['measured'] or float('nan'):.3f} | {x['predicted']:.3f} | {x['exposed']:.3f} | {ratio:.2f} | "
            f"{verdict} |"
        )
    good = [r for r in ratios if r == r]
    print(
        f"\nmulti-node step time within {STEP_TOLERANCE:.0%}: {sum(abs(r - 1) <= STEP_TOLERANCE for r in good)} of "
        f"{len(ratios)} (pred/meas {min(good):.2f}-{max(good):.2f})"
    )
    # Two bucket sizes whose measured steps differ by less than twice the step-to-step
    # spread of these trials are a tie: measurement cannot order them.
    tie = 2 * statistics.median(x["spread"] for x in rows)
    print(
        f"step-to-step spread (std/mean of the timed steps), median {tie / 2:.1%}: differences under {tie:.1%} are ties"
    )
    for dp in (2, 4):
        sweep = [
            x for x in rows if x["engine"] == "deepspeed" and x["stage"] == 2 and x["dp"] == dp and x["per_node"] == 1
        ]
        if len(sweep) > 1:
            print_ranking(f"ZeRO-2 dp {dp}", sweep, tie)


def print_ranking(title: str, sweep: list[dict], tie: float) -> None:
    by = {k: [f"{x['bucket']:.0e}" for x in sorted(sweep, key=lambda x: x[k])] for k in ("measured", "predicted")}
    disagree, ties = [], []
    for a in sweep:
        for b in sweep:
            if a["measured"] < b["measured"]:
                pair = f"{a['bucket']:.0e}/{b['bucket']:.0e}"
                if b["measured"] / a["measured"] - 1 < tie:
                    ties.append(pair)
                elif a["predicted"] > b["predicted"]:
                    disagree.append(pair)
    print(
        f"{title}, buckets fastest first: measured {' < '.join(by['measured'])}; predicted "
        f"{' < '.join(by['predicted'])}; pairs ordered differently: {', '.join(disagree) or 'none'}"
        f" (ties: {', '.join(ties) or 'none'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("collectives")
    c.add_argument("--link-mbit", type=int, default=400)
    c.add_argument("--reps", type=int, default=3)
    c.set_defaults(handler=collectives)
    k = sub.add_parser("calibrate")
    k.add_argument("--link-mbit", type=int, default=400)
    k.set_defaults(handler=calibrate_links)
    t = sub.add_parser("trials")
    t.add_argument("out", metavar="OUT_DIR", help="trial directories (trials already there are not run again)")
    t.add_argument("--link-mbit", type=int, default=100)
    t.add_argument("--engines", default="deepspeed,fsdp", help="deepspeed, fsdp or both (comma-separated)")
    t.set_defaults(handler=trials)
    args = parser.parse_args()
    args.handler(args)


if __name__ == "__main__":
    main()
