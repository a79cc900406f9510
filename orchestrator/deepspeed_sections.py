"""DeepSpeed's zero_optimization and optimizer sections of a trial: what ds_config.json holds
(translate/deepspeed.py writes them) and what the plan times the engine's own step with
(plan/planner.py, workload/step_timing.py): one definition for both."""

from __future__ import annotations

from orchestrator.config import ADAMW_BETAS, ADAMW_EPS
from orchestrator.spec import TrialSpec


def zero_section(spec: TrialSpec) -> dict:
    """ds_config's zero_optimization: the stage and its knobs as the trial sets them."""
    z = spec.cfg.zero
    zero: dict = {"stage": z.stage}
    if z.stage == 0:
        return zero
    zero.update(
        reduce_bucket_size=z.reduce_bucket_size,
        allgather_bucket_size=z.allgather_bucket_size,
        overlap_comm=z.overlap_comm,
        contiguous_gradients=z.contiguous_gradients,
        reduce_scatter=z.reduce_scatter,
    )
    if z.stage == 3:
        zero.update(
            stage3_prefetch_bucket_size=z.prefetch_bucket_size,
            stage3_max_live_parameters=z.max_live_parameters,
            stage3_param_persistence_threshold=z.param_persistence_threshold,
            sub_group_size=z.sub_group_size,
        )
    if z.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": z.offload_optimizer, "pin_memory": z.pin_memory}
    if z.offload_param != "none":
        zero["offload_param"] = {"device": z.offload_param, "pin_memory": z.pin_memory}
    return zero


def optimizer_section(spec: TrialSpec) -> dict:
    """ds_config's optimizer: AdamW with the trial's settings."""
    run = spec.cfg.run
    params: dict = {"lr": run.lr, "betas": list(ADAMW_BETAS), "eps": ADAMW_EPS, "weight_decay": run.weight_decay}
    if spec.cfg.zero.offload_optimizer == "none":
        # torch.optim.AdamW: runs on CPU and GPU alike and needs no compiled DeepSpeed op.
        # With optimizer offload DeepSpeed insists on its DeepSpeedCPUAdam (the default).
        params["torch_adam"] = True
    return {"type": "AdamW", "params": params}
