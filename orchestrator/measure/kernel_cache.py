"""The cache of timed kernels and engine lines (~/.cache/orchestrator/kernels.json): what a
plan timed on this machine, keyed by device, software, method, threads, dtype and shape, so
a sweep times each distinct shape once; and what a cached time may be, so a damaged or
poisoned entry is timed again rather than believed."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.core.files import atomic_write_text, read_json, real_number
from orchestrator.measure.hardware import cache_dir, torch_version

TOO_LARGE = "too large to time whole"  # a cache entry's fourth field: one call took more than kernel_timing.PROBE_S

# What a kernel's time can be on any device: no call is shorter than 10 ns (a GPU's launch
# takes microseconds) nor longer than an hour (PROBE_S keeps every timed call far below it).
MIN_KERNEL_S, MAX_KERNEL_S = 1e-8, 3600.0


def plausible_times(forward_s: float, backward_s: float) -> bool:
    """A kernel's (forward, backward) seconds as a device can take them: finite, forward (a
    call timed) within [MIN_KERNEL_S, MAX_KERNEL_S], backward (forward and backward less the
    forward, so as small as the clock's noise) within [0, MAX_KERNEL_S]."""
    return MIN_KERNEL_S <= forward_s <= MAX_KERNEL_S and 0.0 <= backward_s <= MAX_KERNEL_S


def cache_path() -> Path:
    return cache_dir() / "kernels.json"


class Cache:
    """(forward s, backward s, when timed) per kernel key; read once per process, written
    after new timings."""

    _known: dict[str, list] | None = None
    _dirty = False
    _new: set[str] = set()  # timed by this process and not saved yet
    discarded: list[str] = []  # cached entries found implausible in this process (measured again)

    @classmethod
    def known(cls) -> dict[str, list]:
        if cls._known is None:
            cls._known = read_json(cache_path()) or {}  # missing or damaged: timed again
        return cls._known

    @classmethod
    def get(
        cls,
        key: str,
        measure: Callable[[], tuple[float, float]],
        plausible: Callable[[float, float], bool] | None = None,
    ) -> tuple[float, float, str]:
        """(a, b, when timed) under `key`: cached where the entry is whole and plausible
        (a kernel's times by default), else measured and cached."""
        entry = cls._checked(key, plausible or plausible_times)
        if entry is not None:
            return entry[0], entry[1], str(entry[2])
        fwd, bwd = measure()
        entry = [float(fwd), float(bwd), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())]
        cls.known()[key] = entry
        cls._dirty = True
        cls._new.add(key)
        return entry[0], entry[1], entry[2]

    @classmethod
    def get_whole(
        cls,
        key: str,
        measure: Callable[[], tuple[float, float] | None],
        plausible: Callable[[float, float], bool] | None = None,
    ) -> tuple[tuple | None, str]:
        """As `get`, for a kernel timed whole, which may be too large to time (then None)."""
        entry = cls.known().get(key)
        if isinstance(entry, list) and len(entry) == 4 and entry[3] == TOO_LARGE:
            return None, str(entry[2])
        entry = cls._checked(key, plausible or plausible_times)
        if entry is not None:
            return (entry[0], entry[1]), str(entry[2])
        times = measure()
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cls.known()[key] = [float(times[0]), float(times[1]), when] if times else [0.0, 0.0, when, TOO_LARGE]
        cls._dirty = True
        cls._new.add(key)
        return times, when

    @classmethod
    def _checked(cls, key: str, plausible: Callable[[float, float], bool]) -> list | None:
        """The cached entry under `key` if it is whole and its numbers plausible; a damaged or
        implausible one (negative, zero, NaN, infinite, faster or slower than any device) is
        dropped, to be measured again, and said (`discarded`)."""
        entry = cls.known().get(key)
        if entry is None:
            return None
        whole = isinstance(entry, list) and len(entry) == 3 and all(real_number(x) is not None for x in entry[:2])
        if whole and plausible(float(entry[0]), float(entry[1])):
            return entry
        cls.discarded.append(f"{key.rsplit('|', 1)[-1]}: {str(entry)[:80]}")
        del cls.known()[key]
        return None

    @classmethod
    def reload(cls) -> None:
        """Read the file again at the next look-up (another process has written it)."""
        cls._known, cls._dirty = None, False
        cls._new.clear()

    @classmethod
    def take_discarded(cls) -> str:
        """What `_checked` dropped since the last call, as a warning ('' if nothing)."""
        if not cls.discarded:
            return ""
        said = (
            f"{len(cls.discarded)} cached time(s) in {cache_path()} were not plausible for any device "
            f"(e.g. {cls.discarded[0]}): discarded and timed again"
        )
        cls.discarded.clear()
        return said

    @classmethod
    def forget_new(cls) -> None:
        """Drop what this process timed and has not saved (taken on a busy machine)."""
        for key in cls._new:
            cls.known().pop(key, None)
        cls._new.clear()
        cls._dirty = False

    @classmethod
    def save(cls) -> None:
        if not cls._dirty:
            return
        # merged with what other processes wrote meanwhile; a cache lost costs only time
        merged = {**(read_json(cache_path()) or {}), **cls.known()}
        try:
            atomic_write_text(cache_path(), json.dumps(merged, indent=0))
        except OSError:
            pass
        cls._dirty = False
        cls._new.clear()


# --- what a cached time is keyed by, besides the kernel --------------------------------------


def device_name(device: str) -> str:
    if device.split(":")[0] == "cuda":  # "cuda", "cuda:1": torch's own spelling of a device
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    from orchestrator.measure.hardware import cpu_model

    return cpu_model()


@functools.cache  # reading a package's metadata takes milliseconds, and a sweep plans many points
def software(device: str = "cpu") -> str:
    """What besides the device changes a kernel's time, for the cache's key: the libraries
    (DeepSpeed's fused optimizer, transformers' modules), and on a GPU its driver and CUDA
    runtime, and the host CPU, whose pace the host-bound blocks and the model's ends time."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        deepspeed = f", deepspeed {version('deepspeed')}"
    except PackageNotFoundError:
        deepspeed = ""
    sw = f"torch {torch_version()}, transformers {version('transformers')}{deepspeed}"
    if device.split(":")[0] == "cuda":
        from orchestrator.measure.hardware import cpu_model, gpu_software

        sw += f", {gpu_software()}, host {cpu_model()}"
    return sw
