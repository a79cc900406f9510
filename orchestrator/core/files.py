"""Writing files so that a crash never leaves half of one (temp file, fsync, rename), and
reading them so that a crafted one cannot hang or swamp a command: a trial's files are
read only as regular files, never through a link, and up to a size limit."""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import yaml


def xdg_dir(variable: str, fallback: str) -> Path:
    """An XDG base directory: $VARIABLE where it is an absolute path, else ~/FALLBACK. The
    XDG spec has an empty or relative value ignored: "" would put a cache in the working
    directory, which is whatever the user ran the command in."""
    value = os.environ.get(variable, "")
    return Path(value) if value and Path(value).is_absolute() else Path.home() / fallback


def atomic_write_text(path: Path | str, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would make results unreadable to the team
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def strict_json(data: Any) -> str:
    """Strict JSON: a NaN or infinity (a diverged loss) becomes null, never a bare NaN that
    strict readers reject; whoever produced it flags it in words beside it."""
    return json.dumps(finite(data), indent=2, sort_keys=False, default=str, allow_nan=False)


def atomic_write_json(path: Path | str, data: Any) -> None:
    atomic_write_text(path, strict_json(data) + "\n")


READ_LIMIT = 64 * 2**20  # bytes: a result.json with every step's record is well under a megabyte


def read_text(path: Path | str, limit: int = READ_LIMIT) -> str:
    """The text of a regular file, read without following a link (a link to /dev/zero or
    out of the tree is refused) and only up to `limit` bytes. OSError or ValueError
    (UnicodeDecodeError) otherwise, saying why."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: a FIFO must not block the open
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: the last component is a symbolic link
            raise OSError(exc.errno, "a symbolic link, not followed", str(path)) from None
        raise
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(0, "not a regular file", str(path))
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(0, f"larger than {limit // 2**20} MiB", str(path))
    return data.decode()


def read_json(path: Path | str) -> dict | None:
    """The JSON object in `path` (read_text's rules), or None if it is missing, unreadable,
    not JSON, or JSON of another shape (every file this tool writes holds an object)."""
    try:
        data = json.loads(read_text(path))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def remove_tree(path: Path | str) -> None:
    """shutil.rmtree(path, ignore_errors=True) with a stack, not recursion: Python 3.11's
    rmtree recurses, and a tree 1,500 folders deep would end it with a RecursionError.
    Links are removed, never followed."""
    folders, todo = [], [str(path)]
    while todo:
        folder = todo.pop()
        folders.append(folder)
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(entry.path)
                    else:
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)
        except OSError:
            continue
    for folder in reversed(folders):  # deepest first: each is empty by its turn
        with contextlib.suppress(OSError):
            os.rmdir(folder)


MAX_YAML_NODES = 200_000  # a trial's config.yaml has ~300; an alias bomb expands past any bound


def read_yaml(path: Path | str, limit: int = READ_LIMIT) -> Any:
    """The YAML document in `path`, read as read_text reads (no link, no FIFO, bounded), and
    parsed with its aliases bounded: a document whose aliases would expand it past
    MAX_YAML_NODES nodes (a 'billion laughs' file), or that refers to itself, is refused
    with ValueError before anything is built from it. yaml.YAMLError where it is not YAML."""
    loader = yaml.SafeLoader(read_text(path, limit))
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expanded_size(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_expanded_size(root: yaml.Node) -> None:
    """ValueError if `root`, its aliases expanded, holds more than MAX_YAML_NODES nodes. Walks
    the node graph once (each shared node counted from its size), with a stack, not recursion."""
    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    todo: list[tuple[yaml.Node, bool]] = [(root, False)]
    while todo:
        node, children_done = todo.pop()
        children = (
            [n for pair in node.value for n in pair]
            if isinstance(node, yaml.MappingNode)
            else list(node.value)
            if isinstance(node, yaml.SequenceNode)
            else []
        )
        if children_done:
            visiting.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[id(node)] > MAX_YAML_NODES:
                raise ValueError(f"its aliases expand it past {MAX_YAML_NODES:,} nodes")
            continue
        if id(node) in sizes:
            continue
        if id(node) in visiting:
            raise ValueError("an alias refers to the node that holds it")
        visiting.add(id(node))
        todo.append((node, True))
        todo += [(c, False) for c in children if id(c) not in sizes]


def real_number(value: object) -> float | None:
    """`value` as a float where it is a finite number (a bool is not one), else None: what a
    reader of a record written by hand or by another version may trust as a figure."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def finite(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite(v) for v in data]
    return data
