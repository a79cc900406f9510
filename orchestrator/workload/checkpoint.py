"""The training state that lets a requeued trial go on where it stopped.

A checkpoint is the engine's own (DeepSpeed's save_checkpoint / Accelerate's
save_state: weights, optimizer, scheduler), each rank's RNG states, and, written last
by rank 0 and atomically, checkpoint/latest.json: the step reached, the history so far
(from which the data position follows: the ranks read windows by index), the restarts.
A checkpoint without latest.json pointing at it never existed, so a kill while saving
loses nothing.

Saves happen every run.checkpoint_every steps and, on SLURM, as soon as the ranks agree
after the warning signal SLURM sends before a time limit or preemption (SIGUSR2).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from orchestrator.files import atomic_write_json
from orchestrator.workload import warning

DIRECTORY = "checkpoint"
LATEST = "latest.json"


PERIODIC, WARNED = 1, 2  # why the ranks save: run.checkpoint_every, or SLURM's warning


def wanted(step: int, every: int, device: torch.device) -> int:
    """Whether the ranks save after `step` (0: no; PERIODIC; WARNED), agreed by all of them:
    SLURM's warning reaches the ranks at slightly different steps, and the first rank to
    see it decides for everyone.

    The flag lives on the rank's device: NCCL, the GPU backend, reduces no host tensors.
    """
    local = WARNED if warning.warned() else PERIODIC if every and (step + 1) % every == 0 else 0
    flag = torch.tensor([local], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


def latest(trial_dir: Path) -> dict | None:
    path = trial_dir / DIRECTORY / LATEST
    return json.loads(path.read_text()) if path.is_file() else None


def save(engine, trial_dir: Path, rank: int, state: dict, warned: bool = False) -> None:
    """warned: the save SLURM's warning asked for (latest.json says so: the task waits for it)."""
    root, tag = trial_dir / DIRECTORY, f"step{state['step']}"
    engine.save_state(root, tag)
    rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():  # dropout on a GPU draws from the device's generator
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save(rng, root / tag / f"rng{rank}.pt")
    dist.barrier()  # every rank's part is on disk before it counts
    if rank == 0:
        atomic_write_json(root / LATEST, {**state, "tag": tag, "signalled": warned})
        for old in root.glob("step*"):
            if old.name != tag and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    if warned:
        warning.warned()  # a rank the warning reached a moment late: consumed, it asks for no second save
        warning.clear()


def resume(engine, trial_dir: Path, rank: int) -> dict | None:
    """Load the latest checkpoint into the engine and this rank's RNGs; its state, or None."""
    state = latest(trial_dir)
    if state is None:
        return None
    state["written_at"] = (trial_dir / DIRECTORY / LATEST).stat().st_mtime  # when the save was complete
    root = trial_dir / DIRECTORY
    engine.load_state(root, state["tag"])
    rng = torch.load(root / state["tag"] / f"rng{rank}.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    return state
