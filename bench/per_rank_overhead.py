"""What every rank's step costs (bench/RESULTS.md, "Every rank's step: its cost"), two gloo
ranks under torchrun:

  OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 bench/per_rank_overhead.py

1. A collective through workload/collective_wait.py against torch's own: 1-element
   all_reduces, in alternating blocks, so the two are measured under the same load; and the
   clock's own cost a call, a span around nothing.
2. The step's closing agreement (checkpoint.agree): one 1-element all_reduce a step.
3. How many collectives a step of each engine makes (ZeRO 0-3 and FSDP2 on a small MLP),
   counted through the same wrapper: the per-call cost times this is the cost a step.
Rank 0 prints one JSON line.
"""

import json
import os
import statistics
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch
import torch.distributed as dist
from small_engine import LAYERS, deepspeed_mlp

from orchestrator.workload.checkpoint import agree
from orchestrator.workload.collective_wait import CollectiveWait
from orchestrator.workload.device import Device

BLOCK, BLOCKS = 200, 10


def per_call_us(device: Device) -> tuple[float, float]:
    x = torch.ones(1)
    plain, wrapped = [], []
    for _ in range(BLOCKS):
        for into, wrap in ((plain, False), (wrapped, True)):
            with CollectiveWait(device) if wrap else open(os.devnull) as _:
                dist.barrier()
                start = time.perf_counter()
                for _ in range(BLOCK):
                    dist.all_reduce(x)
                into.append((time.perf_counter() - start) / BLOCK * 1e6)
    return statistics.median(plain), statistics.median(wrapped)


def calls_per_step(stage: int | None, device: Device) -> int:
    if stage is None:  # FSDP2, on the same MLP
        from torch.distributed.fsdp import fully_shard

        model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(LAYERS)])
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters())
        step = lambda: (model(torch.randn(4, 256)).pow(2).mean().backward(), opt.step(), opt.zero_grad())  # noqa: E731
    else:
        _, eng = deepspeed_mlp(stage, width=256, reduce_bucket=20000)

        def step():
            eng.backward(eng(torch.randn(4, 256)).pow(2).mean())
            eng.step()

    step()
    wait = CollectiveWait(device)
    counted = [0]
    span = wait.span

    def counting(name):
        counted[0] += wait._depth == 0  # the outermost, as the clock counts them
        return span(name)

    wait.span = counting  # type: ignore[method-assign]
    with wait:
        step()
    return counted[0]


def main() -> None:
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    device = Device.for_rank("cpu", os.environ)
    plain, wrapped = per_call_us(device)
    clock = CollectiveWait(device)
    start = time.perf_counter()
    for _ in range(100_000):
        with clock.span("all_reduce"):
            pass
    span_us = (time.perf_counter() - start) / 100_000 * 1e6
    clock.step_seconds()
    agreement = []
    for _ in range(BLOCKS):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(BLOCK):
            agree(device)
        agreement.append((time.perf_counter() - start) / BLOCK * 1e6)
    calls = {f"zero{s}" if s is not None else "fsdp2": calls_per_step(s, device) for s in (0, 1, 2, 3, None)}
    if dist.get_rank() == 0:
        print(
            json.dumps(
                {
                    "all_reduce_us": round(plain, 1),
                    "wrapped_all_reduce_us": round(wrapped, 1),
                    "overhead_us_per_call": round(wrapped - plain, 1),
                    "span_alone_us": round(span_us, 2),  # the clock's own cost a call, no collective
                    "agreement_us_per_step": round(statistics.median(agreement), 1),
                    "collectives_per_step": calls,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
