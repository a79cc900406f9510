"""The search space of `orchestrator tune`: its axes, and every candidate planned.

The model, hardware, cluster and dp are what the user's overrides fix. The axes default
to ZeRO stage x micro batch x recompute x reduce / allgather / prefetch bucket sizes x
optimizer offload (DEFAULT_AXES); an override in Hydra's sweep syntax replaces an axis
(`batch.micro_batch_size=1,2,4`, `zero=range(...)` is not a thing but `zero=stage2,stage3`
is) or adds one (`zero.overlap_comm=true,false`), and a plain override of an axis fixes it
(`zero=stage3`). An axis a candidate's ZeRO stage does not read (prefetch below stage 3,
allgather outside stages 1-2, offload at stage 0) is left out of that candidate, and a
candidate the same in effect as an earlier one (every bucket past the model's size is one
bucket of the whole model; offload moves nothing where the device is the host) is kept
out of the search ("same in effect"), so no run is spent twice.

Each candidate is composed and validated like any trial and planned (plan/): fits,
does not fit (with the plan's numbers) or invalid (with the validation's paragraph).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType

from orchestrator.config import GIB
from orchestrator.core.errors import ConfigError, PlanRefused
from orchestrator.hydra_glue.compose import MAX_POINTS
from orchestrator.hydra_glue.hydra_errors import config_error
from orchestrator.plan.params import count_parameters
from orchestrator.plan.prediction import Plan
from orchestrator.run.planning import plan_trial
from orchestrator.spec import TrialSpec, build_spec

# DeepSpeed's default bucket is 5e8 elements; the axis tries it and two smaller ones.
BUCKETS = ["5e7", "2e8", "5e8"]
DEFAULT_AXES: dict[str, list[str]] = {
    "zero": ["stage0", "stage1", "stage2", "stage3"],
    "batch.micro_batch_size": ["1", "2", "4", "8", "16", "32"],
    "recompute": ["none", "selective", "full"],
    "zero.reduce_bucket_size": BUCKETS,
    "zero.allgather_bucket_size": BUCKETS,
    "zero.prefetch_bucket_size": BUCKETS,
    "zero.offload_optimizer": ["none", "cpu"],
}
# Which ZeRO stages read an axis (DeepSpeed's zero_optimization: stage 0 all-reduces in
# fixed-size buffers, allgather_bucket_size is stages 1-2's, stage3_prefetch_bucket_size stage 3's,
# offload needs a partitioned optimizer).
READ_BY_STAGES = {
    "zero.reduce_bucket_size": {1, 2, 3},
    "zero.allgather_bucket_size": {1, 2},
    "zero.prefetch_bucket_size": {3},
    "zero.offload_optimizer": {1, 2, 3},
    "zero.offload_param": {3},
}


@dataclass
class Candidate:
    """One point of the space: its overrides (the user's fixed ones, then the axes'), planned."""

    key: tuple[str, ...]  # the axis overrides, what tells candidates apart
    overrides: tuple[str, ...]
    status: str  # "fits" | "does not fit" | "invalid" | "same in effect"
    reason: str = ""
    spec: TrialSpec | None = field(default=None, repr=False)
    predicted_tokens_per_sec_per_gpu: float | None = None  # by the plan as launched (the preset's parameters)
    predicted_step_s: float | None = None
    predicted_memory: int | None = None  # bytes per rank at the peak

    def label(self) -> str:
        return " ".join(self.key)


@dataclass
class Space:
    fixed: list[str]
    axes: dict[str, list[str]]
    candidates: list[Candidate]

    @property
    def fitting(self) -> list[Candidate]:
        return [c for c in self.candidates if c.status == "fits"]


def axes_of(overrides: Sequence[str]) -> tuple[list[str], dict[str, list[str]]]:
    """(the fixed overrides, the axes) of a tune command line."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception as exc:  # Hydra's parse error, said our way
        raise config_error(exc, list(overrides)) from None
    axes = dict(DEFAULT_AXES)
    fixed: list[str] = []
    for o in parsed:
        name = o.key_or_group
        if o.is_sweep_override():
            if not o.is_discrete_sweep() or o.value_type == ValueType.GLOB_CHOICE_SWEEP:
                raise ConfigError(
                    name,
                    str(o.input_line).partition("=")[2],
                    "a list of values (a,b,c) or range(start,stop[,step]) to search over",
                )
            axes[name] = [str(v) for v in o.sweep_string_iterator()]
        else:
            axes.pop(name, None)  # fixed by the user
            if name == "zero.stage":
                axes.pop("zero", None)
            fixed.append(str(o.input_line))
    if "zero.stage" in axes:  # zero.stage=0,1 sweeps the same thing as zero=stage0,stage1
        axes.pop("zero", None)
    return fixed, axes


def _stage(point: dict[str, str], fixed_stage: int | None) -> int | None:
    if "zero" in point:
        return int(point["zero"].removeprefix("stage"))
    if "zero.stage" in point:
        return int(point["zero.stage"])
    return fixed_stage


def points(axes: dict[str, list[str]], fixed_stage: int | None) -> list[tuple[str, ...]]:
    """The distinct axis-override tuples, with the axes a point's stage does not read left out."""
    names = list(axes)
    seen: dict[tuple[str, ...], None] = {}
    for values in itertools.product(*(axes[n] for n in names)):
        point = dict(zip(names, values))
        stage = _stage(point, fixed_stage)
        key = tuple(
            f"{n}={v}"
            for n, v in point.items()
            if stage is None or n not in READ_BY_STAGES or stage in READ_BY_STAGES[n]
        )
        seen.setdefault(key, None)
    return list(seen)


def plan_space(overrides: list[str], runnable_check: Callable[[TrialSpec], None] | None = None) -> Space:
    """Every candidate of the command line's space, planned. ConfigError when the space is
    empty, when the fixed part is invalid, or when no candidate can run (the constraint
    that excludes them all named). `orchestrator tune` plans before Hydra starts, the
    sweeper again inside it: the second time is the first's."""
    return _plan_space(tuple(overrides), runnable_check)


@functools.lru_cache(maxsize=2)
def _plan_space(overrides: tuple[str, ...], runnable_check: Callable[[TrialSpec], None] | None) -> Space:
    fixed, axes = axes_of(overrides)
    base = build_spec(fixed)  # the fixed part must be valid on its own: its error, not one per point
    if runnable_check is not None:
        runnable_check(base)  # a GPU model on a machine without one: said before planning every candidate
    empty = [n for n, v in axes.items() if not v]
    if empty:
        raise ConfigError(empty[0], "(no values)", "at least one value: the search space is empty")
    size = math.prod(len(v) for v in axes.values())
    if size > MAX_POINTS:
        raise ConfigError(
            "search space",
            f"{size:,} combinations",
            f"at most {MAX_POINTS:,} (each is planned before the search starts, about 10 ms each); narrow an axis",
        )
    candidates: list[Candidate] = []
    effects: dict[tuple, Candidate] = {}
    for key in points(axes, base.cfg.zero.stage):
        overrides_ = (*fixed, *key)
        try:
            spec = build_spec(overrides_)
        except ConfigError as exc:
            candidates.append(Candidate(key, overrides_, "invalid", str(exc)))
            continue
        effect = in_effect(key, spec)
        if effect in effects:
            candidates.append(
                Candidate(
                    key,
                    overrides_,
                    "same in effect",
                    f"runs as {effects[effect].label()} does "
                    f"({', '.join(why for _, why in effect if why) or 'the same settings'})",
                )
            )
            continue
        candidates.append(planned(key, overrides_, spec, plan_trial(spec)))
        effects[effect] = candidates[-1]
    space = Space(fixed, axes, candidates)
    if not space.fitting:  # the plan refuses them all (exit 3, as `plan` says), or none is valid (exit 2)
        if any(c.status == "does not fit" for c in candidates):
            raise PlanRefused(f"search space of {len(candidates)} candidates: {nothing_runs(space)}")
        raise ConfigError("search space", f"{len(candidates)} candidates", nothing_runs(space))
    return space


BUCKET_AXES = ("zero.reduce_bucket_size", "zero.allgather_bucket_size", "zero.prefetch_bucket_size")


def in_effect(key: tuple[str, ...], spec: TrialSpec) -> tuple[tuple[str, str], ...]:
    """A candidate's axis settings as they act on this trial: a bucket of at least the
    model's parameter count holds the whole model (any larger one is the same), and an
    offload on a device that is the host (a CPU) moves nothing. Each setting with why it
    was changed ('' where it acts as given)."""
    params = count_parameters(spec.cfg.model)
    out = []
    for item in key:
        name, _, value = item.partition("=")
        if name in BUCKET_AXES and float(value) >= params:
            out.append((f"{name}=all", f"{name} >= the model's {params:,} parameters: one bucket"))
        elif name.startswith("zero.offload_") and not spec.cfg.hardware.device.is_gpu:
            out.append((f"{name}=none", f"{name} on a CPU device moves nothing"))
        else:
            out.append((item, ""))
    return tuple(out)


def planned(key: tuple[str, ...], overrides: tuple[str, ...], spec: TrialSpec, plan: Plan) -> Candidate:
    m = plan.memory
    status, reason = "fits", ""
    if not m.fits:
        status = "does not fit"
        reason = f"predicted {m.total / GIB:.2f} GiB per rank > {m.capacity / GIB:.2f} GiB ({m.peak_phase})"
    return Candidate(key, overrides, status, reason, spec, plan.time.tokens_per_sec_per_gpu, plan.time.step_s, m.total)


def nothing_runs(space: Space) -> str:
    """Why no candidate of the space can run, naming the constraint that excludes them all."""
    sized = [c for c in space.candidates if c.status == "does not fit"]
    if sized:
        least = min(sized, key=lambda c: c.predicted_memory or 0)
        return (
            f"at least one candidate that fits in device memory, but none does: the smallest, {least.label()}, "
            f"needs {least.reason.removeprefix('predicted ')}; more ranks (parallel.dp), a larger ZeRO stage, "
            "smaller micro batches, more recompute or offload would be needed"
        )
    first = space.candidates[0].reason if space.candidates else "no candidate"
    return f"at least one valid candidate, but every one is invalid, e.g.: {first}"
