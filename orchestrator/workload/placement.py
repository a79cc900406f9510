"""Which GPU a rank uses, from the environment its launcher gave it.

torchrun starts the ranks of a node with all of the node's GPUs visible and LOCAL_RANK
set, so local rank r uses cuda:r. Under SLURM a task may instead see only its own GPU:
`srun --gpus-per-task=1` or `--gpu-bind=single:1` narrow CUDA_VISIBLE_DEVICES to one
entry, and then that one device is cuda:0 whatever the local rank. The engines choose
their device themselves from LOCAL_RANK (DeepSpeed's init_process_group(device_id=cuda:
LOCAL_RANK) and zero.Init's set_device, accelerate's PartialState), so such a task is told
that it is local rank 0 of 1 (`one_gpu_task`): the one GPU it sees is then every engine's
choice. SLURM_LOCALID keeps its place on the node. (submitit's
TorchDistributedEnvironment.export() narrows it to str(LOCAL_RANK) by default, which
names a physical GPU the job may not hold and leaves cuda:LOCAL_RANK out of range; the
SLURM task keeps SLURM's list instead.)
"""

from __future__ import annotations

from collections.abc import Mapping


class DeviceNotVisible(RuntimeError):
    """The rank's GPU is not among the devices its environment makes visible."""


def visible_devices(env: Mapping[str, str]) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list, or None when it is unset (every device visible)."""
    if "CUDA_VISIBLE_DEVICES" not in env:
        return None
    return [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]


def cuda_device_index(env: Mapping[str, str], device_count: int) -> int:
    """The index (as torch numbers the visible devices) of this rank's GPU.

    device_count: what torch.cuda.device_count() says, used when CUDA_VISIBLE_DEVICES is unset.
    """
    local_rank = int(env.get("LOCAL_RANK", "0"))
    visible = visible_devices(env)
    count = len(visible) if visible is not None else device_count
    if count == 1:
        return 0  # this task's own GPU (SLURM bound one to it), or the node's only one
    if 0 <= local_rank < count:
        return local_rank
    shown = ",".join(visible) if visible is not None else f"unset, {device_count} device(s)"
    raise DeviceNotVisible(
        f"local rank {local_rank} needs a GPU of its own, but it sees {count} "
        f"(CUDA_VISIBLE_DEVICES={shown}); ask SLURM for cluster.gpus_per_node GPUs per node, "
        "one per task"
    )


def one_gpu_task(env: Mapping[str, str]) -> dict[str, str]:
    """What changes in the environment of a task that sees one GPU while its node runs
    several tasks (srun --gpus-per-task=1, --gpu-bind=single:1): LOCAL_RANK 0 of 1, so that
    an engine's cuda:LOCAL_RANK is that GPU. Nothing for a task that sees its node's GPUs."""
    visible = visible_devices(env)
    if visible is None or len(visible) != 1 or int(env.get("LOCAL_WORLD_SIZE", "1")) == 1:
        return {}
    return {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
