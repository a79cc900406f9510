"""A probe for issue 72's part 2 (not yet in the workload): one profiled DeepSpeed step per
rank, reduced to compute, communication and exposed communication from the trace's own
intervals. Two gloo ranks under torchrun, this CPU (bench/RESULTS.md, "A profiled step's
exposed communication, probed"):

  OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 bench/profiled_step_probe.py STAGE

On a CPU, gloo runs each collective on a thread of its own ("gloo:all_reduce", ...), and the
rank's thread only enqueues it ("c10d::allreduce_"). Compute: the union of the rank thread's
aten:: ops. Communication: the union of the gloo threads' intervals. Exposed: communication
not under compute. Rank 0 prints one JSON line per rank, gathered.
"""

import json
import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed
import torch
import torch.distributed as dist
import torch.profiler as tp
from small_engine import deepspeed_mlp


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def length(intervals) -> float:
    return sum(end - start for start, end in intervals)


def covered(a, b) -> float:
    """How much of the union a lies under the union b."""
    total = 0.0
    for start, end in a:
        for s, e in b:
            total += max(0.0, min(end, e) - max(start, s))
    return total


def main() -> None:
    stage = int(sys.argv[1])
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    _, eng = deepspeed_mlp(stage)
    x = torch.randn(4, 512)

    def step():
        eng.backward(eng(x).pow(2).mean())
        eng.step()

    step()
    step()
    dist.barrier()
    with tp.profile(activities=[tp.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        step()
        seconds = time.perf_counter() - start
    events = list(prof.events())
    main_thread = min(e.thread for e in events)
    compute = union(
        [
            (e.time_range.start, e.time_range.end)
            for e in events
            if e.thread == main_thread and e.name.startswith("aten::")
        ]
    )
    comm_by_kind: dict[str, list] = {}
    for e in events:
        if e.name.startswith("gloo:"):
            comm_by_kind.setdefault(e.name[5:], []).append((e.time_range.start, e.time_range.end))
    comm = union([i for v in comm_by_kind.values() for i in v])
    row = {
        "rank": dist.get_rank(),
        "stage": stage,
        "step_ms": round(seconds * 1e3, 1),
        "compute_ms": round(length(compute) / 1e3, 1),
        "comm_ms": round(length(comm) / 1e3, 1),
        "exposed_ms": round((length(comm) - covered(comm, compute)) / 1e3, 1),
        "by_kind_ms": {k: round(length(union(v)) / 1e3, 1) for k, v in sorted(comm_by_kind.items())},
    }
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    if dist.get_rank() == 0:
        for r in rows:
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
