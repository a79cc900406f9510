"""What the plan takes besides the trial: the facts of the machine it plans for, and what was
measured on it.

The plan (planner.make_plan) is a pure function of a TrialSpec, MachineFacts and, where the
trial's kernels or this host's links were timed, Measurements. Gathering them is another
stage's work (trial_measurements.py reads this host, times kernels, starts processes), and
one place decides when to measure (planning.plan_trial). These are plain values: nothing
here imports torch, starts a process, reads the environment or a file.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.plan.bus_table import BusTable
from orchestrator.plan.collectives import Level
from orchestrator.plan.compute import KernelTimes


@dataclass(frozen=True)
class MachineFacts:
    """What the plan reads of the machine: published where the preset gives it, else
    measured on this host (cached) by trial_measurements.machine_facts."""

    peak_tflops: float | None  # dense TFLOPS per rank; None: a GPU with no published peak (MFU unknown)
    peak_note: str  # where the peak comes from
    bandwidth_gbps: float | None  # the device's memory bandwidth per rank; None: not counted
    bandwidth_note: str  # where it comes from
    host_memory_bytes: int  # this host's memory: a CPU trial's device memory, a local GPU trial's host's
    gpu_driver_present: bool  # whether this host has a GPU (a local GPU trial then runs on it)
    network_table: BusTable | None = None  # hardware.network, read (None: the preset's two levels)
    # a CPU's peak on one thread: the k x n GEMM layout's kernel runs on one (plan/rates.py)
    peak_tflops_one_thread: float | None = None


@dataclass(frozen=True)
class MeasuredKernels:
    """The kernels of one micro batch and the optimizer step, and where they were timed
    (kernel_timing.measure, with the engine's own lines from engine_timing.py)."""

    kernels: KernelTimes
    optimizer_s: float
    device: str  # what they were timed on: the device's name
    software: str  # torch and transformers versions
    timed_at: str  # when the oldest of them was timed (UTC, ISO 8601)
    # What the engine adds to each micro batch's forward and backward (hooks, buckets), and
    # how its step was timed: the engine's own (engine_timing.py), or torch's AdamW alone.
    engine_forward_s: float = 0.0
    engine_backward_s: float = 0.0
    optimizer: str = "torch's AdamW over the rank's share"
    busy: str = ""  # the machine was busy while new kernels were timed: what showed it (they were not cached)
    discarded: str = ""  # cached times that no device could take, dropped and timed again: which

    def source(self) -> str:
        return f"measured kernels: timed on {self.device} ({self.software}), {self.timed_at}"


@dataclass(frozen=True)
class LocalLinks:
    """This host's links between a CPU trial's ranks, measured (local_links.py)."""

    level: Level
    table: BusTable
    source: str  # what was measured, where and when, for the plan's assumptions


@dataclass(frozen=True)
class Measurements:
    """What was timed for one trial, and what the plan says of its compute where nothing was."""

    kernels: MeasuredKernels | None = None
    # where the compute times come from, where the kernels were not timed too (why not:
    # the trial does not fit, it runs on a node not yet allocated, timing failed); "": the preset's
    compute_source: str = ""
    links: LocalLinks | None = None
    links_note: str = ""  # why this host's links were not measured, where they were asked for
