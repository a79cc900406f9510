"""The plan against what a finished trial measured, beside the estimators users have today.

`compare(trial_dir)` re-plans the trial from its config.yaml (so the current planner
is checked against stored measurements) and returns predicted, measured and
predicted / measured for static memory, activation memory and step time, with
DeepSpeed's own model-state estimators and the textbook 16N for the same trial.
bench/memory_matrix.py prints it for a matrix of trials; tests/test_plan_drift.py
fails when a ratio leaves its target.

Static memory is what stays allocated between optimizer steps (a census after the
first step() finds it); the estimators and 16N estimate model states, which is the
same thing once the gradients are freed, so they are compared against that figure.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.plan.prediction import planned_for_timed_steps
from orchestrator.records.trial_dir import TrialPaths

# The targets: |predicted / measured - 1| at most this.
STATIC_TOLERANCE = 0.03
ACTIVATION_TOLERANCE = 0.15
PEAK_TOLERANCE = 0.05  # the plan's total (less the runtime) against the live-tensor peak


def deepspeed_estimate(n_params: int, largest_layer: int, stage: int, dp: int) -> int:
    """DeepSpeed's estimate_zero{2,3}_model_states_mem_needs, GPU side, no offload.

    DeepSpeed only offers estimators for ZeRO-2 and ZeRO-3; for stages 0 and 1 a user
    has the ZeRO-2 one, given one GPU for stage 0 (nothing is partitioned there).
    """
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    if stage == 3:
        return int(
            estimate_zero3_model_states_mem_needs(
                n_params, largest_layer, dp, 1, cpu_offload=False, cpu_offload_params=False
            )[1]
        )
    return int(estimate_zero2_model_states_mem_needs(n_params, dp if stage else 1, 1, cpu_offload=False)[1])


def compare(trial_dir: Path) -> dict:
    from orchestrator.run.planning import plan_trial
    from orchestrator.spec import load_spec

    result = json.loads(TrialPaths(trial_dir).result.read_text())
    spec = load_spec(trial_dir)
    plan = plan_trial(spec)
    cfg = spec.cfg
    measured = (result.get("metrics") or {}).get("memory", {})
    n, stage, dp = plan.parameters, cfg.zero.stage, spec.dp
    largest = cfg.model.vocab * cfg.model.hidden
    # The plan's total less the CUDA context and NCCL (or the Python process on a CPU) is
    # comparable with the CUDA allocator's peak, and on a CPU with the live-tensor peak of
    # an untimed step; a CPU's max RSS is not comparable.
    on_gpu = "CUDA" in str(measured.get("peak_source"))
    # the plan's step for the steps the trial timed, each at its global batch (a warm-up's are shorter)
    step_s = planned_for_timed_steps(plan.as_dict(), (result.get("metrics") or {}).get("history"))["step_s"]
    predicted = {
        "static": plan.memory.static,
        "activations": plan.memory.activations,
        "step_s": step_s,
        # the allocator's count: it includes the never-written part of a CPU's buckets
        "peak": plan.memory.allocated - plan.memory.runtime,
        "mfu": plan.time.mfu,
    }
    got = {
        "static": measured.get("static_bytes"),
        "activations": measured.get("activation_bytes"),
        "step_s": (result.get("metrics") or {}).get("step_time_s"),
        "peak": measured.get("peak_bytes") if on_gpu else measured.get("live_peak_bytes"),
        "mfu": (result.get("metrics") or {}).get("mfu"),
    }
    ds = deepspeed_estimate(n, largest, stage, dp)
    textbook = 16 * n // (dp if stage else 1)
    return {
        "trial": f"{'fsdp2 ' if cfg.engine.name == 'fsdp' else ''}{cfg.model.arch} h{cfg.model.hidden} "
        f"L{cfg.model.n_layers} V{cfg.model.vocab} z{stage} "
        f"{cfg.recompute.mode} dp{dp}",
        "status": result["status"],
        "on_gpu": on_gpu,
        "predicted": predicted,
        "measured": got,
        "ratio": {k: ratio(predicted[k], got[k]) for k in predicted},
        "deepspeed_estimate": ds,
        "deepspeed_ratio": ratio(ds, got["static"]),
        "textbook_16n": textbook,
        "textbook_ratio": ratio(textbook, got["static"]),
    }


def ratio(predicted, measured) -> float | None:
    return predicted / measured if predicted and measured else None


def within(r: float | None, tolerance: float) -> bool:
    return r is not None and abs(r - 1) <= tolerance
