"""Local launch: dp processes on this machine through torchrun (or accelerate launch).

This module builds the command as an argument list (never a shell string, so no config
value can reach a shell) with the environment it needs.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from launchers.binding import Binding
from orchestrator import hardware
from orchestrator.spec import TrialSpec

WORKLOAD_MODULE = "orchestrator.workload.train"


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def local_command(spec: TrialSpec, trial_dir: Path, bind: Binding) -> Command:
    env = {"OMP_NUM_THREADS": str(hardware.threads_per_rank(spec.world_size))}
    if spec.cfg.hardware.device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"  # DeepSpeed would otherwise look for CUDA
    if spec.cfg.engine.name == "accelerate":
        argv = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(trial_dir / "accelerate_config.yaml"), *bind.accelerate_args, "--module", WORKLOAD_MODULE,
                str(trial_dir)]
    else:
        # --standalone: a c10d rendezvous on localhost at a free port, picked by torchrun.
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                f"--nproc-per-node={spec.world_size}", *bind.torchrun_args, "--module", WORKLOAD_MODULE,
                str(trial_dir)]
    return Command(argv=argv, env=env)


def environment(command: Command) -> dict[str, str]:
    return {**os.environ, **command.env}
