"""NUMA binding: one numa.mode, said the way each launcher understands it.

- torchrun: --numa-binding=MODE (node, socket, exclusive, core-complex: torch's names).
- accelerate launch: --enable_cpu_affinity, which binds each process to its GPU's NUMA
  node (other modes fall back to that; translate warns).
- SLURM (Bekman, Machine Learning Engineering Open Book, "NUMA affinity"): srun --cpu-bind and the sbatch options
  --gres-flags=enforce-binding (GPUs allocated next to the task's cores) and, for
  socket, --ntasks-per-socket = GPUs per node / sockets.
Binding follows the GPU, so without GPUs there is nothing to bind to: the result is a
warning and no flags, never a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.config import DeviceType
from orchestrator.spec import TrialSpec

SRUN_CPU_BIND = {"node": "ldoms", "socket": "sockets", "exclusive": "cores", "core-complex": "cores"}


@dataclass(frozen=True)
class Binding:
    torchrun_args: list[str] = field(default_factory=list)
    accelerate_args: list[str] = field(default_factory=list)
    srun_args: list[str] = field(default_factory=list)
    sbatch_options: dict[str, str] = field(default_factory=dict)  # name -> value, as submitit takes them
    warnings: list[str] = field(default_factory=list)


def binding(mode: str, device: str, ranks_per_node: int, sockets_per_node: int = 2) -> Binding:
    if mode == "none":
        return Binding()
    if not DeviceType(device).is_gpu:
        return Binding(
            warnings=[
                f"numa.mode={mode}: there is no GPU to bind ranks near (hardware.device={device}); nothing is bound"
            ]
        )
    sbatch = {"gres-flags": "enforce-binding"}
    if mode == "socket":
        sbatch["ntasks-per-socket"] = str(max(1, ranks_per_node // sockets_per_node))
    return Binding(
        torchrun_args=[f"--numa-binding={mode}"],
        accelerate_args=["--enable_cpu_affinity"],
        srun_args=[f"--cpu-bind={SRUN_CPU_BIND[mode]}"],
        sbatch_options=sbatch,
    )


def trial_binding(spec: TrialSpec) -> Binding:
    """The binding of one trial, from its numa, hardware and cluster groups."""
    return binding(spec.cfg.numa.mode, spec.cfg.hardware.device, spec.gpus_per_node, spec.cfg.cluster.sockets_per_node)
