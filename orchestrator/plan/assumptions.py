"""What a plan says it rests on, in words: the peak and where it comes from, how compute is
estimated or that it was timed, the network's levels or measured table, the memory bandwidth,
and what is left out. Printed under every plan and kept in plan.json (`assumptions`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.plan.comm import wire_dtype
from orchestrator.plan.inputs import LocalLinks, MachineFacts
from orchestrator.plan.memory import optimizer_traffic_bytes
from orchestrator.plan.rates import kn_efficiency, saturates_on

if TYPE_CHECKING:
    from orchestrator.spec import TrialSpec


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
