"""The ways a command is stopped, as exceptions the CLI turns into exit codes.

ConfigError (exit 2): the input is wrong. Its message is one short paragraph that names
the field, the value and what is allowed; the CLI prints it without a traceback.
PlanRefused (exit 3): the input is valid but the plan predicts the trial cannot run.
MeasurementFailed (exit 1): a measurement the command ran (calibrate --links) failed.
Interrupted (exit 130 / 143): Ctrl-C or SIGTERM; what was running is recorded first.
"""

from __future__ import annotations

import difflib
import signal
from collections.abc import Iterable
from typing import Any

from orchestrator.core.redact import MASK, is_secret_name, redact_text


class ConfigError(ValueError):
    """A config value that is not allowed, or a combination of values that contradict."""

    exit_code = 2

    def __init__(self, field: str, value: Any, allowed: str, where: str = ""):
        self.field, self.value, self.allowed = field, value, allowed
        prefix = f"{where}: " if where else ""
        field = _short(str(field))
        shown = MASK if is_secret_name(str(field).rsplit(".", 1)[-1]) and value not in (None, "") else _show(value)
        super().__init__(redact_text(f"{prefix}{field}={shown} is not allowed: {allowed}"))


class MeasurementFailed(RuntimeError):
    """A measurement the command ran itself (calibrate --links' ranks) failed: exit 1, with
    what its processes said."""

    exit_code = 1


class KernelTimingError(RuntimeError):
    """A kernel could not be timed on this device (the plan falls back to the preset)."""


class PlanRefused(RuntimeError):
    """The plan predicts the trial does not fit; `run.force=true` launches anyway."""

    exit_code = 3


class Interrupted(BaseException):
    """SIGINT (Ctrl-C) or SIGTERM arrived. Raised from a signal handler, in the orchestrator
    (the running trial is recorded as interrupted, the command exits 128 + the signal's
    number with one line) and in a rank (which records it and closes its W&B run).
    A BaseException, as KeyboardInterrupt is: `except Exception` must not swallow it."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    received: list[int] = []  # the signal the handler turned into Interrupted, in this process

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @classmethod
    def swallowed(cls) -> Interrupted | None:
        """The interrupt a signal raised where nothing could catch it (inside a finalizer,
        `__del__`, which Python reports and drops), or None: the command must still end as
        interrupted, not finish its work and exit 0."""
        return cls(cls.received[0]) if cls.received else None

    @staticmethod
    def install(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
        """Turn the first of these signals into Interrupted in the main thread, and ignore the
        ones after it: what the first sets going (recording the trial, closing its W&B run)
        must not be cut short by a second. Two often come together: a forked rank gets the
        launcher group's SIGTERM and torchrun's forwarded one, SLURM and a user repeat theirs.
        A second SIGTERM once left a rank's W&B run unwritten (7 bytes) on a busy machine."""
        raised = Interrupted.received
        raised.clear()

        def handler(signum, frame):
            if raised:  # one that arrived before the ignore below took effect
                return
            raised.append(signum)
            for sig in signals:
                signal.signal(sig, signal.SIG_IGN)
            raise Interrupted(signum)

        for sig in signals:
            signal.signal(sig, handler)

    @staticmethod
    def ignore(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
        """From now on these signals do nothing (a launcher's SIGKILL still ends the process)."""
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)


def one_of(values: Iterable[Any]) -> str:
    """'a, b or c' for an error message."""
    items = [str(v) for v in values]
    if not items:
        return "(none)"
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def did_you_mean(value: Any, allowed: Iterable[Any]) -> str:
    """' (did you mean X?)' for the allowed value nearest to `value` (case first), or ''."""
    items = [str(v) for v in allowed]
    text = str(value)
    same_case = [v for v in items if v.lower() == text.lower()]
    lowered = {v.lower(): v for v in items}  # case is the likeliest slip, so it weighs nothing
    # a name cut short is the next likeliest: h100 means an h100-..., not the h200 one letter off
    extended = [v for v in items if text and v.lower().startswith(text.lower()) and v != text]
    if not same_case and len(extended) > 1:
        return f" (did you mean {', '.join(extended[:-1])} or {extended[-1]}?)"
    near = (
        same_case
        or extended
        or [lowered[v] for v in difflib.get_close_matches(text.lower(), list(lowered), n=1, cutoff=0.6)]
    )
    return f" (did you mean {near[0]}?)" if near and near[0] != text else ""


def _show(value: Any) -> str:
    return _short("null" if value is None else str(value).lower() if isinstance(value, bool) else str(value))


def _short(text: str, limit: int = 200) -> str:
    """A value as a message shows it: whole up to `limit` characters, else its start and its length."""
    return text if len(text) <= limit else f"{text[: limit // 2]}... ({len(text):,} characters)"
