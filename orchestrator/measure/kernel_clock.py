"""How one kernel is timed: the device's clock (the wall clock on a CPU; on a GPU its kernels'
own time, or CUDA events around a whole block), its threads, and a kernel too large for
`BUDGET_S` timed on fewer rows and scaled along them. kernel_timing.py decides what is timed and
what a time may be; this module only times.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

from orchestrator.core.errors import KernelTimingError
from orchestrator.measure.kernels import Kernel

BUDGET_S = 0.05  # the longest a timed call should take: larger kernels are timed on fewer rows
PROBE_S = 1.0  # the longest one call on the fewest rows may take: larger are timed on a smaller shape, scaled


def clock(device, whole: bool = False) -> Callable[..., float]:
    """tick(op, reps, rounds, warm=True): seconds per call of op over `reps` calls, the best
    of `rounds` rounds after a warm-up call (its first call costs up to 6x: allocation, the
    library picking its kernel). On a CPU the wall clock. On a GPU a kernel's own time is
    the GPU's: the time its kernels ran as CUPTI recorded them (torch.profiler), for a
    kernel timed alone is short enough that its host (the module's Python, autograd.grad
    set up per call) would set its pace, which inside a model the host spends issuing
    ahead. `whole` (a block, the model's ends): CUDA events around the calls, which hold
    the host's pace as the model pays it."""
    cuda = str(device).split(":")[0] == "cuda"  # torch is imported by the first tick, not here

    def wall(op, reps):  # seconds of one round of reps calls
        start = time.perf_counter()
        for _ in range(reps):
            op()
        return time.perf_counter() - start

    def events(op, reps):
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            op()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def device_busy(op, reps):
        import torch
        from torch.profiler import DeviceType, ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                op()
            torch.cuda.synchronize(device)
        return kernels_busy_s([e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA])

    one_round = (events if whole else device_busy) if cuda else wall

    def tick(op, reps, rounds, warm=True):
        if warm:
            op()
        if cuda:
            import torch

            torch.cuda.synchronize(device)
        return min(one_round(op, reps) for _ in range(rounds)) / reps

    tick.__name__ = one_round.__name__  # which clock it is, for a reader (and the tests)
    return tick


def kernels_busy_s(kernel_us: list[float]) -> float:
    """Seconds the GPU ran kernels, from the profiler's CUDA events. None recorded means the
    profiler saw no kernel at all (CUPTI missing, another profiler attached), never a free
    call: the timing fails, and the plan says so and keeps the preset."""
    if not kernel_us:
        raise KernelTimingError(
            "the profiler recorded no GPU kernel (CUPTI missing, or another profiler attached), "
            "so a kernel's own time cannot be read"
        )
    return sum(kernel_us) * 1e-6


@contextmanager
def threads(n: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def time_kernel(kernel: Kernel, tick: Callable) -> tuple[float, float]:
    """(forward s, backward s) of the kernel at its full size. A call on `min_rows` rows
    says what a call costs; a kernel that would take more than BUDGET_S a call whole is
    timed on fewer rows (never under min_rows) and scaled; one that takes longer even on
    min_rows keeps that first timing (a slow device pays once, not best of three) and one
    on twice the rows, for the line through the two (`along_rows`)."""
    kernel, (rows, fwd, both, probe) = affordable(kernel, tick)
    if probe >= BUDGET_S:
        forward = tick(fwd, 1, 1, warm=False) * kernel.rows / rows  # the probe ran it
        total = along_rows(kernel, rows, probe, tick)
        return forward * kernel.scale, max(total - forward, 0.0) * kernel.scale
    if rows < kernel.rows:
        rows = min(kernel.rows, max(rows, int(rows * BUDGET_S / max(probe, 1e-9))))
        fwd, both = kernel.build(rows)
        probe = tick(both, 1, 1)
    forward, total = forward_and_total(fwd, both, probe, tick)
    scale = kernel.scale * kernel.rows / rows
    return forward * scale, max(total - forward, 0.0) * scale


def along_rows(kernel: Kernel, rows: int, total_s: float, tick: Callable) -> float:
    """Seconds of a forward-and-backward call on the kernel's full rows, from one call on its
    fewest `rows` (a slow device's): there a call still pays a part that does not grow with
    the rows (the weight's gradient sums over the rows, a product over a few dozen of them
    runs below its rate, and is written whole), so the time on full rows is read off the line
    through that call and one on twice the rows, not scaled in proportion (Llama's 2,816 x
    1,024 bf16 GEMM on an AVX2 CPU: 14.2 ms a row at 32 rows, 9.1-9.8 from 128; bench/RESULTS.md).
    Where the two calls make no line (the second not longer, or more than twice as long: the
    machine's speed moved between them), the second alone, in proportion."""
    if 2 * rows > kernel.rows:
        return total_s * kernel.rows / rows
    _, both = kernel.build(2 * rows)
    twice = tick(both, 1, 1, warm=False)
    per_row = (twice - total_s) / rows
    if not 0 < per_row <= total_s / rows:
        return twice * kernel.rows / (2 * rows)
    return total_s + per_row * (kernel.rows - rows)


def forward_and_total(
    fwd: Callable, both: Callable, probe_s: float, tick: Callable, rounds: int = 3, tries: int = 3
) -> tuple[float, float]:
    """(seconds of a forward call, of a forward and backward call), each the best of
    `rounds` rounds of calls that fill about BUDGET_S, the two interleaved round by round:
    the backward is their difference, so both must see the machine alike (timed one after
    the other, a load that came and went between them made the forward the longer of the
    two). A forward not shorter than forward and backward is no measurement: timed again,
    up to `tries` times."""
    reps = max(1, min(20, int(BUDGET_S / max(probe_s, 1e-9))))
    forward = total = float("inf")
    for attempt in range(tries):
        for r in range(rounds):  # the forward's first round has its own warm-up call (the probe warmed both)
            forward = min(forward, tick(fwd, reps, 1, warm=attempt == r == 0))
            total = min(total, tick(both, reps, 1, warm=False))
        if total > forward:
            break
    return forward, total


class Probe(NamedTuple):
    """One call of a kernel's forward and backward on its fewest rows."""

    rows: int
    forward: Callable[[], object]
    both: Callable[[], object]  # forward and backward
    seconds: float  # of one call of both


def probe(kernel: Kernel, tick: Callable) -> Probe:
    """One call of the kernel's forward and backward on its fewest rows, after a warm-up."""
    rows = min(kernel.rows, kernel.min_rows)
    fwd, both = kernel.build(rows)
    return Probe(rows, fwd, both, tick(both, 1, 1))


def affordable(kernel: Kernel, tick: Callable) -> tuple[Kernel, Probe]:
    """The largest of the kernel's shapes (itself, then each `smaller`) whose call on its
    fewest rows should take at most PROBE_S, judged from one call of the smallest, and its
    probe: what bounds the time a plan spends timing a huge model on a slow device."""
    shapes = [kernel]
    while shapes[-1].smaller is not None:
        shapes.append(shapes[-1].smaller)
    smallest = shapes[-1]
    probed = probe(smallest, tick)
    chosen = next((s for s in shapes if probed.seconds * smallest.scale / s.scale <= PROBE_S), smallest)
    return chosen, probed if chosen is smallest else probe(chosen, tick)


def time_whole(kernel: Kernel, tick: Callable) -> tuple[float, float] | None:
    """(forward s, backward s) of a kernel timed whole, on all its rows (a block, the model's
    ends: their cost between kernels is per call, so it cannot be scaled from fewer rows);
    None where one call takes more than PROBE_S."""
    fwd, both = kernel.build(kernel.rows)
    probe_s = tick(both, 1, 1)
    if probe_s > PROBE_S:
        return None
    forward, total = forward_and_total(fwd, both, probe_s, tick)
    return forward, max(total - forward, 0.0)
