"""A file of token ids (run.data): what it must hold, checked before launch.

A flat binary file of uint16 or uint32 ids, read as windows of model.seq_len ids (the
model shifts inside a window for its targets). The checks name run.data and say what is
wrong: empty, not a whole number of ids, shorter than one window, or an id the model's
vocabulary does not have (found by scanning the whole file, at numpy's speed, rather than
at whatever step happens to draw that window).
"""

from __future__ import annotations

import os

import numpy as np

from orchestrator.core.errors import ConfigError

SCAN_CHUNK = 2**26  # ids per chunk: the scan's memory stays bounded for any file size


def windows(n_tokens: int, seq_len: int) -> int:
    """Distinct windows of seq_len ids in a file of n_tokens ids."""
    return max(0, n_tokens - seq_len + 1)


def check_token_file(path: str, dtype: str, seq_len: int, vocab: int) -> int:
    """The number of ids in `path`; ConfigError naming run.data if it cannot feed the model."""
    if not os.path.isfile(path):
        raise ConfigError("run.data", path, "a file of token ids that exists (or null for synthetic tokens)")
    size, item = os.path.getsize(path), np.dtype(dtype).itemsize
    if size == 0:
        raise ConfigError("run.data", path, "a file of token ids, but it is empty")
    if size % item:
        raise ConfigError(
            "run.data",
            path,
            f"a whole number of {dtype} ids ({item} bytes each), but it holds {size} "
            f"bytes; is run.data_dtype={dtype} the type it was written with?",
        )
    ids: np.ndarray = np.memmap(path, dtype=np.dtype(dtype), mode="r")
    if len(ids) < seq_len:
        raise ConfigError(
            "run.data", path, f"at least one window of model.seq_len={seq_len} ids, but it holds {len(ids)}"
        )
    for start in range(0, len(ids), SCAN_CHUNK):
        chunk = ids[start : start + SCAN_CHUNK]
        if int(chunk.max()) >= vocab:
            at = start + int(np.argmax(chunk >= vocab))
            raise ConfigError(
                "run.data", path, f"ids below model.vocab={vocab}, but id {int(ids[at])} is at position {at:,}"
            )
    return len(ids)


def few_windows_warning(path: str, dtype: str, seq_len: int, global_batch: int) -> str | None:
    """A warning when the file has fewer distinct windows than one step's batch: sequences repeat."""
    n = windows(os.path.getsize(path) // np.dtype(dtype).itemsize, seq_len)
    if n >= global_batch:
        return None
    return (
        f"run.data holds {n} distinct window(s) of model.seq_len={seq_len}, fewer than one global batch of "
        f"{global_batch} sequences: every batch repeats sequences (the loss says little)"
    )
