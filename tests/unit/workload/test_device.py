"""The rank's Device (orchestrator/workload/device.py): the CPU path for real, and the GPU
path's control flow with a fake CUDA runtime, since this machine has no GPU (the fake
stands in for torch.cuda only; every decision around it is the real code's)."""

import random

import numpy as np
import pytest
import torch

from orchestrator.config import DeviceType
from orchestrator.workload.device import Device
from orchestrator.workload.placement import DeviceNotVisible


class FakeCuda:
    """torch.cuda's calls a Device makes, recorded; a GPU with 8 devices and 3 GiB at peak."""

    def __init__(self, count: int = 8):
        self.count, self.calls, self.current = count, [], None

    def device_count(self) -> int:
        return self.count

    def set_device(self, index: int) -> None:
        self.calls.append(("set_device", index))
        self.current = index

    def synchronize(self, index: int) -> None:
        self.calls.append(("synchronize", index))

    def max_memory_allocated(self, index: int) -> int:
        self.calls.append(("max_memory_allocated", index))
        return 3 * 2**30

    def get_rng_state(self, index: int) -> torch.Tensor:
        return torch.tensor([index, 42], dtype=torch.uint8)

    def set_rng_state(self, state: torch.Tensor, index: int) -> None:
        self.calls.append(("set_rng_state", index, state.tolist()))


def test_a_gpu_rank_takes_its_local_rank_and_makes_it_current():
    cuda = FakeCuda()
    device = Device.for_rank("cuda", {"LOCAL_RANK": "3"}, accel=cuda)
    assert device.torch == torch.device("cuda", 3) and device.index == 3
    assert cuda.calls == [("set_device", 3)] and device.backend == "nccl"


def test_a_task_bound_to_one_gpu_uses_cuda_0_whatever_its_local_rank():
    cuda = FakeCuda(count=1)
    device = Device.for_rank(DeviceType.cuda, {"LOCAL_RANK": "5", "CUDA_VISIBLE_DEVICES": "5"}, accel=cuda)
    assert device.index == 0 and cuda.calls == [("set_device", 0)]


def test_a_gpu_rank_without_its_gpu_fails_before_touching_any():
    cuda = FakeCuda(count=2)
    with pytest.raises(DeviceNotVisible, match="local rank 3"):
        Device.for_rank("cuda", {"LOCAL_RANK": "3", "CUDA_VISIBLE_DEVICES": "0,1"}, accel=cuda)
    assert cuda.calls == []


def test_the_gpu_timer_waits_for_the_device_and_the_peak_is_the_allocators():
    cuda = FakeCuda()
    device = Device.for_rank("cuda", {"LOCAL_RANK": "1"}, accel=cuda)
    start = device.clock()
    assert cuda.calls[-1] == ("synchronize", 1)  # queued kernels end before the clock is read
    assert device.clock() >= start and cuda.calls[-1] == ("synchronize", 1)
    assert device.peak_bytes() == 3 * 2**30 and cuda.calls[-1] == ("max_memory_allocated", 1)
    assert "CUDA allocator" in device.peak_source


def test_a_gpu_checkpoint_carries_the_devices_generator_and_restores_it():
    cuda = FakeCuda()
    device = Device.for_rank("cuda", {"LOCAL_RANK": "2"}, accel=cuda)
    state = device.rng_state()
    assert state["cuda"].tolist() == [2, 42] and {"torch", "numpy", "python"} <= state.keys()
    device.set_rng_state(state)
    assert cuda.calls[-1] == ("set_rng_state", 2, [2, 42])
    names = {a.name for a in device.profiler_activities()}
    assert names == {"CPU", "CUDA"}


def test_the_cpu_path_for_real():
    device = Device.for_rank("cpu", {"LOCAL_RANK": "3"})
    assert device.torch == torch.device("cpu") and device.backend == "gloo" and not device.is_gpu
    device.synchronize()  # nothing to wait for, and no GPU runtime touched
    assert device.peak_bytes() > 10 * 2**20 and "RSS" in device.peak_source
    state = device.rng_state()
    assert "cuda" not in state
    drawn = (torch.rand(3), np.random.rand(), random.random())
    device.set_rng_state(state)
    again = (torch.rand(3), np.random.rand(), random.random())
    assert torch.equal(drawn[0], again[0]) and drawn[1:] == again[1:]
    assert {a.name for a in device.profiler_activities()} == {"CPU"}


class FakeEvent:
    """torch.cuda.Event's timing calls: record() takes the fake stream's time, in ms."""

    clock_ms = [0.0]

    def __init__(self, enable_timing: bool = False):
        assert enable_timing  # an event that cannot time would raise on elapsed_time
        self.at: float | None = None

    def record(self) -> None:
        self.at = FakeEvent.clock_ms[0]

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.at is not None and end.at is not None, "elapsed_time of an event never recorded"
        return end.at - self.at


def test_a_gpu_interval_is_two_events_on_the_stream_read_in_seconds():
    cuda = FakeCuda()
    cuda.Event = FakeEvent  # type: ignore[attr-defined]
    device = Device.for_rank("cuda", {"LOCAL_RANK": "0"}, accel=cuda)
    FakeEvent.clock_ms[0] = 10.0
    start = device.mark()
    FakeEvent.clock_ms[0] = 35.0  # the stream ran 25 ms past the first event
    end = device.mark()
    assert isinstance(start, FakeEvent) and device.seconds_between(start, end) == 0.025
    assert not [c for c in cuda.calls if c[0] == "synchronize"]  # marking never waits for the device


def test_a_cpu_interval_is_the_hosts_clock():
    device = Device.for_rank("cpu", {})
    start = device.mark()
    end = device.mark()
    assert isinstance(start, float) and 0 <= device.seconds_between(start, end) < 0.1
