"""One rank of bench/comm_check.py's collective measurement (run by srun, one per task).

torch.distributed over gloo, its variables from SLURM's (submitit's
TorchDistributedEnvironment, as the orchestrator's own SLURM task). For each collective
and size: one untimed call, then the median of REPS timed calls, each started together
(a barrier) and ended by the slowest rank (a barrier). Rank 0 prints one JSON line.
Usage: collective_worker.py SIZES_BYTES REPS
"""

import json
import statistics
import sys
import time

import submitit
import torch
import torch.distributed as dist


def timed(call, reps: int) -> float:
    call()
    times = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        call()
        dist.barrier()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    sizes, reps = [int(s) for s in sys.argv[1].split(",")], int(sys.argv[2])
    env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    dist.init_process_group("gloo")
    n = dist.get_world_size()
    barrier = timed(lambda: None, reps)  # what the two barriers alone cost, taken off every figure
    rows = []
    for nbytes in sizes:
        elements = max(n, nbytes // 4 // n * n)  # fp32, divisible by the world size
        full, part = torch.ones(elements), torch.ones(elements // n)
        calls = {"all_reduce": lambda: dist.all_reduce(full),
                 "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full),
                 "all_gather": lambda: dist.all_gather_into_tensor(full, part)}
        for op, call in calls.items():
            rows.append({"op": op, "bytes": elements * 4, "seconds": max(0.0, timed(call, reps) - barrier)})
    hosts = _hosts()
    if env.rank == 0:
        print(json.dumps({"world": n, "nodes": len(set(hosts)), "barrier_s": barrier, "rows": rows}), flush=True)
    dist.destroy_process_group()


def _hosts() -> list[str]:
    import socket

    names = [None] * dist.get_world_size()
    dist.all_gather_object(names, socket.gethostname())
    return names


if __name__ == "__main__":
    main()
