"""This rank's time inside collectives, step by step: what tells one rank's step from another's.

In synchronous data parallelism every rank's step lasts as long as the slowest rank's: a rank
that is done with its own work first waits in the next collective for the others. So each
rank's step splits in two: the time inside torch.distributed's collectives (the transfer,
and waiting for the ranks that are late) and the rest, the rank's own compute. The rank with
the most compute is the one the others wait for (workload/rank_steps.py names it).

Every collective DeepSpeed and FSDP2 call goes through `torch_compat.wrap_collectives`. A
synchronous call is timed whole; an asynchronous one from its Work.wait() to its return,
where the rank stands still for it (the transfer that ran beside compute before that is
hidden, and not counted). A collective called inside another (all_gather_object's
all_gather) is counted once, as the outer one.

The clock is the rank's device's (`Device.mark`): on a CPU (gloo) a collective blocks the
host, and the host's clock times it; on a GPU a collective is queued, and two events on the
compute stream time how long that stream stood still for it, read after the step's
synchronize. A GPU stream waiting on another stream's event (FSDP2's all-gather stream) is
not a collective call, and is not seen here: issue 72's profiled step measures that.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.workload.device import Device
from orchestrator.workload.torch_compat import wrap_collectives


class CollectiveWait:
    """Installed for the steps (a context manager): each step's seconds in collectives."""

    def __init__(self, device: Device):
        self.device = device
        self._depth = 0
        self._spans: list[tuple[Any, Any]] = []
        self._unwrap: Callable[[], None] | None = None

    def __enter__(self) -> CollectiveWait:
        self._unwrap = wrap_collectives(self.span)
        return self

    def __exit__(self, *exc) -> None:
        if self._unwrap:
            self._unwrap()
            self._unwrap = None

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        """One collective's time (the outermost of nested ones)."""
        self._depth += 1
        start = self.device.mark() if self._depth == 1 else None
        try:
            yield
        finally:
            self._depth -= 1
            if start is not None:
                self._spans.append((start, self.device.mark()))

    def start_step(self) -> None:
        """Forget what came before this step (the engine's set-up, the last step's bookkeeping)."""
        self._spans.clear()

    def step_seconds(self) -> float:
        """Seconds in collectives since `start_step`; the device must have run past them
        (read after the step's `Device.clock`)."""
        seconds = sum(self.device.seconds_between(start, end) for start, end in self._spans)
        self._spans.clear()
        return seconds
