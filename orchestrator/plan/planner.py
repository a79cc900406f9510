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

from orchestrator.config import Sharding, runs_as
from orchestrator.core.errors import ConfigError
from orchestrator.plan import advice
from orchestrator.plan.collectives import Network, network, small_call_note
from orchestrator.plan.comm import Schedule, StepTime, bytes_per_rank_per_step, step_time
from orchestrator.plan.compute import ComputeTime, Rates, estimated_kernels, micro_batch_time
from orchestrator.plan.flops import flops
from orchestrator.plan.fsdp import FsdpLayout, fsdp_states, fsdp_step_time, layout_of
from orchestrator.plan.host_memory import HostMemory, host_memory, slurm_size_bytes
from orchestrator.plan.inputs import LocalLinks, MachineFacts, Measurements
from orchestrator.plan.memory import (
    CPU_PROCESS,
    GIB,
    Memory,
    activation_bytes,
    loss_backward_bytes,
    max_micro_batch,
    model_states,
    offloaded_step_s,
    optimizer_traffic_bytes,
    peak_memory,
    recompute_bytes,
    runtime_bytes,
    sample_bytes,
    zero_layout,
)
from orchestrator.plan.params import count_parameters, element_bytes, parameter_tensors
from orchestrator.plan.prediction import Comm, Plan, Time

if TYPE_CHECKING:  # the trial, as a type: the plan reads its fields, it builds none
    from orchestrator.spec import TrialSpec


def make_plan(spec: TrialSpec, facts: MachineFacts, measured: Measurements | None = None) -> Plan:
    """The plan of one trial on a machine of these `facts`, from what was `measured` for it
    (None: nothing was; the time from the hardware preset's parameters)."""
    cfg, hw = spec.cfg, spec.cfg.hardware
    measured = measured or Measurements()
    n = count_parameters(cfg.model)
    layout = zero_layout(spec)
    sharded = fsdp_layout(spec)  # FSDP2 planned as FSDP2; None for DeepSpeed and DDP
    states = fsdp_states(sharded) if sharded else model_states(cfg.model, layout)
    runtime = runtime_bytes(hw.device, spec.world_size)
    capacity = capacity_bytes(spec, facts)
    micro, mode = spec.micro_batch_size, cfg.recompute.mode
    memory = memory_of(spec, facts)

    f = flops(cfg.model, cfg.recompute.mode, spec.tokens_per_step)
    peak_tflops, peak_note = facts.peak_tflops, facts.peak_note
    bandwidth, bandwidth_note = facts.bandwidth_gbps, facts.bandwidth_note
    links, links_note = measured.links, measured.links_note
    net = network_of(spec, facts, links)
    timed, compute_source = measured.kernels, measured.compute_source or compute_assumption(hw)
    if not timed and peak_tflops is None:
        raise ConfigError(
            "hardware.peak_tflops." + spec.precision,
            None,
            f"the dense peak of this GPU: its kernels could "
            f"not be timed ({compute_source}), and without them the plan estimates from the peak",
        )
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
    offloaded = bool((sharded.offload if sharded else layout.offload_optimizer and cfg.zero.stage) and hw.device.is_gpu)
    optimizer_s = timed.optimizer_s if timed and not offloaded else optimizer_step_s(spec, n, offloaded, bandwidth)
    step_s = t.step_s + optimizer_s
    denominator = step_s * spec.world_size * peak_tflops * 1e12 if peak_tflops else None  # None: MFU unknown
    max_micro = max_micro_batch(states, runtime, capacity, sample_bytes(cfg.model, mode, spec.precision))

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
        time=Time(
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
        ),
        max_micro_batch=max_micro,
        assumptions=assumptions(
            spec,
            peak_tflops,
            peak_note,
            bandwidth_note,
            offloaded,
            compute_source,
            f"network{links_note}: {network_note(spec.cfg.hardware, facts, links)}"
            + (f"; {small}" if (small := small_call_note(net)) else ""),
        ),
        sources={"compute": compute_source, "peak": peak_note},
        host_memory=host_memory_of(spec, facts, n, memory.offloaded),
    )
    if not plan.fits:
        plan = dataclasses.replace(plan, fitting_changes=advice.fitting_changes(spec, plan))
    plan.warnings.extend(advice.warnings(spec, plan))
    if timed and timed.busy:
        plan.warnings.append(timed.busy)
    if timed and timed.discarded:
        plan.warnings.append(timed.discarded)
    return plan


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
        return fsdp_step_time(
            dataclasses.replace(sharded, grad_accum=grad_accum),
            fwd_s=micro_time.forward_s,
            bwd_s=micro_time.backward_s,
            net=net,
        )
    return step_time(
        schedule_of(spec), grad_accum=grad_accum, fwd_s=micro_time.forward_s, bwd_s=micro_time.backward_s, net=net
    )


def optimizer_step_s(spec: TrialSpec, n: int, offloaded: bool, bandwidth_gbps: float | None) -> float:
    """The optimizer step is memory-bound: the bytes AdamW moves for the parameters this
    rank updates, at the device's bandwidth, or the host's where it is offloaded."""
    hw = spec.cfg.hardware
    updated = n if spec.cfg.zero.stage == 0 else -(-n // spec.dp)
    if offloaded:
        return offloaded_step_s(
            updated, spec.precision, hw.host_memory_bandwidth_gbps, spec.gpus_per_node, hw.host_link_gbps
        )
    # on a CPU the host is the device: offload moves nothing
    return optimizer_traffic_bytes(updated, spec.precision) / (bandwidth_gbps * 1e9) if bandwidth_gbps else 0.0


def assumptions(
    spec: TrialSpec,
    peak_tflops: float | None,
    peak_note: str,
    bandwidth_note: str,
    offloaded: bool,
    compute_source: str,
    network: str,
) -> list[str]:
    """What the plan's figures rest on, said with their sources (the plan prints them)."""
    hw = spec.cfg.hardware
    return [
        f"peak {peak_tflops:.4g} TFLOPS per rank ({peak_note})" if peak_tflops else peak_note,
        compute_source,
        f"{network}; {hw.device.collective_backend}'s "
        + ("ring or tree, the faster per call" if hw.device.is_gpu else "ring")
        + f"; gradients on the wire in {wire_dtype(spec)}",
        f"memory-bound kernels and the optimizer step ({optimizer_traffic_bytes(1, spec.precision)} bytes moved per "
        f"parameter updated on the device) at {bandwidth_note}",
        "data loading takes no time; times are for the global batch after any warm-up",
        *(
            [
                f"offloaded optimizer step: CPU Adam at {hw.host_memory_bandwidth_gbps:g} GB/s of host memory "
                f"shared by {spec.gpus_per_node} rank(s), {hw.host_link_gbps:g} GB/s host link (assumed)"
            ]
            if offloaded
            else []
        ),
    ]


def network_note(hw, facts: MachineFacts, links: LocalLinks | None) -> str:
    """What the plan's network rests on: this host's measured links, a measured table, or
    the preset's levels."""
    call = f"; the engine adds {hw.collective_overhead_us:g} us to each call (hardware.collective_overhead_us)"
    if links:
        return (
            f"intra-node measured on this host ({links.source}): bus bandwidth by collective and message "
            f"size, and where that has no curve {links.level.busbw / 1e9:.3g} GB/s busbw, "
            f"{links.level.latency * 1e6:.3g} us a hop; {_level(hw.inter_node, 'inter-node')}{call}"
        )
    if facts.network_table is None:
        return f"{_level(hw.intra_node, 'intra-node')}; {_level(hw.inter_node, 'inter-node')}{call}"
    source = facts.network_table.source
    return (
        f"bus bandwidth by collective, message size and node count as measured in {hw.network} "
        f"({source[:160] + '...' if len(source) > 160 else source}); where it has no curve, "
        f"{_level(hw.intra_node, 'intra-node')}; {_level(hw.inter_node, 'inter-node')}{call}"
    )


def _level(link, where: str) -> str:
    return f"{where} {link.name + ' ' if link.name else ''}{link.busbw_gbps:g} GB/s busbw, {link.latency_us:g} us a hop"


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
        spec.dp,
        element_bytes(spec.precision),
        element_bytes(wire_dtype(spec)),
        reshard=z.stage == 3,
        grad_accum=spec.grad_accum_steps,
        offload=z.offload_param != "none" or z.offload_optimizer != "none",
        adam_foreach=spec.cfg.hardware.device.is_gpu,
        overlap=spec.cfg.hardware.device.is_gpu,
    )


def wire_dtype(spec: TrialSpec) -> str:
    """The dtype gradients are reduced in: communication_dtype, else the dtype they were
    accumulated in (BF16_Optimizer's fp32 at stage 1), else the training precision."""
    z = spec.cfg.zero
    return str(z.communication_dtype or (z.grad_accum_dtype if z.stage == 1 else None) or spec.precision)


def schedule_of(spec: TrialSpec) -> Schedule:
    """What the trial's engine communicates, in which dtypes and buckets."""
    z, engine = spec.cfg.zero, spec.cfg.engine
    return Schedule(
        stage=z.stage,
        tensors=[p.numel for p in parameter_tensors(spec.cfg.model)],
        param_bytes=element_bytes(spec.precision),
        wire_bytes=element_bytes(wire_dtype(spec)),
        reduce_bucket=z.reduce_bucket_size,
        allgather_bucket=z.allgather_bucket_size,
        prefetch_bucket=z.prefetch_bucket_size,
        overlap_comm=z.overlap_comm,
        ddp=runs_as(engine.backend, z.stage) == Sharding.ddp,
        persistence_threshold=z.param_persistence_threshold,
    )


def rates(spec: TrialSpec, facts: MachineFacts) -> Rates:
    """The hardware preset's step-time parameters, in the units plan/compute.py takes."""
    hw, peak_tflops, bandwidth_gbps = spec.cfg.hardware, facts.peak_tflops or 0.0, facts.bandwidth_gbps
    memory = bandwidth_gbps * 1e9 * hw.memory_efficiency if bandwidth_gbps else float("inf")
    kn = kn_efficiency(hw)
    if facts.peak_tflops_one_thread and peak_tflops:
        # That layout's kernel runs on one thread (1.0-1.35x on two here, bench/RESULTS.md):
        # its share is of one thread's peak, whatever the rank's.
        kn *= facts.peak_tflops_one_thread / peak_tflops
    return Rates(
        peak_flops=peak_tflops * 1e12,
        compute_efficiency=hw.compute_efficiency,
        kn_efficiency=kn,
        gemm_half_dim=hw.gemm_half_dim,
        cache_bytes=hw.gemm_cache_mb * 1e6 if hw.gemm_cache_mb else float("inf"),
        saturate_on_reduction=saturates_on(hw) == "reduction",
        attention_efficiency=hw.attention_efficiency,
        attention_backward_efficiency=hw.attention_backward_efficiency,
        memory_bytes_per_s=memory,
        op_overhead_s=hw.op_overhead_us * 1e-6,
        host_op_s=hw.host_op_us * 1e-6 if hw.device.is_gpu else 0.0,
    )


def saturates_on(hw) -> str:
    """Which dimension of a GEMM sets its share of the peak: the preset's, or the device's kind."""
    return hw.gemm_saturates_on or ("reduction" if not hw.device.is_gpu else "smallest")


def kn_efficiency(hw) -> float:
    """The share of the peak of a GEMM whose right operand is stored k x n: the preset's, or
    every other GEMM's where it gives none."""
    return hw.compute_efficiency if hw.gemm_kn_efficiency is None else hw.gemm_kn_efficiency


def compute_assumption(hw) -> str:
    source = f"calibrated on {hw.calibrated_on}" if hw.calibrated_on else f"the {hw.name} preset's parameters"
    dim = "smallest dimension" if saturates_on(hw) == "smallest" else "reduction length k"
    return (
        f"compute ({source}): large GEMMs at {hw.compute_efficiency:.0%} of the peak "
        f"({kn_efficiency(hw):.0%} with a k x n right operand), half of that at a {dim} of {hw.gemm_half_dim:g}"
        + (f" and at a smaller operand of {hw.gemm_cache_mb:g} MB" if hw.gemm_cache_mb else "")
        + "; "
        f"fused attention at {hw.attention_efficiency:.0%} forward, "
        f"{hw.attention_backward_efficiency:.0%} backward; memory-bound kernels at {hw.memory_efficiency:.0%} "
        f"of the memory bandwidth; {hw.op_overhead_us:g} us per kernel"
        + (
            f"; the host issues each kernel in {hw.host_op_us:g} us, beside the device"
            if hw.device.is_gpu and hw.host_op_us
            else ""
        )
    )


def capacity_bytes(spec: TrialSpec, facts: MachineFacts) -> int:
    """Device memory per rank; on CPU the host's RAM shared by the ranks on this node."""
    hw = spec.cfg.hardware
    if hw.memory_gib is not None:
        total = int(hw.memory_gib * GIB)
        return total if hw.device.is_gpu else total // spec.gpus_per_node
    return facts.host_memory_bytes // spec.gpus_per_node
