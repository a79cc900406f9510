"""How a CPU rank's memory is allocated, for the ranks and for whatever times their work.

glibc's malloc serves a block below its mmap threshold from its heap, whose freed blocks
stay resident, and raises that threshold to the size of each mmapped block freed (up to
32 MiB; mallopt(3), M_MMAP_THRESHOLD). A CPU trial's activations (MBs to tens of MBs) then
live in the heap, and its resident peak grows past its live tensors: 0.52 GiB on a
two-layer gpt2-125m at micro 4 (bench/RESULTS.md). Fixed, the threshold stops moving and
every block from 1 MiB up is returned to the system when freed, so the resident peak is
what the plan counts.

That has a price the plan must see: every such block is mapped afresh and its pages are
faulted in one by one. At hidden 256 on an AVX-512 CPU a training step took 45-50 thousand
page faults and 1.4x as long as under glibc's moving threshold (bench/RESULTS.md, "The
ranks' allocator, timed with their kernels"). So the process that times a CPU trial's
kernels, and the engine's timing process, allocate as the ranks do.
"""

from __future__ import annotations

import ctypes
import os

ENV = "MALLOC_MMAP_THRESHOLD_"
MMAP_THRESHOLD = 1 << 20
MAX_MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64 bits
_M_MMAP_THRESHOLD = -3  # mallopt(3)'s parameter number in glibc's malloc.h


def mmap_threshold() -> int:
    """The threshold the ranks get: the user's own MALLOC_MMAP_THRESHOLD_ where it is a
    whole number of bytes (theirs to choose), else ours."""
    value = os.environ.get(ENV, "")
    return int(value) if value.isdigit() else MMAP_THRESHOLD


def rank_environment() -> dict[str, str]:
    """The variable that gives a new process (a rank, the engine's timing) the ranks'
    allocator; glibc reads it once, at the process's start. Other C libraries ignore it."""
    return {ENV: str(mmap_threshold())}


def _glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError, AttributeError):  # no such name on this system
        return False


def _fixed_threshold() -> int | None:
    """The ranks' fixed threshold, or None where glibc does not fix one: another C library,
    or a value past glibc's largest (32 MiB on 64 bits), which glibc ignores."""
    threshold = mmap_threshold()
    return threshold if _glibc() and threshold <= MAX_MMAP_THRESHOLD else None


def allocator_key() -> str:
    """What a timing's cache key says of the ranks' allocator."""
    threshold = _fixed_threshold()
    return f"glibc mmap from {threshold} B" if threshold is not None else "malloc's own"


def allocate_as_the_ranks() -> None:
    """Fixes this process's mmap threshold at the ranks' (mallopt), for the rest of its life:
    glibc cannot be given its moving threshold back."""
    threshold = _fixed_threshold()
    if threshold is not None:
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, threshold)  # this process's libc, glibc here
