"""The plan's step time against measured steps on this machine, uncalibrated: the trials of
issue 38 (small shapes, where what happens between kernels is a large part of the step).

    .venv/bin/python bench/compute_check.py OUT [--runs 3] [--only NAME,...] [--fresh-cache]
                                                [--hardware auto] [--summary FILE.json]

Each trial runs `--runs` times through `orchestrator run` (hardware=cpu: kernels timed on
this machine, nothing fitted; `--hardware auto` on a GPU node: the GPU's kernels timed
there); the measured step is the median of the runs' median timed steps, the prediction
the plan each trial made before launch. `--summary` writes each trial's measured steps and
its plan's time breakdown to one JSON file (what a GPU node sends back). Run it alone: anything
beside it slows the measured steps (up to 1.6x) and, with an empty kernel cache, the
timed kernels. `--fresh-cache` times every kernel again (a cache of its own under OUT).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

COMMON = ["logger.mode=disabled", "run.steps=10", "run.warmup_steps=3"]
SMALL = [
    "model.hidden=256",
    "model.heads=4",
    "model.kv_heads=4",
    "model.ffn_hidden=1024",
    "model.n_layers=4",
    "model.seq_len=256",
    "model.max_positions=256",
    "model.vocab=8192",
    "batch.micro_batch_size=2",
]
TRIALS = {
    "default": [],
    "gpt2-h256-dp1": ["model=tiny", *SMALL, "parallel.dp=1"],
    "gpt2-h256-dp2": ["model=tiny", *SMALL, "parallel.dp=2"],
    "llama-h256-dp1": ["model=tiny", "model.arch=llama", *SMALL, "parallel.dp=1"],
    "llama-h256-dp2": ["model=tiny", "model.arch=llama", *SMALL, "parallel.dp=2"],
    "gpt2-h512-dp1": [
        "model=tiny",
        *SMALL,
        "model.hidden=512",
        "model.heads=8",
        "model.kv_heads=8",
        "model.ffn_hidden=2048",
        "parallel.dp=1",
    ],
    "llama-h1024-dp1": [
        "model=tiny",
        "model.arch=llama",
        *SMALL,
        "model.hidden=1024",
        "model.heads=16",
        "model.kv_heads=16",
        "model.ffn_hidden=2816",
        "model.n_layers=2",
        "batch.micro_batch_size=1",
        "parallel.dp=1",
    ],
    "llama-h256-fsdp2-dp2": ["model=tiny", "model.arch=llama", *SMALL, "engine=fsdp", "zero=stage3", "parallel.dp=2"],
    "gpt2-h256-zero3-dp2": ["model=tiny", *SMALL, "zero=stage3", "parallel.dp=2"],
}
# Run only when named (--only): one GPU holds one rank, and the larger model is a GPU's shape.
ONE_DEVICE = {
    "llama-h256-fsdp2-dp1": [*TRIALS["llama-h256-fsdp2-dp2"][:-1], "parallel.dp=1"],
    "gpt2-h256-zero3-dp1": [*TRIALS["gpt2-h256-zero3-dp2"][:-1], "parallel.dp=1"],
    "gpt2-125m-mb8-dp1": ["model=gpt2-125m", "batch.micro_batch_size=8", "parallel.dp=1"],
}
TOLERANCE = 0.20


def run(out: Path, name: str, overrides: list[str], env: dict, hardware: str) -> dict | None:
    trial = out / name
    if not (trial / "result.json").is_file():
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "run",
                "--out",
                str(trial),
                f"hardware={hardware}",
                *COMMON,
                *overrides,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )
        if proc.returncode:
            print(f"{name}: exit {proc.returncode}: {proc.stderr.strip()[-600:]}", file=sys.stderr)
    try:
        result = json.loads((trial / "result.json").read_text())
    except (OSError, ValueError):
        return None
    return result if result.get("status") == "ok" else None


def compute_lines(plan: dict) -> str:
    t = plan["time"]
    parts = t.get("micro_batch") or {}
    shown = ", ".join(f"{k} {v:.4g}" for k, v in parts.items() if isinstance(v, (int, float)))
    return shown or f"compute {t['compute_s']:.4g}, optimizer {t['optimizer_s']:.4g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default="")
    parser.add_argument("--fresh-cache", action="store_true")
    parser.add_argument("--hardware", default="cpu")
    parser.add_argument("--summary", type=Path)
    args = parser.parse_args()
    summary = {}
    env = {**os.environ, **({"XDG_CACHE_HOME": str(args.out / "cache")} if args.fresh_cache else {})}
    trials = {**TRIALS, **ONE_DEVICE}
    names = [n for n in trials if n in args.only.split(",")] if args.only else list(TRIALS)
    print("| trial | measured step s (runs) | predicted s | predicted / measured | |")
    print("|---|---|---:|---:|---|")
    within = 0
    for name in names:
        results = [r for i in range(args.runs) if (r := run(args.out, f"{name}-{i}", trials[name], env, args.hardware))]
        if not results:
            print(f"| {name} | failed | | | |")
            continue
        steps = [r["metrics"]["step_time_s"] for r in results]
        measured = statistics.median(steps)
        predicted = results[0]["plan"]["time"]["step_s"]
        ratio = predicted / measured
        within += abs(ratio - 1) <= TOLERANCE
        summary[name] = {
            "measured_steps_s": steps,
            "plan_time": results[0]["plan"]["time"],
            "plan_sources": results[0]["plan"].get("sources"),
            "device": results[0]["metrics"].get("device"),
            "peak_bytes": [r["metrics"].get("memory", {}).get("peak") for r in results],
            "plan_total_bytes": results[0]["plan"]["memory"]["total"],
        }
        if args.summary:  # after each trial: a run cut short keeps what it measured
            args.summary.write_text(json.dumps(summary, indent=1))
        print(
            f"| {name} | {measured:.4f} ({', '.join(f'{s:.4f}' for s in steps)}) | {predicted:.4f} | {ratio:.2f} | "
            f"{'ok' if abs(ratio - 1) <= TOLERANCE else 'MISS'} |",
            flush=True,
        )
    print(f"\nwithin +-{TOLERANCE:.0%}: {within} of {len(names)}")


if __name__ == "__main__":
    main()
