"""Communication per step, as each engine schedules it, and the step time it leaves exposed.

What one call costs is plan/collectives.py's (NCCL's ring or tree, gloo's ring). This
module says which calls a step makes, on what, and what they can hide behind.

Per optimizer step and rank (g micro batches; gradients on the wire in the dtype the
engine reduces in, `wire_bytes`: DeepSpeed's communication_data_type, else the
gradients' own dtype):
- DeepSpeed stage 0: all-reduce of the gradients after the last micro batch's backward
  (its engine does not overlap it), in buckets of a fixed 5e8 elements
  (MEMORY_OPT_ALLREDUCE_SIZE: zero.reduce_bucket_size does not reach it).
- DDP (engine=accelerate, zero.stage=0; torch's DistributedDataParallel, as nanotron and
  most trainers reduce): gradient buckets of zero.reduce_bucket_size all-reduced while
  the last micro batch's backward still runs (Li et al., 2020); the other micro batches
  accumulate without communicating (no_sync).
- DeepSpeed stages 1 and 2: the gradient buckets are all-reduced, not reduce-scattered
  (DeepSpeed's use_multi_rank_bucket_allreduce, on by default: each rank then keeps its
  partition), then the updated parameters are all-gathered after step(). Stage 1 reduces
  during the last micro batch's backward; stage 2 during every micro batch's (gradients
  live only as partitions).
- DeepSpeed stage 3: all-gather in forward + all-gather in backward + reduce-scatter,
  every micro batch; after step(), each persistent parameter (at most
  param_persistence_threshold elements, kept whole on every rank but updated as a
  partition) is all-gathered in a call of its own (DeepSpeed's `_post_step`, whose
  "coalesced" gather issues one all-gather per parameter), behind nothing. Small calls,
  but one per bias and norm: at dp 2 on a CPU's gloo 39 of them took about 80 ms of a
  0.36 s step (bench/RESULTS.md).

Overlap (overlap_comm=true): a pass's buckets go out as its backward produces them, so
the pass takes the first bucket's backward, then the longer of the rest of the backward
and the communication of all but the last bucket, then the last bucket's communication.
Only the backward of the micro batch that communicates can hide it: with one micro batch
per step that is all there is, and the all-gather after step() hides behind nothing.
ZeRO-3's forward gathers are prefetched under the forward's compute the same way.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from orchestrator.config import Sharding, runs_as
from orchestrator.plan.collectives import CallTime, Network, call_time
from orchestrator.plan.params import element_bytes, parameter_tensors, persistent

if TYPE_CHECKING:
    from orchestrator.spec import TrialSpec


@dataclass(frozen=True)
class Collective:
    """One kind of call a step makes: how many, on how much, how, and what it costs."""

    op: str  # all_reduce | reduce_scatter | all_gather
    phase: str  # where it happens, for the reader
    dtype_bytes: int  # bytes per element on the wire
    bytes_per_call: float  # mean size of the buffer handed to the collective
    calls: int  # per optimizer step
    bytes_per_rank: float  # sent by one rank per step, as a ring sends it
    algorithm: str  # the one NCCL (gloo) runs at that size: ring | tree (the larger share of the calls)
    level: str  # intra | inter: the slowest level the calls cross
    busbw_gbps: float  # the bus bandwidth the calls' bandwidth terms add up to (their bytes / their byte-times)
    time_s: float  # all calls, run back to back
    exposed_s: float = 0.0  # of time_s, what compute did not hide
    busbw_note: str = ""  # where a measured table's figure was not measured itself: what it rests on

    def as_dict(self) -> dict:
        return asdict(self)


def buckets(total_elements: int, bucket_elements: int) -> list[int]:
    """Bucket sizes in elements: full buckets then the remainder."""
    full, rest = divmod(total_elements, bucket_elements)
    return [bucket_elements] * full + ([rest] if rest else [])


def packed_buckets(tensors: list[int], bucket_elements: int) -> list[int]:
    """Gradient buckets as DeepSpeed (and DDP) fill them: whole tensors in backward order
    (the model's, reversed) until the next would overflow the bucket; a tensor larger than
    the bucket goes alone. So a bucket far smaller than the tensors gives one collective per
    tensor, not total / bucket of them."""
    out, current = [], 0
    for numel in reversed(tensors):
        if current and current + numel > bucket_elements:
            out.append(current)
            current = 0
        current += numel
    return out + ([current] if current else [])


@dataclass(frozen=True)
class Calls:
    """One op's calls on buffers of `sizes` elements, each timed once (collectives.call_time)."""

    op: str
    sizes: list[int]
    dtype_bytes: int
    times: list[CallTime]

    @property
    def seconds(self) -> list[float]:
        return [t.seconds for t in self.times]


def calls(op: str, sizes: list[int], dtype_bytes: int, net: Network) -> Calls:
    return Calls(op, sizes, dtype_bytes, [call_time(op, float(e * dtype_bytes), net) for e in sizes])


def collective(phase: str, c: Calls, net: Network, per_step: int = 1, exposed_s: float = 0.0) -> Collective:
    """What `c`, made `per_step` times a step, costs and puts on the wire."""
    total = sum(c.sizes) * c.dtype_bytes
    steps = (2 if c.op == "all_reduce" else 1) * (net.ranks - 1) / net.ranks
    algorithm = max(("ring", "tree", "measured", "none"), key=lambda a: sum(1 for t in c.times if t.algorithm == a))
    time_s = per_step * sum(c.seconds)
    moved = [(e, t.busbw) for e, t in zip(c.sizes, c.times) if t.busbw > 0]
    busbw = sum(e for e, _ in moved) / sum(e / b for e, b in moved) if moved else 0.0
    return Collective(
        op=c.op,
        phase=phase,
        dtype_bytes=c.dtype_bytes,
        bytes_per_call=total / len(c.times) if c.times else 0.0,
        calls=per_step * len(c.times),
        bytes_per_rank=per_step * steps * total,
        algorithm=algorithm,
        level=net.level,
        busbw_gbps=busbw / 1e9,
        time_s=time_s,
        exposed_s=min(exposed_s, time_s),
        busbw_note="; ".join(dict.fromkeys(t.note for t in c.times if t.note)),
    )


def overlapped(compute_s: float, comm_bucket_s: list[float]) -> float:
    """A pass whose buckets communicate while it computes: from its start to its last bucket's end."""
    if not comm_bucket_s:
        return compute_s
    k = len(comm_bucket_s)
    first, rest = compute_s / k, compute_s * (k - 1) / k
    return first + max(rest, sum(comm_bucket_s[:-1])) + comm_bucket_s[-1]


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    comm_s: float  # all communication time, as if nothing overlapped
    exposed_s: float  # what the step waits for
    step_s: float
    collectives: list[Collective]


STAGE0_BUCKET = 500_000_000  # elements: DeepSpeed's engine all-reduces stage 0 gradients in these


@dataclass(frozen=True)
class CommSchedule:
    """What the engine communicates and how: the plan's inputs to step_time."""

    stage: int
    tensors: list[int]  # elements of each parameter tensor, in the model's order (params.py)
    param_bytes: int  # bytes per element of a gathered parameter
    wire_bytes: int  # bytes per element of a gradient on the wire
    reduce_bucket: int
    allgather_bucket: int
    prefetch_bucket: int
    overlap_comm: bool
    ddp: bool = False  # stage 0 as torch DDP (engine=accelerate): bucketed, overlapped
    persistence_threshold: int = 0  # stage 3: tensors of at most this many elements stay whole


def step_time(s: CommSchedule, *, grad_accum: int, fwd_s: float, bwd_s: float, net: Network) -> StepTime:
    """Step time of `grad_accum` micro batches of forward `fwd_s` and backward `bwd_s`."""
    micro = fwd_s + bwd_s
    overlap = s.overlap_comm and net.ranks > 1
    if s.stage == 0:
        reduce = calls(
            "all_reduce", packed_buckets(s.tensors, s.reduce_bucket if s.ddp else STAGE0_BUCKET), s.wire_bytes, net
        )
        last = overlapped(bwd_s, reduce.seconds) if s.ddp and overlap else bwd_s + sum(reduce.seconds)
        step = (grad_accum - 1) * micro + fwd_s + last
        phase = "backward of the last micro batch, gradient buckets" if s.ddp else "after the last backward"
        c = [collective(phase, reduce, net, exposed_s=last - bwd_s)]
    elif s.stage in (1, 2):
        every = grad_accum if s.stage == 2 else 1
        reduce = calls("all_reduce", packed_buckets(s.tensors, s.reduce_bucket), s.wire_bytes, net)
        with_comm = overlapped(bwd_s, reduce.seconds) if overlap else bwd_s + sum(reduce.seconds)
        gather = collective(
            "after step(), updated parameters",
            calls("all_gather", buckets(sum(s.tensors), s.allgather_bucket), s.param_bytes, net),
            net,
            exposed_s=math.inf,
        )
        where = ", every micro batch" if s.stage == 2 else ", last micro batch"
        c = [
            collective(
                "backward, gradient buckets" + where, reduce, net, per_step=every, exposed_s=every * (with_comm - bwd_s)
            ),
            gather,
        ]
        step = (grad_accum - every) * micro + every * (fwd_s + with_comm) + gather.time_s
    else:
        step, c = _stage3(s, grad_accum, fwd_s, bwd_s, net, overlap)
    compute = grad_accum * micro
    comm = math.fsum(x.time_s for x in c)
    return StepTime(compute_s=compute, comm_s=comm, exposed_s=max(0.0, step - compute), step_s=step, collectives=c)


def _stage3(
    s: CommSchedule, grad_accum: int, fwd_s: float, bwd_s: float, net: Network, overlap: bool
) -> tuple[float, list[Collective]]:
    """ZeRO-3: gather in forward and backward, reduce-scatter in backward, every micro batch."""
    gathers = calls("all_gather", buckets(sum(s.tensors), s.prefetch_bucket), s.param_bytes, net)
    scatters = calls("reduce_scatter", packed_buckets(s.tensors, s.reduce_bucket), s.wire_bytes, net)
    fetch, reduce = gathers.seconds, scatters.seconds
    if overlap:
        fwd = overlapped(fwd_s, fetch)
        bwd = overlapped(bwd_s, _interleave(fetch, reduce))
    else:
        fwd, bwd = fwd_s + sum(fetch), bwd_s + sum(fetch) + sum(reduce)
    per_micro = {"forward": fwd - fwd_s, "backward": bwd - bwd_s}
    b_total = sum(fetch) + sum(reduce)
    c = [
        collective(
            "forward, every micro batch", gathers, net, per_step=grad_accum, exposed_s=grad_accum * per_micro["forward"]
        ),
        collective(
            "backward, every micro batch",
            gathers,
            net,
            per_step=grad_accum,
            exposed_s=grad_accum * per_micro["backward"] * (sum(fetch) / b_total if b_total else 0),
        ),
        collective(
            "backward, every micro batch",
            scatters,
            net,
            per_step=grad_accum,
            exposed_s=grad_accum * per_micro["backward"] * (sum(reduce) / b_total if b_total else 0),
        ),
    ]
    kept = persistent(s.tensors, s.persistence_threshold) if net.ranks > 1 else []
    if kept:
        c.append(
            collective(
                "after step(), each persistent parameter",
                calls("all_gather", kept, s.param_bytes, net),
                net,
                exposed_s=math.inf,
            )
        )
    return grad_accum * (fwd + bwd) + (c[-1].time_s if kept else 0.0), c


def _interleave(fetch: list[float], reduce: list[float]) -> list[float]:
    """Backward's communication as buckets: the gathers and reduce-scatters, spread evenly."""
    k = max(len(fetch), len(reduce))
    total = sum(fetch) + sum(reduce)
    return [total / k] * k if k else []


def bytes_per_rank_per_step(collectives: list[Collective]) -> float:
    return math.fsum(c.bytes_per_rank for c in collectives)


def wire_dtype(spec: TrialSpec) -> str:
    """The dtype gradients are reduced in: communication_dtype, else the dtype they were
    accumulated in (BF16_Optimizer's fp32 at stage 1), else the training precision."""
    z = spec.cfg.zero
    return str(z.communication_dtype or (z.grad_accum_dtype if z.stage == 1 else None) or spec.precision)


def schedule_of(spec: TrialSpec) -> CommSchedule:
    """What the trial's engine communicates, in which dtypes and buckets."""
    z, engine = spec.cfg.zero, spec.cfg.engine
    return CommSchedule(
        stage=z.stage,
        tensors=[p.numel for p in parameter_tensors(spec.cfg.model)],
        param_bytes=element_bytes(spec.precision),
        wire_bytes=element_bytes(wire_dtype(spec)),
        reduce_bucket=z.reduce_bucket_size,
        allgather_bucket=z.allgather_bucket_size,
        prefetch_bucket=z.prefetch_bucket_size,
        overlap_comm=z.overlap_comm,
        ddp=runs_as(engine.backend, z.stage) == Sharding.ddp,
        persistence_threshold=z.param_persistence_threshold,
    )
