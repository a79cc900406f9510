"""Predicted vs measured across a matrix of real local trials, beside the estimators users have.

    .venv/bin/python bench/memory_matrix.py [OUT_DIR]

Runs engine=deepspeed trials on this machine (ZeRO 0-3 x recompute none/selective/full
x dp 1 and 2, on two model shapes whose static memory is tens of MB per rank) through
`orchestrator run`, then prints one table: static memory (the plan's parameters +
gradients + optimizer states against the census after the first optimizer step),
activation memory and step time, predicted / measured, and beside them DeepSpeed's own
estimators (estimate_zero2/3_model_states_mem_needs, GPU side, no offload) and the
textbook 16N / dp. About 6 minutes on the 2-core CI machine.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

SHAPES = {
    "gpt2-small": ["model.n_layers=4", "model.hidden=256", "model.heads=4", "model.kv_heads=4", "model.ffn_hidden=1024",
                   "model.vocab=8192"],
    "llama-small": ["model=llama3-8b", "model.n_layers=4", "model.hidden=256", "model.heads=4", "model.kv_heads=2",
                    "model.ffn_hidden=768", "model.vocab=8192", "model.seq_len=128", "model.max_positions=128"],
}
MATRIX = list(itertools.product(SHAPES, [0, 1, 2, 3], ["none", "selective", "full"], [1, 2]))
COMMON = ["hardware=cpu", "run.steps=3", "run.warmup_steps=1", "logger.mode=disabled", "batch.micro_batch_size=2"]


def run_matrix(out: Path) -> list[dict]:
    rows = []
    for shape, stage, recompute, dp in MATRIX:
        trial = out / f"{shape}-z{stage}-{recompute}-dp{dp}"
        if not (trial / "result.json").is_file():
            subprocess.run([sys.executable, "-m", "orchestrator", "run", "--out", str(trial), *SHAPES[shape], *COMMON,
                            f"zero=stage{stage}", f"recompute={recompute}", f"parallel.dp={dp}"],
                           capture_output=True, timeout=600)
        r = json.loads((trial / "result.json").read_text())
        rows.append(compare(shape, r))
    return rows


def compare(shape: str, r: dict) -> dict:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    plan, m, cfg = r["plan"], r["metrics"] or {}, r["config"]
    n, dp, stage = plan["parameters"], cfg["parallel"]["dp"], cfg["zero"]["stage"]
    mem = m.get("memory", {})
    predicted_static = sum(plan["memory"][k] for k in ("params", "grads", "optimizer"))
    if stage == 3:
        largest = cfg["model"]["vocab"] * cfg["model"]["hidden"]
        ds = estimate_zero3_model_states_mem_needs(n, largest, dp, 1, cpu_offload=False, cpu_offload_params=False)[1]
    else:
        ds = estimate_zero2_model_states_mem_needs(n, dp, 1, cpu_offload=False)[1]

    def ratio(a, b):
        return a / b if a and b else None

    return {"trial": f"{shape} z{stage} {cfg['recompute']['mode']} dp{dp}", "status": r["status"],
            "static_measured": mem.get("static_bytes"), "static_predicted": predicted_static,
            "static_ratio": ratio(predicted_static, mem.get("static_bytes")),
            "ds_estimate": ds, "ds_ratio": ratio(ds, mem.get("static_bytes")),
            "textbook_16n": 16 * n / dp if stage else 16 * n, "textbook_ratio": ratio(16 * n / (dp if stage else 1),
                                                                                       mem.get("static_bytes")),
            "activation_ratio": ratio(plan["memory"]["activations"], mem.get("activation_bytes")),
            "step_ratio": ratio(plan["time"]["step_s"], m.get("step_time_s"))}


def show(rows: list[dict]) -> None:
    header = ["trial", "status", "static MB (meas.)", "plan/meas.", "DeepSpeed est./meas.", "16N/meas.",
              "activations plan/meas.", "step plan/meas."]
    print(" | ".join(header))
    for r in rows:
        def f(x):
            return "" if x is None else f"{x:.2f}"
        print(" | ".join([r["trial"], r["status"], f((r["static_measured"] or 0) / 1e6), f(r["static_ratio"]),
                          f(r["ds_ratio"]), f(r["textbook_ratio"]), f(r["activation_ratio"]), f(r["step_ratio"])]))


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "bench-runs")
    rows = run_matrix(out)
    show(rows)
    (out / "memory_matrix.json").write_text(json.dumps(rows, indent=2))
