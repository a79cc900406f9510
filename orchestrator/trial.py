"""One trial end to end: plan, translate, launch, collect, result.json.

The CLI calls `run_trial` once per point of a sweep; a point that is refused or fails is
recorded with its cause and the sweep goes on.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rich.console import Console

from launchers.local import run_local
from orchestrator import hardware
from orchestrator.errors import ConfigError
from orchestrator.display import show_plan, show_progress, show_result
from orchestrator.plan.planner import Plan, make_plan
from orchestrator.results import now, outcome_status, write_result
from orchestrator.spec import TrialSpec
from orchestrator.translate import write_trial_files


def refusal(spec: TrialSpec, plan: Plan) -> str | None:
    """Why the plan refuses to launch this trial, or None."""
    if plan.fits or spec.cfg.run.force:
        return None
    return (f"does not fit: predicted {plan.memory.total / 2**30:.2f} GiB per rank > "
            f"{plan.memory.capacity / 2**30:.2f} GiB capacity; run.force=true launches anyway")


def check_runnable_here(spec: TrialSpec) -> None:
    """A local trial needs the device it names (plan and translate need nothing)."""
    if spec.cfg.cluster.name == "local" and spec.cfg.hardware.device == "cuda" and hardware.local_gpu_name() is None:
        raise ConfigError("hardware", spec.cfg.hardware.name, "this machine has no GPU to run it on; use hardware=auto "
                          "or cpu here (plan and translate take any hardware)")
    if spec.cfg.engine.backend == "fsdp" and spec.cfg.zero.stage and spec.cfg.hardware.device == "cpu":
        raise ConfigError("engine.backend", "fsdp", f"accelerate applies FSDP only on GPUs (on a CPU it quietly runs "
                          f"DDP instead, so zero.stage={spec.cfg.zero.stage} would not be what runs); use "
                          "engine.backend=deepspeed here, or zero.stage=0 for DDP")


def run_trial(spec: TrialSpec, trial_dir: Path, out: Console, sweep: dict | None = None) -> dict:
    """sweep: the point's W&B group, name and swept values (see cli.run_command)."""
    started = now()
    trial_dir.mkdir(parents=True, exist_ok=True)
    plan = make_plan(spec)
    if message := refusal(spec, plan):
        show_plan(spec, plan, out)
        out.print(f"[red]refused:[/red] {message}")
        return write_result(trial_dir, spec, plan.as_dict(), "refused", started,
                            {"type": "PlanRefused", "message": message, "rank": None, "log_tail": ""})
    files = write_trial_files(spec, trial_dir, plan=plan.as_dict(), sweep=sweep)
    for stale in ("errors", "metrics.json", "result.json"):  # a re-run into the same directory
        path = trial_dir / stale
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    for warning in files.warnings:
        out.print(f"[yellow]warning:[/yellow] {warning}")
    out.print(f"[bold]run[/bold] {trial_dir}")
    timeout = spec.cfg.run.timeout_min * 60 if spec.cfg.run.timeout_min else None
    outcome = run_local(files.command, trial_dir, timeout, lambda p: show_progress(p, out))
    status, error = outcome_status(trial_dir, outcome.returncode, outcome.timed_out)
    result = write_result(trial_dir, spec, plan.as_dict(), status, started, error)
    show_result(result, trial_dir, out)
    return result
