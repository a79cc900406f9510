"""What a plan predicts: the Plan of a trial and its Comm and Time parts, as data.

The models that fill them in are the rest of this package (memory, flops, comm, compute);
planner.make_plan puts them together. Kept apart from the planner so that the advice
rules, the display and the tuner can read a Plan without importing the planner.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from statistics import median

from orchestrator.plan.comm import Collective
from orchestrator.plan.compute import ComputeTime
from orchestrator.plan.flops import Flops
from orchestrator.plan.host_memory import HostMemory
from orchestrator.plan.memory import Memory

# How far a plan typically misses: its median |predicted / measured - 1| on the published rows
# no preset was fitted on (the Ultra-Scale 1B rows on their cluster's network and IBM's
# fms-fsdp eager rows; bench/published.py). Two plans closer than this are not ranked by the
# plan: tests/test_published_accuracy.py keeps the figure at or above what those rows show.
HELD_OUT_ERROR = 0.05


@dataclass(frozen=True)
class Comm:
    bytes_per_rank_per_step: float
    collectives: list[Collective]
    time_s: float  # all collectives of a step, back to back
    exposed_s: float  # what compute does not hide

    def as_dict(self) -> dict:
        return {
            "bytes_per_rank_per_step": self.bytes_per_rank_per_step,
            "collectives": [c.as_dict() for c in self.collectives],
            "time_s": self.time_s,
            "exposed_s": self.exposed_s,
        }


@dataclass(frozen=True)
class Time:
    """One optimizer step, predicted. `micro_batch` breaks one micro batch's compute down."""

    compute_s: float
    comm_s: float
    exposed_comm_s: float
    optimizer_s: float
    step_s: float
    tokens_per_sec_per_gpu: float
    mfu: float | None  # None: no published peak for this GPU (hardware=auto on one without a preset)
    hfu: float | None
    peak_tflops: float | None
    micro_batch: ComputeTime
    optimizer_source: str = ""  # how the optimizer step was timed or estimated
    # What each micro batch adds to a step (compute and the communication that comes with
    # it): a warm-up step of fewer micro batches is step_s less this for each one fewer.
    added_micro_batch_s: float = 0.0

    def as_dict(self) -> dict:
        return {
            **{k: v for k, v in asdict(self).items() if k != "micro_batch"},
            "micro_batch": self.micro_batch.as_dict(),
        }


def step_s_at(plan: dict, global_batch: int) -> float:
    """The planned time of a step at `global_batch` sequences (a warm-up step's), from a
    plan's dict: every step model here is a line in the number of micro batches."""
    batch, time = plan["batch"], plan["time"]
    fewer = batch["grad_accum_steps"] * (1 - global_batch / batch["global_batch_size"])
    return time["step_s"] - fewer * time.get("added_micro_batch_s", 0.0)


def planned_steps_s(plan: dict, global_batches: list[int]) -> list[float]:
    """The planned time of each step of a run whose steps have these global batches."""
    return [step_s_at(plan, b) for b in global_batches]


def planned_step_s(plan: dict, global_batches: list[int] | tuple[int, ...]) -> float:
    """The median planned step over steps of these global batches (the full batch's step
    where there are none): what a trial's measured median is compared with."""
    return median(planned_steps_s(plan, list(global_batches))) if global_batches else plan["time"]["step_s"]


def timed_batches(history: list[dict] | None) -> list[int]:
    """The global batch of each timed step of a trial's history (result.json's)."""
    return [
        h["global_batch_size"]
        for h in history or ()
        if isinstance(h, dict)
        and h.get("timed")
        and isinstance(h.get("global_batch_size"), int)
        and h["global_batch_size"] > 0
    ]


def planned_for_timed_steps(plan: dict, history: list[dict] | None) -> dict:
    """The plan's step time, tokens/s/GPU, MFU and HFU for what a trial reports, the
    medians over its timed steps: each timed step planned at its own global batch (a
    warm-up's first steps are shorter and carry fewer tokens). A trial without its steps'
    history gets the full batch's figures."""
    time, full = plan["time"], plan["batch"]["global_batch_size"]
    batches = timed_batches(history) or [full]
    steps = planned_steps_s(plan, batches)
    # a rate scales with the tokens a step carries over the time it takes
    rates = [b / full * time["step_s"] / s if s else 1.0 for b, s in zip(batches, steps)]
    scaled = lambda key: None if time.get(key) is None else median([time[key] * r for r in rates])  # noqa: E731
    return {
        "step_s": planned_step_s(plan, batches),
        "tokens_per_sec_per_gpu": scaled("tokens_per_sec_per_gpu"),
        "mfu": scaled("mfu"),
        "hfu": scaled("hfu"),
        "at_full_batch": all(b == full for b in batches),
    }


@dataclass(frozen=True)
class Plan:
    parameters: int
    parallel: dict
    batch: dict
    memory: Memory
    flops: Flops
    comm: Comm
    time: Time
    max_micro_batch: int  # the largest micro batch that fits, by this plan
    fitting_changes: str = ""  # where it does not fit: the changes that would make it fit
    warnings: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    # Where the figures come from: "compute" (measured kernels, with what and when; a
    # preset's fitted values; a calibrated preset), "peak" (published or measured).
    sources: dict[str, str] = field(default_factory=dict)
    host_memory: HostMemory | None = None  # a GPU trial's ranks in their node's RAM (None on a CPU: that is `memory`)

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def as_dict(self) -> dict:
        return {
            "parameters": self.parameters,
            "parallel": self.parallel,
            "batch": self.batch,
            "memory": self.memory.as_dict(),
            "flops": self.flops.as_dict(),
            "comm": self.comm.as_dict(),
            "time": self.time.as_dict(),
            "max_micro_batch": self.max_micro_batch,
            "warnings": self.warnings,
            "assumptions": self.assumptions,
            "sources": self.sources,
            "host_memory": self.host_memory.as_dict() if self.host_memory else None,
        }
