"""What one trial's plan takes from this machine: its facts (peak, memory bandwidth, memory,
whether it has a GPU, the network table) and, where asked, its kernels, its engine's lines
and this host's links timed.

This is where the plan's inputs are measured; the plan itself (plan/planner.py) only
computes from them, and planning.py decides when to measure. The measurements are cached
(kernel_cache.py, local_links.json, cpu_peak.json), so a sweep times each shape once.
"""

from __future__ import annotations

import dataclasses
import os
import socket

from orchestrator import machine, network_table
from orchestrator.config import KernelSource, Sharding, runs_as
from orchestrator.core.errors import ConfigError, KernelTimingError, MeasurementFailed
from orchestrator.deepspeed_sections import optimizer_section, zero_section
from orchestrator.measure import engine_timing, hardware, kernel_timing
from orchestrator.measure.kernel_cache import Cache
from orchestrator.measure.links import MEASURED
from orchestrator.measure.local_links import local_links
from orchestrator.plan.assumptions import compute_assumption
from orchestrator.plan.inputs import LocalLinks, MachineFacts, MeasuredKernels, Measurements
from orchestrator.plan.params import parameter_tensors
from orchestrator.spec import TrialSpec


def machine_facts(spec: TrialSpec) -> MachineFacts:
    """The facts of the machine the trial is planned for: the preset's published figures,
    else this host's, measured once and cached."""
    hw = spec.cfg.hardware
    peak, peak_note = hardware.peak_tflops(hw, spec.precision, spec.threads_per_rank)
    if hw.memory_bandwidth_gbps:
        bandwidth, bandwidth_note = (
            float(hw.memory_bandwidth_gbps),
            f"{hw.memory_bandwidth_gbps:g} GB/s ({hw.name}, published)",
        )
    elif not hw.device.is_gpu:  # the ranks on a node share its memory bandwidth
        node = hardware.measured_cpu_bandwidth_gbps(os.cpu_count() or 1)
        bandwidth = node / spec.gpus_per_node
        bandwidth_note = f"{node:.3g} GB/s measured on this host, shared by {spec.gpus_per_node} rank(s)"
    else:
        bandwidth, bandwidth_note = None, "no memory bandwidth given (hardware.memory_bandwidth_gbps), so not counted"
    # the k x n GEMM layout's kernel runs on one thread (plan/rates.py): its peak, where it matters
    one_thread = (
        hardware.peak_tflops(hw, spec.precision, 1)[0]
        if not hw.device.is_gpu and hw.gemm_kn_efficiency is not None and spec.threads_per_rank > 1
        else None
    )
    return MachineFacts(
        peak_tflops=peak,
        peak_note=peak_note,
        bandwidth_gbps=bandwidth,
        bandwidth_note=bandwidth_note,
        host_memory_bytes=machine.host_memory_bytes(),
        gpu_driver_present=hw.device.is_gpu and machine.gpu_driver_present(),
        network_table=network_table.load(hw.network) if hw.network else None,
        peak_tflops_one_thread=one_thread,
    )


def measure_for_trial(spec: TrialSpec, facts: MachineFacts, here: bool, refused: bool) -> Measurements:
    """This host's links, then the trial's kernels (nothing beside them), where the trial's
    kernels are to be measured (hardware.kernels=measured) and it runs `here`; `refused`: the
    plan refuses it for its memory, so nothing is worth timing (a 175B model's kernels on a
    slow CPU take most of a minute)."""
    links, links_note = measured_links(spec, here=here, refused=refused)
    kernels, source = measured_kernels(
        spec, here=here, refused=refused, peak_tflops=facts.peak_tflops, bandwidth_gbps=facts.bandwidth_gbps
    )
    return Measurements(kernels=kernels, compute_source=source, links=links, links_note=links_note)


def measured_kernels(
    spec: TrialSpec,
    here: bool,
    refused: bool = False,
    peak_tflops: float | None = None,
    bandwidth_gbps: float | None = None,
) -> tuple[MeasuredKernels | None, str]:
    """The trial's kernels timed on this machine's device where hardware.kernels=measured
    and the trial runs `here` (None otherwise, where the plan will refuse the trial for its
    memory, or where timing failed), and where the compute times come from."""
    hw = spec.cfg.hardware
    if hw.kernels != KernelSource.measured:
        return None, compute_assumption(hw)
    if refused:
        return None, f"{compute_assumption(hw)}; kernels not timed: the trial does not fit (run.force=true times them)"
    if not here:  # a login node times nothing of a compute node's
        return (
            None,
            f"{compute_assumption(hw)}, until the kernels are timed on the allocated node before the ranks start",
        )
    device = hw.device.value
    threads = spec.threads_per_rank if not hw.device.is_gpu else 1
    shares = [
        p.numel if spec.cfg.zero.stage == 0 else -(-p.numel // spec.dp) for p in parameter_tensors(spec.cfg.model)
    ]
    try:
        if hw.device.is_gpu and machine.local_gpu_name() is None:
            raise KernelTimingError("no CUDA device on this machine")
        args = (spec.cfg.model, spec.micro_batch_size, spec.precision, device, threads, shares, spec.cfg.recompute.mode)
        peak = peak_tflops * 1e12 if peak_tflops else None  # what no timed GEMM can beat
        bandwidth = bandwidth_gbps * 1e9 if bandwidth_gbps else None
        with engine_timing.EngineTiming(engine_settings(spec), threads, sum(shares), device) as engine:
            if hw.device.is_gpu:  # in a process of its own: the planner keeps no CUDA context for the ranks to meet
                engine.imported()
                m, discarded = kernel_timing.measure_apart(*args, peak_flops=peak, bandwidth=bandwidth)
            else:
                m, discarded = (
                    kernel_timing.measure(*args, before_timing=engine.imported, peak_flops=peak, bandwidth=bandwidth),
                    Cache.take_discarded(),
                )
            m = dataclasses.replace(engine.apply(m, bandwidth), discarded=discarded)
    except KernelTimingError as exc:
        return None, f"measured kernels failed ({exc}), so {compute_assumption(hw)}"
    on = f", {threads} thread(s) per rank" if not hw.device.is_gpu else ""
    if spec.cfg.cluster.name != "local":
        on += f", on {socket.gethostname()} in SLURM job {os.environ.get('SLURM_JOB_ID', '?')} before the ranks started"
    return m, f"compute: {m.source()}{on}"


def measured_links(spec: TrialSpec, here: bool, refused: bool) -> tuple[LocalLinks | None, str]:
    """This host's links where a CPU trial whose kernels are measured puts several ranks on
    it and its preset's inside-node level is not a measured one (local_links.py); where
    they cannot be measured, None and what the plan says instead."""
    hw = spec.cfg.hardware
    if (
        hw.device.is_gpu
        or hw.kernels != KernelSource.measured
        or not here
        or refused
        or spec.gpus_per_node < 2
        or hw.network
        or hw.intra_node.name.startswith(MEASURED)
    ):
        return None, ""
    try:
        return local_links(spec.gpus_per_node), ""
    except (MeasurementFailed, ConfigError, OSError) as exc:
        return None, f" (this host's links could not be measured: {str(exc)[:200]})"


def engine_settings(spec: TrialSpec) -> dict | None:
    """What workload/step_timing.py needs to time the trial's engine as it runs: DeepSpeed
    (also under accelerate) with its ZeRO section and optimizer, or FSDP2; None for DDP
    (torch's AdamW alone is its step) and for offloaded optimizers (another device's step)."""
    cfg = spec.cfg
    if cfg.zero.offload_optimizer != "none" or cfg.zero.offload_param != "none":
        return None
    modules = [(p.module, p.numel) for p in parameter_tensors(cfg.model)]  # proportions: timed at a fixed size
    common = {
        "precision": spec.precision,
        "grad_clip": cfg.run.grad_clip,
        "optimizer": optimizer_section(spec),
        "modules": modules,
        "device": cfg.hardware.device.value,
    }
    if runs_as(cfg.engine.backend, cfg.zero.stage) == Sharding.zero:  # engine=deepspeed, or accelerate's DeepSpeed
        # Bucket sizes left out: on one rank they change little, and a sweep of them would
        # time the engine again at every size (the plan's buckets are in its communication).
        # So is ZeRO-3's sub-group size: the stand-in is the model scaled down, its groups not.
        zero = {k: v for k, v in zero_section(spec).items() if not k.endswith("bucket_size") and k != "sub_group_size"}
        return {"engine": "deepspeed", "zero": zero, **common}
    if cfg.engine.name == "fsdp":
        return {"engine": "fsdp", **common}
    return None
