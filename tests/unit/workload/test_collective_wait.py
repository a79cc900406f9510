"""workload/collective_wait.py on a real gloo process group of two ranks (spawned processes
on loopback): a rank's seconds inside collectives, synchronous and asynchronous, counted
once where one collective calls another, and torch's functions put back afterwards."""

import json
import os
import socket
import time

import torch.distributed as dist
import torch.multiprocessing as mp

LATE_S = 0.3  # rank 1 comes to each collective this late


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, out: str) -> None:
    import torch

    from orchestrator.workload.collective_wait import CollectiveWait
    from orchestrator.workload.device import Device

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    real = dist.all_reduce
    late = lambda: time.sleep(LATE_S if rank == 1 else 0)  # noqa: E731
    seen = {}
    with CollectiveWait(Device.for_rank("cpu", {})) as wait:
        seen["wrapped"] = dist.all_reduce is not real
        dist.barrier()
        wait.start_step()  # the barrier before is not this step's
        late()
        dist.all_reduce(torch.ones(4))
        seen["sync"] = wait.step_seconds()[0]
        dist.barrier()
        wait.start_step()
        late()
        work = dist.all_reduce(torch.ones(4), async_op=True)
        time.sleep(2 * LATE_S if rank == 0 else 0)  # rank 0 computes past rank 1's arrival: no wait
        work.wait()
        seen["async, waited late"] = wait.step_seconds()[0]
        dist.barrier()
        wait.start_step()
        late()
        work = dist.all_reduce(torch.ones(4), async_op=True)
        work.wait()
        seen["async, waited at once"] = wait.step_seconds()[0]
        dist.barrier()
        wait.start_step()
        late()
        gathered = [None, None]
        dist.all_gather_object(gathered, rank)  # its own all_gather inside: one collective
        seen["nested"], kinds = wait.step_seconds()
        seen["nested kinds"] = sorted(kinds)
    seen["put back"] = dist.all_reduce is real
    dist.destroy_process_group()
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(seen, f)


def test_each_ranks_seconds_in_collectives_are_the_waits_it_made(tmp_path):
    mp.spawn(_rank, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    early, late = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert early["wrapped"] and early["put back"] and late["put back"]
    assert LATE_S * 0.9 < early["sync"] < LATE_S * 2  # rank 0 stood in the all_reduce for rank 1
    assert late["sync"] < LATE_S / 2  # rank 1 found rank 0 there already
    assert early["async, waited at once"] > LATE_S * 0.9 and late["async, waited at once"] < LATE_S / 2
    assert early["async, waited late"] < LATE_S / 2  # in flight while rank 0 computed: not a wait
    assert LATE_S * 0.9 < early["nested"] < LATE_S * 1.5  # counted once, not once per inner call
    assert early["nested kinds"] == ["all_gather"]  # as the outer call: all_gather_object


def test_a_collectives_kind_is_the_plans_name_for_it_and_the_agreement_is_its_own():
    from orchestrator.workload.collective_wait import CollectiveWait, collective_kind
    from orchestrator.workload.device import Device
    from orchestrator.workload.rank_steps import AGREEMENT

    names = ("all_gather_into_tensor", "reduce_scatter_single", "reduce_scatter_tensor", "all_reduce", "broadcast")
    assert [collective_kind(n) for n in names] == [
        "all_gather",
        "reduce_scatter",
        "reduce_scatter",
        "all_reduce",
        "broadcast",
    ]
    clock = CollectiveWait(Device.for_rank("cpu", {}))
    with clock.span("all_gather_into_tensor"):
        time.sleep(0.01)
    with clock.as_kind(AGREEMENT), clock.span("all_reduce"):
        pass
    with clock.span("all_reduce"):
        pass
    total, kinds = clock.step_seconds()
    assert set(kinds) == {"all_gather", "all_reduce", AGREEMENT} and kinds["all_gather"] >= 0.01
    assert total == sum(kinds.values()) and clock.step_seconds() == (0, {})  # read once
