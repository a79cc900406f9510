"""How one rank of a link measurement times a call (workload/collective_timing.py): on a
scripted clock, so that the load a busy machine puts on it is known exactly."""

from __future__ import annotations

import pytest

from orchestrator.workload.collective_timing import timed


class Host:
    """A clock that moves only when a barrier or the call runs: a barrier costs what the load
    makes it, the call its own time plus the load."""

    def __init__(self, loads: list[float], call_s: float):
        self.now, self.loads, self.call_s = 0.0, iter(loads), call_s

    def clock(self) -> float:
        return self.now

    def barrier(self) -> None:
        self.now += next(self.loads, 1e-4)

    def call(self) -> None:
        self.now += self.call_s


def test_a_burst_of_load_on_the_first_barriers_does_not_time_the_calls_at_nothing():
    # The CI run that lost every call below 2 MB: the barriers cost 5 ms while load lasted (two
    # reps here), 0.1 ms after it; a barrier cost timed once, in the burst, outweighs a 0.3 ms call.
    host = Host([5e-3] * 6, call_s=3e-4)
    seconds, barrier_s = timed(host.call, 5, host.clock, host.barrier)
    assert seconds == pytest.approx(3e-4) and barrier_s == pytest.approx(1e-4)


def test_load_beside_each_call_is_taken_off_with_its_barrier():
    # Load alternating between reps: each rep's barrier sees what its call sees.
    loads = [load for rep in range(7) for load in [2e-3 if rep % 2 else 1e-4] * 3]
    host = Host(loads, call_s=3e-4)
    seconds, _ = timed(host.call, 7, host.clock, host.barrier)
    assert seconds == pytest.approx(3e-4)


def test_a_call_shorter_than_the_noise_is_timed_at_nothing_not_below():
    host = Host([1e-4, 1e-4, 1e-4] + [1e-4, 5e-3, 1e-4] * 3, call_s=0.0)
    seconds, _ = timed(host.call, 4, host.clock, host.barrier)
    assert seconds == 0.0
