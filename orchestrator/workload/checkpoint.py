"""The training state that lets a requeued trial go on where it stopped.

A checkpoint is the engine's own (DeepSpeed's save_checkpoint / Accelerate's
save_state: weights, optimizer, scheduler), each rank's RNG states, and, written last
by rank 0 and atomically, latest.json: the step reached, the history so far
(from which the data position follows: the ranks read windows by index), the restarts.
A checkpoint without latest.json pointing at it never existed, so a kill while saving
loses nothing.

Saves happen every run.checkpoint_every steps and, on SLURM, as soon as the ranks agree
after the warning signal SLURM sends before a time limit or preemption (SIGUSR2).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from orchestrator.core.files import atomic_write_json, read_json
from orchestrator.records.trial_dir import TrialPaths
from orchestrator.workload import warning
from orchestrator.workload.device import Device

PERIODIC, WARNED = 1, 2  # why the ranks save: run.checkpoint_every, or SLURM's warning


def wanted(step: int, every: int, device: Device) -> int:
    """Whether the ranks save after `step` (0: no; PERIODIC; WARNED), agreed by all of them:
    SLURM's warning reaches the ranks at slightly different steps, and the first rank to
    see it decides for everyone.

    The flag lives on the rank's device: NCCL, the GPU backend, reduces no host tensors.
    """
    return agree(device, WARNED if warning.warned() else PERIODIC if every and (step + 1) % every == 0 else 0)


def agree(device: Device, local: int = 0) -> int:
    """The largest of every rank's `local`, on the rank's device."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return local
    flag = torch.tensor([local], device=device.torch)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


def save(engine, trial_dir: Path, rank: int, device: Device, state: dict, warned: bool = False) -> None:
    """warned: the save SLURM's warning asked for (latest.json says so: the task waits for it)."""
    paths, tag = TrialPaths(trial_dir), f"step{state['step']}"
    engine.save_state(paths.checkpoint, tag)
    torch.save(device.rng_state(), paths.checkpoint_rng(tag, rank))
    dist.barrier()  # every rank's part is on disk before it counts
    if rank == 0:
        atomic_write_json(paths.checkpoint_latest, {**state, "tag": tag, "signalled": warned})
        for old in paths.checkpoint.glob("step*"):
            if old.name != tag and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    if warned:
        warning.warned()  # a rank the warning reached a moment late: consumed, it asks for no second save
        warning.clear()


def resume(engine, trial_dir: Path, rank: int, device: Device) -> dict | None:
    """Load the latest checkpoint into the engine and this rank's RNGs; its state, or None."""
    paths = TrialPaths(trial_dir)
    state = read_json(paths.checkpoint_latest)
    if state is None:
        return None
    state["written_at"] = paths.checkpoint_latest.stat().st_mtime  # when the save was complete
    engine.load_state(paths.checkpoint, state["tag"])
    device.set_rng_state(torch.load(paths.checkpoint_rng(state["tag"], rank), weights_only=False))
    return state
