"""SLURM's warning before a time limit or preemption (SIGUSR2), noted when a rank asks.

The rank keeps SIGUSR2 blocked for its whole life and looks for it at step boundaries
(`warned()` consumes a pending one). Blocked rather than handled because the mask is
inherited across exec: the compilers DeepSpeed spawns to build its ops on first use
(ninja, c++) would otherwise die of SIGUSR2's default action mid-build, failing the rank.
The SLURM task starts the rank with it blocked already; `listen()` makes sure of it for
any other launcher, first thing, before a thread exists that could take the signal.
"""

from __future__ import annotations

import signal

_warned = False


def listen() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})


def warned() -> bool:
    global _warned
    if not _warned and signal.SIGUSR2 in signal.sigpending():
        signal.sigtimedwait({signal.SIGUSR2}, 0)  # consume it: one warning, one save
        _warned = True
    return _warned


def clear() -> None:
    global _warned
    _warned = False
