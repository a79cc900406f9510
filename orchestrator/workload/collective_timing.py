"""One rank of a link measurement (`orchestrator calibrate --links`, bench/comm_check.py).

torch.distributed on the rank's backend (gloo here, NCCL on GPUs), its variables from
torchrun's environment or, under srun, from SLURM's (submitit's TorchDistributedEnvironment,
as the orchestrator's own SLURM task). For each collective and size: one untimed call, then
the median of REPS timed calls, each started together (a barrier) and ended by the slowest
rank (a barrier), less the median of what the barriers alone cost, timed beside each call so
that both see the same load: a barrier cost timed once, at the start, was taken off every call
after it, and on a busy machine a burst of load there timed every call below 2 MB at nothing.
Rank 0 prints one JSON line: the world, its nodes, and a row per collective and size.

Usage: python -m orchestrator.workload.collective_timing SIZES_BYTES REPS [DEVICE]
"""

from __future__ import annotations

import functools
import json
import os
import socket
import statistics
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist

from orchestrator.config import DeviceType
from orchestrator.core.process import freeze_at_exit
from orchestrator.workload.device import Device


def timed(
    call: Callable[[], object], reps: int, clock: Callable[[], float], barrier=dist.barrier
) -> tuple[float, float]:
    """(seconds of one call, seconds of the barrier that ends it): medians of `reps`, each rep
    a barrier-only interval and then the call's, back to back."""
    call()  # untimed: gloo sets up a size's buffers on its first call
    calls, barriers = [], []
    for _ in range(reps):
        barrier()
        start = clock()
        barrier()  # ends the barrier's interval, and starts the call on every rank together
        middle = clock()
        call()
        barrier()  # the slowest rank's end
        calls.append(clock() - middle)
        barriers.append(middle - start)
    barrier_s = statistics.median(barriers)
    return max(0.0, statistics.median(calls) - barrier_s), barrier_s


def main() -> None:
    freeze_at_exit()
    sizes, reps = [int(s) for s in sys.argv[1].split(",")], int(sys.argv[2])
    kind = DeviceType(sys.argv[3] if len(sys.argv) > 3 else "cpu")
    if "RANK" not in os.environ:  # a task of srun: SLURM's variables, as torch.distributed's
        import submitit

        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    device = Device.for_rank(kind, os.environ)
    dist.init_process_group(device.backend)
    n = dist.get_world_size()
    rows, barriers = [], []
    for nbytes in sizes:
        elements = max(n, nbytes // 4 // n * n)  # fp32, divisible by the world size
        full, part = torch.ones(elements, device=device.torch), torch.ones(elements // n, device=device.torch)
        calls: dict[str, Callable[[], object]] = {  # each bound to this size's tensors
            "all_reduce": functools.partial(dist.all_reduce, full),
            "reduce_scatter": functools.partial(dist.reduce_scatter_tensor, part, full),
            "all_gather": functools.partial(dist.all_gather_into_tensor, full, part),
        }
        for op, call in calls.items():
            seconds, barrier_s = timed(call, reps, device.clock)
            rows.append({"op": op, "bytes": elements * 4, "seconds": seconds})
            barriers.append(barrier_s)
    hosts = [None] * n
    dist.all_gather_object(hosts, socket.gethostname())
    if dist.get_rank() == 0:
        print(
            json.dumps({"world": n, "nodes": len(set(hosts)), "barrier_s": statistics.median(barriers), "rows": rows}),
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
