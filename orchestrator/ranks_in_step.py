"""The other ranks of a node, run beside the plan's timing of a CPU rank's kernels.

A data-parallel trial's ranks on one host run the same kernels at the same moment (every
step's all-reduce puts them back in step), so each rank's kernel meets the same kernel of the
others and they share the caches and the memory's bandwidth. Timed alone, a rank's kernels
came out fast: on a 2-core AVX2 CPU one block by 1.17-1.23x and a 128k vocabulary's lm_head
(its 33 MB output larger than the L3) by 1.22x (bench/RESULTS.md, "The matrix's step times on
the AVX2 CPU"). So where a CPU trial puts several ranks on a node, the plan times each kernel
with the node's other ranks as partner processes making the same calls: `python -m
orchestrator.ranks_in_step SETTINGS` builds the trial's kernels (kernels.trial_kernels) and
follows the planner, one line each way per message:

    planner -> partner   ["NAME", ROWS, "forward" | "both", REPS, ROUNDS]   build that call
    partner -> planner   ready                                              built, waiting
    planner -> partner   go                                                 run REPS calls,
    partner -> planner   done                                               then wait again

so every round of calls starts on every rank together, and the next starts only once every
rank has finished the last, as a step's collectives hold its ranks. Calls that are not a
trial's kernel (the busy probe) run alone. More ranks than the host has cores for would take
turns on them, which is not modelled: at most as many copies run as fit the cores. A GPU's
ranks each have their own device, so nothing runs beside them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from typing import Callable

from orchestrator.kernels import Kernel

READY, GO, DONE = "ready", "go", "done"


def copies(ranks_on_node: int, threads_per_rank: int) -> int:
    """How many of a node's ranks run at once on the cores this process may use: the ranks
    timed in step. A SLURM task bound to its own CPUs (task/affinity) plans alone: its
    partners could only take turns with it there."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(ranks_on_node, usable // max(threads_per_rank, 1)))


class Call:
    """One of a kernel's calls, named so that a partner can build and make the same call."""

    def __init__(self, call: Callable[[], object], name: str, rows: int, which: str):
        self.call, self.key = call, [name, rows, which]

    def __call__(self) -> object:
        return self.call()


def followed(kernel: Kernel) -> Kernel:
    """`kernel` (and its smaller shapes) building `Call`s the partners can follow."""
    def build(rows: int):
        forward, both = kernel.build(rows)
        return Call(forward, kernel.name, rows, "forward"), Call(both, kernel.name, rows, "both")

    smaller = followed(kernel.smaller) if kernel.smaller is not None else None
    return dataclasses.replace(kernel, build=build, smaller=smaller)


class PartnerError(RuntimeError):
    """A partner process ended or answered out of turn."""


class Partners:
    """`count` partner processes for one plan's timing. `start` them before the planner's own
    imports (they import beside it), `wait_ready` before the first kernel is timed, `close`
    at the end. `together(op, reps, rounds)` gives the `go` to call before each round."""

    def __init__(self, count: int, settings: dict):
        self.count, self.settings = count, settings
        self.procs: list[subprocess.Popen] = []
        self.errors: list = []  # each partner's stderr, a file read only on a failure (a pipe could fill)
        self.unread = 0  # "done"s the partners owe for rounds already started

    def start(self) -> None:
        if self.count and not self.procs:
            self.errors = [tempfile.TemporaryFile(mode="w+") for _ in range(self.count)]
            self.procs = [subprocess.Popen([sys.executable, "-m", __name__, json.dumps(self.settings)], text=True,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, bufsize=1)
                          for err in self.errors]

    def wait_ready(self) -> None:
        self._expect(READY)

    def together(self, op: Callable, reps: int, rounds: int) -> Callable[[], None]:
        """The `go` before each of `rounds` rounds of `reps` calls of `op`: every partner
        makes the same round at the same moment. Nothing where `op` is not a trial's kernel."""
        key = getattr(op, "key", None)
        if not self.procs or key is None:
            return lambda: None
        self._drain()
        self._send(json.dumps([*key, reps, rounds]))
        self._expect(READY)

        def go() -> None:
            self._drain()  # the last round ended on every rank, as after a collective
            self._send(GO)
            self.unread = 1
        return go

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.stdin.close()  # the partner's loop ends
                    proc.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    proc.kill()
                    proc.wait()
        for err in self.errors:
            err.close()
        self.procs, self.errors, self.unread = [], [], 0

    def _drain(self) -> None:
        if self.unread:
            self.unread = 0
            self._expect(DONE)

    def _send(self, line: str) -> None:
        try:
            for proc in self.procs:
                proc.stdin.write(line + "\n")
                proc.stdin.flush()
        except OSError as exc:
            raise PartnerError(f"a partner rank ended: {exc}") from None

    def _expect(self, word: str) -> None:
        for proc, err in zip(self.procs, self.errors):
            line = proc.stdout.readline().strip()
            if line != word:
                proc.kill()
                proc.wait()
                err.seek(0)
                said = (err.read().strip().splitlines() or [line or "no output"])[-1]
                raise PartnerError(f"a partner rank ended ({said[:200]})")


def settings(model, micro: int, recompute: str, precision: str, device: str, threads: int) -> dict:
    """What a partner needs to build the same kernels (JSON)."""
    return {"model": dataclasses.asdict(model), "micro": micro, "recompute": str(recompute),
            "precision": precision, "device": device, "threads": threads}


def follow(given: dict) -> None:
    """A partner: build the trial's kernels and make each call the planner names, round by round."""
    import torch

    from orchestrator import kernels
    from orchestrator.config import Arch, Attention, ModelConfig

    torch.set_num_threads(given["threads"])
    m = given["model"]
    model = ModelConfig(**{**m, "arch": Arch(m["arch"]), "attention": Attention(m["attention"])})
    kernels.import_libraries(model.arch)
    known = {k.name: k for k in kernels.trial_kernels(model, given["micro"], given["recompute"], given["precision"],
                                                      given["device"]).every()}
    built: dict[tuple[str, int], tuple] = {}
    print(READY, flush=True)
    for line in sys.stdin:
        name, rows, which, reps, rounds = json.loads(line)
        if (name, rows) not in built:
            while len(built) >= 2:  # the planner times one shape at a time; keep memory to that
                built.pop(next(iter(built)))
            built[name, rows] = known[name].build(rows)
        call = built[name, rows][0 if which == "forward" else 1]
        print(READY, flush=True)
        for _ in range(rounds):
            if sys.stdin.readline().strip() != GO:
                return
            for _ in range(reps):
                call()
            print(DONE, flush=True)


if __name__ == "__main__":
    follow(json.loads(sys.argv[1]))
