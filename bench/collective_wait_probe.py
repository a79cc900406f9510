"""The probe that workload/collective_wait.py grew from (issue 72): each rank's time inside
torch.distributed collectives, synchronous or through Work.wait(), and its compute as the step
less that (bench/RESULTS.md, "Each rank's wait in collectives, probed"). torchrun 2 ranks:
  OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 bench/collective_wait_probe.py STAGE SLOW_S
FSDP2 (torch 2.13) calls dist.all_gather_single / reduce_scatter_single: wrap those too."""

import json
import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch
import torch.distributed as dist

WAIT = [0.0]
NAMES = (
    "all_gather_single",
    "reduce_scatter_single",
    "all_reduce",
    "reduce_scatter_tensor",
    "all_gather_into_tensor",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "barrier",
    "all_to_all_single",
)


class TimedWork:
    def __init__(self, work):
        self._work = work

    def wait(self, *a, **k):
        t = time.perf_counter()
        try:
            return self._work.wait(*a, **k)
        finally:
            WAIT[0] += time.perf_counter() - t

    def __getattr__(self, name):
        return getattr(self._work, name)


def wrap(name):
    real = getattr(dist, name)

    def timed(*a, **k):
        t = time.perf_counter()
        out = real(*a, **k)
        if k.get("async_op"):
            return TimedWork(out) if out is not None else out
        WAIT[0] += time.perf_counter() - t
        return out

    setattr(dist, name, timed)


for n in NAMES:
    if hasattr(dist, n):
        wrap(n)

import deepspeed  # noqa: E402  (after the collectives are wrapped: DeepSpeed binds nothing at import, but say so)
from small_engine import deepspeed_mlp  # noqa: E402

stage = int(sys.argv[1])
slow = float(sys.argv[2])
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
rank = dist.get_rank()
_, eng = deepspeed_mlp(stage)
x = torch.randn(4, 512)
rows = []
for _ in range(6):
    WAIT[0] = 0.0
    t = time.perf_counter()
    loss = eng(x).pow(2).mean()
    if rank == 1 and slow:
        time.sleep(slow)
    eng.backward(loss)
    eng.step()
    total = time.perf_counter() - t
    rows.append((round(total, 4), round(WAIT[0], 4), round(total - WAIT[0], 4)))
print(json.dumps({"rank": rank, "stage": stage, "rows": rows[2:]}), flush=True)
