"""Warnings a plan attaches: shape advice and memory headroom.

Shape advice follows Bekman (Machine Learning Engineering Open Book) and NVIDIA's Matrix
Multiplication Background guide.

Each rule is a small function of the spec and the plan that returns a sentence or None,
so a rule can be read, tested and removed on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, replace
from typing import TYPE_CHECKING

from orchestrator.config import GIB
from orchestrator.plan.memory import max_micro_batch, model_states, phases, sample_bytes, zero_layout

if TYPE_CHECKING:
    from orchestrator.plan.prediction import Plan
    from orchestrator.spec import TrialSpec

Rule = Callable[["TrialSpec", "Plan"], str | None]


def vocab_multiple_of_64(spec: TrialSpec, plan: Plan) -> str | None:
    v = spec.cfg.model.vocab
    if v % 64:
        padded = -(-v // 64) * 64
        return (
            f"model.vocab={v} is not a multiple of 64: pad it to {padded} for tensor-core friendly "
            "embedding and lm_head matmuls"
        )
    return None


def head_size_power_of_two(spec: TrialSpec, plan: Plan) -> str | None:
    m = spec.cfg.model
    head = m.head_dim
    if head % 64:
        return (
            f"head size hidden/heads = {m.hidden}/{m.heads} = {head} is not a multiple of 64: "
            "attention kernels and matmuls run slower off power-of-two multiples"
        )
    return None


def swiglu_shape(spec: TrialSpec, plan: Plan) -> str | None:
    m = spec.cfg.model
    if m.arch == "llama" and m.ffn_hidden is not None and m.ffn_hidden % 256:
        return (
            f"model.ffn_hidden={m.ffn_hidden} is not a multiple of 256: search the fastest SwiGLU size near "
            f"8/3 x hidden = {8 * m.hidden // 3} (Llama 3 8B uses 14336 = 56 x 256)"
        )
    return None


def micro_batch_not_maxed(spec: TrialSpec, plan: Plan) -> str | None:
    if plan.fits and plan.max_micro_batch >= 2 * spec.micro_batch_size:
        return (
            f"batch.micro_batch_size={spec.micro_batch_size} leaves memory unused: up to "
            f"{plan.max_micro_batch} fits by this plan, and larger micro batches run matmuls closer to peak"
        )
    return None


def what_would_fit(spec: TrialSpec, plan: Plan) -> str | None:
    return None if plan.fits else f"does not fit; {plan.fitting_changes}"


def fitting_changes(spec: TrialSpec, plan: Plan) -> str:
    """The nearest changes that make the trial fit, by this plan: first the micro batch,
    then more recompute, then a higher ZeRO stage with full recompute."""
    mem = plan.memory
    m, precision, mode = spec.cfg.model, spec.precision, spec.cfg.recompute.mode
    options = [f"batch.micro_batch_size={plan.max_micro_batch}"] if plan.max_micro_batch else []
    modes = ("none", "selective", "full")  # least recompute first
    for other in modes[modes.index(mode) + 1 :]:
        k = max_micro_batch(asdict(mem), mem.runtime, mem.capacity, sample_bytes(m, other, precision))
        if k:
            options.append(f"recompute={other} batch.micro_batch_size={min(k, spec.micro_batch_size)}")
    for stage in range(spec.cfg.zero.stage + 1, 4):
        if options:
            break
        states = model_states(m, replace(zero_layout(spec), stage=stage))
        k = max_micro_batch(states, mem.runtime, mem.capacity, sample_bytes(m, "full", precision))
        if k:
            options.append(f"zero=stage{stage} recompute=full batch.micro_batch_size={min(k, spec.micro_batch_size)}")
    if not options:
        z3 = model_states(m, replace(zero_layout(spec), stage=3))
        floor = mem.runtime + max(phases(z3, 0, 0, 0).values())
        ranks = (
            "fewer ranks (parallel.dp: here every rank shares this host's memory, so each has less as there are more)"
            if not spec.cfg.hardware.device.is_gpu and spec.nodes == 1
            else "more ranks (parallel.dp)"
        )
        return (
            f"not even ZeRO-3 with full recompute and micro batch 1 would: there a rank needs "
            f"{floor / GIB:.1f} of {mem.capacity / GIB:.1f} GiB before any activation; {ranks} "
            "or offload (zero.offload_optimizer=cpu, zero.offload_param=cpu) would be needed"
        )
    return "by this plan these would fit: " + "; ".join(options)


def little_headroom(spec: TrialSpec, plan: Plan) -> str | None:
    mem = plan.memory
    if mem.fits and mem.total > 0.9 * mem.capacity:
        return (
            f"the plan uses {mem.total / mem.capacity:.0%} of device memory: fragmentation can push it over; "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps"
        )
    return None


RULES: tuple[Rule, ...] = (
    what_would_fit,
    vocab_multiple_of_64,
    head_size_power_of_two,
    swiglu_shape,
    micro_batch_not_maxed,
    little_headroom,
)


def warnings(spec: TrialSpec, plan: Plan) -> list[str]:
    return [w for rule in RULES if (w := rule(spec, plan))]
