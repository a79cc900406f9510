"""Every emitted engine config is accepted by the engine's own parser."""

import itertools
import os
import socket

import pytest

from orchestrator.run.trial_files import write_trial_files
from orchestrator.spec import build_spec
from orchestrator.translate.deepspeed import ds_config

OFFLOADS = {
    0: [()],
    1: [(), ("zero.offload_optimizer=cpu",)],
    2: [(), ("zero.offload_optimizer=cpu",)],
    3: [(), ("zero.offload_optimizer=cpu",), ("zero.offload_optimizer=cpu", "zero.offload_param=cpu")],
}
PRECISIONS = {"bf16": ("run.bf16=true",), "fp16": ("run.bf16=false", "run.fp16=true"), "fp32": ("run.bf16=false",)}
GRID = [
    (stage, offload, precision, recompute, bucket)
    for stage in range(4)
    for offload in OFFLOADS[stage]
    for precision in PRECISIONS
    for recompute in ("none", "selective", "full")
    for bucket in ("2e7", "5e8")
]


class DataParallelOf:
    """DeepSpeed reads the data-parallel size from an mpu: it stands in for the ranks of
    other hosts, which cannot run here. torch.distributed itself is real (gloo, 1 rank)."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_data_parallel_group(self):
        return None

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0


@pytest.fixture(scope="module")
def one_rank_process_group():
    """A one-rank gloo group in this process. Its variables are taken back afterwards: the
    worker goes on to other files, whose commands would otherwise start as rank 0 of 1."""
    import deepspeed
    import torch.distributed as dist

    from orchestrator.workload.deepspeed_compat import leave_shm_comm_unbuilt

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DS_ACCELERATOR", os.environ.get("DS_ACCELERATOR", "cpu"))
        for name, value in dict(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
        ).items():
            env.setenv(name, value)
        leave_shm_comm_unbuilt()  # as a CPU rank does
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        yield
        dist.destroy_process_group()


def test_the_grid_is_the_whole_matrix():
    assert len(GRID) == 8 * 3 * 3 * 2


def test_deepspeed_parser_accepts_every_config_of_the_grid(one_rank_process_group):
    from deepspeed.runtime.config import DeepSpeedConfig

    for stage, offload, precision, recompute, bucket in GRID:
        spec = build_spec(
            [
                f"zero=stage{stage}",
                *offload,
                *PRECISIONS[precision],
                f"recompute={recompute}",
                f"zero.reduce_bucket_size={bucket}",
                "hardware=h100-sxm",
                "parallel.dp=8",
                "batch.micro_batch_size=2",
                "batch.global_batch_size=64",
            ]
        )
        config = ds_config(spec)
        parsed = DeepSpeedConfig(config, mpu=DataParallelOf(spec.dp))
        assert parsed.train_batch_size == 64 and parsed.gradient_accumulation_steps == 4
        assert parsed.zero_optimization_stage == stage
        assert parsed.bfloat16_config.enabled == (precision == "bf16")
        assert parsed.float16_config.enabled == (precision == "fp16")
        if stage:
            assert parsed.zero_config.reduce_bucket_size == int(float(bucket))
        assert (parsed.zero_config.offload_optimizer is not None) == ("zero.offload_optimizer=cpu" in offload)
        assert (parsed.zero_config.offload_param is not None) == ("zero.offload_param=cpu" in offload)
        assert parsed.gradient_clipping == 1.0


@pytest.mark.parametrize(
    "backend,stage,precision", list(itertools.product(["deepspeed", "fsdp"], [0, 2, 3], ["bf16", "fp16", "fp32"]))
)
def test_accelerate_loads_every_config_back(tmp_path, backend, stage, precision):
    from accelerate.commands.config.config_args import load_config_from_file

    spec = build_spec(
        [
            "engine=accelerate",
            f"engine.backend={backend}",
            f"zero=stage{stage}",
            *PRECISIONS[precision],
            "hardware=h100-sxm",
            "parallel.dp=4",
            "recompute=full",
        ]
    )
    write_trial_files(spec, tmp_path)
    loaded = load_config_from_file(str(tmp_path / "accelerate_config.yaml"))
    expected_type = "DEEPSPEED" if backend == "deepspeed" else "FSDP" if stage else "MULTI_GPU"
    assert (
        str(loaded.distributed_type.value if hasattr(loaded.distributed_type, "value") else loaded.distributed_type)
        == expected_type
    )
    assert loaded.num_processes == 4 and loaded.num_machines == 1
    if backend == "deepspeed":  # precision is in the JSON: accelerate refuses it in both places
        assert loaded.mixed_precision is None
        assert loaded.deepspeed_config["deepspeed_config_file"] == str(tmp_path / "ds_config.json")
    else:
        assert (
            str(getattr(loaded.mixed_precision, "value", loaded.mixed_precision))
            == {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[precision]
        )
    if backend == "fsdp" and stage:
        assert loaded.fsdp_config["fsdp_version"] == 2
        assert loaded.fsdp_config["fsdp_reshard_after_forward"] == (stage == 3)
        # recompute=full, yet accelerate's own checkpointing is off: the workload checkpoints each block once
        assert loaded.fsdp_config["fsdp_activation_checkpointing"] is False


def test_accelerate_deepspeed_plugin_reads_the_json(tmp_path):
    from accelerate.utils import DeepSpeedPlugin

    spec = build_spec(["engine=accelerate", "zero=stage3", "hardware=h100-sxm", "parallel.dp=4"])
    write_trial_files(spec, tmp_path)
    plugin = DeepSpeedPlugin(hf_ds_config=str(tmp_path / "ds_config.json"))
    assert plugin.zero_stage == 3 and plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == 4
