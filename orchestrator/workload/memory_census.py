"""What a rank measures: activation and static memory, peak memory, the CPU's peak.

activation_bytes: the storages allocated during one micro-batch forward that are still
alive after it: what backward will need. A TorchDispatchMode sees every tensor an op
creates (inside checkpointed regions and selective-checkpoint caches too, which
saved_tensors_hooks cannot see), so full / selective recompute are measured as they
really are.
static_bytes: a census of the unique tensor storages on the rank's device alive after the
first optimizer step (parameters, gradient buffers, master weights, optimizer states,
DeepSpeed's flat buffers and buckets).
peak_bytes: the device's own statistic (workload/device.py).
AllocatorPeak: on a CPU, the most bytes of tensor storage alive at once during one step,
from the CPU allocator's own count (torch.profiler's memory events), not RSS.
"""

from __future__ import annotations

import gc
import warnings
import weakref

import torch

from orchestrator.workload.torch_compat import TorchDispatchMode, allocator_events


def storage_of(t: torch.Tensor):
    """The tensor's storage, or None where it has none to count: a wrapper without storage
    of its own (FSDP2's DTensor, whose local shard is counted) or storage FSDP2 freed (a
    resharded block's unsharded parameters)."""
    try:
        storage = t.untyped_storage()
        storage.data_ptr()
        return storage
    except (RuntimeError, NotImplementedError):
        return None


def _storage_key(t: torch.Tensor) -> tuple:
    storage = storage_of(t)
    return (t.device.type, storage.data_ptr() if storage is not None else None)


class _Creations(TorchDispatchMode):
    """Every tensor an op returns, and which storages ops allocated (not views of inputs)."""

    def __init__(self):
        super().__init__()
        self.created: list[weakref.ref] = []
        self.allocated: set[tuple] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {_storage_key(t) for t in tensors_in((args, kwargs)) if t.device.type != "meta"}
        for t in tensors_in(out):
            if t.device.type != "meta" and (s := storage_of(t)) is not None and s.nbytes():
                self.created.append(weakref.ref(t))
                if _storage_key(t) not in inputs:
                    self.allocated.add(_storage_key(t))
        return out


def tensors_in(tree):
    """Every tensor in a nest of tuples, lists and dicts (an op's arguments or results)."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (tuple, list)):
        for x in tree:
            yield from tensors_in(x)
    elif isinstance(tree, dict):
        for x in tree.values():
            yield from tensors_in(x)


class ActivationCensus:
    """with ActivationCensus() as census: loss = model(...)  ->  census.bytes

    Only storages allocated inside the forward count. A view of a parameter that
    autograd saves (aten::t(weight) for a linear layer) is not activation memory; with
    ZeRO 1/2 every parameter is a view into one flat buffer, so counting the storages of
    views would count all the parameters again. Nor is a parameter the forward gathered and
    left gathered for the backward (FSDP2's root, every block at reshard_after_forward=False;
    their storage is the module's parameter once the forward ends): the plan counts those
    as the engine's working set, not as activations.
    """

    def __enter__(self) -> ActivationCensus:
        self._mode = _Creations()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        alive = [t for t in (ref() for ref in self._mode.created) if t is not None]
        parameters = {_storage_key(t) for t in _heap_parameters()}
        self.bytes = unique_storage_bytes(
            t for t in alive if _storage_key(t) in self._mode.allocated and _storage_key(t) not in parameters
        )


def _heap_parameters() -> list[torch.nn.Parameter]:
    """Every parameter the Python heap holds (a rank's frozen imports are not walked)."""
    return [o for o in gc.get_objects() if isinstance(o, torch.nn.Parameter)]


def unique_storage_bytes(tensors) -> int:
    seen: dict[tuple, int] = {}
    for t in tensors:
        if t is None or t.device.type == "meta":
            continue
        storage = storage_of(t)
        if storage is not None and storage.nbytes():
            seen[(t.device.type, storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def static_bytes(device_type: str | None = None) -> int:
    """Unique storages of every tensor the Python heap holds (call with no batch in flight),
    only those on `device_type` ("cuda": what the GPU holds, not offloaded host copies).
    Objects frozen by gc.freeze() are not walked: a rank freezes only what its imports made."""
    gc.collect()
    return unique_storage_bytes(_heap_tensors(device_type))


def _heap_tensors(device_type: str | None) -> list[torch.Tensor]:
    """Every tensor the Python heap holds, on `device_type` (None: any)."""
    with warnings.catch_warnings():  # isinstance() on deprecated module objects warns
        warnings.simplefilter("ignore")
        return [
            o
            for o in gc.get_objects()
            if isinstance(o, torch.Tensor) and (device_type is None or o.device.type == device_type)
        ]


class AllocatorPeak:
    """with AllocatorPeak() as p: one step  ->  p.growth, p.where (the ops the peak was reached in)

    The most bytes of tensor storage the CPU allocator held at once inside the block,
    beyond what it held on entry. With profile_memory on, c10's CPU allocator reports
    every allocation and free made on a profiled thread (torch.profiler's memory events);
    `held_growth` replays them. Its own running total is not used: a block freed on a
    thread the profiler does not watch (a gloo worker dropping the last reference to a
    bucket DeepSpeed all-reduced) is never subtracted from it, so the total drifts up by
    that block, in some runs and not others. Enter it once per process, with no other
    profiler running; it slows the step it watches, so it watches an untimed one.
    """

    def __enter__(self) -> AllocatorPeak:
        from torch.profiler import ProfilerActivity, profile

        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profile.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._profile.__exit__(*exc)
        events = allocator_events(self._profile)
        events.sort()
        # A block allocated here that no event freed and no tensor holds now was freed on a
        # thread the profiler does not watch: a gloo worker drops the last reference to a
        # collective's buffer once it completes, inside the op that made it. It is let go
        # when that top-level op returned.
        still_held = _replay([(ptr, size) for _, ptr, size, _, _ in events])[2]
        unreported = still_held.keys() - live_storage_addresses("cpu")
        ends = {ptr: (top_end, ptr, -size, "", top_end) for _, ptr, size, _, top_end in events if ptr in unreported}
        events = sorted(events + list(ends.values()))
        self.growth, at = held_growth([(ptr, size) for _, ptr, size, _, _ in events])
        self.where = events[at][3] if at is not None else None


def live_storage_addresses(device_type: str) -> set[int]:
    """The data pointers of every storage on `device_type` a Python-visible tensor holds."""
    return {
        s.data_ptr()
        for t in _heap_tensors(device_type)
        if t.layout == torch.strided and (s := storage_of(t)) is not None
    }


def held_growth(events: list[tuple[int, int]]) -> tuple[int, int | None]:
    """(the most bytes held beyond the start, the index of the event that reached it) from
    allocator events in time order: (address, +bytes allocated or -bytes freed).

    An allocation at an address still held means the block there was freed where no event
    reported it (another thread): it stops counting then. Frees of blocks allocated before
    the first event lower what is held below the start."""
    most, at, _ = _replay(events)
    return most, at


def _replay(events: list[tuple[int, int]]) -> tuple[int, int | None, dict[int, int]]:
    """held_growth's replay, and the blocks still held after the last event (address: bytes)."""
    held: dict[int, int] = {}
    now, most, at = 0, 0, None
    for i, (ptr, size) in enumerate(events):
        if size > 0:
            now += size - held.get(ptr, 0)
            held[ptr] = size
        else:
            now -= held.pop(ptr, -size)
        if now > most:
            most, at = now, i
    return most, at, held
