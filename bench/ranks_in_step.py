"""What ranks sharing a node cost each other when they run the same kernel in step.

    .venv/bin/python bench/ranks_in_step.py [--ranks N] [--calls C] OVERRIDE ...

The plan times a rank's kernels alone, on the threads the rank will have. The ranks of a
data-parallel trial run the same kernels at the same moment: every step's all-reduce puts
them back in step, so a memory-bound phase of one meets the same phase of the others (the
L3 and the memory's bandwidth shared). This times three pieces of the trial given by the
overrides (the lm_head's GEMM, the loss, one real block whole: kernels.py), each alone and
then in N processes released together by a barrier before every call, and prints the
median call of each and in-step / alone. Run it alone: anything else running moves both.

On the 2-core AVX2 EPYC (bench/RESULTS.md, "The matrix's step times on the AVX2 CPU") the
128k-vocabulary Llama's dp 2 trials took 1.4-1.9x their plan.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time


def pieces(overrides: list[str]) -> dict:
    from orchestrator.measure import kernels
    from orchestrator.spec import build_spec

    spec = build_spec(["hardware=cpu", *overrides])
    m, micro = spec.cfg.model, spec.micro_batch_size
    tokens = micro * m.seq_len
    return {
        "lm_head GEMM": kernels.gemm(tokens, m.vocab, m.hidden, False, False, spec.precision, "cpu"),
        "loss": kernels.loss(m.vocab, tokens, spec.precision, "cpu"),
        "block": kernels.block(m, micro, spec.cfg.recompute.mode, spec.precision, "cpu"),
    }


def worker(overrides: list[str], name: str, threads: int, calls: int, barrier, out) -> None:
    import torch

    torch.set_num_threads(threads)
    kernel = pieces(overrides)[name]
    _, both = kernel.build(kernel.rows)
    both()  # warm-up: allocation, the library's choice of kernel
    times = []
    for _ in range(calls):
        barrier.wait()  # every rank starts the call together, as after an all-reduce
        start = time.perf_counter()
        both()
        times.append(time.perf_counter() - start)
    out.put(statistics.median(times))


def timed(overrides: list[str], name: str, ranks: int, threads: int, calls: int) -> list[float]:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(ranks), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(overrides, name, threads, calls, barrier, out)) for _ in range(ranks)]
    for p in procs:
        p.start()
    medians = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="ranks on the node (default 2)")
    parser.add_argument("--calls", type=int, default=5, help="calls timed per rank (default 5)")
    parser.add_argument("overrides", nargs="*", help="the trial's overrides (model=..., batch.micro_batch_size=...)")
    args = parser.parse_args()
    threads = max(1, (os.cpu_count() or 1) // args.ranks)  # what each rank gets (hardware.threads_per_rank)
    print(f"{args.ranks} ranks, {threads} thread(s) each, {args.calls} calls each; {' '.join(args.overrides)}")
    for name in pieces(args.overrides):
        alone = timed(args.overrides, name, 1, threads, args.calls)[0]
        together = timed(args.overrides, name, args.ranks, threads, args.calls)
        print(
            f"{name:>13}: alone {alone:.4g} s a call; in step "
            + ", ".join(f"{t:.4g}" for t in together)
            + f" s; in step / alone {max(together) / alone:.2f}"
        )


if __name__ == "__main__":
    main()
