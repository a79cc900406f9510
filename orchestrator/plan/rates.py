"""The hardware preset's step-time parameters as the rates plan/compute.py takes: the peak and
the share of it a GEMM reaches (by its layout and the dimension that saturates it), attention's,
the memory's, and the fixed cost of a kernel on the device and on its host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.plan.compute import Rates
from orchestrator.plan.inputs import MachineFacts

if TYPE_CHECKING:
    from orchestrator.spec import TrialSpec


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
