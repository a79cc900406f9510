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
"""

from __future__ import annotations

import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["TorchDispatchMode", "allocator_events", "cheap_rendezvous_records"]


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
