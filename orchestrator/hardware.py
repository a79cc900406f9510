"""Which accelerator a trial runs on: presets, detection for hardware=auto, peak FLOPS.

MFU never uses a guessed peak: a GPU without a preset has to be described by the user
(hardware.peak_tflops.*), and on a CPU the peak is a measured matmul rate.
"""

from __future__ import annotations

import functools

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


@functools.cache
def local_gpu_name() -> str | None:
    """The name of this machine's first CUDA device, or None without one."""
    import torch  # imported here: composing a config must not pay for torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
