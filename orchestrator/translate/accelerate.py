"""The Accelerate config of a trial: the YAML `accelerate config` writes and
`accelerate launch --config_file` reads (loaded back by accelerate's own loader in a test).

backend=deepspeed points at the DeepSpeed JSON of translate/deepspeed.py. backend=fsdp
uses FSDP2 (fully_shard): zero.stage 3 shards everything and reshards after forward,
stage 2 keeps parameters unsharded between forward and backward (FSDP1's
SHARD_GRAD_OP: gradients and optimizer sharded), stage 0 shards nothing, which FSDP2
has no mode for, so it is plain DDP (what FSDP1's NO_SHARD amounted to).
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.plan.params import element_bytes
from orchestrator.spec import TrialSpec

LAYER_CLASS = {"gpt2": "GPT2Block", "llama": "LlamaDecoderLayer"}
MIXED_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}


def ddp_bucket_mb(spec: TrialSpec) -> float:
    """DDP's bucket_cap_mb: zero.reduce_bucket_size elements of the gradients' dtype (the plan's buckets)."""
    return spec.cfg.zero.reduce_bucket_size * element_bytes(spec.precision) / 2**20


def accelerate_config(spec: TrialSpec, ds_config_path: Path) -> dict:
    cfg = spec.cfg
    cpu = not cfg.hardware.device.is_gpu
    common = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "mixed_precision": MIXED_PRECISION[spec.precision],
        "num_processes": spec.world_size,
        "num_machines": spec.nodes,
        # On several nodes each node's SLURM task passes its own machine rank and the first
        # node's address and port on accelerate launch's command line (launchers/slurm.py).
        "machine_rank": 0,
        "main_process_ip": "127.0.0.1" if spec.nodes == 1 else None,
        "main_process_port": None,  # a free port, chosen at launch
        "rdzv_backend": "static",
        "same_network": True,
        "main_training_function": "main",
        "enable_cpu_affinity": cfg.numa.mode != "none" and not cpu,
        "downcast_bf16": "no",
        # use_cpu would make accelerate launch take its single-process / MPI path and drop
        # DeepSpeed and FSDP; torchrun's path runs them over gloo on a CPU as well.
        "use_cpu": False,
    }
    if cfg.engine.backend == "deepspeed":
        # Precision, batch sizes and ZeRO live in the JSON: accelerate refuses a
        # mixed_precision beside a deepspeed_config_file.
        # zero3_init_flag: ZeRO-3 partitions the model while transformers builds it.
        del common["mixed_precision"]
        # deepspeed_multinode_launcher=standard: torchrun on each node, which the node's SLURM task
        # starts (accelerate's default, pdsh, would ssh from one node into the others).
        return {
            **common,
            "distributed_type": "DEEPSPEED",
            "deepspeed_config": {
                "deepspeed_config_file": str(ds_config_path),
                "zero3_init_flag": cfg.zero.stage == 3,
                "deepspeed_multinode_launcher": "standard",
            },
        }
    if cfg.zero.stage == 0:
        # DDP (accelerate's MULTI_CPU launcher wants MPI; MULTI_GPU's torchrun path runs on gloo).
        return {**common, "distributed_type": "MULTI_GPU"}
    return {
        **common,
        "distributed_type": "FSDP",
        "fsdp_config": {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": cfg.zero.stage == 3,
            "fsdp_offload_params": cfg.zero.offload_param != "none" or cfg.zero.offload_optimizer != "none",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": LAYER_CLASS[cfg.model.arch],
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": False,
            # Off whatever recompute.mode says: the workload applies it itself (apply_recompute, the
            # same for every engine), and accelerate's own on top would checkpoint each block twice.
            "fsdp_activation_checkpointing": False,
        },
    }


def explain(spec: TrialSpec) -> list[str]:
    cfg = spec.cfg
    lines = [
        f"distributed_type: engine.backend={cfg.engine.backend}, zero.stage={cfg.zero.stage}",
        f"mixed_precision = {MIXED_PRECISION[spec.precision]}: run.bf16 / run.fp16"
        + (
            " (in ds_config.json, which accelerate requires for DeepSpeed)" if cfg.engine.backend == "deepspeed" else ""
        ),
        f"num_processes = {spec.world_size} (parallel.dp), num_machines = {spec.nodes} "
        f"(ceil(dp / cluster.gpus_per_node) on SLURM)"
        + (
            "; on SLURM one task a node runs accelerate launch with its --machine_rank (SLURM's node index) and "
            "the first node's --main_process_ip / --main_process_port, so the file's 0 and null stand for those"
            if cfg.cluster.name == "slurm"
            else ""
        ),
        "use_cpu = false: accelerate launch drops DeepSpeed and FSDP with it; torchrun's path runs on CPUs too",
        f"enable_cpu_affinity: numa.mode={cfg.numa.mode} (binds only where there are GPUs)",
    ]
    if cfg.engine.backend == "deepspeed":
        lines.append("deepspeed_config_file: the ds_config.json beside this file")
    elif cfg.zero.stage == 0:
        lines.append(
            f"DDP bucket_cap_mb = {ddp_bucket_mb(spec):.4g}: zero.reduce_bucket_size={cfg.zero.reduce_bucket_size:,} "
            "elements (passed to DistributedDataParallel by the workload; the config file has no such key)"
        )
    elif cfg.zero.stage:
        lines += [
            f"fsdp_reshard_after_forward = {str(cfg.zero.stage == 3).lower()}: zero.stage 3 reshards, 2 keeps "
            "parameters gathered until backward",
            f"fsdp_activation_checkpointing = false: recompute.mode={cfg.recompute.mode} is applied by the "
            "workload, as for every engine (accelerate's own would checkpoint each block a second time)",
        ]
        if cfg.zero.communication_dtype:
            lines.append(
                f"gradients reduced in {cfg.zero.communication_dtype} (zero.communication_dtype): the "
                "workload's FullyShardedDataParallelPlugin(mixed_precision_policy=...), the config file "
                "has no such key"
            )
    return lines
