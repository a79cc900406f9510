"""What cannot work on a GPU cluster is said before anything starts, and what a GPU decides is
decided right without one.

No GPU here: where a test needs one it says so and fakes only the GPU's count or runtime;
the checks, DeepSpeed's own device choice and accelerate's plugin are the real code.
"""

import os
from datetime import timedelta

import pytest
import torch

from orchestrator.core.errors import ConfigError, KernelTimingError
from orchestrator.measure.kernel_cache import software
from orchestrator.measure.kernel_clock import kernels_busy_s
from orchestrator.run.trial import check_runnable_here
from orchestrator.spec import build_spec
from orchestrator.workload.placement import cuda_device_index, one_gpu_task
from tests.conftest import run_in_process

GPU_TRIAL = ["hardware=h100-sxm", "logger.mode=disabled"]


def test_a_local_gpu_trial_above_the_visible_gpus_is_refused_with_the_nearest_dp():
    spec = build_spec([*GPU_TRIAL, "parallel.dp=2"])
    with pytest.raises(
        ConfigError,
        match=r"parallel.dp=2 is not allowed: at most 1, the GPUs this host makes visible"
        r".*nearest valid value is parallel.dp=1",
    ):
        check_runnable_here(spec, visible_gpus=1)  # fake: the count a one-GPU host's torch reports
    check_runnable_here(spec, visible_gpus=2)
    with pytest.raises(ConfigError, match="this machine has no GPU"):
        check_runnable_here(spec, visible_gpus=0)


def test_numa_binding_without_its_tools_is_refused_before_launch(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no numactl on it
    spec = build_spec([*GPU_TRIAL, "parallel.dp=2", "numa=socket"])
    with pytest.raises(ConfigError, match="numa.mode=socket.*install numactl"):
        check_runnable_here(spec, visible_gpus=2)
    (tmp_path / "numactl").write_text("#!/bin/sh\n")
    (tmp_path / "numactl").chmod(0o755)
    check_runnable_here(spec, visible_gpus=2)
    accelerate = build_spec([*GPU_TRIAL, "parallel.dp=2", "numa=node", "engine=accelerate"])
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pynvml" else object())
    with pytest.raises(ConfigError, match="numa.mode=node.*nvidia-ml-py"):
        check_runnable_here(accelerate, visible_gpus=2)


def test_dp_past_one_node_of_gpus_is_never_planned_as_one_node():
    with pytest.raises(
        ConfigError,
        match=r"parallel.dp=256 is not allowed: at most cluster.gpus_per_node=8 with "
        r"cluster=local.*cluster=slurm.*parallel.dp=8",
    ):
        build_spec([*GPU_TRIAL, "parallel.dp=256"])
    across = build_spec([*GPU_TRIAL, "parallel.dp=256", "cluster=slurm"])
    assert (across.nodes, across.gpus_per_node) == (32, 8)
    assert build_spec(["hardware=cpu", "parallel.dp=16"]).nodes == 1  # CPU ranks are processes: no such bound


def test_translate_writes_a_refused_trial_but_says_so_and_exits_3(tmp_path):
    proc = run_in_process(
        "translate", "model=llama3-8b", "zero=stage3", "hardware=h100-sxm", "cluster=slurm", "--out", str(tmp_path)
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert (tmp_path / "launch.sh").is_file() and (tmp_path / "ds_config.json").is_file()
    said = " ".join(proc.stderr.split())
    assert "refused by the plan" in said and "does not fit" in said and "recompute=full" in said


def test_a_profiler_that_records_no_gpu_kernel_fails_the_timing_not_the_plan():
    with pytest.raises(KernelTimingError, match="no GPU kernel"):
        kernels_busy_s([])
    assert kernels_busy_s([1.5, 2.5]) == pytest.approx(4e-6)


def test_the_kernel_cache_is_keyed_by_what_changes_a_kernels_time():
    import deepspeed

    cpu, cuda = software("cpu"), software("cuda")
    assert f"deepspeed {deepspeed.__version__}" in cpu and f"torch {torch.__version__}" in cpu
    assert cuda.startswith(cpu) and "driver " in cuda and "CUDA " in cuda and ", host " in cuda


def test_deepspeeds_own_device_choice_is_the_one_gpu_a_task_sees(monkeypatch):
    """DeepSpeed's TorchBackend.init_process_group, as it is, under a fake CUDA accelerator:
    it passes device_id=cuda:LOCAL_RANK, which must be the device the rank itself uses."""
    import importlib

    ds_torch = importlib.import_module("deepspeed.comm.torch")  # `from deepspeed.comm import torch` is torch itself

    task = {"CUDA_VISIBLE_DEVICES": "6", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "RANK": "6", "WORLD_SIZE": "8"}
    task.update(one_gpu_task(task))  # what the SLURM task exports (launchers/slurm_task.task_environment)
    for name, value in task.items():
        monkeypatch.setenv(name, value)

    class FakeCuda:  # the GPU runtime DeepSpeed would ask: the only fake here
        def device_name(self, index=None):
            return "cuda"

        def device(self, index):
            return f"cuda:{index}"

    seen = {}
    monkeypatch.setattr(ds_torch, "get_accelerator", lambda: FakeCuda())
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)

    def init_process_group(backend, device_id=None, **kw):  # the signature DeepSpeed inspects
        seen.update(kw, device_id=device_id)

    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda *a: "nccl")
    backend = ds_torch.TorchBackend.__new__(ds_torch.TorchBackend)
    backend.init_process_group("nccl", timedelta(seconds=60), None, 6, 8)
    assert seen["device_id"] == f"cuda:{cuda_device_index(os.environ, device_count=1)}" == "cuda:0"


def test_accelerates_fsdp2_reduces_in_the_communication_dtype(monkeypatch):
    from orchestrator.workload.engines import fsdp_plugin

    monkeypatch.setenv("FSDP_VERSION", "2")  # as accelerate launch sets it from accelerate_config.yaml
    spec = build_spec(
        [*GPU_TRIAL, "engine=accelerate", "engine.backend=fsdp", "zero=stage3", "zero.communication_dtype=fp32"]
    )
    policy = fsdp_plugin(spec).mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert fsdp_plugin(build_spec([*GPU_TRIAL, "engine=accelerate", "engine.backend=fsdp", "zero=stage3"])) is None


def test_the_collective_timeout_reaches_the_process_group_keywords():
    assert build_spec(["run.collective_timeout_s=30"]).collective_timeout == {"timeout": timedelta(seconds=30)}
    assert build_spec([]).collective_timeout == {}
    with pytest.raises(ConfigError, match="run.collective_timeout_s=0"):
        build_spec(["run.collective_timeout_s=0"])


def test_a_gpu_trials_host_memory_is_planned_per_node_and_refused_past_what_slurm_grants():
    from orchestrator.config import GIB
    from orchestrator.plan.host_memory import host_memory, slurm_size_bytes
    from orchestrator.run.planning import plan_trial
    from orchestrator.run.trial import refusal

    # eight ranks of a 70B model each building it whole in fp32: over 2 TB of one node
    whole = host_memory(70_553_706_496, False, 64, 0, 0, 8, None, "")
    assert whole.per_node / 1e12 > 2.2 and whole.fits  # nothing said what the node grants: unchecked
    assert host_memory(70_553_706_496, True, 64, 0, 0, 8, 10 * GIB, "").per_rank == 4 * 70_553_706_496 // 64
    assert slurm_size_bytes("40G") == 40 * GIB and slurm_size_bytes("512") == 512 * 2**20

    fits_the_gpu = [
        "model=llama3-8b",
        "hardware=h100-sxm",
        "cluster=slurm",
        "parallel.dp=8",
        "recompute=full",
        "batch.micro_batch_size=1",
    ]
    spec = build_spec([*fits_the_gpu, "zero=stage2", "cluster.mem_gb=200"])
    plan = plan_trial(spec)
    assert plan.fits and not plan.host_memory.fits and plan.as_dict()["host_memory"]["per_node"] > 200 * GIB
    assert "the node's host memory: 8 rank(s)" in refusal(spec, plan) and "cluster.mem_gb=200" in refusal(spec, plan)
    partitioned = build_spec([*fits_the_gpu, "zero=stage3", "cluster.mem_gb=200"])  # zero.Init: a share a rank
    assert refusal(partitioned, plan_trial(partitioned)) is None
    per_gpu = build_spec([*fits_the_gpu, "zero=stage2", "cluster.mem_per_gpu=40G"])
    assert plan_trial(per_gpu).host_memory.capacity == 8 * 40 * GIB
    assert (
        plan_trial(build_spec(["hardware=cpu", "hardware.kernels=preset"])).host_memory is None
    )  # a CPU's is `memory`


def test_the_interpreter_the_tasks_run_is_a_field_of_its_own(tmp_path):
    from orchestrator.launchers import slurm

    spec = build_spec(["cluster=slurm", "hardware=cpu", "cluster.python='apptainer exec img.sif python'"])
    assert slurm.task_command(spec, tmp_path)[:4] == ["apptainer", "exec", "img.sif", "python"]
    with pytest.raises(ConfigError, match="cluster.python"):
        build_spec(["cluster=slurm", "hardware=cpu", "cluster.python='python \"unclosed'"])
