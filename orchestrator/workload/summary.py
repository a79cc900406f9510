"""The measured figures of result.json: what rank 0 makes of the steps every rank ran.

Throughput and MFU are over the timed steps only (after run.warmup_steps): the median
step and the median step's throughput, with their spread and the median's 95 % interval
(orchestrator/core/timing_stats.py), and a verdict where the steps scatter past what a quiet
machine shows. MFU and HFU divide by the peak the trial's plan divided by (plan.json: a
preset's published figure, or on a CPU this machine's measured matmul rate), never a guessed one.
"""

from __future__ import annotations

import gc
import importlib.metadata as md
import os
import platform

from orchestrator.core.files import read_json, real_number
from orchestrator.core.timing_stats import spread
from orchestrator.plan.flops import flops_per_token
from orchestrator.records.trial_dir import TrialPaths
from orchestrator.spec import TrialSpec
from orchestrator.workload.device import Device

LIVE_PEAK_SOURCE = "static census + the CPU allocator's most bytes held during step 2 (torch.profiler memory events)"


def planned_peak(trial_dir) -> tuple[float | None, str]:
    """The peak the trial's plan divided by (plan.json, written before the ranks start; on
    SLURM by the node's own plan): the run's MFU against the same figure as the plan's, and
    nothing timed again in rank 0 after the steps."""
    plan = read_json(TrialPaths(trial_dir).plan) or {}
    time, sources = plan.get("time"), plan.get("sources")
    peak = real_number(time.get("peak_tflops")) if isinstance(time, dict) else None
    source = sources.get("peak") if isinstance(sources, dict) and isinstance(sources.get("peak"), str) else None
    if peak is None or peak <= 0:
        return None, source or f"no peak in {TrialPaths(trial_dir).plan.name}, so MFU is unknown"
    return peak, source or "the plan's"


def summarize(spec: TrialSpec, history: list[dict], world: int, device: Device, trial_dir, memory: dict) -> dict:
    """The measured figures of result.json, over the timed steps."""
    run = spec.cfg.run
    timed = [h for h in history if h["timed"]]
    tokens = sum(h["global_batch_size"] for h in timed) * spec.cfg.model.seq_len
    model_flops, hardware_flops, _ = flops_per_token(spec.cfg.model, spec.cfg.recompute.mode)
    peak_tflops, peak_source = planned_peak(trial_dir)
    step = spread([h["step_time_s"] for h in timed]) if timed else None
    # A warm-up schedule changes the batch from step to step: each step's own throughput.
    throughput = spread([h["tokens_per_sec_per_gpu"] for h in timed]) if timed else None
    per_gpu = throughput.median if throughput else 0.0
    return {
        "tokens_per_sec": per_gpu * world,
        "tokens_per_sec_per_gpu": per_gpu,
        "tokens_per_sec_per_gpu_spread": throughput.as_dict() if throughput else None,
        "tflops_per_gpu": model_flops * per_gpu / 1e12,
        "mfu": model_flops * per_gpu / (peak_tflops * 1e12) if peak_tflops else None,  # None: no published peak
        "hfu": hardware_flops * per_gpu / (peak_tflops * 1e12) if peak_tflops else None,
        "peak_tflops": peak_tflops,
        "peak_source": peak_source,
        "step_time_s": step.median if step else None,
        "step_time_spread": step.as_dict() if step else None,
        "noisy": step.noisy() if step else None,  # why the steps cannot be read as one figure, or None
        "step_times_s": [h["step_time_s"] for h in history],
        "steps": len(history),  # run.steps, or fewer where run.timing_ci was met first
        "timing_ci_met": run.timing_ci is not None and len(history) < run.steps,
        "timed_steps": len(timed),
        "tokens": tokens,
        "loss_first": history[0]["loss"],
        "loss_last": history[-1]["loss"],
        "losses": [h["loss"] for h in history],
        "global_batch_sizes": [h["global_batch_size"] for h in history],
        "memory": {
            **memory,
            "peak_source": device.peak_source,
            "live_peak_source": None if memory.get("live_peak_bytes") is None else LIVE_PEAK_SOURCE,
        },
        "history": history,
        "tuning": {
            "compile": run.compile,
            "gc_collect_every": run.gc_collect_every,
            "gc_enabled": gc.isenabled(),
            "gc_frozen_objects": gc.get_freeze_count(),
            "dataloader_workers": run.dataloader_workers,
            "pin_memory": run.pin_memory,
            "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") if device.is_gpu else None,
            "profile": str(TrialPaths(trial_dir).profile) if run.profile else None,
        },
    }


def versions() -> dict:
    """The versions a result was measured with."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("torch", "deepspeed", "accelerate", "transformers", "hydra-core"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out
