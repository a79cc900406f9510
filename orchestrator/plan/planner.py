"""The plan of a trial: the memory, FLOPs, communication and time models put together.

`make_plan(spec)` is pure arithmetic on the TrialSpec (plus, on a CPU, one cached
matmul measurement for the peak) and returns a Plan whose `as_dict()` has the keys of
DESIGN.md's `plan --json`. Every figure in it is a prediction; `assumptions` lists what
it rests on (compute efficiency, peak, links) so the output can say so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from orchestrator import hardware
from orchestrator.plan import advice
from orchestrator.plan.comm import bytes_per_rank_per_step, links_for, step_time
from orchestrator.plan.flops import Flops, flops
from orchestrator.plan.memory import (GIB, Memory, ZeroLayout, activation_bytes, max_micro_batch, model_states,
                                     optimizer_traffic_bytes, peak_memory, recompute_bytes, runtime_bytes,
                                     sample_bytes)
from orchestrator.plan.params import count_parameters, parameter_tensors
from orchestrator.spec import TrialSpec


@dataclass(frozen=True)
class Plan:
    parameters: int
    parallel: dict
    batch: dict
    memory: Memory
    flops: Flops
    comm: dict
    time: dict
    max_micro_batch: int  # the largest micro batch that fits, by this plan
    warnings: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def as_dict(self) -> dict:
        return {"parameters": self.parameters, "parallel": self.parallel, "batch": self.batch,
                "memory": self.memory.as_dict(), "flops": self.flops.as_dict(), "comm": self.comm,
                "time": self.time, "max_micro_batch": self.max_micro_batch, "warnings": self.warnings,
                "assumptions": self.assumptions}


def make_plan(spec: TrialSpec) -> Plan:
    cfg, hw = spec.cfg, spec.cfg.hardware
    n = count_parameters(cfg.model)
    layout = zero_layout(spec)
    states = model_states(cfg.model, layout)
    runtime = runtime_bytes(hw.device, spec.world_size)
    capacity = capacity_bytes(spec)
    micro, mode = spec.micro_batch_size, cfg.recompute.mode
    memory = peak_memory(states, activation_bytes(cfg.model, micro, mode, spec.precision),
                         recompute_bytes(cfg.model, micro, mode, spec.precision), runtime, capacity)

    f = flops(cfg.model, cfg.recompute.mode, spec.tokens_per_step)
    peak_tflops, peak_note = hardware.peak_tflops(hw, spec.precision, hardware.threads_per_rank(spec.gpus_per_node))
    rate = peak_tflops * 1e12 * hw.compute_efficiency  # FLOP/s one rank is assumed to sustain
    tokens_micro = spec.micro_batch_size * cfg.model.seq_len
    fwd_s = f.forward_per_token * tokens_micro / rate
    bwd_s = (f.hardware_per_token - f.forward_per_token) * tokens_micro / rate
    low = 4 if spec.precision == "fp32" else 2
    links = links_for(spec.world_size, spec.nodes, hw.intra_node.bandwidth_gbps, hw.intra_node.latency_us,
                      hw.inter_node.bandwidth_gbps, hw.inter_node.latency_us,
                      backend="nccl" if hw.device == "cuda" else "gloo", call_us=hw.collective_overhead_us)
    z = cfg.zero
    tensors = [p.numel for p in parameter_tensors(cfg.model)]
    t = step_time(stage=z.stage, tensors=tensors, param_bytes=low, grad_bytes=low, reduce_bucket=z.reduce_bucket_size,
                  allgather_bucket=z.allgather_bucket_size, prefetch_bucket=z.prefetch_bucket_size,
                  overlap_comm=z.overlap_comm, grad_accum=spec.grad_accum_steps, fwd_s=fwd_s, bwd_s=bwd_s, links=links)
    # The optimizer step is memory-bound: the bytes it moves at the device's bandwidth.
    bandwidth, bandwidth_note = memory_bandwidth(spec)
    updated = 0 if layout.offload_optimizer and z.stage else n if z.stage == 0 else -(-n // spec.dp)
    optimizer_s = optimizer_traffic_bytes(updated, spec.precision) / (bandwidth * 1e9) if bandwidth else 0.0
    step_s = t.step_s + optimizer_s
    model_flops_step = f.model_per_token * spec.tokens_per_step
    denominator = step_s * spec.world_size * peak_tflops * 1e12
    max_micro = max_micro_batch(states, runtime, capacity, sample_bytes(cfg.model, mode, spec.precision))

    plan = Plan(
        parameters=n,
        parallel={"world_size": spec.world_size, "dp": spec.dp, "nodes": spec.nodes, "gpus_per_node": spec.gpus_per_node},
        batch={"micro_batch_size": spec.micro_batch_size, "grad_accum_steps": spec.grad_accum_steps,
               "global_batch_size": spec.global_batch_size, "tokens_per_step": spec.tokens_per_step,
               "schedule": [list(s) for s in spec.schedule]},
        memory=memory, flops=f,
        comm={"bytes_per_rank_per_step": bytes_per_rank_per_step(t.collectives),
              "collectives": [c.as_dict() for c in t.collectives], "time_s": t.comm_s, "exposed_s": t.exposed_s},
        time={"compute_s": t.compute_s, "comm_s": t.comm_s, "exposed_comm_s": t.exposed_s, "optimizer_s": optimizer_s,
              "step_s": step_s, "tokens_per_sec_per_gpu": spec.tokens_per_step / step_s / spec.world_size,
              "mfu": model_flops_step / denominator, "hfu": f.per_step / denominator,
              "peak_tflops": peak_tflops},
        max_micro_batch=max_micro,
        assumptions=[
            f"peak {peak_tflops:.4g} TFLOPS per rank ({peak_note})",
            f"compute runs at {hw.compute_efficiency:.0%} of that peak (hardware.compute_efficiency)",
            f"links: {hw.intra_node.bandwidth_gbps:g} GB/s, {hw.intra_node.latency_us:g} us intra-node; "
            f"{hw.inter_node.bandwidth_gbps:g} GB/s, {hw.inter_node.latency_us:g} us inter-node; ring collectives, "
            f"{hw.collective_overhead_us:g} us fixed cost each (hardware.collective_overhead_us)",
            f"optimizer step: {optimizer_traffic_bytes(1, spec.precision)} bytes moved per parameter updated on the "
            f"device, at {bandwidth_note}",
            "data loading takes no time; times are for the global batch after any warm-up",
        ],
    )
    plan.warnings.extend(advice.warnings(spec, plan))
    return plan


def zero_layout(spec: TrialSpec) -> ZeroLayout:
    z = spec.cfg.zero
    return ZeroLayout(stage=z.stage, dp=spec.dp, precision=spec.precision, reduce_bucket_size=z.reduce_bucket_size,
                      overlap_comm=z.overlap_comm, contiguous_gradients=z.contiguous_gradients,
                      prefetch_bucket_size=z.prefetch_bucket_size, max_live_parameters=z.max_live_parameters,
                      param_persistence_threshold=z.param_persistence_threshold,
                      offload_optimizer=z.offload_optimizer != "none", offload_param=z.offload_param != "none")


def capacity_bytes(spec: TrialSpec) -> int:
    """Device memory per rank; on CPU the host's RAM shared by the ranks on this node."""
    hw = spec.cfg.hardware
    if hw.memory_gib is not None:
        total = int(hw.memory_gib * GIB)
        return total if hw.device == "cuda" else total // spec.gpus_per_node
    return hardware.host_memory_bytes() // spec.gpus_per_node


def memory_bandwidth(spec: TrialSpec) -> tuple[float | None, str]:
    """(GB/s per rank, where the figure comes from); None where nothing gives it."""
    hw = spec.cfg.hardware
    if hw.memory_bandwidth_gbps:
        return float(hw.memory_bandwidth_gbps), f"{hw.memory_bandwidth_gbps:g} GB/s ({hw.name}, published)"
    if hw.device == "cpu":  # the ranks on a node share its memory bandwidth
        node = hardware.measured_cpu_bandwidth_gbps(os.cpu_count() or 1)
        return node / spec.gpus_per_node, f"{node:.3g} GB/s measured on this host, shared by {spec.gpus_per_node} rank(s)"
    return None, "no memory bandwidth given (hardware.memory_bandwidth_gbps), so not counted"
