"""The DeepSpeed config of a trial: the JSON `deepspeed.initialize(config=...)` reads.

Every key follows from one field of the TrialSpec; `explain()` says which, so a user
can lift the JSON into their own training script. DeepSpeed's own parser
(deepspeed.runtime.config.DeepSpeedConfig) accepts every combination (tested).
"""

from __future__ import annotations

from orchestrator.config import ADAMW_BETAS, ADAMW_EPS
from orchestrator.deepspeed_sections import optimizer_section, zero_section
from orchestrator.plan.batch import grad_accum_steps
from orchestrator.spec import TrialSpec

STEPS_PER_PRINT = 10**9  # the orchestrator reports progress itself; keep DeepSpeed quiet


def ds_config(spec: TrialSpec) -> dict:
    cfg = spec.cfg
    first_batch = spec.schedule[0][1]  # a warm-up starts small; the workload grows it step by step
    config: dict = {
        "train_batch_size": first_batch,
        "train_micro_batch_size_per_gpu": spec.micro_batch_size,
        "gradient_accumulation_steps": grad_accum_steps(first_batch, spec.micro_batch_size, spec.dp),
        "gradient_clipping": cfg.run.grad_clip,
        "bf16": {"enabled": spec.precision == "bf16"},
        "fp16": _fp16(spec.precision == "fp16"),
        "zero_optimization": zero_section(spec),
        "optimizer": optimizer_section(spec),
        "steps_per_print": STEPS_PER_PRINT,
        "wall_clock_breakdown": cfg.run.profile,
    }
    z = cfg.zero
    if z.communication_dtype:  # the dtype gradients are reduced in (the plan's wire bytes)
        config["communication_data_type"] = str(z.communication_dtype)
    if z.grad_accum_dtype:
        config["data_types"] = {"grad_accum_dtype": str(z.grad_accum_dtype)}
    if cfg.recompute.mode != "none":
        # Recompute itself is applied to the transformers model by the workload (torch
        # checkpointing); this section only configures DeepSpeed's checkpointing helper
        # for scripts that call deepspeed.checkpointing.checkpoint.
        config["activation_checkpointing"] = {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
    return config


def _fp16(enabled: bool) -> dict:
    if not enabled:
        return {"enabled": False}
    # Dynamic loss scaling (loss_scale 0): start at 2^16, halve on overflow, double
    # after 1000 clean steps: DeepSpeed's defaults, written out so they can be read.
    return {
        "enabled": True,
        "loss_scale": 0,
        "initial_scale_power": 16,
        "loss_scale_window": 1000,
        "hysteresis": 2,
        "min_loss_scale": 1,
    }


def explain(spec: TrialSpec) -> list[str]:
    """One line per DeepSpeed key: its value and the trial field it comes from."""
    z = spec.cfg.zero
    lines = [
        f"train_batch_size = {spec.schedule[0][1]}: the global batch in sequences"
        + (
            " at the start of the warm-up (batch.warmup.start); the workload raises it with "
            f"engine.set_train_batch_size along {spec.schedule}"
            if len(spec.schedule) > 1
            else " (batch.global_batch_size, null = micro x dp)"
        ),
        f"train_micro_batch_size_per_gpu = {spec.micro_batch_size}: batch.micro_batch_size",
        f"gradient_accumulation_steps = {grad_accum_steps(spec.schedule[0][1], spec.micro_batch_size, spec.dp)}: "
        f"train_batch_size / (micro {spec.micro_batch_size} x dp {spec.dp})",
        f"gradient_clipping = {spec.cfg.run.grad_clip}: run.grad_clip",
        f"bf16.enabled / fp16.enabled: run.bf16={str(spec.cfg.run.bf16).lower()}, "
        f"run.fp16={str(spec.cfg.run.fp16).lower()}"
        + ("; fp16 uses dynamic loss scaling" if spec.precision == "fp16" else ""),
        f"zero_optimization.stage = {z.stage}: zero.stage (preset zero={spec.choices.get('zero')})",
    ]
    if z.stage > 0:
        lines += [
            f"zero_optimization.reduce_bucket_size = {z.reduce_bucket_size:,} elements: zero.reduce_bucket_size",
            f"zero_optimization.allgather_bucket_size = {z.allgather_bucket_size:,}: zero.allgather_bucket_size",
            "zero_optimization.overlap_comm / contiguous_gradients / reduce_scatter: zero.* of the same names",
        ]
    if z.stage == 3:
        lines += [
            f"stage3_prefetch_bucket_size = {z.prefetch_bucket_size:,}: zero.prefetch_bucket_size",
            f"stage3_max_live_parameters = {z.max_live_parameters:,}: zero.max_live_parameters",
            f"stage3_param_persistence_threshold = {z.param_persistence_threshold:,}: zero.param_persistence_threshold",
            f"sub_group_size = {z.sub_group_size:,}: zero.sub_group_size (the optimizer steps its partition "
            "this many elements at a time)",
        ]
    if z.communication_dtype:
        lines.append(
            f"communication_data_type = {z.communication_dtype}: zero.communication_dtype (gradients are "
            "reduced in it; the plan puts these bytes on the wire)"
        )
    if z.grad_accum_dtype:
        lines.append(
            f"data_types.grad_accum_dtype = {z.grad_accum_dtype}: zero.grad_accum_dtype (and, without a "
            "communication_data_type, the dtype gradients are reduced in)"
        )
    if z.offload_optimizer != "none" or z.offload_param != "none":
        lines.append(
            f"offload_optimizer / offload_param: zero.offload_optimizer={z.offload_optimizer}, "
            f"zero.offload_param={z.offload_param}, pin_memory=zero.pin_memory"
        )
    lines.append(
        f"optimizer = AdamW(lr={spec.cfg.run.lr}, betas={list(ADAMW_BETAS)}, eps={ADAMW_EPS}, "
        f"weight_decay={spec.cfg.run.weight_decay}): run.lr, run.weight_decay"
        + ("; torch_adam: torch.optim.AdamW" if z.offload_optimizer == "none" else "; DeepSpeedCPUAdam for offload")
    )
    if spec.cfg.recompute.mode != "none":
        lines.append(
            f"activation_checkpointing: recompute.mode={spec.cfg.recompute.mode} (applied to the model by the workload)"
        )
    lines.append(f"wall_clock_breakdown = {str(spec.cfg.run.profile).lower()}: run.profile")
    return lines
