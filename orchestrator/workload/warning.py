"""SLURM's warning before a time limit or preemption (SIGUSR2), noted the moment it comes.

Installed first thing in a rank (no heavy imports here), since SIGUSR2's default action
would kill a rank still starting up. The SLURM task starts the rank with SIGUSR2
blocked, so a warning that arrives even earlier waits until `listen()` unblocks it.
"""

from __future__ import annotations

import signal

_warned = False


def listen() -> None:
    signal.signal(signal.SIGUSR2, _note)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})


def _note(signum, frame) -> None:
    global _warned
    _warned = True


def warned() -> bool:
    return _warned


def clear() -> None:
    global _warned
    _warned = False
