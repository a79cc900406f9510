"""The plan against a data-parallel sweep where communication is exposed: the 1B rows of the
Ultra-Scale Playbook (bench/data/ultrascale-1b.csv; nanotron, 8 x H100 per node over EFA,
a global batch of 256 x 4,096 tokens in every row).

    .venv/bin/python bench/scaling_check.py [--csv PATH]

Each row is planned with the settings those runs used: gradients reduced in fp32
(zero.communication_dtype=fp32), 25 MB buckets (6.25M fp32 elements to reduce, 12.5M bf16
to gather), no recompute. ZeRO-0 rows are planned as DDP (engine=accelerate, zero.stage=0:
buckets all-reduced during the last backward, as nanotron does); DeepSpeed's own stage 0
reduces in fixed 5e8-element buckets after the backward and cannot be set that way.
ZeRO-1 rows are DeepSpeed's stage 1.

It prints four tables, nothing of the network fitted on these rows:
(1) `hardware=h100-p5 hardware.network=bench/data/network/ultrascale-cluster.csv`: the runs'
    cluster as it measured itself (the playbook's 256 MB collectives per node count, carried
    to every size by p5's nccl-tests curves: bench/network_tables.py);
(2) `hardware=h100-p5` as shipped: p5's published nccl-tests;
(3) `hardware=h100-sxm` as shipped: InfiniBand NDR levels, no table (the model before tables);
(4) `orchestrator calibrate --csv` on the dp 8-32 rows, then the dp 64-256 rows planned with
    the calibrated preset: the held-out check of calibration.
Rows without a measurement are the runs that crashed or ran out of memory; the tables say
which of them the plan refuses. `--csv` checks another set of rows (a held-out one) the same way.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from orchestrator.conf_tree import Source, use_source
from orchestrator.plan.planner import make_plan
from orchestrator.plots import BucketPoint, bucket_plot
from orchestrator.spec import build_spec

CSV = Path(__file__).resolve().parent / "data" / "ultrascale-1b.csv"
CLUSTER = Path(__file__).resolve().parent / "data" / "network" / "ultrascale-cluster.csv"
MODEL = {"model": "llama3-8b", "model.n_layers": 16, "model.hidden": 2048, "model.heads": 32, "model.kv_heads": 32,
         "model.ffn_hidden": 8192, "model.vocab": 131072, "model.tie_embeddings": "true", "model.seq_len": 4096,
         "model.max_positions": 4096}
RUNS = {"cluster": "slurm", "cluster.gpus_per_node": 8, "batch.global_batch_size": 256, "recompute": "none",
        "logger.mode": "disabled", "zero.reduce_bucket_size": 6_250_000, "zero.allgather_bucket_size": 12_500_000,
        "zero.communication_dtype": "fp32"}
TOLERANCE, HELD_OUT_TOLERANCE = 0.20, 0.15
FIGURE = Path(__file__).resolve().parent / "figures" / "buckets-1b.png"
BUCKETS = (1_000_000, 3_125_000, 6_250_000, 12_500_000, 25_000_000, 50_000_000, 100_000_000, 250_000_000, 500_000_000)


def overrides(row: dict, hardware: str = "h100-sxm") -> dict:
    stage = int(row["zero_stage"])
    engine = {"engine": "accelerate", "engine.backend": "fsdp"} if stage == 0 else {"engine": "deepspeed"}
    return {**MODEL, **RUNS, **engine, "hardware": hardware, "zero": f"stage{stage}", "parallel.dp": row["dp"],
            "batch.micro_batch_size": row["micro_batch"]}


def plan_row(row: dict, hardware: str = "h100-sxm", extra: tuple[str, ...] = ()):
    return make_plan(build_spec([f"{k}={v}" for k, v in overrides(row, hardware).items()] + list(extra)))


def table(title: str, rows: list[dict], hardware: str = "h100-sxm", extra: tuple[str, ...] = (),
          fitted_on: int = 0, tolerance: float = TOLERANCE) -> dict:
    """Plan every row; pred/meas per measured row. fitted_on: rows of dp up to this were the
    fit's (shown, not counted)."""
    print(f"\n{title}\n\n| dp | ZeRO | micro | measured tok/s/GPU | predicted | pred/meas | exposed comm s | |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    ratios = {}
    for row in rows:
        plan = plan_row(row, hardware, extra)
        predicted, measured = plan.time.tokens_per_sec_per_gpu, row["tokens_per_sec_per_gpu"]
        if measured:
            ratio = predicted / float(measured)
            ratios[(int(row["dp"]), int(row["zero_stage"]), int(row["micro_batch"]))] = ratio
            note = "fit" if int(row["dp"]) <= fitted_on else "ok" if abs(ratio - 1) <= tolerance else "MISS"
            shown = f"{float(measured):,.0f} | {predicted:,.0f} | {ratio:.2f}"
        else:
            note = "crashed or OOM in the runs; plan: " + ("fits" if plan.fits else
                                                            f"refuses ({plan.memory.total / 2**30:.1f} GiB)")
            shown = f"- | {predicted:,.0f} | -"
        print(f"| {row['dp']} | {row['zero_stage']} | {row['micro_batch']} | {shown} | "
              f"{plan.time.exposed_comm_s:.3f} | {note} |")
    checked = [r for (dp, *_), r in ratios.items() if dp > fitted_on]
    within = sum(abs(r - 1) <= tolerance for r in checked)
    print(f"\nwithin +-{tolerance:.0%}: {within} of {len(checked)} measured rows" + (" held out" if fitted_on else ""))
    scaling(rows, ratios)
    return ratios


def scaling(rows: list[dict], ratios: dict) -> None:
    """dp 256 against dp 8 (micro batch 1), measured and predicted, per ZeRO stage."""
    for stage in (0, 1):
        measured = {int(r["dp"]): float(r["tokens_per_sec_per_gpu"]) for r in rows
                    if int(r["zero_stage"]) == stage and r["micro_batch"] == "1" and r["tokens_per_sec_per_gpu"]}
        if 8 in measured and 256 in measured:
            m = measured[256] / measured[8]
            p = m * ratios[(256, stage, 1)] / ratios[(8, stage, 1)]
            print(f"ZeRO-{stage}: dp 256 / dp 8 measured {m:.2f}, predicted {p:.2f} ({p / m:.2f} of it)")


def bucket_question(figure: Path) -> None:
    """Where larger gradient buckets stop paying: the 1B model as DDP with one micro batch of
    one sequence per GPU and step (nothing else to hide the reduction behind) on 1, 4 and 32
    nodes of h100-p5, predicted step time per bucket size (and the plot report draws)."""
    print("\n(5) the bucket-size question: 1B, ZeRO-0 as DDP, one micro batch of 1 per GPU and step, fp32 "
          "gradients, h100-p5: step time (s) by zero.reduce_bucket_size (elements)\n")
    print("| nodes | " + " | ".join(f"{b / 1e6:g}M" for b in BUCKETS) + " | smallest within 1 % of the best |")
    print("|---:|" + "---:|" * (len(BUCKETS) + 1))
    points = []
    for dp in (8, 32, 256):
        row = {"dp": dp, "zero_stage": 0, "micro_batch": 1}
        steps = [plan_row(row, "h100-p5", (f"zero.reduce_bucket_size={b}", f"batch.global_batch_size={dp}")).time.step_s
                 for b in BUCKETS]
        points += [BucketPoint(dp // 8, b, s) for b, s in zip(BUCKETS, steps)]
        best = next(b for b, s in zip(BUCKETS, steps) if s <= 1.01 * min(steps))
        print(f"| {dp // 8} | " + " | ".join(f"{s:.4f}" for s in steps) + f" | {best / 1e6:g}M |")
    bucket_plot(points, figure, "1B, DDP, micro batch 1, h100-p5 (predicted)")
    print(f"\nplot: {figure}")


def held_out(rows: list[dict]) -> None:
    """Calibrate on the dp 8-32 rows through `orchestrator calibrate --csv`, check dp 64-256."""
    train = [r for r in rows if int(r["dp"]) <= 32 and r["tokens_per_sec_per_gpu"]]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dp8-32.csv"
        with path.open("w", newline="") as f:
            columns = [*overrides(train[0]), "tokens_per_sec_per_gpu"]
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows({**overrides(r), "tokens_per_sec_per_gpu": r["tokens_per_sec_per_gpu"]} for r in train)
        env = {**os.environ, "ORCHESTRATOR_USER_CONF": str(Path(tmp) / "conf")}
        proc = subprocess.run([sys.executable, "-m", "orchestrator", "calibrate", "--csv", str(path)], env=env,
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode:
            raise SystemExit(proc.stderr)
        fitted = proc.stdout[proc.stdout.index("fitted:"):proc.stdout.index("wrote")]
        print("\n" + " ".join(fitted.split()))
        os.environ["ORCHESTRATOR_USER_CONF"] = env["ORCHESTRATOR_USER_CONF"]
        use_source(Source())  # the user's presets, the calibrated one among them
        table("(4) calibrated on the 6 measured dp 8-32 rows (fit); the dp 64-256 rows held out", rows,
              hardware="h100-sxm-calibrated", fitted_on=32, tolerance=HELD_OUT_TOLERANCE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=CSV)
    args = parser.parse_args()
    rows = list(csv.DictReader(args.csv.open()))
    table("(1) h100-p5 with the runs' cluster as it measured itself (bench/data/network/ultrascale-cluster.csv)",
          rows, hardware="h100-p5", extra=(f"hardware.network={CLUSTER}",))
    table("(2) h100-p5 as shipped: p5's published nccl-tests (conf/hardware/h100-p5.network.csv)", rows,
          hardware="h100-p5")
    table("(3) h100-sxm as shipped: InfiniBand NDR levels, no table", rows)
    bucket_question(FIGURE)
    held_out(rows)


if __name__ == "__main__":
    main()
