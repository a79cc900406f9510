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
not a collective call, and is not seen here.

Each step's seconds are also kept by kind (`collective_kind`: all_reduce, all_gather,
reduce_scatter, ...), in the names the plan gives its collectives. The rank that waits least
waits only for the transfer itself: its seconds by kind are the step's exposed communication,
measured (workload/rank_steps.py). The step's closing agreement (hooks.Checkpointer.due) is
kind AGREEMENT: the orchestrator's, not the training's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.workload.deepspeed_compat import rebind_collectives
from orchestrator.workload.device import Device
from orchestrator.workload.torch_compat import wrap_collectives

# torch.distributed's names, as the plan names the collective (plan/comm.py)
_SUFFIXES = ("_into_tensor", "_tensor", "_single", "_coalesced", "_object_list", "_object", "_base")


def collective_kind(name: str) -> str:
    """all_gather_into_tensor -> all_gather, reduce_scatter_single -> reduce_scatter, ..."""
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


class CollectiveWait:
    """Installed for the steps (a context manager): each step's seconds in collectives."""

    def __init__(self, device: Device):
        self.device = device
        self._depth = 0
        self._kind: str | None = None  # while `as_kind` holds: every span's kind
        self._spans: list[tuple[str, Any, Any]] = []
        self._unwrap: Callable[[], None] | None = None

    def __enter__(self) -> CollectiveWait:
        unwrap = wrap_collectives(self.span)
        restore = rebind_collectives()  # DeepSpeed bound two of them when its backend started

        def undo() -> None:
            restore()
            unwrap()

        self._unwrap = undo
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
                self._spans.append((self._kind or collective_kind(name), start, self.device.mark()))

    @contextlib.contextmanager
    def as_kind(self, kind: str) -> Iterator[None]:
        """Count the collectives inside as `kind` (the step's closing agreement: AGREEMENT)."""
        self._kind = kind
        try:
            yield
        finally:
            self._kind = None

    def start_step(self) -> None:
        """Forget what came before this step (the engine's set-up, the last step's bookkeeping)."""
        self._spans.clear()

    def step_seconds(self) -> tuple[float, dict[str, float]]:
        """Seconds in collectives since `start_step`, and by kind; the device must have run
        past them (read after the step's `Device.clock`)."""
        kinds: dict[str, float] = {}
        for kind, start, end in self._spans:
            kinds[kind] = kinds.get(kind, 0.0) + self.device.seconds_between(start, end)
        self._spans.clear()
        return sum(kinds.values()), kinds
