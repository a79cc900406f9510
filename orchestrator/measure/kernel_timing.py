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
from collections.abc import Callable
from contextlib import ExitStack

from orchestrator.config import ModelConfig
from orchestrator.core.errors import KernelTimingError
from orchestrator.core.process import collector_paused
from orchestrator.measure import cpu_allocator, kernels
from orchestrator.measure.kernel_cache import Cache, device_name, plausible_times, software  # the cache's key
from orchestrator.measure.kernel_clock import PROBE_S, clock, threads, time_kernel, time_whole
from orchestrator.measure.kernels import Kernel
from orchestrator.plan.compute import KernelTimes
from orchestrator.plan.inputs import MeasuredKernels

# How kernels are timed, in the cache key: times taken another way are timed again.
METHOD = (
    "timing 5 (weights up to 8192 x 8192 elements, probe 1 s; a GPU's kernels by their own time; "
    "forward and forward-and-backward timed round by round; "
    "a slow call's full rows along the line through two row counts)"
)
# A block or the model's ends is timed whole (autograd and all) only where its kernels' sum
# says a forward and backward take at most this long, and its weights hold at most this many
# elements: a GPT-3-sized block would take minutes to build and time on a CPU, and there
# what lies between the kernels is a small part of the step.
WHOLE_MAX_S = PROBE_S / 4
WHOLE_MAX_ELEMENTS = 2**26


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


class _Timer:
    """One micro batch's timing: each kernel cached where its entry is one this device can take,
    else timed (and timed once more where that time is not one either: then kept, and said)."""

    def __init__(self, prefix: str, device: str, threads_per_rank: int, arch: str, before_timing: Callable[[], None]):
        self.prefix, self.device, self.threads_per_rank, self.arch = prefix, device, threads_per_rank, arch
        self.before_timing = before_timing
        self.tick, self.whole_tick = clock(device), clock(device, whole=True)
        self.quiet = QuietCheck(self.tick, device)
        self.whens: list[str] = []
        self.impossible: list[str] = []
        # torch's threads are set at the first kernel timed: a plan whose kernels are all cached
        # never imports torch (1.5 s of every `plan`).
        self.timing = ExitStack()

    def first(self, how: Callable) -> Callable:
        if self.quiet.before is None:
            with collector_paused():
                kernels.import_libraries(self.arch)
            self.timing.enter_context(threads(self.threads_per_rank))
            if self.device == "cpu":  # a rank's page faults are part of its kernels' time (cpu_allocator.py)
                cpu_allocator.allocate_as_the_ranks()
            self.before_timing()
        return self.quiet.first(how)

    def timed(self, kernel: Kernel, peak_flops: float | None, bandwidth: float | None) -> tuple[float, float]:
        key = f"{self.prefix}{kernel.name} rows={kernel.rows}"
        possible = possible_times(kernel.flops, peak_flops, kernel.bytes, bandwidth)
        fwd, bwd, when = Cache.get(key, lambda: self.first(time_kernel)(kernel, self.tick), plausible=possible)
        if not possible(fwd, bwd):
            Cache.known().pop(key, None)
            fwd, bwd, when = Cache.get(key, lambda: self.first(time_kernel)(kernel, self.tick), plausible=possible)
            if not possible(fwd, bwd):
                self.impossible.append(f"{kernel.name} rows={kernel.rows}: {fwd:.3g} s forward")
        self.whens.append(when)
        return fwd, bwd

    def whole(
        self, kernel: Kernel, kernels_s: float, elements: int, flops: float, peak_flops: float | None
    ) -> tuple[float, float] | None:
        """A block or the ends timed whole where its kernels say a call is short and its
        weights are small (else the plan keeps their kernels' sum, and says so); timed once
        more where the time is not one this device can take (possible_whole)."""
        if kernels_s > WHOLE_MAX_S or elements > WHOLE_MAX_ELEMENTS:
            return None
        key, possible = f"{self.prefix}{kernel.name} rows={kernel.rows}", possible_whole(kernels_s, flops, peak_flops)

        def run() -> tuple[float, float] | None:
            return self.first(time_whole)(kernel, self.whole_tick)

        times, when = Cache.get_whole(key, run, plausible=possible)
        if times is not None and not possible(*times):
            Cache.known().pop(key, None)
            times, when = Cache.get_whole(key, run, plausible=possible)
            if times is not None and not possible(*times):
                self.impossible.append(f"{kernel.name} rows={kernel.rows} whole: {times[0]:.3g} s forward")
        self.whens.append(when)
        return times


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
    allocator = f"{cpu_allocator.allocator_key()}|" if device == "cpu" else ""
    prefix = f"{name}|{sw}|{METHOD}|{threads_per_rank} threads|{precision}|{allocator}"
    timer = _Timer(prefix, device, threads_per_rank, model.arch, before_timing)
    try:
        trial = kernels.trial_kernels(model, micro, recompute, precision, device)
        with timer.timing:
            times = _micro_batch(timer, trial, model, (micro, recompute, precision, device), peak_flops, bandwidth)
            optimizer_s = timer.timed(kernels.adamw(optimizer_tensors, device), peak_flops, bandwidth)[0]
            busy = timer.quiet.verdict()
        if busy:
            Cache.forget_new()
    except (RuntimeError, ValueError, TypeError, ImportError, MemoryError) as exc:
        raise KernelTimingError(
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        ) from exc
    finally:
        Cache.save()
    if timer.impossible and not busy:
        busy = (
            f"{len(timer.impossible)} kernel time(s) this device's peak or bandwidth rule out, twice "
            f"(e.g. {timer.impossible[0]}): "
            "something else held the device while they were timed; plan again on a quiet machine"
        )
        Cache.forget_new()
    return MeasuredKernels(
        kernels=times, optimizer_s=optimizer_s, device=name, software=sw, timed_at=min(timer.whens), busy=busy
    )


def _micro_batch(
    timer: _Timer, trial, model: ModelConfig, shape: tuple, peak_flops: float | None, bandwidth: float | None
) -> KernelTimes:
    """Every kernel of one micro batch, then a block and the model's ends timed whole. shape:
    (micro batch, recompute, precision, device)."""
    micro, recompute, precision, device = shape

    def timed(kernel: Kernel) -> tuple[float, float]:
        return timer.timed(kernel, peak_flops, bandwidth)

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
    block_elements = sum(n * k * count for (n, k, *_), count in kernels.trial_gemms(model, micro * model.seq_len))
    ends_s = sum(times.head) + sum(times.loss)
    times = dataclasses.replace(
        times,
        block=timer.whole(trial.block, block_s, block_elements, block_flops, peak_flops),
        ends=timer.whole(trial.ends, ends_s, model.vocab * model.hidden, trial.head.flops, peak_flops),
    )
    if device.startswith("cuda"):  # the host's own time: the same, on 8 tokens (any size fits a GPU)
        tiny = dataclasses.replace(model, seq_len=8)
        times = dataclasses.replace(
            times,
            host_block=timer.whole(kernels.block(tiny, 1, recompute, precision, device), 0.0, 0, 0.0, peak_flops),
            host_ends=timer.whole(kernels.ends(tiny, 1, precision, device), 0.0, 0, 0.0, peak_flops),
        )
    return times
