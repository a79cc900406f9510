"""The device a rank computes on, chosen once per rank: every device-specific call goes through it.

A trial says `hardware.device` (a `DeviceType`: cpu or cuda). `Device.for_rank` turns that
into this rank's device (which GPU: placement.py) and then answers everything that
differs between a CPU and a GPU at run time: torch's device, the collective backend, how
to wait for queued kernels before reading the clock, which memory statistic is the peak,
which RNG states a checkpoint must carry, and which activities the profiler records.

The GPU is reached only through `accel` (torch.cuda unless a test passes another), so
tests/unit/workload/test_device.py runs the GPU's control flow on a CPU with a fake one.
"""

from __future__ import annotations

import random
import resource
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from orchestrator.config import DeviceType
from orchestrator.workload.placement import cuda_device_index


@dataclass(frozen=True)
class Device:
    type: DeviceType
    index: int | None = None  # the GPU's index among the visible ones; None on a CPU
    accel: Any = None  # the GPU runtime (torch.cuda); None on a CPU

    @classmethod
    def for_rank(cls, kind: DeviceType | str, env: Mapping[str, str], accel: Any = None) -> Device:
        """This rank's device: a CPU, or the GPU its launcher's environment gives it (made current)."""
        kind = DeviceType(kind)
        if not kind.is_gpu:
            return cls(kind)
        accel = torch.cuda if accel is None else accel
        index = cuda_device_index(env, accel.device_count())
        accel.set_device(index)
        return cls(kind, index, accel)

    @property
    def is_gpu(self) -> bool:
        return self.type.is_gpu

    @property
    def torch(self) -> torch.device:
        return torch.device(self.type.value, self.index) if self.is_gpu else torch.device(self.type.value)

    @property
    def backend(self) -> str:
        return self.type.collective_backend

    def synchronize(self) -> None:
        """Wait for every kernel queued on the device (a GPU runs them asynchronously)."""
        if self.is_gpu:
            self.accel.synchronize(self.index)

    def clock(self) -> float:
        """A time to subtract from another: queued work finished first, so it is counted."""
        self.synchronize()
        return time.perf_counter()

    def mark(self) -> Any:
        """A point in this rank's work, to time an interval from without waiting for the device:
        the host's clock, or on a GPU an event queued on the current stream (an interval
        between two is known once the device has run past both: `seconds_between` after
        `clock` or `synchronize`)."""
        if self.is_gpu:
            event = self.accel.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds_between(self, start: Any, end: Any) -> float:
        """The seconds from one `mark` to a later one."""
        return start.elapsed_time(end) / 1e3 if self.is_gpu else end - start  # CUDA events count milliseconds

    def peak_bytes(self) -> int:
        """The most memory the rank held: the GPU allocator's peak, or on a CPU the
        process's max RSS (which counts only pages touched)."""
        if self.is_gpu:
            return int(self.accel.max_memory_allocated(self.index))
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB

    @property
    def peak_source(self) -> str:
        return "CUDA allocator max_memory_allocated" if self.is_gpu else "max RSS of rank 0"

    def rng_state(self) -> dict:
        """Every generator a step draws from (dropout on a GPU draws from the device's)."""
        state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
        if self.is_gpu:
            state["cuda"] = self.accel.get_rng_state(self.index)
        return state

    def set_rng_state(self, state: dict) -> None:
        torch.set_rng_state(state["torch"])
        np.random.set_state(state["numpy"])
        random.setstate(state["python"])
        if self.is_gpu and "cuda" in state:
            self.accel.set_rng_state(state["cuda"], self.index)

    def profiler_activities(self) -> list:
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if self.is_gpu else [])]
