"""Where larger gradient buckets stop paying, on GPUs: a 1B and an 8B data-parallel trial
on 1, 4 and 32 nodes of each EFA and InfiniBand preset, planned at every bucket size.

    .venv/bin/python bench/buckets.py [--plot PATH]

Each trial has one micro batch of one sequence per GPU and step, so the gradient reduction
has only the last backward to hide behind. The 1B is the Ultra-Scale model as those runs
ran it (DDP, fp32 gradients on the wire, nanotron's fused kernels as run.compile=true); the
8B is Llama 3 8B at sequence 4,096 under DeepSpeed ZeRO-1 with bf16 gradients and full
recompute (as DDP it does not fit). A bucket size is "the same as the best" when its plan
is within the plan's own error of the best one (HELD_OUT_ERROR: the median miss on
published rows no preset was fitted on): the plan cannot rank those, and says so.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from published import ultrascale_overrides

from orchestrator.analysis.plots import BucketPoint, bucket_plot
from orchestrator.plan.prediction import HELD_OUT_ERROR
from orchestrator.run.planning import plan_trial
from orchestrator.spec import build_spec

BUCKETS = (1_000_000, 5_000_000, 25_000_000, 50_000_000, 100_000_000, 500_000_000)  # zero.reduce_bucket_size
NODES = (1, 4, 32)
PRESETS = ("h100-p5", "h100-sxm")  # EFA with its measured table; InfiniBand NDR from NCCL's model
FIGURE = Path(__file__).resolve().parent / "figures" / "buckets-1b.png"


def trial(model: str, hardware: str, nodes: int, bucket: int) -> list[str]:
    dp = 8 * nodes
    if model == "1B":
        base = list(ultrascale_overrides(dp, 0, 1, hardware))
    else:
        base = [
            "model=llama3-8b",
            "model.seq_len=4096",
            "model.max_positions=4096",
            f"hardware={hardware}",
            "cluster=slurm",
            "cluster.gpus_per_node=8",
            "engine=deepspeed",
            "zero=stage1",
            "recompute=full",
            f"parallel.dp={dp}",
            "batch.micro_batch_size=1",
            "logger.mode=disabled",
        ]
    return [*base, f"batch.global_batch_size={dp}", f"zero.reduce_bucket_size={bucket}"]


def plans(model: str, hardware: str, nodes: int) -> list:
    return [plan_trial(build_spec(trial(model, hardware, nodes, b))) for b in BUCKETS]


def steps(model: str, hardware: str, nodes: int) -> list[float]:
    return [p.time.step_s for p in plans(model, hardware, nodes)]


def smallest_as_good(line: list[float]) -> int:
    """The smallest bucket whose step is within the plan's error of the best."""
    return next(b for b, s in zip(BUCKETS, line) if s <= (1 + HELD_OUT_ERROR) * min(line))


def table() -> str:
    lines = [
        "| preset | model | nodes | "
        + " | ".join(f"{b / 1e6:g}M" for b in BUCKETS)
        + f" | smallest within {HELD_OUT_ERROR:.0%} of the best |",
        "|---|---|---:|" + "---:|" * (len(BUCKETS) + 1),
    ]
    for hardware in PRESETS:
        for model in ("1B", "8B"):
            for nodes in NODES:
                line = steps(model, hardware, nodes)
                lines.append(
                    f"| {hardware} | {model} | {nodes} | "
                    + " | ".join(f"{s:.4f}" for s in line)
                    + f" | {smallest_as_good(line) / 1e6:g}M |"
                )
    return "\n".join(lines) + "\n"


def plot(path: Path) -> Path:
    points = [
        BucketPoint(f"{n} node(s)", b, p.time.step_s, predicted_exposed_s=p.comm.exposed_s)
        for n in NODES
        for b, p in zip(BUCKETS, plans("1B", "h100-p5", n))
    ]
    return bucket_plot(points, path, "1B, DDP, micro batch 1, h100-p5 (predicted)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", type=Path, default=FIGURE)
    args = parser.parse_args()
    print("step time (s) by zero.reduce_bucket_size (elements), predicted\n")
    print(table())
    print(f"plot: {plot(args.plot)}")


if __name__ == "__main__":
    main()
