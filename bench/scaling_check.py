"""The plan against a data-parallel sweep where communication is exposed: the 1B rows of the
Ultra-Scale Playbook (bench/data/ultrascale-1b.csv; nanotron, 8 x H100 per node over EFA,
a global batch of 256 x 4,096 tokens in every row).

    .venv/bin/python bench/scaling_check.py [--csv PATH]

Each row is planned with the settings those runs used (bench/published.py: ultrascale_overrides).
pytest holds the same rows to their floors (tests/test_published_accuracy.py); this script
prints them whole and runs the calibration through the command itself.

It prints four tables, nothing of the network fitted on these rows:
(1) `hardware=h100-p5 hardware.network=bench/data/network/ultrascale-cluster.csv`: the runs'
    cluster as it measured itself (the playbook's 256 MB collectives per node count, carried
    to every size by p5's nccl-tests curves: bench/network_tables.py);
(2) `hardware=h100-p5` as shipped: p5's published nccl-tests;
(3) `hardware=h100-sxm` as shipped: InfiniBand NDR levels, no table (the model before tables);
(4) `orchestrator calibrate --csv` on the dp 8-32 rows on the runs' own network (1), then the
    dp 64-256 rows planned with the calibrated preset: the held-out check of calibration.
Rows without a measurement are the runs that crashed or ran out of memory; the tables say
which of them the plan refuses. The bucket-size question is bench/buckets.py's. `--csv` checks
another set of rows (a held-out one) the same way.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from published import CLUSTER, DATA, ultrascale_overrides

from orchestrator.hydra_glue.conf_tree import Source, use_source
from orchestrator.run.planning import plan_trial
from orchestrator.spec import build_spec

CSV = DATA / "ultrascale-1b.csv"
TOLERANCE = 0.20
ON_ITS_NETWORK = (f"hardware.network={CLUSTER}",)


def overrides(row: dict, hardware: str = "h100-sxm") -> list[str]:
    return list(ultrascale_overrides(int(row["dp"]), int(row["zero_stage"]), int(row["micro_batch"]), hardware))


def plan_row(row: dict, hardware: str = "h100-sxm", extra: tuple[str, ...] = ()):
    return plan_trial(build_spec(overrides(row, hardware) + list(extra)))


def table(
    title: str,
    rows: list[dict],
    hardware: str = "h100-sxm",
    extra: tuple[str, ...] = (),
    fitted_on: int = 0,
    tolerance: float = TOLERANCE,
) -> dict:
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
            note = "crashed or OOM in the runs; plan: " + (
                "fits" if plan.fits else f"refuses ({plan.memory.total / 2**30:.1f} GiB)"
            )
            shown = f"- | {predicted:,.0f} | -"
        print(
            f"| {row['dp']} | {row['zero_stage']} | {row['micro_batch']} | {shown} | "
            f"{plan.time.exposed_comm_s:.3f} | {note} |"
        )
    checked = [r for (dp, *_), r in ratios.items() if dp > fitted_on]
    within = sum(abs(r - 1) <= tolerance for r in checked)
    print(f"\nwithin +-{tolerance:.0%}: {within} of {len(checked)} measured rows" + (" held out" if fitted_on else ""))
    scaling(rows, ratios)
    return ratios


def scaling(rows: list[dict], ratios: dict) -> None:
    """dp 256 against dp 8 (micro batch 1), measured and predicted, per ZeRO stage."""
    for stage in (0, 1):
        measured = {
            int(r["dp"]): float(r["tokens_per_sec_per_gpu"])
            for r in rows
            if int(r["zero_stage"]) == stage and r["micro_batch"] == "1" and r["tokens_per_sec_per_gpu"]
        }
        if 8 in measured and 256 in measured:
            m = measured[256] / measured[8]
            p = m * ratios[(256, stage, 1)] / ratios[(8, stage, 1)]
            print(f"ZeRO-{stage}: dp 256 / dp 8 measured {m:.2f}, predicted {p:.2f} ({p / m:.2f} of it)")


def held_out(rows: list[dict]) -> None:
    """Calibrate on the dp 8-32 rows through `orchestrator calibrate --csv`, on the runs' own
    network, then check dp 64-256 with the calibrated preset."""
    train = [r for r in rows if int(r["dp"]) <= 32 and r["tokens_per_sec_per_gpu"]]
    as_row = lambda r: dict(o.split("=", 1) for o in overrides(r, "h100-p5") + list(ON_ITS_NETWORK))  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dp8-32.csv"
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=[*as_row(train[0]), "tokens_per_sec_per_gpu"])
            writer.writeheader()
            writer.writerows({**as_row(r), "tokens_per_sec_per_gpu": r["tokens_per_sec_per_gpu"]} for r in train)
        env = {**os.environ, "ORCHESTRATOR_USER_CONF": str(Path(tmp) / "conf")}
        proc = subprocess.run(
            [sys.executable, "-m", "orchestrator", "calibrate", "--csv", str(path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if proc.returncode:
            raise SystemExit(proc.stderr)
        fitted = proc.stdout[proc.stdout.index("fitted:") : proc.stdout.index("wrote")]
        print("\n" + " ".join(fitted.split()))
        os.environ["ORCHESTRATOR_USER_CONF"] = env["ORCHESTRATOR_USER_CONF"]
        use_source(Source())  # the user's presets, the calibrated one among them
        table(
            "(4) calibrated on the 6 measured dp 8-32 rows (fit), on the runs' own network; the dp 64-256 rows "
            "held out",
            rows,
            hardware="h100-p5-calibrated",
            extra=ON_ITS_NETWORK,
            fitted_on=32,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=CSV)
    args = parser.parse_args()
    rows = list(csv.DictReader(args.csv.open()))
    table(
        "(1) h100-p5 with the runs' cluster as it measured itself (bench/data/network/ultrascale-cluster.csv)",
        rows,
        hardware="h100-p5",
        extra=ON_ITS_NETWORK,
    )
    table(
        "(2) h100-p5 as shipped: p5's published nccl-tests (conf/hardware/h100-p5.network.csv)",
        rows,
        hardware="h100-p5",
    )
    table("(3) h100-sxm as shipped: InfiniBand NDR levels, no table", rows)
    held_out(rows)


if __name__ == "__main__":
    main()
