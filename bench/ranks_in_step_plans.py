"""The same trials planned with their kernels timed alone and with the node's other ranks in
step, alternating, each plan with a kernel cache of its own (the CPU's peak and the engine's
lines kept): how far timing in step moves a plan, beside how far two timings of one kind differ.

    .venv/bin/python bench/ranks_in_step_plans.py [--rounds 3] [--only NAME,...]

Prints each plan's step and the median of each kind per trial; divide by a trial's measured
step (bench/compute_check.py) for its ratio. Run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compute_check import TRIALS  # noqa: E402

from orchestrator import hardware, ranks_in_step  # noqa: E402
from orchestrator.kernel_cache import Cache  # noqa: E402
from orchestrator.plan.planner import make_plan  # noqa: E402
from orchestrator.spec import build_spec  # noqa: E402

DP2 = ["default", "gpt2-h256-dp2", "llama-h256-dp2", "llama-h256-fsdp2-dp2", "gpt2-h256-zero3-dp2"]
# bench/memory_matrix.py's 128k-vocabulary Llama at dp 2 (stage 0, no recompute), whose
# lm_head's 33 MB output outgrows a 32 MB L3 (its dp 2 steps took 1.4-1.9x their plan there)
TRIALS = {**TRIALS, "llama-128k-dp2": ["model=llama3-8b", "model.n_layers=4", "model.hidden=64", "model.heads=4",
                                       "model.kv_heads=2", "model.ffn_hidden=192", "model.seq_len=128",
                                       "model.max_positions=128", "batch.micro_batch_size=1", "parallel.dp=2",
                                       "zero.reduce_bucket_size=1e6"]}


def fresh_cache(kept: Path, into: Path) -> None:
    """A cache folder holding only what is timed once per machine (the CPU's peak and
    bandwidth) and the engines' lines: every kernel is timed again."""
    shutil.rmtree(into, ignore_errors=True)
    (into / "orchestrator").mkdir(parents=True)
    for f in kept.glob("*.json"):
        if f.name != "kernels.json":
            shutil.copy(f, into / "orchestrator" / f.name)
    known = json.loads((kept / "kernels.json").read_text()) if (kept / "kernels.json").is_file() else {}
    engine = {k: v for k, v in known.items() if "|engine " in k}
    (into / "orchestrator" / "kernels.json").write_text(json.dumps(engine))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=",".join(DP2), help=f"of {', '.join(TRIALS)}")
    args = parser.parse_args()
    kept = hardware.cache_dir()
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions" / "py311_cpu"))
    real_copies = ranks_in_step.copies
    steps: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_CACHE_HOME"] = tmp
        for r in range(args.rounds):
            for name in args.only.split(","):
                for kind in ("alone", "in step"):
                    ranks_in_step.copies = real_copies if kind == "in step" else (lambda ranks, threads: 1)
                    fresh_cache(kept, Path(tmp))
                    Cache._known = None
                    plan = make_plan(build_spec(["hardware=cpu", "logger.mode=disabled", *TRIALS[name]]))
                    steps.setdefault((name, kind), []).append(plan.time.step_s)
                    print(f"round {r + 1} {name:>22} {kind:>8}: {plan.time.step_s:.4g} s  ({plan.sources['compute'][-80:]})",
                          flush=True)
    print("\n| trial | planned alone (median) | planned in step (median) | in step / alone |\n|---|---|---|---:|")
    for name in args.only.split(","):
        a, t = steps[name, "alone"], steps[name, "in step"]
        print(f"| {name} | {', '.join(f'{x:.4g}' for x in a)} ({statistics.median(a):.4g}) | "
              f"{', '.join(f'{x:.4g}' for x in t)} ({statistics.median(t):.4g}) | "
              f"{statistics.median(t) / statistics.median(a):.2f} |")


if __name__ == "__main__":
    main()
