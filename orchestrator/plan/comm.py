"""Communication per step and the step time it leaves exposed (docs/theory.md).

Ring collectives over n ranks (NCCL's ring; trees do better at scale, so this is an
upper bound): an all-reduce takes 2(n-1) steps, a reduce-scatter or
all-gather n-1. The ring moves in lock step, so once it spans nodes every step waits for
the slowest link: its latency and bytes/n over its bandwidth (the alpha-beta model):

    t = call + steps * (lat + (bytes / n) / bw),   lat, bw = the inter-node link's if nodes > 1

Across nodes NCCL runs one ring per channel, each crossing at a different GPU, so a node's
g GPUs' NICs share the inter-node hops: bw there is g x the per-GPU link (or the intra-node
link, if slower). With one rank per node (the CPU test cluster) that is the link itself.

`call` is a fixed cost per collective that the engine issues, whatever its size: DeepSpeed
flattens each bucket, launches the collective and copies the result back
(hardware.collective_overhead_us). On the 2-core test nodes it is milliseconds, and it
orders the bucket sizes: many small buckets pay it many times (bench/RESULTS.md).

gloo (the CPU backend) reduce-scatters with an all-reduce's traffic: on the shaped
test cluster its reduce_scatter_tensor took 1.0-1.1x an all-reduce of the same buffer at
4-16 MB (bench/comm_check.py, bench/RESULTS.md), so it is charged as one.

Per optimizer step and rank, as DeepSpeed schedules them:
- stage 0: all-reduce of the gradients at the last micro batch, after the backward
  (DeepSpeed's engine does not overlap it), in buckets of its fixed 5e8 elements
  (MEMORY_OPT_ALLREDUCE_SIZE: zero.reduce_bucket_size does not reach it): 2x the gradient bytes.
- stages 1 and 2: the gradient buckets are all-reduced, not reduce-scattered (DeepSpeed's
  use_multi_rank_bucket_allreduce, on by default: each rank then keeps its partition),
  then the updated parameters are all-gathered after step(): 3x. Stage 1 reduces at the
  last micro batch; stage 2 at EVERY micro batch (gradients live only as partitions), so
  its volume grows with grad accumulation.
- stage 3: all-gather in forward + all-gather in backward + reduce-scatter, every
  micro batch: 3x.
Overlap (overlap_comm=true, stages 1-3): step = fwd + first bucket of bwd +
max(rest of bwd, comm of all but the last bucket) + comm of the last bucket. ZeRO-3's
forward gathers are prefetched under the forward's compute the same way.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Links:
    ranks: int
    nodes: int
    intra_bw: float  # bytes/s per rank, one direction
    intra_lat: float  # seconds per hop
    inter_bw: float
    inter_lat: float
    backend: str = "nccl"  # nccl | gloo: how a reduce-scatter is carried out
    call: float = 0.0  # seconds of fixed cost per collective the engine issues


@dataclass(frozen=True)
class Collective:
    op: str  # all_reduce | reduce_scatter | all_gather
    phase: str  # where it happens, for the reader
    bytes_per_call: float  # mean size of the buffer handed to the collective
    calls: int  # per optimizer step
    bytes_per_rank: float  # sent by one rank per step: (n-1)/n of each buffer per ring pass
    time_s: float  # all calls, run back to back

    def as_dict(self) -> dict:
        return asdict(self)


def ring_rounds(op: str, backend: str = "nccl") -> int:
    """Passes around the ring: 2 for an all-reduce (reduce-scatter + all-gather), else 1;
    gloo reduce-scatters with an all-reduce."""
    return 2 if op == "all_reduce" or (op == "reduce_scatter" and backend == "gloo") else 1


def ring_time(op: str, nbytes: float, links: Links) -> float:
    """Seconds for one ring collective of an `nbytes` buffer, its fixed cost included."""
    n = links.ranks
    if n == 1 or nbytes <= 0:
        return 0.0
    steps = ring_rounds(op, links.backend) * (n - 1)
    chunk = nbytes / n
    if links.nodes == 1:
        return links.call + steps * (links.intra_lat + chunk / links.intra_bw)
    # NCCL runs one ring per channel, each crossing between nodes at a different GPU, so
    # the ring's inter-node traffic is spread over all of a node's NICs (one per GPU).
    per_node = n / links.nodes
    hop = max(chunk / links.intra_bw, chunk / (links.inter_bw * per_node))
    return links.call + steps * (links.inter_lat + hop)


def buckets(total_elements: int, bucket_elements: int) -> list[int]:
    """Bucket sizes in elements: full buckets then the remainder."""
    full, rest = divmod(total_elements, bucket_elements)
    return [bucket_elements] * full + ([rest] if rest else [])


def packed_buckets(tensors: list[int], bucket_elements: int) -> list[int]:
    """Gradient buckets as DeepSpeed fills them: whole tensors in backward order (the
    model's, reversed) until the next would overflow the bucket; a tensor larger than the
    bucket goes alone. So a bucket far smaller than the tensors gives one collective per
    tensor, not total / bucket of them."""
    out, current = [], 0
    for numel in reversed(tensors):
        if current and current + numel > bucket_elements:
            out.append(current)
            current = 0
        current += numel
    return out + ([current] if current else [])


def collective(op: str, phase: str, sizes_bytes: list[float], links: Links, per_step: int = 1) -> Collective:
    n = links.ranks
    passes = ring_rounds(op, links.backend) * (n - 1) / n
    mean = sum(sizes_bytes) / len(sizes_bytes) if sizes_bytes else 0.0
    return Collective(op=op, phase=phase, bytes_per_call=mean, calls=per_step * len(sizes_bytes),
                      bytes_per_rank=per_step * passes * sum(sizes_bytes),
                      time_s=per_step * sum(ring_time(op, b, links) for b in sizes_bytes))


def overlapped(compute_s: float, comm_bucket_s: list[float]) -> float:
    """004's bucketed overlap: time from the start of a pass to its last bucket's end."""
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


def step_time(*, stage: int, tensors: list[int], param_bytes: int, grad_bytes: int, reduce_bucket: int,
              allgather_bucket: int, prefetch_bucket: int, overlap_comm: bool, grad_accum: int,
              fwd_s: float, bwd_s: float, links: Links) -> StepTime:
    """Step time of `grad_accum` micro batches of forward `fwd_s` and backward `bwd_s`.

    tensors: the elements of each parameter tensor, in the model's order (params.py)."""
    n_params = sum(tensors)
    g = [e * grad_bytes for e in packed_buckets(tensors, STAGE0_BUCKET if stage == 0 else reduce_bucket)]
    p_gather = [e * param_bytes for e in buckets(n_params, allgather_bucket)]
    p_fetch = [e * param_bytes for e in buckets(n_params, prefetch_bucket)]
    micro = fwd_s + bwd_s
    overlap = overlap_comm and links.ranks > 1
    if stage == 0:
        c = [collective("all_reduce", "after backward, last micro batch", g, links)]
        step = grad_accum * micro + c[0].time_s
    elif stage in (1, 2):
        every = grad_accum if stage == 2 else 1
        ar = collective("all_reduce", "backward, gradient buckets" + (", every micro batch" if stage == 2
                                                                      else ", last micro batch"), g, links, per_step=every)
        ag = collective("all_gather", "after step(), updated parameters", p_gather, links)
        c = [ar, ag]
        ar_buckets = [ring_time("all_reduce", b, links) for b in g]
        with_comm = fwd_s + (overlapped(bwd_s, ar_buckets) if overlap else bwd_s + sum(ar_buckets))
        step = (grad_accum - every) * micro + every * with_comm + ag.time_s
    else:
        ag_f = collective("all_gather", "forward, every micro batch", p_fetch, links, per_step=grad_accum)
        ag_b = collective("all_gather", "backward, every micro batch", p_fetch, links, per_step=grad_accum)
        rs = collective("reduce_scatter", "backward, every micro batch", g, links, per_step=grad_accum)
        c = [ag_f, ag_b, rs]
        fetch = [ring_time("all_gather", b, links) for b in p_fetch]
        reduce = [ring_time("reduce_scatter", b, links) for b in g]
        if overlap:
            fwd = overlapped(fwd_s, fetch)
            bwd = overlapped(bwd_s, _interleave(fetch, reduce))
        else:
            fwd, bwd = fwd_s + sum(fetch), bwd_s + sum(fetch) + sum(reduce)
        step = grad_accum * (fwd + bwd)
    compute = grad_accum * micro
    comm = sum(x.time_s for x in c)
    return StepTime(compute_s=compute, comm_s=comm, exposed_s=max(0.0, step - compute), step_s=step, collectives=c)


def _interleave(fetch: list[float], reduce: list[float]) -> list[float]:
    """Backward's communication as buckets: the gathers and reduce-scatters, spread evenly."""
    k = max(len(fetch), len(reduce))
    total = sum(fetch) + sum(reduce)
    return [total / k] * k if k else []


def links_for(ranks: int, nodes: int, intra_gbps: float, intra_us: float, inter_gbps: float, inter_us: float,
              backend: str = "nccl", call_us: float = 0.0) -> Links:
    return Links(ranks=ranks, nodes=nodes, intra_bw=intra_gbps * 1e9, intra_lat=intra_us * 1e-6,
                 inter_bw=inter_gbps * 1e9, inter_lat=inter_us * 1e-6, backend=backend, call=call_us * 1e-6)


def bytes_per_rank_per_step(collectives: list[Collective]) -> float:
    return math.fsum(c.bytes_per_rank for c in collectives)
