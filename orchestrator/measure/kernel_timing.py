"""The trial's own kernels, timed on the device the trial will use: what the plan composes
a step from where it runs on that kind of device (hardware.kernels=measured).

Timed, each in the dtype and layout the model really uses (transformers' modules):
- every distinct GEMM of a layer and the lm_head, forward and backward (autograd's dX and
  dW), nn.Linear's [out, in] weight or GPT-2's Conv1D's [in, out];
- attention at the trial's sequence length, forward and backward, sdpa (causal) or eager
  (transformers' matmul, mask, fp32 softmax, matmul);
- one layer's memory-bound kernels: the two norms, the activation (GPT-2's tanh GELU, or
  Llama's SiLU gate times up), the two residual adds, Llama's rotary on Q and K;
- the loss: the logits upcast to fp32 and cross-entropy over the vocabulary;
- the optimizer step: torch's AdamW over the rank's share of the parameters;
- an empty kernel: the fixed cost of one launch;
- on a GPU, the block and the ends once more on 8 tokens, timed whole: the host's own time
  to issue them (every kernel there is shorter than its issuing).

On a CPU the clock is the wall clock on the rank's threads (each kernel timed alone: the
other ranks of a node are not run beside it; bench/RESULTS.md, "Ranks in step, timed and
not kept", says why); on a GPU, the time its kernels ran on the GPU (`clock`), and CUDA
events around a block or the ends. A kernel too large to time in `BUDGET_S` is timed on
fewer rows (tokens, sequences x heads, elements) and scaled, its time being linear in them
once they are a few dozen; a GEMM's weight is cut to `kernels.GEMM_MAX_N` x `GEMM_MAX_K`
the same way, and further (`affordable`) where one call on its fewest rows would pass
`PROBE_S`.

Times are cached by device name, torch and transformers versions, threads, dtype and
shape (kernel_cache.py), so a sweep times each distinct shape once. The method is vTrain's
(Bang et al., MICRO 2024): profile each operator on the target device, compose the step
from those times.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import NamedTuple

from orchestrator.config import ModelConfig
from orchestrator.core.process import collector_paused
from orchestrator.measure import cpu_allocator, kernels
from orchestrator.measure.kernel_cache import Cache, device_name, plausible_times, software  # the cache's key
from orchestrator.measure.kernels import Kernel
from orchestrator.plan.compute import KernelTimes
from orchestrator.plan.inputs import MeasuredKernels

BUDGET_S = 0.05  # the longest a timed call should take: larger kernels are timed on fewer rows
# How kernels are timed, in the cache key: times taken another way are timed again.
METHOD = (
    "timing 5 (weights up to 8192 x 8192 elements, probe 1 s; a GPU's kernels by their own time; "
    "forward and forward-and-backward timed round by round; "
    "a slow call's full rows along the line through two row counts)"
)
PROBE_S = 1.0  # the longest one call on the fewest rows may take: larger are timed on a smaller shape, scaled
# A block or the model's ends is timed whole (autograd and all) only where its kernels' sum
# says a forward and backward take at most this long, and its weights hold at most this many
# elements: a GPT-3-sized block would take minutes to build and time on a CPU, and there
# what lies between the kernels is a small part of the step.
WHOLE_MAX_S = PROBE_S / 4
WHOLE_MAX_ELEMENTS = 2**26


class KernelTimingError(RuntimeError):
    """A kernel could not be timed on this device (the plan falls back to the preset)."""


BUSY_RATIO = 1.25  # the same probe this much slower or faster the second time: something else ran
# A kernel's time against the device (its peak: measured on a CPU, published for a GPU; its
# memory bandwidth): no kernel beats the peak (a margin for the peak's own measurement), and one
# 100x below it, or below what its bytes take at the bandwidth, plus a fixed allowance for a
# launch, is no kernel either: something else held the device while it was timed.
PEAK_MARGIN, SLOWEST_SHARE, LAUNCH_ALLOWANCE_S = 1.3, 0.01, 0.01
# Past every cache (the largest L3 is about 1 GiB): what moves this much runs at the memory's
# bandwidth at best, so it has a lower bound too.
BEYOND_CACHES_BYTES = 2**31
# A block or the ends timed whole take their kernels' time and what runs between them (the
# modules' Python, autograd: a few ms a call on a slow host); more than this past 100x their
# kernels' sum is no block's time. (A block is timed whole only where its kernels sum under WHOLE_MAX_S.)
WHOLE_ALLOWANCE_S = 0.25


def possible_times(
    flops: float, peak_flops: float | None, nbytes: float = 0.0, bandwidth: float | None = None
) -> Callable[[float, float], bool]:
    """Whether (forward s, backward s) of a kernel of `flops` forward FLOPs (twice that
    backward) are times this device can take against its peak: never faster, nor 100x
    slower; one that moves `nbytes` (a memory-bound one), not 100x slower than the
    bandwidth allows (faster may be: caches). Any time where neither is known."""

    def possible(forward_s: float, backward_s: float) -> bool:
        if not plausible_times(forward_s, backward_s):
            return False
        bounds = []
        if flops and peak_flops:
            bounds += [
                (work / (PEAK_MARGIN * peak_flops), work / (SLOWEST_SHARE * peak_flops), s)
                for work, s in ((flops, forward_s), (2 * flops, backward_s))
            ]
        if nbytes and bandwidth:
            fastest = (
                (lambda work: work / (PEAK_MARGIN * bandwidth)) if nbytes >= BEYOND_CACHES_BYTES else (lambda _: 0.0)
            )
            bounds += [
                (fastest(work), work / (SLOWEST_SHARE * bandwidth), s)
                for work, s in ((nbytes, forward_s), (2 * nbytes, backward_s))
            ]
        return all(low <= s <= high + LAUNCH_ALLOWANCE_S for low, high, s in bounds)

    return possible


def possible_whole(kernels_s: float, flops: float, peak_flops: float | None) -> Callable[[float, float], bool]:
    """Whether (forward s, backward s) of a block (or the ends) timed whole are times this
    device can take: never faster than its GEMMs' `flops` at the peak, nor slower than 100x
    the sum of its kernels (`kernels_s`, timed just before, forward and backward) plus
    WHOLE_ALLOWANCE_S for what runs between them."""

    def possible(forward_s: float, backward_s: float) -> bool:
        fastest = flops / (PEAK_MARGIN * peak_flops) if flops and peak_flops else 0.0
        slowest = kernels_s / SLOWEST_SHARE + WHOLE_ALLOWANCE_S
        return (
            plausible_times(forward_s, backward_s)
            and fastest <= forward_s <= slowest
            and 2 * fastest <= backward_s <= slowest
        )

    return possible


class QuietCheck:
    """Whether the machine stayed quiet while new kernels were timed: a reference probe (a
    small fp32 matmul) timed before the first new kernel and again after the last; if the two
    disagree by more than BUSY_RATIO, other work shared the device and the new times are not
    kept. A load steady through both probes slows both alike and is not seen."""

    def __init__(self, tick: Callable, device: str):
        self.tick, self.device = tick, device
        self.before: float | None = None

    def probe(self) -> float:
        import torch

        a = torch.randn(256, 256, device=self.device)
        return self.tick(lambda: a @ a, 10, 3)

    def first(self, how: Callable) -> Callable:
        if self.before is None:
            self.before = self.probe()
        return how

    def verdict(self) -> str:
        if self.before is None:
            return ""
        after = self.probe()
        ratio = max(after, self.before) / min(after, self.before)
        if ratio <= BUSY_RATIO:
            return ""
        return (
            f"the machine was busy while the kernels were timed (the same probe took {self.before * 1e3:.3g} ms, "
            f"then {after * 1e3:.3g} ms): these times are not cached, plan again on a quiet machine"
        )


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


def measure_apart(*args, **kwargs) -> tuple[MeasuredKernels, str]:
    """`measure` in a process of its own (spawned), with what the cache discarded there: a
    GPU's CUDA context and the timing's buffers end with that process, so the ranks started
    after the plan find GPU 0 as whole as the others (an EXCLUSIVE_PROCESS GPU free to open)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        measured = pool.submit(_measure_and_discarded, *args, **kwargs).result()
    Cache.reload()  # the child wrote the file: what this process read of it is out of date
    return measured


def _measure_and_discarded(*args, **kwargs) -> tuple[MeasuredKernels, str]:
    return measure(*args, **kwargs), Cache.take_discarded()


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


def measure(
    model: ModelConfig,
    micro: int,
    precision: str,
    device: str,
    threads_per_rank: int,
    optimizer_tensors: list[int],
    recompute: str = "none",
    before_timing: Callable[[], None] = lambda: None,
    peak_flops: float | None = None,
    bandwidth: float | None = None,
) -> MeasuredKernels:
    """Times (or finds cached) every kernel of one micro batch of `micro` sequences, and the
    optimizer step over `optimizer_tensors` (elements of each of the rank's shares).
    `before_timing`: called once, after the imports and before the first kernel is timed
    (the planner waits there for the engine's timing process to finish its imports).
    KernelTimingError where the device cannot run one."""
    name, sw = device_name(device), software(device)
    on_cpu = device == "cpu"
    allocator = f"{cpu_allocator.allocator_key()}|" if on_cpu else ""
    prefix = f"{name}|{sw}|{METHOD}|{threads_per_rank} threads|{precision}|{allocator}"
    tick, whole_tick = clock(device), clock(device, whole=True)
    whens: list[str] = []

    impossible: list[str] = []

    def timed(kernel: Kernel, how: Callable = time_kernel) -> tuple[float, float]:
        """Cached where the entry is one this device can take (against its peak and bandwidth), else
        timed, and timed once more where that time is not one either (then kept, and said)."""
        key = f"{prefix}{kernel.name} rows={kernel.rows}"
        possible = possible_times(kernel.flops, peak_flops, kernel.bytes, bandwidth)
        fwd, bwd, when = Cache.get(key, lambda: first(how)(kernel, tick), plausible=possible)
        if not possible(fwd, bwd):
            Cache.known().pop(key, None)
            fwd, bwd, when = Cache.get(key, lambda: first(how)(kernel, tick), plausible=possible)
            if not possible(fwd, bwd):
                impossible.append(f"{kernel.name} rows={kernel.rows}: {fwd:.3g} s forward")
        whens.append(when)
        return fwd, bwd

    def whole(kernel: Kernel, kernels_s: float, elements: int, flops: float = 0.0) -> tuple[float, float] | None:
        """A block or the ends timed whole where its kernels say a call is short and its
        weights are small (else the plan keeps their kernels' sum, and says so); timed once
        more where the time is not one this device can take (possible_whole)."""
        if kernels_s > WHOLE_MAX_S or elements > WHOLE_MAX_ELEMENTS:
            return None
        key, possible = f"{prefix}{kernel.name} rows={kernel.rows}", possible_whole(kernels_s, flops, peak_flops)
        times, when = Cache.get_whole(key, lambda: first(time_whole)(kernel, whole_tick), plausible=possible)
        if times is not None and not possible(*times):
            Cache.known().pop(key, None)
            times, when = Cache.get_whole(key, lambda: first(time_whole)(kernel, whole_tick), plausible=possible)
            if times is not None and not possible(*times):
                impossible.append(f"{kernel.name} rows={kernel.rows} whole: {times[0]:.3g} s forward")
        whens.append(when)
        return times

    tokens = micro * model.seq_len
    quiet = QuietCheck(tick, device)
    # torch's threads are set at the first kernel timed: a plan whose kernels are all cached
    # never imports torch (1.5 s of every `plan`).
    timing = ExitStack()

    def first(how: Callable) -> Callable:
        if quiet.before is None:
            with collector_paused():
                kernels.import_libraries(model.arch)
            timing.enter_context(threads(threads_per_rank))
            if on_cpu:  # a rank's page faults are part of its kernels' time (cpu_allocator.py)
                cpu_allocator.allocate_as_the_ranks()
            before_timing()
        return quiet.first(how)

    try:
        trial = kernels.trial_kernels(model, micro, recompute, precision, device)
        with timing:
            layer = [0.0, 0.0]
            for kernel, count in trial.layer_gemms:
                fwd, bwd = timed(kernel)
                layer = [layer[0] + count * fwd, layer[1] + count * bwd]
            times = KernelTimes(
                layer_gemms=(layer[0], layer[1]),
                head=timed(trial.head),
                attention=timed(trial.attention),
                memory_bound=timed(trial.memory_bound),
                loss=timed(trial.loss),
                launch_s=timed(kernels.launch(device))[0],
            )
            block_s = sum(times.layer_gemms) + sum(times.attention) + sum(times.memory_bound)
            block_flops = sum(k.flops * count for k, count in trial.layer_gemms) + trial.attention.flops
            times = dataclasses.replace(
                times,
                block=whole(
                    trial.block,
                    block_s,
                    sum(n * k * count for (n, k, *_), count in kernels.trial_gemms(model, tokens)),
                    block_flops,
                ),
                ends=whole(trial.ends, sum(times.head) + sum(times.loss), model.vocab * model.hidden, trial.head.flops),
            )
            if device.startswith("cuda"):  # the host's own time: the same, on 8 tokens (any size fits a GPU)
                tiny = dataclasses.replace(model, seq_len=8)
                times = dataclasses.replace(
                    times,
                    host_block=whole(kernels.block(tiny, 1, recompute, precision, device), 0.0, 0),
                    host_ends=whole(kernels.ends(tiny, 1, precision, device), 0.0, 0),
                )
            optimizer_s = timed(kernels.adamw(optimizer_tensors, device))[0]
            busy = quiet.verdict()
        if busy:
            Cache.forget_new()
    except (RuntimeError, ValueError, TypeError, ImportError, MemoryError) as exc:
        raise KernelTimingError(
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        ) from exc
    finally:
        Cache.save()
    if impossible and not busy:
        busy = (
            f"{len(impossible)} kernel time(s) this device's peak or bandwidth rule out, twice "
            f"(e.g. {impossible[0]}): "
            "something else held the device while they were timed; plan again on a quiet machine"
        )
        Cache.forget_new()
    return MeasuredKernels(
        kernels=times, optimizer_s=optimizer_s, device=name, software=sw, timed_at=min(whens), busy=busy
    )
