"""workload/rank_steps.py: each rank's compute and wait, and the straggler rule, on crafted
per-rank steps (what real ranks measure is in tests/unit/workload/test_collective_wait.py
and, on SLURM nodes, tests/test_multinode.py)."""

import random

from orchestrator.workload.rank_steps import (
    STRAGGLER_SHARE,
    per_rank_line,
    rank_steps,
    straggler_cell,
    straggler_line,
)


def ranks(computes: list[list[float]], step: float = 0.1, host=lambda r: f"node{r}") -> list[dict]:
    """Each rank's record: every step lasts `step`; what is not its compute it waits."""
    return [
        {"rank": r, "host": host(r), "steps": [[i, step, step - c] for i, c in enumerate(cs)]}
        for r, cs in enumerate(computes)
    ]


def test_the_rank_with_the_most_compute_is_named_with_its_host_and_the_others_wait():
    rng = random.Random(0)
    quick = lambda: [0.04 + rng.uniform(0, 0.004) for _ in range(8)]  # noqa: E731
    out = rank_steps(ranks([quick(), quick(), [0.09] * 8, quick()]))
    s = out["straggler"]
    assert s["rank"] == 2 and s["host"] == "node2" and s["steps"] == 8
    assert 0.045 < s["by_s"] < 0.05 and s["by_interval_s"][0] > 0 and 0.45 < s["share_of_step"] < 0.5
    assert [r["rank"] for r in out["ranks"]] == [0, 1, 2, 3]
    assert out["ranks"][2]["compute_s"]["median"] == 0.09 and abs(out["ranks"][2]["wait_s"]["median"] - 0.01) < 1e-12
    assert straggler_line(out) == (
        f"straggler: rank 2 on node2; the others wait {s['by_s'] * 1e3:.3g} ms a step for it "
        f"({s['share_of_step']:.0%} of the step)"
    )
    assert straggler_cell(out) == f"rank 2 on node2, {s['by_s'] * 1e3:.3g} ms ({s['share_of_step']:.0%})"


def test_ranks_that_take_turns_being_slower_name_nobody():
    # each rank a little slower on alternate steps: a quiet run's scatter, no straggler
    out = rank_steps(ranks([[0.05, 0.06] * 4, [0.06, 0.05] * 4]))
    assert out["straggler"] is None and "surely" in out["why_no_straggler"]
    assert straggler_line(out) is None and straggler_cell(out) == ""


def test_a_steady_gap_below_the_share_that_matters_names_nobody():
    small = 0.1 * STRAGGLER_SHARE * 0.8  # always slower, by less than the rule's share of the step
    out = rank_steps(ranks([[0.05] * 8, [0.05 + small] * 8]))
    assert out["straggler"] is None and "rank 1" in out["why_no_straggler"]


def test_too_few_steps_to_be_sure_name_nobody_and_one_rank_waits_for_nobody():
    out = rank_steps(ranks([[0.01] * 5, [0.09] * 5]))
    assert out["straggler"] is None and "too few" in out["why_no_straggler"]
    assert rank_steps(ranks([[0.05] * 8]))["why_no_straggler"] == "one rank: nobody waits"
    assert rank_steps([{"rank": 0, "host": "a", "steps": []}]) is None  # no timed step: nothing to say


def test_only_the_steps_every_rank_timed_are_compared():
    records = ranks([[0.05] * 8, [0.09] * 8])
    records[0]["steps"] = records[0]["steps"][2:]  # rank 0 resumed later (a requeue): steps 2-7
    out = rank_steps(records)
    assert out["straggler"]["steps"] == 6 and out["straggler"]["rank"] == 1
    assert out["ranks"][0]["steps"] == 6 and out["ranks"][1]["steps"] == 8


def test_the_display_lines_survive_a_result_written_by_hand():
    out = rank_steps(ranks([[0.05] * 8, [0.09] * 8]))
    assert per_rank_line(out) == "per rank, median ms of compute / in collectives: 0: 50 / 50, 1: 90 / 10"
    many = rank_steps(ranks([[0.05] * 8] * 10))
    assert per_rank_line(many).endswith("... (10 ranks)")
    for crafted in (None, [], "x", {"straggler": "rank 1"}, {"straggler": {"rank": 1, "by_s": "fast"}}):
        assert straggler_cell(crafted) == "" and straggler_line(crafted) is None
    assert per_rank_line({"ranks": [{"rank": 0, "compute_s": "x", "wait_s": {"median": 1}}]}) is None


def test_the_exposed_communication_is_the_least_waiting_ranks_by_kind_with_the_agreement_apart():
    from orchestrator.workload.rank_steps import AGREEMENT, exposed_comm, exposed_line, planned_exposed

    def record(rank, wait_reduce, wait_gather):
        kinds = {"all_reduce": wait_reduce, "all_gather": wait_gather, AGREEMENT: 0.001}
        return {"rank": rank, "host": "h", "steps": [[i, 0.1, sum(kinds.values()), kinds] for i in range(6)]}

    # rank 1 waits for rank 0 besides the transfer; rank 0 waits for the transfer alone
    out = exposed_comm([record(1, 0.05, 0.02), record(0, 0.01, 0.004)])
    assert out["rank"] == 0 and out["by_kind_s"] == {"all_gather": 0.004, "all_reduce": 0.01}
    assert out["exposed_s"] == 0.014 and out["agreement_s"] == 0.001  # the agreement is not the training's
    assert exposed_comm([{"rank": 0, "steps": [[0, 0.1, 0.01]]}]) is None  # steps without kinds: nothing to say
    plan = {
        "comm": {
            "exposed_s": 0.02,
            "collectives": [{"op": "all_reduce", "exposed_s": 0.012}, {"op": "all_gather", "exposed_s": 0.008}],
        }
    }
    assert planned_exposed(plan) == (0.02, {"all_reduce": 0.012, "all_gather": 0.008})
    line = exposed_line({"exposed_comm": out}, plan)
    assert "all_gather 4 / 8, all_reduce 10 / 12" in line and "rank 0" in line
    assert planned_exposed({"comm": "x"}) == (None, {}) and exposed_line({"exposed_comm": 3}, plan) is None
