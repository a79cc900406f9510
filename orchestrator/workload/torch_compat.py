"""Every use of torch's private API, in one place (tests/unit/workload/test_memory_census.py exercises each).

- `TorchDispatchMode`: sees every tensor an op creates, inside checkpointed regions too
  (the activation census). torch has kept it in torch.utils._python_dispatch since 1.13.
- `allocator_events`: the CPU allocator's allocations and frees from a finished
  torch.profiler run with profile_memory, read from the profiler's event tree (the public
  key_averages() sums them and loses which block was freed when).
- `cheap_rendezvous_records`: torchrun's c10d rendezvous names the method behind each of
  its records with `inspect.stack()`, which reads the source of every frame on the stack,
  and `inspect.getmodule` walks every module loaded for each: in a launcher that imported
  the ranks' libraries (3,400 modules; launchers/forked.py) some 0.5 CPU-s a trial, for a
  name that goes into an event log. The same name from the frame itself
  (`sys._getframe`, as pytorch/pytorch#105940 did for custom ops).
- `wrap_collectives`: DeepSpeed (deepspeed.comm's torch backend) and FSDP2 look each
  collective up on the `torch.distributed` module when they call it, so a function put
  there sees every call. FSDP2 (torch 2.13) calls `all_gather_single` and
  `reduce_scatter_single`, which torch.distributed exports but does not document.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["COLLECTIVES", "TorchDispatchMode", "allocator_events", "cheap_rendezvous_records", "wrap_collectives"]

# Every torch.distributed call that waits for other ranks, as the engines call them.
COLLECTIVES = (
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "barrier",
)


def allocator_events(profile, device_type: str = "cpu") -> list[tuple[int, int, int, str, int]]:
    """(start ns, address, bytes: + allocated / - freed, the ops it happened in as
    "outer > inner", when its top-level op ended) for every allocator event on
    `device_type`, in no particular order."""
    from torch._C._profiler import _EventType

    events = []
    stack = [(e, "", e.end_time_ns) for e in profile.profiler.kineto_results.experimental_event_tree()]
    while stack:
        event, where, top_end = stack.pop()
        inside = f"{where} > {event.name}" if where else event.name
        stack.extend((child, inside, top_end) for child in event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == torch.device(device_type).type:
            fields = event.extra_fields
            events.append((event.start_time_ns, fields.ptr, fields.alloc_size, where, top_end))
    return events


def cheap_rendezvous_records() -> None:
    """Name the method behind each of torchrun's rendezvous records from its frame, not from
    `inspect.stack()` (above); the same name, "no_method_name" where the stack is shallower."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    dynamic_rendezvous.get_method_name = _method_name


def _method_name(depth: int = 2) -> str:
    try:  # depth frames above this one, as inspect.stack()[depth] is above its caller
        return sys._getframe(depth).f_code.co_name
    except ValueError:
        return "no_method_name"


def wrap_collectives(span: Callable[[str], AbstractContextManager]) -> Callable[[], None]:
    """Run every collective of COLLECTIVES inside `span(name)`: a synchronous call whole, an
    asynchronous one (async_op=True) where its Work is waited on. Returns the function that
    puts torch's own back."""
    import torch.distributed as dist

    real = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
    for name, call in real.items():
        setattr(dist, name, _spanned(name, call, span))

    def unwrap() -> None:
        for name, call in real.items():
            setattr(dist, name, call)

    return unwrap


def _spanned(name: str, call: Callable, span: Callable[[str], AbstractContextManager]) -> Callable:
    def collective(*args, **kwargs):
        if kwargs.get("async_op"):
            work = call(*args, **kwargs)
            return work if work is None else _SpannedWork(work, name, span)
        with span(name):
            return call(*args, **kwargs)

    collective.__wrapped__ = call  # type: ignore[attr-defined]
    collective.__name__ = name
    return collective


class _SpannedWork:
    """A collective's Work whose wait() runs inside the span; everything else is the Work's own."""

    def __init__(self, work, name: str, span: Callable[[str], AbstractContextManager]):
        self._work, self._name, self._span = work, name, span

    def wait(self, *args, **kwargs):
        with self._span(self._name):
            return self._work.wait(*args, **kwargs)

    def __getattr__(self, attr: str):
        return getattr(self._work, attr)
