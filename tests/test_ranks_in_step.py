"""The node's other ranks beside a CPU plan's kernel timing (ranks_in_step.py): how many run,
that a partner makes the same calls round by round, the cache keeps in-step times apart,
and a partner's failure is said. Real partner processes and real kernels; nothing mocked
but the busy probe (other tests run beside these under xdist)."""

import json
import time

import psutil
import pytest

from orchestrator import kernel_timing, kernels, ranks_in_step
from orchestrator.kernel_cache import Cache
from orchestrator.kernel_timing import measure
from orchestrator.plan.params import parameter_tensors
from orchestrator.plan import planner
from orchestrator.plan.planner import make_plan
from orchestrator.ranks_in_step import Call, PartnerError, Partners, copies, followed
from tests.test_kernel_timing import fresh_cache, small_spec  # noqa: F401 - the fixture


# (cores this process may use, ranks on the node, threads a rank, ranks timed in step); one
# core: a SLURM task bound to its CPU, whose partner would only take turns with it
@pytest.mark.parametrize("cores,ranks,threads,expected", [(2, 2, 1, 2), (2, 1, 2, 1), (2, 4, 1, 2), (16, 8, 2, 8),
                                                          (16, 4, 4, 4), (1, 2, 1, 1)])
def test_as_many_ranks_run_in_step_as_the_cores_hold(monkeypatch, cores, ranks, threads, expected):
    monkeypatch.setattr(ranks_in_step.os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert copies(ranks, threads) == expected


def _partner_cpu_s(partners: Partners) -> float:
    return sum(sum(psutil.Process(p.pid).cpu_times()[:2]) for p in partners.procs)


def test_a_partner_makes_each_round_of_the_same_calls_and_only_a_trials_kernels():
    spec = small_spec()
    model = spec.cfg.model
    trial = kernels.trial_kernels(model, 2, "none", "bf16", "cpu")
    partners = Partners(1, ranks_in_step.settings(model, 2, "none", "bf16", "cpu", 1))
    try:
        partners.start()
        partners.wait_ready()
        forward, both = followed(trial.block).build(trial.block.rows)
        assert both.key == [trial.block.name, trial.block.rows, "both"]
        with kernel_timing.threads(1):  # as the partner's
            both()  # the first call allocates
            idle = _partner_cpu_s(partners)
            start = time.process_time()
            go = partners.together(both, 5, 2)
            for _ in range(2):
                go()
                for _ in range(5):
                    both()
            mine = time.process_time() - start
        partners._drain()
        worked = _partner_cpu_s(partners) - idle
        # CPU time, which a busy machine does not shrink: the partner made the same ten calls
        assert worked > 0.5 * mine, (worked, mine)
        # a call that is not a trial's kernel (the busy probe) runs alone
        before = _partner_cpu_s(partners)
        go = partners.together(lambda: sum(range(10**6)), 1, 1)
        go()
        assert _partner_cpu_s(partners) - before < 0.05 and partners.unread == 0
    finally:
        partners.close()
    assert partners.procs == []


def test_a_partner_that_fails_is_said():
    model = small_spec().cfg.model
    partners = Partners(1, ranks_in_step.settings(model, 2, "none", "bf16", "cpu", 1))
    try:
        partners.start()
        partners.wait_ready()
        with pytest.raises(PartnerError, match="KeyError"):
            partners.together(Call(lambda: None, "no such kernel", 1, "both"), 1, 1)
    finally:
        partners.close()


def test_kernels_timed_in_step_are_cached_apart_from_those_timed_alone(fresh_cache, monkeypatch):  # noqa: F811
    spec = small_spec()
    model, tensors = spec.cfg.model, [p.numel for p in parameter_tensors(spec.cfg.model)]
    together = measure(model, 2, "bf16", "cpu", 1, tensors, "none", ranks_in_step=2)
    keys = json.loads(fresh_cache.read_text())
    assert keys and all("|1 threads x 2 ranks in step|" in k for k in keys)
    assert together.kernels.block and all(x > 0 for x in (*together.kernels.head, *together.kernels.block))
    alone = measure(model, 2, "bf16", "cpu", 1, tensors, "none", ranks_in_step=1)
    keys = json.loads(fresh_cache.read_text())
    assert sum("|1 threads|" in k for k in keys) == sum("ranks in step" in k for k in keys) == len(keys) // 2
    # and each is read back under its own key, nothing timed again
    monkeypatch.setattr(kernel_timing, "time_kernel", lambda *a: pytest.fail("timed again"))
    Cache._known = None
    assert measure(model, 2, "bf16", "cpu", 1, tensors, "none", ranks_in_step=2).kernels == together.kernels
    assert measure(model, 2, "bf16", "cpu", 1, tensors, "none", ranks_in_step=1).kernels == alone.kernels


def test_the_plan_says_its_kernels_were_timed_with_the_nodes_other_ranks(fresh_cache, monkeypatch):  # noqa: F811
    monkeypatch.setattr(ranks_in_step.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(planner, "engine_settings", lambda spec: None)  # the engine's own timing: its own tests
    two = make_plan(small_spec("parallel.dp=2"))
    assert "each kernel timed with 2 ranks making it together" in two.sources["compute"]
    one = make_plan(small_spec("parallel.dp=1"))
    assert "together" not in one.sources["compute"]
