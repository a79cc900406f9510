"""The engine's own cost, timed as the engine runs it: what a plan adds to the kernels
(kernel_timing.py) where the trial's engine is DeepSpeed or FSDP2 on this machine's CPU.

workload/step_timing.py, started in a process of its own, wraps a stand-in with the trial's
modules in the real engine and times its hooks and its step at the two powers of two around
the rank's share; each comes back as a line in the elements a rank holds (intercept, slope),
cached with the kernels, so one timing serves every share within that power of two and every
bucket size. The
process starts before the plan times its kernels and imports while the planner does, then
waits to be told to time (`EngineTiming`): a new shape's plan pays its imports once.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import select
import subprocess
import sys
import time

from orchestrator.core.errors import KernelTimingError
from orchestrator.core.process import clear_stale_build_locks
from orchestrator.measure import cpu_allocator
from orchestrator.measure.kernel_cache import Cache, device_name, software
from orchestrator.plan.inputs import MeasuredKernels

TIMEOUT_S = 300
# The longest the plan waits for that process's imports before timing its kernels anyway
# (its quiet check then judges them): an import takes seconds.
IMPORT_WAIT_S = 60
# `python -m orchestrator.workload.step_timing SETTINGS --when-told` imports, says READY and
# times only once the line GO arrives on its stdin (EngineTiming below).
WHEN_TOLD, READY, GO = "--when-told", "ready", "go"
PARTS = ("forward_s", "backward_s", "step_s")
# How the engine is timed, in the cache key: lines taken another way are timed again.
METHOD = "engine 2 (a dip taken in proportion; a small share on a CPU bracketed)"


def start_timing(settings: dict) -> subprocess.Popen:
    """step_timing's process for `settings` (the engine's, threads and sizes), importing
    until `finish_timing` tells it to time; on a CPU it allocates as the ranks do."""
    clear_stale_build_locks()  # DeepSpeed builds its CPU op there first: a killed build's lock would hang it
    env = {**os.environ, **(cpu_allocator.rank_environment() if _on_cpu(settings) else {})}
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.workload.step_timing", json.dumps(settings), WHEN_TOLD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _on_cpu(settings: dict) -> bool:
    return str(settings.get("device", "cpu")).split(":")[0] == "cpu"


def finish_timing(proc: subprocess.Popen) -> tuple[dict[str, tuple[float, float]], str]:
    """Each of the engine's forward and backward additions and its step as a line in the
    elements a rank holds, (intercept s, s per element), and the engine's optimizer.
    KernelTimingError if it fails."""
    try:
        out, err = proc.communicate(GO + "\n", timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise KernelTimingError(f"the engine's step was not timed within {TIMEOUT_S} s") from None
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        tail = (err.strip().splitlines() or ["no output"])[-1]
        raise KernelTimingError(f"the engine's step could not be timed ({tail[:200]})")
    result = json.loads(lines[-1])
    return {name: (float(a), float(b)) for name, (a, b) in result["lines"].items()}, str(result["optimizer"])


def time_engine(settings: dict) -> tuple[dict[str, tuple[float, float]], str]:
    """`finish_timing` of a process started now."""
    return finish_timing(start_timing(settings))


# The stand-in's two sizes in elements where the plan names none (step_timing's, when run by
# hand; the step is a line through them), by device type: a GPU moves a small stand-in in
# microseconds, too little to see its per-element cost above the noise.
DEFAULT_SIZES = {"cpu": (2**20, 2**21), "cuda": (2**24, 2**25)}
# The largest stand-in on each device: what the optimizer's states of a stand-in (about 18
# bytes an element) leave a GPU to spare; on a CPU 16M elements (some 300 MB of states, past
# the L3 of most CPUs), which with 8M take about 4 s to time on a 2-core CPU, where 16M and
# 32M took 7 s: a larger share reads the line past its points, on its straight part (a 34M
# share's step: 237 ms from 8M and 16M, 250 ms from 16M and 32M, 231-286 ms at the share).
MAX_SIZE = {"cpu": 2**24, "cuda": 2**28}
# The smallest lower size: a few thousand elements on a CPU, the defaults on a GPU.
MIN_SIZE = {"cpu": 2**12, "cuda": DEFAULT_SIZES["cuda"][0]}


def stand_in_sizes(device: str, elements: int) -> list[int]:
    """The two sizes to time the engine's stand-in at: the powers of two around the rank's
    own share, within the device's bounds, so the line is read between its two points, or
    past them only where both are far past the caches. Read far past them it moved: on an
    H200 a line through 16M and 32M elements, extrapolated to gpt2-125m's 124M, put
    DeepSpeed's step at 68.6 ms in one timing and 23.2 ms in the next (62M and 124M: 32.4 ms,
    the real engine 28.5 ms); on a 2-core CPU with 32 MB of L3 a line through 1M and 2M
    (states inside the L3) put a 34M share's step at 42-330 ms, where the stand-in at that
    share took 230-290 ms and a line through 8M and 16M 237 ms (bench/RESULTS.md)."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    top = 1 << max(elements - 1, 1).bit_length()
    top = min(max(top, 2 * MIN_SIZE[kind]), MAX_SIZE[kind])
    return [top // 2, top]


# An engine's hooks and step at no elements: what DeepSpeed or FSDP2 do per call around the
# work (milliseconds); past this either way it is no engine's time.
MAX_ENGINE_INTERCEPT_S = 10.0
# What an engine's hook or step moves per element at the most (fp32 parameter, gradient and
# moments read and written, a copy or two beside them), and the least share of the memory's
# bandwidth it reaches: a step's per-tensor Python over a small stand-in is slow (FSDP2's on
# a 2-core CPU: 1.1e-6 s an element, 0.6 % of that rate), a slope 10,000x past it is no engine's.
ENGINE_BYTES_PER_ELEMENT, ENGINE_SLOWEST_SHARE = 64, 1e-4


def plausible_line(intercept_s: float, slope_s: float, bandwidth: float | None = None) -> bool:
    """An engine's (intercept, seconds per element) as a device can take them: finite, the
    intercept within MAX_ENGINE_INTERCEPT_S either way (a fitted line may start below 0), the
    slope >= 0 and no slower than ENGINE_BYTES_PER_ELEMENT at ENGINE_SLOWEST_SHARE of
    `bandwidth` (bytes/s; a millisecond an element where it is not known)."""
    slowest = ENGINE_BYTES_PER_ELEMENT / (ENGINE_SLOWEST_SHARE * bandwidth) if bandwidth else 1e-3
    return abs(intercept_s) <= MAX_ENGINE_INTERCEPT_S and 0.0 <= slope_s <= slowest


class EngineTiming:
    """The engine's hooks and step for one trial: cached lines, or a step_timing process.

    Entered before the plan times its kernels, it starts that process where a line is not
    cached: the process imports torch and the engine (4 of its 6 s on a 2-core CPU) while
    the planner imports its own, and times only once `apply` tells it to, after the kernels,
    so no timing runs beside another. Leaving ends a process never told. `engine` None
    (DDP, an offloaded optimizer): nothing to time, `apply` changes nothing."""

    def __init__(self, engine: dict | None, threads: int, elements: int, device: str):
        self.engine, self.elements = engine, elements
        self.proc: subprocess.Popen | None = None
        if engine is None:
            return
        self.settings = {**engine, "threads": threads}
        if _on_cpu(self.settings):  # in the key: a line timed under another allocator is timed again
            self.settings["allocator"] = cpu_allocator.allocator_key()
        # One timing per power of two of the share, cached as any other.
        self.settings["sizes"] = stand_in_sizes(str(engine.get("device", "cpu")), elements)
        self.key = (
            f"{device_name(device)}|{software(str(device))}|{METHOD} "
            + hashlib.sha256(json.dumps(self.settings, sort_keys=True).encode()).hexdigest()[:16]
        )

    def _uncached(self, part: str) -> bool:
        return f"{self.key} {part}" not in Cache.known()

    def __enter__(self) -> EngineTiming:
        if self.engine is not None and any(map(self._uncached, PARTS)):
            self.proc = start_timing(self.settings)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()

    def imported(self) -> None:
        """Once its process (if any) has imported, which it says: called before the plan's
        first kernel is timed, so that no kernel is timed beside that import (on a CPU whose
        planner imports faster than the engine's process, the first timings ran beside it,
        and the quiet check threw them away: bench/RESULTS.md, "Plan speed")."""
        if self.proc is None or self.proc.stdout is None:
            return
        fd, said, deadline = self.proc.stdout.fileno(), b"", time.monotonic() + IMPORT_WAIT_S
        # Read from the pipe itself, as `communicate` in `finish_timing` goes on to: what came
        # before READY is only the libraries' chatter, and nothing follows it until GO.
        while (left := deadline - time.monotonic()) > 0 and select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 65536)
            said += chunk
            if not chunk or READY in said.decode(errors="replace").splitlines():  # EOF: it failed (`apply` says why)
                return

    def timed(self) -> dict[str, tuple[float, float]]:
        proc = self.proc = self.proc or start_timing(self.settings)
        return finish_timing(proc)[0]

    def apply(self, measured: MeasuredKernels, bandwidth: float | None = None) -> MeasuredKernels:
        """`measured` with the engine's hooks per micro batch and its own step for a rank
        holding `elements`; where the engine cannot be timed, or its lines are no engine's
        (plausible_line, against the memory's `bandwidth` in bytes/s), `measured` as it is
        (torch's AdamW), saying why."""
        if self.engine is None:
            return measured
        lines: dict = {}
        at, whens = {}, [measured.timed_at]

        def plausible(a: float, b: float) -> bool:
            return plausible_line(a, b, bandwidth)

        def line(part: str) -> tuple[float, float]:  # timed where not cached, or cached as no engine's time
            if part not in lines:
                lines.update(self.timed())
            return lines[part]

        try:
            for part in PARTS:
                key = f"{self.key} {part}"
                a, b, when = Cache.get(key, functools.partial(line, part), plausible)
                if not plausible(a, b):  # timed so just now: something else ran beside it
                    Cache.known().pop(key, None)
                    raise ValueError(
                        f"its {part} line ({a:.3g} s + {b:.3g} s an element) is no engine's time; "
                        "something else ran while it was timed"
                    )
                at[part] = max(a + b * self.elements, 0.0)
                whens.append(when)
        except (KernelTimingError, OSError, ValueError, KeyError) as exc:
            return dataclasses.replace(measured, optimizer=f"{measured.optimizer} ({str(exc)[:200]})")
        finally:
            Cache.save()
        return dataclasses.replace(
            measured,
            engine_forward_s=at["forward_s"],
            engine_backward_s=at["backward_s"],
            optimizer_s=at["step_s"],
            timed_at=min(whens),
            optimizer=f"{self.engine['engine']}'s own step, timed as it runs it",
        )
