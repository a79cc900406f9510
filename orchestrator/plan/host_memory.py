"""Host memory of a GPU trial: what each rank holds in its node's RAM, and the node's sum
against what the node grants.

A GPU rank's host memory is not its device's. Every engine here builds the model on the
host first (workload/model.build_model on "cpu", in fp32, 4 bytes a parameter) and only
then moves it to its GPU, so each rank of ZeRO 0-2, FSDP2 and DDP holds the whole model
there for a while: eight ranks of a 70B model want about 2.2 TB of one node at once.
DeepSpeed's ZeRO-3 builds it partitioned instead (zero.Init: each parameter is split
across the ranks as it is created, Rajbhandari et al. 2021, "ZeRO-Infinity", section 7.2),
a rank's share. Offload (Ren et al. 2021, "ZeRO-Offload") keeps the optimizer's fp32
states, or the parameters, on the host for the whole run: plan/memory's `offloaded`.

Pure arithmetic; the planner says what the node grants (`capacity`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

FP32_BYTES = 4  # the model as built, before the engine casts it


@dataclass(frozen=True)
class HostMemory:
    built: int  # bytes a rank holds while the model is built: the whole model, or its share (ZeRO-3)
    partitioned: bool  # built partitioned (zero.Init): `built` is a share
    offloaded: int  # what offload keeps on the host for the run, per rank
    process: int  # the Python process with torch and the engine imported
    per_rank: int  # the peak: the build or the offloaded states, whichever is larger, and the process
    ranks_per_node: int
    per_node: int
    capacity: int | None  # what a node grants its ranks; None where nothing says (SLURM without --mem)
    capacity_source: str  # where `capacity` comes from, for the plan's text

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.per_node <= self.capacity

    def as_dict(self) -> dict:
        return {**asdict(self), "fits": self.fits}


def host_memory(
    parameters: int,
    built_partitioned: bool,
    dp: int,
    offloaded: int,
    process: int,
    ranks_per_node: int,
    capacity: int | None,
    capacity_source: str,
) -> HostMemory:
    """The host memory of one node of a GPU trial. The build's copy is freed once the engine
    has moved the model to the device, before offload allocates its states, so the peak is
    the larger of the two (and the process beside it)."""
    built = FP32_BYTES * (-(-parameters // dp) if built_partitioned else parameters)
    per_rank = max(built, offloaded) + process
    return HostMemory(
        built=built,
        partitioned=built_partitioned,
        offloaded=offloaded,
        process=process,
        per_rank=per_rank,
        ranks_per_node=ranks_per_node,
        per_node=per_rank * ranks_per_node,
        capacity=capacity,
        capacity_source=capacity_source,
    )


def slurm_size_bytes(size: str) -> int:
    """A SLURM size (--mem-per-gpu=40G): a number of MiB, or with K, M, G or T."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    size = str(size).strip().upper()
    if size and size[-1] in units:
        return int(float(size[:-1]) * units[size[-1]])
    return int(float(size) * 2**20)
