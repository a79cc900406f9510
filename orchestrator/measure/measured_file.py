"""One policy for a measurement cached in a file of this machine's (the CPU's peak and bandwidth
in cpu_peak.json, this host's links in local_links.json; the kernels' cache, kernel_cache.py,
keeps the same rules with its own checks of a time against the device):

- the file is read as trial files are (files.read_json: a FIFO, a link or a huge file is not
  read), and anything but a JSON object is an empty cache;
- an entry is used only where `usable` says it is one a device of this kind can give; one that
  is not is said on stderr, naming the file, and measured again;
- a new measurement replaces the entry atomically, and a cache that cannot be written (a
  read-only or missing directory) costs only the measurement next time.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.core.files import atomic_write_text, read_json


def cached_or_measured(path: Path, key: str, usable: Callable[[Any], bool], measure: Callable[[], Any]) -> Any:
    """The entry under `key` in the cache at `path` where `usable`, else `measure()`, stored there."""
    known = data if isinstance(data := read_json(path), dict) else {}
    if key in known:
        if usable(known[key]):
            return known[key]
        print(
            f"warning: {path} held {str(known[key])[:40]!r} for {key}, which cannot be: measured again", file=sys.stderr
        )
    known[key] = measure()
    with contextlib.suppress(OSError):
        atomic_write_text(path, json.dumps(known, indent=1))
    return known[key]
