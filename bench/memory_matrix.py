"""Predicted vs measured across a matrix of real local trials, beside the estimators users have.

    .venv/bin/python bench/memory_matrix.py [OUT_DIR] [--hardware NAME] [--models A,B] [--dp 1,2]
                                            [--engines deepspeed,fsdp]
                                            [--stages 0,3] [--recompute none,full]

Runs trials on this machine through `orchestrator run` (engine=deepspeed: ZeRO 0-3;
engine=fsdp: FSDP2 at zero.stage 2 and 3; x recompute none/selective/full x dp 1 and 2, on
a GPT-2 and a Llama shape whose static memory is tens of MB per rank), then prints one
table from bench/plan_drift.py:
static memory (alive between optimizer steps), activation memory and step time,
predicted / measured, and beside them DeepSpeed's own estimators
(estimate_zero2/3_model_states_mem_needs) and the textbook 16N, and the peak: the plan's
total less the runtime against the live-tensor peak of an untimed step (the CPU
allocator's count; the CUDA allocator's peak on a GPU). Trials already in
OUT_DIR are not run again; the plan is always recomputed. About 50 minutes on the
2-core CI machine (17 of them the 128k-vocabulary Llama's 24). tests/test_plan_drift.py
runs a few of these points in CI.
On a GPU node the table adds the CUDA allocator's peak against the plan's peak less the
CUDA context, and measured against predicted MFU; the GPU check is
`--hardware auto --models gpt2-125m,gpt2-350m,gpt2-1.3b --dp 1` (8 of its points ran on an
H200: bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
from pathlib import Path

from plan_drift import ACTIVATION_TOLERANCE, PEAK_TOLERANCE, STATIC_TOLERANCE, compare, within

SHAPES = {
    "gpt2": [
        "model.n_layers=4",
        "model.hidden=256",
        "model.heads=4",
        "model.kv_heads=4",
        "model.ffn_hidden=1024",
        "model.vocab=8192",
    ],
    "llama": [
        "model=llama3-8b",
        "model.n_layers=4",
        "model.hidden=256",
        "model.heads=4",
        "model.kv_heads=2",
        "model.ffn_hidden=768",
        "model.vocab=8192",
        "model.seq_len=128",
        "model.max_positions=128",
    ],
    # Llama 3's 128k vocabulary: the loss's fp32 gradients set the peak. Width 64 keeps its
    # lm_head (a minute per step at width 256 on a 2-core CPU) to seconds.
    "llama-128k": [
        "model=llama3-8b",
        "model.n_layers=4",
        "model.hidden=64",
        "model.heads=4",
        "model.kv_heads=2",
        "model.ffn_hidden=192",
        "model.seq_len=128",
        "model.max_positions=128",
    ],
}
# ZeRO-3's reduce bucket stays allocated between steps at its configured size (5e8
# elements, 1 GB, by default); 1e6 keeps the model states, not the bucket, what is compared.
COMMON = ["logger.mode=disabled", "zero.reduce_bucket_size=1e6"]
# Steps and micro batch: the 128k vocabulary's lm_head and loss take seconds a step here.
STEPS = {"llama-128k": ["run.steps=6", "run.warmup_steps=2", "batch.micro_batch_size=1"]}
DEFAULT_STEPS = ["run.steps=6", "run.warmup_steps=2", "batch.micro_batch_size=2"]


STAGES = {"deepspeed": [0, 1, 2, 3], "fsdp": [2, 3]}  # FSDP2: resharded after forward (3) or kept (2)


RECOMPUTE = ["none", "selective", "full"]


def matrix(shapes, dps, engines=("deepspeed",), stages=None, recompute=RECOMPUTE) -> list[tuple]:
    """Every point, or those of `stages` (each engine keeps the stages it has) and `recompute`."""
    return [
        (engine, *point)
        for engine in engines
        for point in itertools.product(
            shapes, [s for s in STAGES[engine] if stages is None or s in stages], recompute, dps
        )
    ]


def run_trial(out: Path, hardware: str, engine: str, shape: str, stage: int, recompute: str, dp: int) -> Path:
    trial = out / (
        f"{shape}-z{stage}-{recompute}-dp{dp}"
        if engine == "deepspeed"
        else f"{engine}-{shape}-z{stage}-{recompute}-dp{dp}"
    )
    model = SHAPES.get(shape, [f"model={shape}"])  # a shape above, or a model preset by name
    if not (trial / "result.json").is_file():
        common = COMMON if engine == "deepspeed" else [c for c in COMMON if not c.startswith("zero.")]  # ZeRO's knob
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "run",
                "--out",
                str(trial),
                *model,
                *common,
                *STEPS.get(shape, DEFAULT_STEPS),
                f"hardware={hardware}",
                f"zero=stage{stage}",
                f"recompute={recompute}",
                f"parallel.dp={dp}",
                f"engine={engine}",
            ],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if not (trial / "trial.json").is_file():  # refused or failed before its directory was written
            print(f"{trial.name}: exit {done.returncode}: {done.stderr.strip()[-400:]}", file=sys.stderr)
    return trial


def show(rows: list[dict]) -> None:
    def f(x, scale=1.0):
        return "" if x is None else f"{x / scale:.3f}" if scale == 1.0 else f"{x / scale:.2f}"

    gpu = any(r["on_gpu"] for r in rows)
    print(
        "trial | status | static MB meas. | plan | DeepSpeed est. | 16N | activations MB meas. | plan "
        "| step s meas. | plan | peak MB meas. | plan" + (" | MFU meas. | plan" if gpu else "")
    )
    for r in rows:
        m, q = r["measured"], r["ratio"]
        print(
            " | ".join(
                [
                    r["trial"],
                    r["status"],
                    f(m["static"], 1e6),
                    f(q["static"]),
                    f(r["deepspeed_ratio"]),
                    f(r["textbook_ratio"]),
                    f(m["activations"], 1e6),
                    f(q["activations"]),
                    f(m["step_s"]),
                    f(q["step_s"]),
                    f(m["peak"], 1e6),
                    f(q["peak"]),
                    *([f(m["mfu"]), f(q["mfu"])] if gpu else []),
                ]
            )
        )
    print("(plan, DeepSpeed est., 16N: predicted / measured)")
    for name, key, tolerance in (
        ("static", "static", STATIC_TOLERANCE),
        ("activations", "activations", ACTIVATION_TOLERANCE),
        ("peak", "peak", PEAK_TOLERANCE),
    ):
        bad = [r["trial"] for r in rows if not within(r["ratio"][key], tolerance)]
        worst = max(abs(r["ratio"][key] - 1) for r in rows if r["ratio"][key])
        print(f"{name}: worst |plan/measured - 1| = {worst:.3%} (target {tolerance:.0%}); outside: {bad or 'none'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="bench-runs", type=Path)
    parser.add_argument("--hardware", default="cpu")
    parser.add_argument("--models", default=",".join(SHAPES), help="shapes above or model presets, comma-separated")
    parser.add_argument("--dp", default="1,2", help="data-parallel sizes, comma-separated")
    parser.add_argument("--engines", default="deepspeed", help="deepspeed, fsdp or both, comma-separated")
    parser.add_argument("--stages", help="ZeRO stages to run, comma-separated (default: each engine's all)")
    parser.add_argument("--recompute", default=",".join(RECOMPUTE), help="recompute modes, comma-separated")
    args = parser.parse_args()
    points = matrix(
        args.models.split(","),
        [int(d) for d in args.dp.split(",")],
        args.engines.split(","),
        stages=None if args.stages is None else [int(s) for s in args.stages.split(",")],
        recompute=args.recompute.split(","),
    )
    trials = [run_trial(args.out, args.hardware, *point) for point in points]
    rows = [compare(trial) for trial in trials if (trial / "trial.json").is_file()]
    show(rows)
    (args.out / "memory_matrix.json").write_text(json.dumps(rows, indent=2))
