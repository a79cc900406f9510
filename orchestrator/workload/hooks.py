"""What happens around the training loop's steps, one named hook each (train.run_steps).

- `RunState`: the history and the restarts a run carries across steps, and across a
  requeue (it is what a checkpoint stores beside the engine's state).
- `MemoryProbes`: the three memory figures, each taken once: activations on the first
  micro batch's forward, the static census after the first optimizer step, and on a CPU
  the live-tensor peak of the second step when it is untimed (the profiler that sees it
  slows it).
- `Reporter`: each step to the launcher's pipe (progress), to W&B, and the non-finite
  loss check.
- `Checkpointer`: a save every run.checkpoint_every steps and on SLURM's warning.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.core.process import PROGRESS
from orchestrator.workload import checkpoint, memory_census
from orchestrator.workload.device import Device

MEMORY_KEYS = ("activation_bytes", "static_bytes", "live_peak_bytes", "live_peak_at")


class NonFiniteLoss(FloatingPointError):
    """The loss became NaN or infinite (run.stop_on_nonfinite_loss ends the trial on it)."""


@dataclass
class RunState:
    """A run's record so far; a resumed run starts from its checkpoint's."""

    history: list[dict] = field(default_factory=list)
    memory: dict = field(default_factory=lambda: dict.fromkeys(MEMORY_KEYS))
    resumed_at: list[int] = field(default_factory=list)  # the steps each requeue resumed at
    on_warning: list[int] = field(default_factory=list)  # checkpoints SLURM's warning asked for
    resumed_from_saved_at: list[float] = field(default_factory=list)  # when each resumed checkpoint was complete
    nonfinite: list[int] = field(default_factory=list)  # steps whose loss was NaN or infinite
    # this process's timed steps, [step, seconds, seconds in collectives, those by kind]: each rank's own
    # (the history is rank 0's, and a checkpoint's); after a requeue, those since the resume
    own_steps: list[list] = field(default_factory=list)

    @classmethod
    def resumed(cls, saved: dict | None) -> RunState:
        if saved is None:
            return cls()
        return cls(
            history=saved["history"],
            memory={k: saved.get(k) for k in MEMORY_KEYS},
            resumed_at=[*saved.get("resumed_at", []), saved["step"]],
            on_warning=list(saved.get("on_warning", [])),
            resumed_from_saved_at=[*saved.get("resumed_from_saved_at", []), saved["written_at"]],
            nonfinite=[h["step"] for h in saved["history"] if not _finite(h["loss"])],
        )

    def add(self, record: dict) -> None:
        self.history.append(record)
        if record["timed"]:
            own = [record["step"], record["step_time_s"], record["collective_wait_s"]]
            self.own_steps.append([*own, record["collective_wait_by_kind_s"]])
        if not _finite(record["loss"]):
            self.nonfinite.append(record["step"])

    def saved(self, step: int) -> dict:
        """What a checkpoint after `step` stores."""
        return {
            "step": step + 1,
            "history": self.history,
            **self.memory,
            "resumed_at": self.resumed_at,
            "on_warning": self.on_warning,
            "resumed_from_saved_at": self.resumed_from_saved_at,
        }

    def restarts(self) -> dict:
        return {
            "restarts": len(self.resumed_at),
            "resumed_at_steps": self.resumed_at,
            "checkpoints_on_warning": self.on_warning,
            "resumed_from_saved_at": self.resumed_from_saved_at,
            "nonfinite_loss_steps": self.nonfinite,
        }


def _finite(loss: float | None) -> bool:
    return loss is not None and math.isfinite(loss)


class MemoryProbes:
    """Each memory figure once, from the step (and micro batch) where it means what it says."""

    def __init__(self, device: Device, run, memory: dict):
        self.device, self.run, self.memory = device, run, memory

    def around_step(self, step: int):
        """The CPU's live-tensor peak, on the second step if it is not timed: the static
        census is then exactly what was alive when it began."""
        watch = (
            not self.device.is_gpu
            and step == 1
            and step < self.run.warmup_steps
            and not self.run.profile
            and self.memory["live_peak_bytes"] is None
            and self.memory["static_bytes"] is not None
        )
        return self._watching() if watch else contextlib.nullcontext()

    @contextlib.contextmanager
    def _watching(self):
        with memory_census.AllocatorPeak() as allocator:
            yield
        self.memory["live_peak_bytes"] = self.memory["static_bytes"] + allocator.growth
        self.memory["live_peak_at"] = allocator.where

    @contextlib.contextmanager
    def around_forward(self, micro: int):
        """Activations: what the first micro batch's forward leaves alive for the backward."""
        if self.memory["activation_bytes"] is not None or micro:
            yield
            return
        with memory_census.ActivationCensus() as census:
            yield
        self.memory["activation_bytes"] = census.bytes

    def after_step(self) -> None:
        """The static census: after the first optimizer step, no batch in flight."""
        if self.memory["static_bytes"] is None:
            self.memory["static_bytes"] = memory_census.static_bytes(self.device.type.value)


class Reporter:
    """Each step's record to rank 0's progress line and W&B; ends the run on a bad loss."""

    def __init__(self, run, console, tracker):
        self.run, self.console, self.tracker = run, console, tracker

    def __call__(self, record: dict, state: RunState) -> None:
        if self.console:
            self.console.write(PROGRESS + json.dumps({**record, "steps": self.run.steps}) + "\n")
        if self.tracker:
            self.tracker.log_step(record)
        if state.nonfinite and self.run.stop_on_nonfinite_loss:
            raise NonFiniteLoss(
                f"the loss is {record['loss']} at step {record['step'] + 1} of {self.run.steps} "
                f"(run.lr={self.run.lr}); run.stop_on_nonfinite_loss=false trains on"
            )


class Checkpointer:
    """Saves after a step when every rank agrees one is due (checkpoint.wanted)."""

    def __init__(self, engine, trial_dir: Path, rank: int, device: Device, every: int, enabled: bool):
        self.engine, self.trial_dir, self.rank, self.device = engine, trial_dir, rank, device
        self.every, self.enabled = every, enabled

    def resume(self) -> RunState:
        return RunState.resumed(
            checkpoint.resume(self.engine, self.trial_dir, self.rank, self.device) if self.enabled else None
        )

    def due(self, step: int, steps: int) -> int:
        """Whether the ranks save after `step` (checkpoint.wanted), agreed as the step's last
        collective, inside its time, on every step (on 0 where nothing can be saved). A rank
        done early waits for a slower one at the next collective; were that one between steps
        (this agreement, run.timing_ci's), the wait would be in no step's time: rank 0's steps
        would seem shorter than the slowest rank's, its throughput higher than the ranks ran
        at, and the straggler hidden (workload/rank_steps.py)."""
        wanted = checkpoint.wanted(step, self.every, self.device)
        return wanted if self.enabled and step + 1 < steps else 0

    def __call__(self, step: int, state: RunState, why: int) -> None:
        """Save after `step` where the ranks agreed to (`due`)."""
        if not why:
            return
        if why == checkpoint.WARNED:
            state.on_warning.append(step + 1)
        checkpoint.save(
            self.engine, self.trial_dir, self.rank, self.device, state.saved(step), warned=why == checkpoint.WARNED
        )
