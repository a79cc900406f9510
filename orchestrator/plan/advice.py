"""Warnings a plan attaches: shape advice (003_0448ac9f835ea7a3.txt) and memory headroom.

Each rule is a small function of the spec and the plan that returns a sentence or None,
so a rule can be read, tested and removed on its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:
    from orchestrator.plan.planner import Plan
    from orchestrator.spec import TrialSpec

Rule = Callable[["TrialSpec", "Plan"], Optional[str]]


def vocab_multiple_of_64(spec: TrialSpec, plan: Plan) -> str | None:
    v = spec.cfg.model.vocab
    if v % 64:
        padded = -(-v // 64) * 64
        return (f"model.vocab={v} is not a multiple of 64: pad it to {padded} for tensor-core friendly "
                "embedding and lm_head matmuls")
    return None


def head_size_power_of_two(spec: TrialSpec, plan: Plan) -> str | None:
    m = spec.cfg.model
    head = m.hidden // m.heads
    if head % 64:
        return (f"head size hidden/heads = {m.hidden}/{m.heads} = {head} is not a multiple of 64: "
                "attention kernels and matmuls run slower off power-of-two multiples")
    return None


def swiglu_shape(spec: TrialSpec, plan: Plan) -> str | None:
    m = spec.cfg.model
    if m.arch == "llama" and m.ffn_hidden % 256:
        return (f"model.ffn_hidden={m.ffn_hidden} is not a multiple of 256: search the fastest SwiGLU size near "
                f"8/3 x hidden = {8 * m.hidden // 3} (Llama 3 8B uses 14336 = 56 x 256)")
    return None


def micro_batch_not_maxed(spec: TrialSpec, plan: Plan) -> str | None:
    if plan.fits and plan.max_micro_batch >= 2 * spec.micro_batch_size:
        return (f"batch.micro_batch_size={spec.micro_batch_size} leaves memory unused: up to "
                f"{plan.max_micro_batch} fits by this plan, and larger micro batches run matmuls closer to peak")
    return None


def little_headroom(spec: TrialSpec, plan: Plan) -> str | None:
    mem = plan.memory
    if mem.fits and mem.total > 0.9 * mem.capacity:
        return (f"the plan uses {mem.total / mem.capacity:.0%} of device memory: fragmentation can push it over; "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps")
    return None


def numa_without_gpu(spec: TrialSpec, plan: Plan) -> str | None:
    if spec.cfg.numa.mode != "none" and spec.cfg.hardware.device == "cpu":
        return f"numa.mode={spec.cfg.numa.mode} binds ranks to GPUs' NUMA nodes; with no GPU nothing is bound"
    return None


RULES: tuple[Rule, ...] = (vocab_multiple_of_64, head_size_power_of_two, swiglu_shape, micro_batch_not_maxed,
                           little_headroom, numa_without_gpu)


def warnings(spec: TrialSpec, plan: Plan) -> list[str]:
    return [w for rule in RULES if (w := rule(spec, plan))]
