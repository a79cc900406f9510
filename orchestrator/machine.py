"""The machine a command runs on, as it says of itself (read, never timed): its GPU and the
preset that names it (hardware=auto), the device files a GPU driver makes, the CPUs this
process may use and each rank's share of them, the host's memory. measure/hardware.py times
what needs timing (a CPU's peak, its memory bandwidth).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from orchestrator.config import GIB

# Substrings of torch.cuda.get_device_name() -> preset. Checked in order (H100 PCIe
# before the SXM part, whose name is just "NVIDIA H100 80GB HBM3").
_GPU_PRESETS = (
    ("H200", "h200"),
    ("H100 PCIe", "h100-pcie"),
    ("H100", "h100-sxm"),
    ("A100-SXM4-80GB", "a100-80gb"),
    ("A100 80GB", "a100-80gb"),
)


def preset_for_gpu(device_name: str) -> str | None:
    """The hardware preset for a CUDA device name, or None if there is none."""
    for fragment, preset in _GPU_PRESETS:
        if fragment.lower() in device_name.lower():
            return preset
    return None


def local_gpu_memory_gib() -> float:
    """The first CUDA device's memory in GiB."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory / GIB


# The device files a GPU driver makes: NVIDIA's (/dev/nvidia0, nvidiactl, MIG's caps), AMD
# ROCm's (/dev/kfd, which torch.cuda drives too) and WSL2's (/dev/dxg). Where none exists
# torch cannot see a GPU, and asking it would cost every `plan` torch's import (1.5 s).
GPU_DEVICE_FILES = ("nvidia*", "kfd", "dxg")


def gpu_driver_present(dev: Path = Path("/dev")) -> bool:
    return any(any(dev.glob(pattern)) for pattern in GPU_DEVICE_FILES)


@functools.cache
def local_gpu_name() -> str | None:
    """The name of this machine's first CUDA device, or None without one."""
    if not gpu_driver_present():
        return None
    import torch  # imported here: composing a config must not pay for torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity (taskset, a SLURM task's binding, a
    container's cpuset), which may be fewer than the machine has (os.cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def threads_per_rank(ranks_on_node: int) -> int:
    """Each rank's share of the usable CPUs: more threads than CPUs only contend."""
    return max(1, usable_cpus() // ranks_on_node)


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
