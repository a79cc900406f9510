"""SLURM launch through submitit: one task per GPU, nodes = ceil(dp / gpus_per_node).

This module turns a trial into submitit's executor parameters and the equivalent sbatch
and srun options (for a user who wants to submit by hand), as argument lists.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from launchers.binding import Binding
from launchers.local import WORKLOAD_MODULE
from orchestrator.spec import TrialSpec


def timeout_minutes(time: str) -> int:
    """SLURM's MM, HH:MM:SS or D-HH:MM:SS as whole minutes (rounded up)."""
    days, _, clock = time.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if len(parts) == 1:
        seconds = parts[0] * 60
    else:
        parts = [0] * (3 - len(parts)) + parts
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return int(days or 0) * 1440 + math.ceil(seconds / 60)


def submitit_parameters(spec: TrialSpec, bind: Binding) -> dict:
    c = spec.cfg.cluster
    params = {"nodes": spec.nodes, "tasks_per_node": spec.gpus_per_node, "cpus_per_task": c.cpus_per_task,
              "timeout_min": timeout_minutes(c.time), "slurm_setup": list(c.setup),
              "slurm_srun_args": [*bind.srun_args, *c.srun_args],
              "slurm_additional_parameters": dict(bind.sbatch_options)}
    if spec.cfg.hardware.device == "cuda":
        params["gpus_per_node"] = spec.gpus_per_node
    for name in ("partition", "account", "qos", "constraint"):
        if getattr(c, name):
            params[f"slurm_{name}"] = getattr(c, name)
    return params


def sbatch_options(spec: TrialSpec, bind: Binding) -> list[str]:
    c = spec.cfg.cluster
    opts = [f"--nodes={spec.nodes}", f"--ntasks-per-node={spec.gpus_per_node}", f"--cpus-per-task={c.cpus_per_task}",
            f"--time={c.time}"]
    if spec.cfg.hardware.device == "cuda":
        opts.append(f"--gpus-per-node={spec.gpus_per_node}")
    opts += [f"--{name}={getattr(c, name)}" for name in ("partition", "account", "qos", "constraint") if getattr(c, name)]
    return opts + [f"--{k}={v}" for k, v in bind.sbatch_options.items()]


def srun_options(spec: TrialSpec, bind: Binding) -> list[str]:
    return [*bind.srun_args, *spec.cfg.cluster.srun_args]


def task_command(trial_dir: Path) -> list[str]:
    """What each SLURM task runs: the workload, rank and world from SLURM's environment."""
    return [sys.executable, "-m", WORKLOAD_MODULE, str(trial_dir)]
