"""Which GPU each rank picks on a multi-GPU SLURM node.

No GPU is needed, and none is mocked: the choice is environment in, device index out.
The environment is what srun gives the tasks of `--nodes=2 --ntasks-per-node=4
--gpus-per-node=4` on the second node, which holds GPUs 4-7 for this job (SLURM_* and
CUDA_VISIBLE_DEVICES as SLURM sets them), and submitit's real
TorchDistributedEnvironment exports torch.distributed's variables from it, in a process of
its own as in a real task.
"""

import json
import os
import subprocess
import sys

import pytest

from orchestrator.workload.placement import DeviceNotVisible, cuda_device_index, one_gpu_task

ALLOCATED = "4,5,6,7"  # the node's GPUs this job holds, as SLURM lists them to every task


def slurm_task_env(local_id: int, visible: str) -> dict[str, str]:
    """Task `local_id` on the second of two nodes, four tasks per node."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "CUDA_VISIBLE"))}
    env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    return {
        **env,
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu-node[07-08]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NTASKS": "8",
        "SLURM_NTASKS_PER_NODE": "4",
        "SLURM_NODEID": "1",
        "SLURM_PROCID": str(4 + local_id),
        "SLURM_LOCALID": str(local_id),
        "CUDA_VISIBLE_DEVICES": visible,
    }


def exported(env: dict[str, str], narrow: bool = False) -> dict[str, str]:
    """The rank's environment after the SLURM task's export (or submitit's default, narrow=True)."""
    code = (
        "import json, os, submitit\n"
        "from orchestrator.launchers.slurm_task import task_environment\n"
        f"submitit.helpers.TorchDistributedEnvironment().export() if {narrow} else task_environment()\n"
        "print(json.dumps(dict(os.environ)))"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def physical_gpu(env: dict[str, str], device_count: int = 0) -> str:
    index = cuda_device_index(env, device_count)
    return env["CUDA_VISIBLE_DEVICES"].split(",")[index]


def test_every_rank_of_a_node_gets_a_gpu_of_its_own_from_the_allocation():
    envs = [exported(slurm_task_env(local, ALLOCATED)) for local in range(4)]
    assert [e["RANK"] for e in envs] == ["4", "5", "6", "7"] and {e["MASTER_ADDR"] for e in envs} == {"gpu-node07"}
    assert all(e["CUDA_VISIBLE_DEVICES"] == ALLOCATED for e in envs)  # SLURM's list is kept
    assert [physical_gpu(e) for e in envs] == ["4", "5", "6", "7"]


def test_submitits_default_narrowing_would_put_ranks_on_gpus_the_job_does_not_hold():
    # What the SLURM task used to do: export() narrows to str(LOCAL_RANK), a physical
    # index; then cuda:LOCAL_RANK is out of range, or the one device is not the job's.
    narrowed = exported(slurm_task_env(1, ALLOCATED), narrow=True)
    assert narrowed["CUDA_VISIBLE_DEVICES"] == "1" and int(narrowed["LOCAL_RANK"]) >= 1  # cuda:1 of 1 device
    assert physical_gpu(narrowed) not in ALLOCATED.split(",")


def test_a_task_bound_to_one_gpu_is_local_rank_0_of_1_for_every_engine():
    # srun --gpus-per-task=1 / --gpu-bind=single:1: one GPU visible to each of the node's tasks.
    # The engines pick cuda:LOCAL_RANK themselves (DeepSpeed's init_process_group device_id and
    # zero.Init's set_device, accelerate's PartialState): told local rank 0 of 1, that is its GPU.
    env = exported(slurm_task_env(2, "6"))
    assert env["LOCAL_RANK"] == "0" and env["LOCAL_WORLD_SIZE"] == "1" and env["SLURM_LOCALID"] == "2"
    assert env["RANK"] == "6" and env["WORLD_SIZE"] == "8"  # its place in the job is kept
    assert cuda_device_index(env, device_count=1) == 0


def test_a_task_that_sees_its_nodes_gpus_keeps_its_local_rank():
    assert one_gpu_task({"CUDA_VISIBLE_DEVICES": "4,5,6,7", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4"}) == {}
    assert one_gpu_task({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4"}) == {}  # none named: all visible
    assert one_gpu_task({"CUDA_VISIBLE_DEVICES": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}) == {}


def test_torchrun_without_cuda_visible_devices_uses_the_local_rank():
    assert cuda_device_index({"LOCAL_RANK": "5"}, device_count=8) == 5


def test_too_few_visible_gpus_is_said_before_any_gpu_is_touched():
    with pytest.raises(DeviceNotVisible, match="local rank 3 needs a GPU of its own, but it sees 2"):
        cuda_device_index({"LOCAL_RANK": "3", "CUDA_VISIBLE_DEVICES": "0,1"}, device_count=8)
