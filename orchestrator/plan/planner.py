"""The plan of a trial: the memory, FLOPs, communication and time models put together.

`make_plan(spec, facts, measured)` is a pure function: of the TrialSpec, the facts of the
machine it is planned for (plan/inputs.MachineFacts: the peak, the memory bandwidth, the
host's memory, the network table) and what was timed for it (plan/inputs.Measurements:
kernels, the engine's lines, this host's links), gathered before it by
trial_measurements.py; planning.plan_trial decides when to measure. It returns a Plan
whose `as_dict()` has the keys of docs/architecture.md's `plan --json`. Every figure in
it is a prediction; `assumptions` lists what it rests on (compute efficiency, peak, links)
so the output can say so.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from orchestrator.config import GIB, Sharding, runs_as
from orchestrator.core.errors import ConfigError
from orchestrator.plan import advice
from orchestrator.plan.activations import activation_bytes, loss_backward_bytes, recompute_bytes
from orchestrator.plan.assumptions import assumptions, compute_assumption, network_note
from orchestrator.plan.collectives import Network, network, small_call_note
from orchestrator.plan.comm import StepTime, bytes_per_rank_per_step, schedule_of, step_time, wire_dtype
from orchestrator.plan.compute import ComputeTime, estimated_kernels, micro_batch_time
from orchestrator.plan.flops import Flops, flops
from orchestrator.plan.fsdp import FsdpLayout, fsdp_states, fsdp_step_time, group_networks, layout_of
from orchestrator.plan.host_memory import HostMemory, host_memory, slurm_size_bytes
from orchestrator.plan.inputs import LocalLinks, MachineFacts, MeasuredKernels, Measurements
from orchestrator.plan.memory import (
    CPU_PROCESS,
    Memory,
    max_micro_batch,
    model_states,
    offloaded_step_s,
    optimizer_traffic_bytes,
    peak_memory,
    runtime_bytes,
    sample_bytes,
    zero_layout,
)
from orchestrator.plan.params import count_parameters, element_bytes, parameter_tensors
from orchestrator.plan.prediction import Comm, Plan, Time
from orchestrator.plan.rates import rates

if TYPE_CHECKING:  # the trial, as a type: the plan reads its fields, it builds none
    from orchestrator.spec import TrialSpec


def make_plan(spec: TrialSpec, facts: MachineFacts, measured: Measurements | None = None) -> Plan:
    """The plan of one trial on a machine of these `facts`, from what was `measured` for it
    (None: nothing was; the time from the hardware preset's parameters)."""
    cfg = spec.cfg
    measured = measured or Measurements()
    n = count_parameters(cfg.model)
    memory = memory_of(spec, facts)
    f = flops(cfg.model, cfg.recompute.mode, spec.tokens_per_step)
    net = network_of(spec, facts, measured.links)
    timed, compute_source = measured.kernels, measured.compute_source or compute_assumption(cfg.hardware)
    if not timed and facts.peak_tflops is None:
        raise ConfigError(
            "hardware.peak_tflops." + spec.precision,
            None,
            f"the dense peak of this GPU: its kernels could "
            f"not be timed ({compute_source}), and without them the plan estimates from the peak",
        )
    t, time = step_and_time(spec, facts, timed, net, n, f)
    network = f"network{measured.links_note}: {network_note(cfg.hardware, facts, measured.links)}"
    plan = Plan(
        parameters=n,
        parallel={
            "world_size": spec.world_size,
            "dp": spec.dp,
            "nodes": spec.nodes,
            "gpus_per_node": spec.gpus_per_node,
        },
        batch={
            "micro_batch_size": spec.micro_batch_size,
            "grad_accum_steps": spec.grad_accum_steps,
            "global_batch_size": spec.global_batch_size,
            "tokens_per_step": spec.tokens_per_step,
            "schedule": [list(s) for s in spec.schedule],
        },
        memory=memory,
        flops=f,
        comm=Comm(
            bytes_per_rank_per_step=bytes_per_rank_per_step(t.collectives),
            collectives=t.collectives,
            time_s=t.comm_s,
            exposed_s=t.exposed_s,
        ),
        time=time,
        max_micro_batch=largest_micro_batch(spec, facts),
        assumptions=assumptions(
            spec,
            facts.peak_tflops,
            facts.peak_note,
            facts.bandwidth_note,
            optimizer_offloaded(spec),
            compute_source,
            network + (f"; {small}" if (small := small_call_note(net)) else ""),
        ),
        sources={"compute": compute_source, "peak": facts.peak_note},
        host_memory=host_memory_of(spec, facts, n, memory.offloaded),
    )
    if not plan.fits:
        plan = dataclasses.replace(plan, fitting_changes=advice.fitting_changes(spec, plan))
    plan.warnings.extend(advice.warnings(spec, plan))
    if timed:
        plan.warnings.extend(w for w in (timed.busy, timed.discarded) if w)
    return plan


def optimizer_offloaded(spec: TrialSpec) -> bool:
    """Whether a GPU trial's optimizer runs on its host (ZeRO's offload_optimizer, FSDP2's offload)."""
    sharded = fsdp_layout(spec)
    offload = sharded.offload if sharded else zero_layout(spec).offload_optimizer and spec.cfg.zero.stage
    return bool(offload and spec.cfg.hardware.device.is_gpu)


def step_and_time(
    spec: TrialSpec, facts: MachineFacts, timed: MeasuredKernels | None, net: Network, n: int, f: Flops
) -> tuple[StepTime, Time]:
    """The step's compute and communication (timed kernels, else the preset's estimate), the
    optimizer's step, and what they give: tokens/s/GPU, MFU and HFU against the peak."""
    cfg, micro, mode = spec.cfg, spec.micro_batch_size, spec.cfg.recompute.mode
    sharded = fsdp_layout(spec)  # FSDP2 planned as FSDP2; None for DeepSpeed and DDP
    # run.compile: the preset's estimate fuses as inductor does; timed kernels are eager (not compiled)
    compiled = cfg.run.compile and not timed
    kernels = (
        timed.kernels
        if timed
        else estimated_kernels(cfg.model, micro, rates(spec, facts), element_bytes(spec.precision), compiled=compiled)
    )
    engine = (timed.engine_forward_s, timed.engine_backward_s) if timed else (0.0, 0.0)
    micro_time = micro_batch_time(
        cfg.model, micro, mode, kernels, timed=timed is not None, engine=engine, compiled=compiled
    )
    t, t_one = (step_times(spec, sharded, grad_accum, micro_time, net) for grad_accum in (spec.grad_accum_steps, 1))
    offloaded = optimizer_offloaded(spec)
    optimizer_s = (
        timed.optimizer_s if timed and not offloaded else optimizer_step_s(spec, n, offloaded, facts.bandwidth_gbps)
    )
    step_s = t.step_s + optimizer_s
    peak_tflops = facts.peak_tflops
    denominator = step_s * spec.world_size * peak_tflops * 1e12 if peak_tflops else None  # None: MFU unknown
    return t, Time(
        compute_s=t.compute_s,
        comm_s=t.comm_s,
        exposed_comm_s=t.exposed_s,
        optimizer_s=optimizer_s,
        step_s=step_s,
        tokens_per_sec_per_gpu=spec.tokens_per_step / step_s / spec.world_size,
        mfu=f.model_per_token * spec.tokens_per_step / denominator if denominator else None,
        hfu=f.per_step / denominator if denominator else None,
        peak_tflops=peak_tflops,
        micro_batch=micro_time,
        optimizer_source=timed.optimizer
        if timed and not offloaded
        else "offloaded: CPU Adam on the host"
        if offloaded
        else "memory-bound: AdamW's bytes at the bandwidth",
        added_micro_batch_s=(t.step_s - t_one.step_s) / (spec.grad_accum_steps - 1)
        if spec.grad_accum_steps > 1
        else 0.0,
    )


def largest_micro_batch(spec: TrialSpec, facts: MachineFacts) -> int:
    """The largest micro batch whose activations fit beside the model's states on the device."""
    cfg, sharded = spec.cfg, fsdp_layout(spec)
    states = fsdp_states(sharded) if sharded else model_states(cfg.model, zero_layout(spec))
    runtime = runtime_bytes(cfg.hardware.device, spec.world_size)
    return max_micro_batch(
        states, runtime, capacity_bytes(spec, facts), sample_bytes(cfg.model, cfg.recompute.mode, spec.precision)
    )


def memory_of(spec: TrialSpec, facts: MachineFacts) -> Memory:
    """The trial's memory per rank at its peak, against the device's (needs nothing timed:
    planning.plan_trial reads it to decide whether the trial is worth timing)."""
    cfg, hw = spec.cfg, spec.cfg.hardware
    sharded = fsdp_layout(spec)
    states = fsdp_states(sharded) if sharded else model_states(cfg.model, zero_layout(spec))
    micro, mode = spec.micro_batch_size, cfg.recompute.mode
    return peak_memory(
        states,
        activation_bytes(cfg.model, micro, mode, spec.precision),
        recompute_bytes(cfg.model, micro, mode, spec.precision),
        loss_backward_bytes(cfg.model, micro),
        runtime_bytes(hw.device, spec.world_size),
        capacity_bytes(spec, facts),
    )


def host_memory_of(spec: TrialSpec, facts: MachineFacts, parameters: int, offloaded: int) -> HostMemory | None:
    """A GPU trial's host memory on one node, against what the node grants: cluster.mem_gb or
    --mem-per-gpu on SLURM (unchecked without either: the partition's default is not known
    here), this host's memory locally where it has a GPU (unchecked where it has none: the
    trial is planned for another machine). None on a CPU, where the device's memory is the host's."""
    cfg = spec.cfg
    if not cfg.hardware.device.is_gpu:
        return None
    c = cfg.cluster
    if c.name == "local" and facts.gpu_driver_present:
        capacity, source = facts.host_memory_bytes, "this host's memory"
    elif c.name == "local":  # planned for GPUs this host lacks: their node's memory is not this one's
        capacity, source = None, "not checked: planned for a GPU this host lacks (its node's memory is not known here)"
    elif c.mem_gb is not None:
        capacity, source = int(c.mem_gb * GIB), f"cluster.mem_gb={c.mem_gb:g} (sbatch --mem)"
    elif c.mem_per_gpu is not None:
        capacity = slurm_size_bytes(c.mem_per_gpu) * spec.gpus_per_node
        source = f"cluster.mem_per_gpu={c.mem_per_gpu} x {spec.gpus_per_node} GPUs"
    else:
        capacity, source = None, "not checked: cluster.mem_gb unset, the partition's default is not known here"
    partitioned = cfg.zero.stage == 3 and runs_as(cfg.engine.backend, 3) == Sharding.zero  # zero.Init (zero3_init_flag)
    return host_memory(parameters, partitioned, spec.dp, offloaded, CPU_PROCESS, spec.gpus_per_node, capacity, source)


def step_times(
    spec: TrialSpec, sharded: FsdpLayout | None, grad_accum: int, micro_time: ComputeTime, net: Network
) -> StepTime:
    """The step of `grad_accum` micro batches (compute and communication, no optimizer)
    under the trial's engine: FSDP2's schedule, or DeepSpeed's (and DDP's)."""
    if sharded:
        shard_net, replicas = group_networks(net, spec.layout)
        return fsdp_step_time(
            dataclasses.replace(sharded, grad_accum=grad_accum),
            fwd_s=micro_time.forward_s,
            bwd_s=micro_time.backward_s,
            net=shard_net,
            replicas=replicas,
        )
    return step_time(
        schedule_of(spec), grad_accum=grad_accum, fwd_s=micro_time.forward_s, bwd_s=micro_time.backward_s, net=net
    )


def optimizer_step_s(spec: TrialSpec, n: int, offloaded: bool, bandwidth_gbps: float | None) -> float:
    """The optimizer step is memory-bound: the bytes AdamW moves for the parameters this
    rank updates, at the device's bandwidth, or the host's where it is offloaded."""
    hw = spec.cfg.hardware
    updated = n if spec.cfg.zero.stage == 0 else -(-n // spec.layout.shard)  # HSDP: each replica updates its shard
    if offloaded:
        return offloaded_step_s(
            updated, spec.precision, hw.host_memory_bandwidth_gbps, spec.gpus_per_node, hw.host_link_gbps
        )
    # on a CPU the host is the device: offload moves nothing
    return optimizer_traffic_bytes(updated, spec.precision) / (bandwidth_gbps * 1e9) if bandwidth_gbps else 0.0


def network_of(spec: TrialSpec, facts: MachineFacts, links: LocalLinks | None = None) -> Network:
    """The trial's ranks on its nodes, over the network table of `facts` or the preset's (or
    the user's) two network levels, or inside a node over this host's measured `links`."""
    hw = spec.cfg.hardware
    intra = (
        (links.level.busbw / 1e9, links.level.latency * 1e6)
        if links
        else (hw.intra_node.busbw_gbps, hw.intra_node.latency_us)
    )
    table = links.table if links else facts.network_table
    return network(
        spec.world_size,
        spec.nodes,
        *intra,
        hw.inter_node.busbw_gbps,
        hw.inter_node.latency_us,
        backend=hw.device.collective_backend,
        call_us=hw.collective_overhead_us,
        table=table,
    )


def fsdp_layout(spec: TrialSpec) -> FsdpLayout | None:
    """FSDP2's layout where the trial shards with it (engine=fsdp, or accelerate's FSDP at
    zero.stage 2 or 3: the two routes describe the same sharding), else None."""
    z = spec.cfg.zero
    if runs_as(spec.cfg.engine.backend, z.stage) != Sharding.fsdp2:
        return None
    return layout_of(
        parameter_tensors(spec.cfg.model),
        spec.layout.shard,
        element_bytes(spec.precision),
        element_bytes(wire_dtype(spec)),
        reshard=z.stage == 3,
        grad_accum=spec.grad_accum_steps,
        offload=z.offload_param != "none" or z.offload_optimizer != "none",
        adam_foreach=spec.cfg.hardware.device.is_gpu,
        overlap=spec.cfg.hardware.device.is_gpu,
        replicate=spec.layout.replicate,
    )


def capacity_bytes(spec: TrialSpec, facts: MachineFacts) -> int:
    """Device memory per rank; on CPU the host's RAM shared by the ranks on this node."""
    hw = spec.cfg.hardware
    if hw.memory_gib is not None:
        total = int(hw.memory_gib * GIB)
        return total if hw.device.is_gpu else total // spec.gpus_per_node
    return facts.host_memory_bytes // spec.gpus_per_node
