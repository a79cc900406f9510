"""Each GEMM of the matrix trials timed alone on one CPU thread, beside the plan's rate for it.

    .venv/bin/python bench/gemm_layouts.py [--hardware cpu]

The step-time model (orchestrator/plan/compute.py) charges a product (m x k) @ (k x n) by
its shape and by the layout of its right operand: stored [n, k] as nn.Linear's weight
(`x @ W.t()`) or k x n (`x @ W`: GPT-2's Conv1D forward, nn.Linear's dX = dY W). This
prints, for the shapes the matrix's trials run (width 256 and the 128k-vocabulary lm_head
at width 64) and a sweep of k, the measured GFLOPS of both layouts and the preset's
prediction, so each part of the GEMM model is checked on its own. bf16, one thread (one
rank per core, as the trials run). About a minute; run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time

import torch

from orchestrator.measure.hardware import measured_cpu_bandwidth_gbps, measured_cpu_peak_tflops
from orchestrator.plan.compute import gemm_time
from orchestrator.plan.inputs import MachineFacts
from orchestrator.plan.rates import rates
from orchestrator.spec import build_spec

# (m, n, k): tokens x out x in of the trials' products, then the lm_head dX at growing k.
SHAPES = [
    (256, 768, 256),
    (256, 256, 256),
    (256, 1024, 256),
    (256, 256, 1024),
    (256, 256, 8192),
    (128, 64, 192),
    (128, 192, 64),
    (128, 64, 8192),
    (128, 64, 32768),
    (128, 64, 128256),
    (256, 256, 32768),
    (128, 8192, 64),
    (128, 128256, 64),
]


def seconds(op, budget_s: float = 0.3) -> float:
    """The best time of one call, repeated for about budget_s after a warm-up."""
    op()
    best, spent = float("inf"), 0.0
    while spent < budget_s:
        start = time.perf_counter()
        op()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
    return best


def fit_cache_mb(rows: list[tuple[int, int, int, bool, float]], r) -> float:
    """The hardware.gemm_cache_mb that best explains the measured rates (m, n, k, kn, GFLOPS)
    by its shape alone: squared log error with each layout's level free (its efficiency
    is the trials' to fit), over products with k >= 128 (a shorter k is the saturation's)."""

    def error(cache_mb: float) -> float:
        rates_with = dataclasses.replace(r, cache_bytes=cache_mb * 1e6)
        residual = {False: [], True: []}
        for m, n, k, kn, measured in rows:
            if k >= 128:
                predicted = 2.0 * m * n * k / gemm_time(m, n, k, rates_with, 2, kn=kn) / 1e9
                residual[kn].append(math.log(measured / predicted))
        return sum(sum((x - sum(xs) / len(xs)) ** 2 for x in xs) for xs in residual.values())

    return min((0.25 * 1.05**i for i in range(200)), key=error)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hardware", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = build_spec([f"hardware={args.hardware}", "parallel.dp=1"])
    facts = MachineFacts(
        measured_cpu_peak_tflops("bf16", 1),
        "measured",
        measured_cpu_bandwidth_gbps(1),
        "measured",
        host_memory_bytes=0,
        gpu_driver_present=False,
    )
    r = rates(spec, facts)
    print(f"bf16, 1 thread; peak {r.peak_flops / 1e9:.1f} GFLOPS (measured), preset {args.hardware}")
    print(
        f"{'m x n x k':>18} {'A MB':>6} {'B MB':>6} | {'W[n,k] meas.':>12} {'plan':>6} | {'W[k,n] meas.':>12} "
        f"{'plan':>6}"
    )
    rows = []
    for m, n, k in SHAPES:
        x = torch.randn(m, k, dtype=torch.bfloat16)
        w_nk, w_kn = torch.randn(n, k, dtype=torch.bfloat16), torch.randn(k, n, dtype=torch.bfloat16)
        flops = 2.0 * m * n * k
        line = f"{f'{m}x{n}x{k}':>18} {m * k * 2 / 1e6:6.2f} {k * n * 2 / 1e6:6.2f}"
        for op, kn in ((lambda x=x, w=w_nk: x @ w.t(), False), (lambda x=x, w=w_kn: x @ w, True)):
            measured = flops / seconds(op) / 1e9
            rows.append((m, n, k, kn, measured))
            line += f" | {measured:12.2f} {flops / gemm_time(m, n, k, r, 2, kn=kn) / 1e9:6.2f}"
        print(line)
    print(
        f"hardware.gemm_cache_mb that fits these shapes best: {fit_cache_mb(rows, r):.3g} "
        f"(the preset's: {r.cache_bytes / 1e6:.3g})"
    )


if __name__ == "__main__":
    main()
