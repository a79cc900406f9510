"""The engine's own cost per step, timed as the engine runs it: `python -m
orchestrator.workload.step_timing SETTINGS_JSON` prints one JSON line.

A stand-in model has the trial's modules in their order, each holding one parameter per
tensor, in the proportions of the trial's model, and computes nothing worth timing: the engine's
hooks run per module (ZeRO-3's fetch and release) or per block (FSDP2's `fully_shard` on every
transformer block, then the root), as on the real model. The real engine wraps it (DeepSpeed's
`deepspeed.initialize` with the trial's ZeRO section, precision and clipping; or FSDP2's
`fully_shard` with its mixed precision, torch's AdamW and clipping) on a one-rank group in this
process, on the trial's device (gloo on a CPU, NCCL on a GPU, where the host's time per tensor is
most of a small model's step). Timed: the engine's forward and backward of the stand-in, the same
without the engine, and the optimizer step as the engine runs it (DeepSpeed's fp32 master copies,
gradient norm, AdamW, the copy back to the model's dtype; FSDP2's AdamW over its sharded
parameters). The difference of the first two is what the engine adds around a real model's forward
and backward (its hooks, buckets and bookkeeping), the third its step: neither is a kernel the plan
could time alone.

Run in its own process (engine_timing.py starts it): the engine needs a process group, and
the planning process must not keep one, nor DeepSpeed's global state. With `--when-told` it
imports, prints "ready" and times only once "go" arrives on its stdin, so its imports
overlap the planner's and its timing overlaps nothing.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from orchestrator.core.process import collector_paused, freeze_at_exit
from orchestrator.measure.engine_timing import DEFAULT_SIZES, GO, READY, WHEN_TOLD
from orchestrator.workload.model import torch_dtype

REPS = 8  # steps timed at most; the first two are warm-up (allocation, the optimizer's state)
# A large stand-in stops at MIN_REPS (three kept) once its steps have taken BUDGET_S: on a
# 2-core CPU a step of 32M elements takes 0.45 s, and eight of them were half a plan's time.
MIN_REPS, BUDGET_S = 5, 1.0


def group_of(device: str) -> tuple[str, str]:
    """(process-group backend, device-mesh type) of a one-rank group on `device`."""
    return ("nccl", "cuda") if torch.device(device).type == "cuda" else ("gloo", "cpu")


def synchronize(device: str) -> None:
    """Wait for the device: the host returns before a GPU is done."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


class Part(torch.nn.Module):
    """One module of the trial's model: its tensors' shares, each touched once."""

    def __init__(self, sizes: list[int], dtype: torch.dtype):
        super().__init__()
        self.shares = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n in sizes])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.stack([p.float().sum() for p in self.shares]).sum()


class Block(torch.nn.Module):
    def __init__(self, parts: list[Part]):
        super().__init__()
        self.parts = torch.nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for part in self.parts:
            x = part(x)
        return x


class StandIn(torch.nn.Module):
    """The trial's modules in order, grouped in blocks as its transformer blocks are."""

    def __init__(self, modules: list[tuple[str, int]], dtype: torch.dtype):
        super().__init__()
        grouped: dict[str, dict[str, list[int]]] = {}
        for name, size in modules:  # "layers.3.mlp.c_fc" -> block "layers.3", module "mlp.c_fc"
            parts = name.split(".")
            block, module = (".".join(parts[:2]), ".".join(parts[2:])) if parts[0] == "layers" else ("ends", name)
            grouped.setdefault(block, {}).setdefault(module, []).append(size)
        self.blocks = torch.nn.ModuleList(
            [Block([Part(sizes, dtype) for sizes in mods.values()]) for mods in grouped.values()]
        )
        self.layer_blocks = [b for name, b in zip(grouped, self.blocks) if name != "ends"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def join_one_rank_group(device: str) -> None:
    """This process as the one rank of its own group on `device`, whatever the process it was
    started from is (a SLURM task, a rank): DeepSpeed reads the variables to size its world."""
    os.environ.update(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0"
    )
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(0)  # the one GPU this process was given (CUDA_VISIBLE_DEVICES)
    dist.init_process_group(group_of(device)[0], store=dist.HashStore(), rank=0, world_size=1)


def median_times(forward, backward, step, device: str = "cpu") -> tuple[float, float, float]:
    times: list[tuple[float, float, float]] = []
    started = time.perf_counter()
    for _ in range(REPS):
        if len(times) >= MIN_REPS and time.perf_counter() - started > BUDGET_S:
            break
        synchronize(device)
        a = time.perf_counter()
        out = forward()
        synchronize(device)
        b = time.perf_counter()
        backward(out)
        synchronize(device)
        c = time.perf_counter()
        step()
        synchronize(device)
        times.append((b - a, time.perf_counter() - c, c - b))
    kept = times[2:]
    forward_s, step_s, backward_s = (statistics.median(t[i] for t in kept) for i in range(3))
    return forward_s, backward_s, step_s


def plain(settings: dict) -> tuple[float, float]:
    """The stand-in's forward and backward without an engine."""
    device = settings["device"]
    model = StandIn(settings["modules"], torch_dtype(settings["precision"])).to(device)
    x = torch.ones((), device=device)
    fwd, bwd, _ = median_times(
        lambda: model(x), lambda out: out.backward(), lambda: model.zero_grad(set_to_none=True), device
    )
    return fwd, bwd


def deepspeed_config(settings: dict) -> dict:
    precision = settings["precision"]
    return {
        "train_batch_size": 1,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": settings["grad_clip"],
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16"},
        "zero_optimization": settings["zero"],
        "optimizer": settings["optimizer"],
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def import_engine(settings: dict) -> None:
    """Import what the engine's timing will use: most of this process's time, and none of it timed."""
    if settings["engine"] == "deepspeed":
        import deepspeed  # noqa: F401

        from orchestrator.workload.deepspeed_compat import import_muon_uncompiled, leave_shm_comm_unbuilt

        import_muon_uncompiled(deepspeed_config(settings))
        if str(settings["device"]).split(":")[0] == "cpu":
            leave_shm_comm_unbuilt()
    else:
        import torch.distributed.fsdp  # noqa: F401


def deepspeed_step(settings: dict) -> tuple[float, float, float, str]:
    import deepspeed

    config = deepspeed_config(settings)
    model = StandIn(settings["modules"], torch.float32)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    x = torch.ones((), device=engine.device)
    fwd, bwd, step = median_times(lambda: engine(x), engine.backward, engine.step, settings["device"])
    return fwd, bwd, step, type(engine.optimizer).__name__


def fsdp_step(settings: dict) -> tuple[float, float, float, str]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    device = settings["device"]
    model = StandIn(settings["modules"], torch.float32).to(device)
    shard = {
        "mesh": init_device_mesh(group_of(device)[1], (1,)),
        "mp_policy": MixedPrecisionPolicy(param_dtype=torch_dtype(settings["precision"])),
    }
    for block in model.layer_blocks:  # as workload/fsdp.py: every transformer block, then the root
        fully_shard(block, **shard)
    fully_shard(model, **shard, reshard_after_forward=False)
    opt = settings["optimizer"]["params"]
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"], weight_decay=opt["weight_decay"]
    )
    clip = settings["grad_clip"]

    def step() -> None:
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    x = torch.ones((), device=device)
    fwd, bwd, step_s = median_times(lambda: model(x), lambda out: out.backward(), step, device)
    return fwd, bwd, step_s, "AdamW over FSDP2's sharded parameters"


def scaled(modules: list[tuple[str, int]], elements: int) -> list[tuple[str, int]]:
    """The same modules and tensors, each cut in proportion to hold about `elements` in all."""
    total = sum(n for _, n in modules)
    return [(name, max(1, round(n * elements / total))) for name, n in modules]


def timed(settings: dict) -> tuple[tuple[float, float, float], str]:
    """((forward, backward the engine adds, its step), its optimizer's name) on the stand-in."""
    plain_fwd, plain_bwd = plain(settings)
    fwd, bwd, step, optimizer = (deepspeed_step if settings["engine"] == "deepspeed" else fsdp_step)(settings)
    return (max(fwd - plain_fwd, 0.0), max(bwd - plain_bwd, 0.0), step), optimizer


def main() -> None:
    """The stand-in at two sizes, module for module in the trial's proportions; each time as
    a line in the elements a rank holds (intercept, slope): what the engine does per call
    (hooks, Python) is the intercept, what it does per element (copies, AdamW) the slope. The
    plan picks the sizes around the rank's share (engine_timing.stand_in_sizes), so one timing
    serves every share within that power of two."""
    freeze_at_exit()
    settings = json.loads(sys.argv[1])
    torch.set_num_threads(settings["threads"])
    device = settings.setdefault("device", "cpu")
    with collector_paused():
        import_engine(settings)
    if WHEN_TOLD in sys.argv[2:]:  # the planner times its kernels meanwhile: nothing is timed beside them
        print(READY, flush=True)
        if sys.stdin.readline().strip() != GO:
            return  # the planner stopped (its stdin closed): nothing to time for
    join_one_rank_group(device)
    try:
        points = []
        for elements in settings.get("sizes") or DEFAULT_SIZES[torch.device(device).type]:
            modules = scaled(settings["modules"], elements)
            times, optimizer = timed({**settings, "modules": modules})
            points.append((sum(n for _, n in modules), times))
    finally:
        dist.destroy_process_group()
    # With its points: run by hand, it shows what times a line the plan missed by was drawn through.
    print(json.dumps({"lines": lines_through(points), "optimizer": optimizer, "points": points}))


def lines_through(points: list[tuple[int, tuple[float, float, float]]]) -> dict[str, tuple[float, float]]:
    """Each part's (intercept s, s per element) through its times at two sizes. More elements
    never cost less: a dip is noise (the machine slowed while the smaller size was timed), and
    a flat line at the smaller size's time would charge a small model a large one's step
    (1.1 s for the default trial's 141k elements, cached on a busy CPU). No fixed part is
    told from such a pair: the larger size's time, in proportion."""
    (e1, y1), (e2, y2) = points
    lines = {}
    for name, a, b in zip(("forward_s", "backward_s", "step_s"), y1, y2):
        slope = (b - a) / (e2 - e1)
        lines[name] = (a - slope * e1, slope) if slope >= 0 else (0.0, b / e2)
    return lines


if __name__ == "__main__":
    main()
