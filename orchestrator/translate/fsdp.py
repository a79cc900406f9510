"""engine=fsdp: what torch's fully_shard is given for a trial, and how EXPLAIN.md says it.

The engine (workload/fsdp.py) applies these; accelerate's FSDP2 config
(translate/accelerate.py) describes the same sharding for the accelerate route.
"""

from __future__ import annotations

from orchestrator.plan.dp_layout import MESH_DIMS
from orchestrator.spec import TrialSpec


def fsdp_settings(spec: TrialSpec) -> dict:
    """fully_shard's settings for this trial (also recorded in metrics.engine)."""
    z = spec.cfg.zero
    layout = spec.layout
    return {
        "mesh": dict(zip(MESH_DIMS, layout.mesh_shape)) if layout.hybrid else {"shard": layout.dp},
        "reshard_after_forward": z.stage == 3,
        "param_dtype": spec.precision,
        "reduce_dtype": str(z.communication_dtype or spec.precision),
        "cpu_offload": z.offload_param != "none",
    }


def explain(spec: TrialSpec) -> list[str]:
    s = fsdp_settings(spec)
    return [
        "fully_shard on each transformer block, then on the root (torchtitan's order), on a "
        + (
            f"2D device mesh (replicate {s['mesh']['replicate']} x shard {s['mesh']['shard']}, parallel.replicate): "
            "HSDP, each parameter sharded within a group of ranks and its gradient shards all-reduced across groups"
            if spec.layout.hybrid
            else f"{spec.world_size}-rank device mesh"
        ),
        f"reshard_after_forward={s['reshard_after_forward']} on the blocks: zero.stage={spec.cfg.zero.stage} "
        + (
            "(parameters gathered again for the backward, ZeRO-3's pattern)"
            if s["reshard_after_forward"]
            else "(parameters kept from the forward to the backward, ZeRO-2's memory for them)"
        )
        + "; False on the root, whose backward needs its parameters first",
        f"MixedPrecisionPolicy(param_dtype={s['param_dtype']}, reduce_dtype={s['reduce_dtype']}): "
        "run.bf16 / zero.communication_dtype; shards and Adam's states stay fp32",
        "CPUOffloadPolicy (zero.offload_param=cpu): parameters, gradients and the optimizer step on the host"
        if s["cpu_offload"]
        else "no offload",
        f"gradient accumulation over {spec.grad_accum_steps} micro batch(es): the reduce-scatter runs on the last "
        "(set_requires_gradient_sync)",
        "checkpoints: torch.distributed.checkpoint, each rank its own shards",
    ]
