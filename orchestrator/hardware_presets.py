"""A hardware preset on disk: its figures' bounds, where a network table it names lives, and
NAME-calibrated, the preset `orchestrator calibrate` writes into the user's config dir.

One owner of NAME-calibrated.yaml: read and checked here (calibrated_preset), written here
(write_calibrated_preset) under one lock (preset_lock), whether calibrate fits its parameters
or calibrate --links / --nccl-tests gives it a network; its network table is NAME-calibrated
.network.csv beside it (calibrated_table_path).
"""

from __future__ import annotations

import contextlib
import fcntl
import math
from collections.abc import Iterator
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from orchestrator.core.errors import ConfigError
from orchestrator.core.files import atomic_write_text, read_yaml
from orchestrator.hydra_glue.conf_tree import current_source, user_conf_dir
from orchestrator.plan.bus_table import MAX_BUSBW_GBPS
from orchestrator.records.trial_dir import writable_dir

CALIBRATED = "-calibrated"  # the preset `orchestrator calibrate` writes for NAME is NAME-calibrated


# What each planning figure of a hardware preset can be on any device this tool plans: the
# config refuses a value outside it (a bus bandwidth of 1e-320 GB/s plans an infinite step)
# and calibrate fits within it, so a fitted preset is always a valid one. Bus bandwidths
# from a slow Ethernet to NVSwitch, hop latencies from RDMA to TCP across a building.
PLAUSIBLE = {
    "compute_efficiency": (0.02, 1.0),
    "gemm_kn_efficiency": (0.02, 1.0),
    "gemm_half_dim": (0.0, 8192.0),
    "attention_efficiency": (0.02, 1.0),
    "attention_backward_efficiency": (0.02, 1.0),
    "memory_efficiency": (0.05, 1.0),
    "op_overhead_us": (0.0, 2000.0),
    "host_op_us": (0.0, 2000.0),
    "intra_node.busbw_gbps": (0.01, MAX_BUSBW_GBPS),
    "inter_node.busbw_gbps": (0.01, MAX_BUSBW_GBPS),
    "intra_node.latency_us": (0.0, 5000.0),
    "inter_node.latency_us": (0.0, 5000.0),
    "collective_overhead_us": (0.0, 20000.0),
    "memory_bandwidth_gbps": (0.1, 1e5),
    "host_memory_bandwidth_gbps": (0.1, 1e5),
    "host_link_gbps": (0.01, MAX_BUSBW_GBPS),
    "memory_gib": (0.01, 1e6),
    "gemm_cache_mb": (0.01, 1e6),
    "peak_tflops.bf16": (1e-5, 1e5),
    "peak_tflops.fp16": (1e-5, 1e5),
    "peak_tflops.fp32": (1e-5, 1e5),
}


def check_plausible(hw) -> None:
    """ConfigError naming the first of `hw`'s figures outside PLAUSIBLE, with the nearest
    valid value; a null (measured on the device) passes."""
    for name, (low, high) in PLAUSIBLE.items():
        value = hw
        for part in name.split("."):
            value = getattr(value, part, None)
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
        if not number or not low <= value <= high:  # NaN and infinity compare outside any range
            nearest = f"; the nearest valid value is {min(max(value, low), high):g}" if number else ""
            raise ConfigError(f"hardware.{name}", value, f"a number from {low:g} to {high:g}{nearest}")


def calibrated_name(name: str) -> str:
    """The name of the calibrated preset of hardware preset `name`."""
    return name if name.endswith(CALIBRATED) else name + CALIBRATED


def calibrated_preset(name: str, conf_dir: Path) -> dict | None:
    """The calibrated preset of hardware `name` in the user's config dir `conf_dir`, checked
    (None if there is none). One that is empty, unreadable, or not what calibrate writes is
    refused naming the file: used as it is, it would plan with defaults without a word."""
    path = conf_dir / "hardware" / f"{calibrated_name(name)}.yaml"
    if not (path.exists() or path.is_symlink()):
        return None
    problem: str | None
    try:
        data = read_yaml(path, limit=2**20)  # aliases bounded, like a trial's config.yaml
    except (OSError, ValueError, RecursionError, yaml.YAMLError) as exc:
        problem = f"cannot be read ({type(exc).__name__})"
    else:
        fields = ("name", "device", "calibrated_on")
        problem = (
            "is empty, or not a preset"
            if not isinstance(data, dict) or not data
            else f"lacks {', '.join(f for f in fields if f not in data)}"
            if any(f not in data for f in fields)
            else None
        )
    if problem:
        raise ConfigError(
            "hardware",
            calibrated_name(name),
            f"a calibrated preset that can be used, but {path} "
            f"{problem}; run `orchestrator calibrate` again, or delete that file",
        )
    return data


def network_table_path(value: str) -> Path:
    """hardware.network as an absolute path: a path as given (relative to the working
    directory), else a file of that name beside the presets (a hardware/ folder of the tree)."""
    given = Path(value).expanduser()
    source = current_source()
    beside = [Path(d) / "hardware" / given for d in (source.primary, *source.extra_dirs)]
    for path in [given] if given.is_absolute() else [Path.cwd() / given, *beside]:
        if path.exists():
            return path.resolve()
    raise ConfigError(
        "hardware.network",
        value,
        "a network table (a CSV of collective,nodes,ranks_per_node,bytes,"
        "busbw_gbps): a path to one, or the name of one beside the presets in conf/hardware/; none "
        "is there",
    )


def writable_preset_dir() -> Path:
    """The user's hardware preset folder, made and checked writable (ConfigError if not)."""
    return writable_dir(user_conf_dir() / "hardware", "ORCHESTRATOR_USER_CONF")


def calibrated_preset_path(name: str) -> Path:
    return user_conf_dir() / "hardware" / f"{calibrated_name(name)}.yaml"


def calibrated_table_path(name: str) -> Path:
    """The network table NAME-calibrated plans from, where calibrate --links or --nccl-tests wrote one."""
    return user_conf_dir() / "hardware" / f"{calibrated_name(name)}.network.csv"


_HELD: set[Path] = set()  # the locks this process holds: taken again inside, they are held already


@contextlib.contextmanager
def preset_lock(name: str) -> Iterator[None]:
    """One writer at a time of NAME-calibrated (a calibrate, a --links, a --nccl-tests): a second
    exits 2 rather than have the last writer silently win. Held by this process, it is held
    for a nested write too (calibrate holds it from its fit to the preset's write)."""
    lock = writable_preset_dir() / f".{calibrated_name(name)}.lock"
    if lock in _HELD:
        yield
        return
    with open(lock, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                "hardware",
                name,
                f"one calibrate at a time: another is fitting and writing "
                f"{calibrated_name(name)} now ({lock}); run this one after it ends",
            ) from None
        _HELD.add(lock)
        try:
            yield
        finally:
            _HELD.discard(lock)


def write_calibrated_preset(name: str, data: dict, header: str) -> Path:
    """NAME-calibrated.yaml in the user's config dir, atomically and under preset_lock; `header`:
    its comment lines, saying who wrote it, when and from what."""
    folder = writable_preset_dir()
    path = calibrated_preset_path(name)
    if path.resolve().parent != folder.resolve():  # hardware.name is checked as a plain name; this is the guard
        raise ConfigError("hardware.name", name, "a plain name (letters, digits, - _ .), not a path")
    with preset_lock(name):
        atomic_write_text(path, header + OmegaConf.to_yaml(OmegaConf.create(data)))
    return path
