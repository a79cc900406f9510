"""`orchestrator tune` against the exhaustive sweep of the same space, on this machine.

    .venv/bin/python bench/tune_check.py [OUT_DIR] [--trials 6]

The space: ZeRO 0-3 x micro batch 1, 2, 4 x recompute none / full (24 points) for a GPT-2
shape large enough that the choice matters on a CPU (hidden 256, 4 layers, vocabulary
8192, 2 ranks). OUT_DIR/exhaustive runs every point (`orchestrator run -m`, skipped when
it is already there); OUT_DIR/tune runs `orchestrator tune` over the same space with a
budget of --trials (25 % of the points by default). Prints both wall-clock times, the
exhaustive best, tune's pick and its measured tokens/s/GPU as a share of the best.
Target (the tune issue): within 10 % of the best while running at most 25 % of the points.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

SHAPE = [
    "model.n_layers=4",
    "model.hidden=256",
    "model.heads=4",
    "model.kv_heads=4",
    "model.ffn_hidden=1024",
    "model.vocab=8192",
    "logger.mode=disabled",
    "run.steps=5",
    "run.warmup_steps=2",
    "parallel.dp=2",
    "zero.reduce_bucket_size=1e6",
    "zero.allgather_bucket_size=1e6",
    "zero.prefetch_bucket_size=1e6",
    "zero.offload_optimizer=none",
]
AXES = ["zero=stage0,stage1,stage2,stage3", "batch.micro_batch_size=1,2,4", "recompute=none,full"]


def orchestrator(*args: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "orchestrator", *args], check=False, capture_output=True)
    return time.perf_counter() - start


def measured(directory: Path) -> dict[str, float]:
    found = {}
    for result in directory.glob("*/result.json"):
        r = json.loads(result.read_text())
        if r["status"] == "ok":
            choice = r["choices"]
            found[
                f"zero={choice['zero']} micro={r['config']['batch']['micro_batch_size']} "
                f"recompute={choice['recompute']}"
            ] = r["metrics"]["tokens_per_sec_per_gpu"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=Path("bench-runs/tune"), type=Path)
    parser.add_argument("--trials", type=int, default=6)
    args = parser.parse_args()
    exhaustive, tune = args.out / "exhaustive", args.out / "tune"
    if not exhaustive.is_dir():
        seconds = orchestrator("run", "-m", "--out", str(exhaustive), *SHAPE, *AXES)
        (args.out / "exhaustive_s.txt").write_text(f"{seconds:.1f}\n")
    exhaustive_s = float((args.out / "exhaustive_s.txt").read_text())
    tune_s = orchestrator("tune", "--out", str(tune), "--overwrite", "--trials", str(args.trials), *SHAPE, *AXES)
    everything = measured(exhaustive)
    best = max(everything, key=everything.get)
    state = json.loads((tune / "tune.json").read_text())
    pick = state["winner"]["overrides"]
    key = (
        f"zero={next(o for o in pick if o.startswith('zero=')).split('=')[1]} "
        f"micro={next(o for o in pick if o.startswith('batch.micro')).split('=')[1]} "
        f"recompute={next(o for o in pick if o.startswith('recompute=')).split('=')[1]}"
    )
    print(
        f"exhaustive: {len(everything)} of 24 points ok in {exhaustive_s:.0f} s; best {best}: "
        f"{everything[best]:,.0f} tokens/s/GPU"
    )
    for name, value in sorted(everything.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<40} {value:>8,.0f}")
    print(f"tune: {state['ran']} points run ({state['ran'] / 24:.0%}) in {tune_s:.0f} s; stopped: {state['stopped']}")
    print(
        f"tune's pick {key}: {state['winner']['measured_tokens_per_sec_per_gpu']:,.0f} tokens/s/GPU as tune "
        f"measured it, {everything.get(key, float('nan')):,.0f} in the exhaustive sweep = "
        f"{everything.get(key, float('nan')) / everything[best]:.1%} of the best (target >= 90 %)"
    )


if __name__ == "__main__":
    main()
