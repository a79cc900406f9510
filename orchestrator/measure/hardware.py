"""Which accelerator a trial runs on, measured: the CPU's peak FLOPS and memory bandwidth, the GPU's
software as the caches key it.

MFU never uses a guessed peak: a GPU without a preset has to be described by the user
(hardware.peak_tflops.*), and on a CPU the peak is a measured matmul rate.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import time
from pathlib import Path

from orchestrator.core.files import real_number, xdg_dir
from orchestrator.machine import gpu_driver_present
from orchestrator.measure.measured_file import cached_or_measured


def gpu_software() -> str:
    """The GPU's driver and the CUDA runtime torch was built with, as the kernel cache keys them."""
    import torch

    try:
        driver = Path("/proc/driver/nvidia/version").read_text().split("Kernel Module", 1)[1].split()[0]
    except (OSError, IndexError):
        driver = "unknown"
    return f"driver {driver}, CUDA {torch.version.cuda}"


def local_gpu_count() -> int:
    """The GPUs this process sees (CUDA_VISIBLE_DEVICES respected); 0 without a driver.
    torch counts them through NVML where it can, without creating a CUDA context."""
    if not gpu_driver_present():
        return 0
    import torch

    return torch.cuda.device_count()


def peak_tflops(hw, precision: str, threads: int) -> tuple[float | None, str]:
    """(TFLOPS per rank, where the figure comes from) for a HardwareConfig: the preset's
    published dense figure, or this CPU's measured matmul rate on `threads` threads; None
    for a GPU that has neither (hardware=auto on a GPU without a preset): MFU unknown.
    The plan's predicted MFU and a run's measured MFU both divide by this one figure."""
    given = getattr(hw.peak_tflops, precision)
    if given:
        return float(given), f"{hw.name} dense {precision}, published"
    if hw.device.is_gpu:
        return None, f"no published dense {precision} peak for this GPU, so MFU is unknown"
    return (
        measured_cpu_peak_tflops(precision, threads),
        f"measured {precision} matmul on this CPU, {threads} thread(s) per rank",
    )


# What a host's matmul and memory copy can measure: from a slow core's 10 MFLOPS and 0.1 GB/s
# to ten times the largest server's (AMX sockets reach tens of TFLOPS; HBM-fed CPUs ~1 TB/s).
PLAUSIBLE_TFLOPS, PLAUSIBLE_GBPS = (1e-5, 1e3), (0.1, 1e5)


def measured_cpu_peak_tflops(precision: str, threads: int) -> float:
    """This CPU's dense matmul rate in TFLOPS for `precision` on `threads` threads.

    Measured once (a few hundred ms) and cached per CPU model, torch version, dtype and
    thread count under ~/.cache/orchestrator/, so MFU on CPU is against what this
    machine's matmul really reaches, not a guess.
    """

    def matmul_tflops() -> float:
        import torch

        from orchestrator.workload.model import torch_dtype

        # The best rate over sizes: where a dtype has no fast kernel (bf16 on a CPU without
        # AVX512-BF16 runs at 1-3 GFLOPS) small matmuls are the fastest, and a model of
        # small layers reaches more than a 512-matmul does.
        # In nn.Linear's layout, x @ W.t() with W stored [out, in]: the kernel the model runs.
        # bf16 on this CI machine runs 5x faster that way than `a @ b` (13 against 2 GFLOPS at
        # 512), and a peak taken from the slow layout gave the default trial an MFU above 1.
        # A long k reaches more than a square of the same rows (17 against 12 GFLOPS on one
        # thread of the CI machine): the peak is the best of both.
        dtype = torch_dtype(precision)
        best = 0.0
        for n, k in ((64, 64), (128, 128), (256, 256), (512, 512), (256, 2048), (512, 2048)):
            a, w = torch.randn(n, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
            best = max(best, 2 * n * n * k / _best_time(lambda a=a, w=w: a @ w.t()) / 1e12)
        return best

    key = (
        f"{cpu_model()}|torch {torch_version()}|{precision}|{threads} threads|linear layout, best of 64-512, k to 2048"
    )
    return _measured(key, threads, matmul_tflops, PLAUSIBLE_TFLOPS)


def measured_cpu_bandwidth_gbps(threads: int) -> float:
    """This host's memory bandwidth in GB/s (bytes read + written by a 256 MB copy) on
    `threads` threads; cached like the peak."""

    def copy_gbps() -> float:
        import torch

        src = torch.randn(2**25)
        dst = torch.empty_like(src)
        return 2 * src.numel() * src.element_size() / _best_time(lambda: dst.copy_(src)) / 1e9

    return _measured(
        f"{cpu_model()}|torch {torch_version()}|copy bandwidth|{threads} threads", threads, copy_gbps, PLAUSIBLE_GBPS
    )


@functools.cache
def torch_version() -> str:
    """torch.__version__, read from torch's installed metadata: a cache key must not cost
    torch's import (1.5 s of every `plan`)."""
    return importlib.metadata.version("torch")


def cache_dir() -> Path:
    """Where this machine's measurements are cached (the CPU's peak, kernels.json)."""
    return xdg_dir("XDG_CACHE_HOME", ".cache") / "orchestrator"


# What this process has read or measured: a plan of a CPU trial asks for a peak (and the
# k x n layout's one-thread peak) at every point of a sweep, and need not read the file each time.
_IN_PROCESS: dict[str, float] = {}


def _measured(key: str, threads: int, measure, plausible: tuple[float, float]) -> float:
    if key not in _IN_PROCESS:
        _IN_PROCESS[key] = _measured_once(key, threads, measure, plausible)
    return _IN_PROCESS[key]


def _measured_once(key: str, threads: int, measure, plausible: tuple[float, float]) -> float:
    """The cached figure under `key` where it is a number within `plausible` (what any device
    of this kind can reach), else measured now on `threads` threads (measured_file.py's rules)."""

    def usable(value) -> bool:
        return (number := real_number(value)) is not None and plausible[0] <= number <= plausible[1]

    def measured() -> float:
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return measure()
        finally:
            torch.set_num_threads(before)

    return float(cached_or_measured(cache_dir() / "cpu_peak.json", key, usable, measured))


def _best_time(op, reps: int = 5) -> float:
    """Seconds per call of op, the best of five rounds after a warm-up (thread pool, caches)."""
    for _ in range(3):
        op()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            op()
        best = min(best, (time.perf_counter() - start) / reps)
    return best


@functools.cache  # one process, one CPU; a sweep's plans each ask
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
