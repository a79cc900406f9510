"""What this machine is, in one line."""

import importlib.metadata as md
import os
import shutil

import torch

from orchestrator import machine

n = torch.cuda.device_count()
name = torch.cuda.get_device_name(0)
total = torch.cuda.get_device_properties(0).total_memory / 2**30
preset = machine.preset_for_gpu(name)


def v(pkg):
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return "-"


try:
    import pynvml  # noqa: F401

    nvml = "yes"
except ImportError:
    nvml = "no (accelerate --enable_cpu_affinity will raise)"
nccl = torch.cuda.nccl.version()
nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
preset_gib = None
if preset:
    from orchestrator.spec import build_spec

    preset_gib = build_spec([f"hardware={preset}", "parallel.dp=1"]).cfg.hardware.memory_gib
print(
    f"INFO {n} x {name} ({total:.2f} GiB as torch sees it; hardware preset {preset}"
    + (f" plans {preset_gib} GiB" if preset_gib else "")
    + f"); torch {torch.__version__} CUDA {torch.version.cuda} cuDNN {torch.backends.cudnn.version()} "
    f"NCCL {nccl}; deepspeed {v('deepspeed')} transformers {v('transformers')} "
    f"accelerate {v('accelerate')} wandb {v('wandb')} submitit {v('submitit')}; CPUs {len(os.sched_getaffinity(0))}; "
    f"numactl {'yes' if shutil.which('numactl') else 'no (torchrun --numa-binding will raise)'}; pynvml {nvml}; "
    f"g++ {'yes' if shutil.which('g++') else 'no'} nvcc {'yes' if shutil.which('nvcc') else 'no'}"
)
print(f"NGPU={n} PRESET={preset or ''}")
