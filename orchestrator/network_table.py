"""A network table's file (hardware.network, a calibrated preset's .network.csv): read once
per version of the file, bounded as a trial's files are, and written atomically. The table
itself, its rows and curves, is plan/bus_table.py's; the plan never reads the file."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from orchestrator.core.errors import ConfigError
from orchestrator.core.files import atomic_write_text, read_text
from orchestrator.plan.bus_table import BusTable, parse, render


def write(path: Path, table: BusTable) -> None:
    atomic_write_text(path, render(table))


TABLE_LIMIT = 16 * 2**20  # bytes: a table of every collective, 64 node counts and 40 sizes is under 200 kB


def load(path: Path | str) -> BusTable:
    """The table in `path` (read as a trial's files are: a regular file, bounded), once per
    file version: a sweep plans every point from the same table."""
    path = Path(path)
    try:
        info = os.stat(path)
    except OSError as exc:
        raise ConfigError("hardware.network", str(path), f"a network table that exists ({exc.strerror})") from None
    return _load(str(path), info.st_mtime_ns, info.st_size)


@functools.lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int, size: int) -> BusTable:
    try:
        text = read_text(path, limit=TABLE_LIMIT)
    except (OSError, ValueError) as exc:
        raise ConfigError("hardware.network", path, f"a network table that can be read ({exc})") from None
    return parse(text, path)
