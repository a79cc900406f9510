"""What a plan predicts: the Plan of a trial and its Comm and Time parts, as data.

The models that fill them in are the rest of this package (memory, flops, comm, compute);
planner.make_plan puts them together. Kept apart from the planner so that the advice
rules, the display and the tuner can read a Plan without importing the planner.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from orchestrator.plan.comm import Collective
from orchestrator.plan.compute import ComputeTime
from orchestrator.plan.flops import Flops
from orchestrator.plan.memory import Memory


@dataclass(frozen=True)
class Comm:
    bytes_per_rank_per_step: float
    collectives: list[Collective]
    time_s: float  # all collectives of a step, back to back
    exposed_s: float  # what compute does not hide

    def as_dict(self) -> dict:
        return {"bytes_per_rank_per_step": self.bytes_per_rank_per_step,
                "collectives": [c.as_dict() for c in self.collectives], "time_s": self.time_s, "exposed_s": self.exposed_s}


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

    def as_dict(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "micro_batch"}, "micro_batch": self.micro_batch.as_dict()}


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

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def as_dict(self) -> dict:
        return {"parameters": self.parameters, "parallel": self.parallel, "batch": self.batch,
                "memory": self.memory.as_dict(), "flops": self.flops.as_dict(), "comm": self.comm.as_dict(),
                "time": self.time.as_dict(), "max_micro_batch": self.max_micro_batch, "warnings": self.warnings,
                "assumptions": self.assumptions, "sources": self.sources}
