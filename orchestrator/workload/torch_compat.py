"""Every use of torch's private API, in one place (tests/test_measure.py exercises each).

- `TorchDispatchMode`: sees every tensor an op creates, inside checkpointed regions too
  (the activation census). torch has kept it in torch.utils._python_dispatch since 1.13.
- `allocator_events`: the CPU allocator's allocations and frees from a finished
  torch.profiler run with profile_memory, read from the profiler's event tree (the public
  key_averages() sums them and loses which block was freed when).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["TorchDispatchMode", "allocator_events"]


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
