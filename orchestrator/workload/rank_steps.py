"""Every rank's step, and the rank the others wait for: pure functions over what each rank
measured of itself (workload/collective_wait.py), for result.json's `metrics.ranks`.

Each rank's timed step splits into its compute (the step less its time in collectives) and
its wait. In synchronous data parallelism the ranks' steps last alike, so the straggler is
not the rank with the longest step but the one with the most compute: the others spend the
difference waiting for it. It is named only where that is sure and large enough to matter:
over the steps every rank timed, the straggler's compute less the median of the other ranks'
compute, step by step, has a median of at least STRAGGLER_SHARE of the step and a 95 %
interval (core/timing_stats.py: the sign-test interval, six steps or more) above zero.
A quiet run, where which rank is a little slower changes from step to step, names none.
"""

from __future__ import annotations

import statistics

from orchestrator.core.files import real_number
from orchestrator.core.timing_stats import spread, sure

# The others wait at least this share of their step for the straggler. Quiet two-rank runs
# came within 4 % of it: rank 0 was the slower by 1.8, 2.4 and 3.9 % of the step in three
# quiet runs on two nodes of the SLURM test cluster (tests/test_multinode.py), by -0.3 to 2.5 %
# on one host; a rank slowed by 50 ms in a 20 ms step costs the others 67 % (bench/RESULTS.md,
# "Every rank's step").
STRAGGLER_SHARE = 0.10
FIGURES = ("compute_s", "wait_s")  # what metrics.ranks gives of each rank: a spread each
SOURCE = "each rank's clock around torch.distributed's collectives (workload/collective_wait.py)"


def rank_steps(records: list[dict]) -> dict | None:
    """{"ranks": each rank's compute and wait (median and spread), "straggler": the rank the
    others wait for or None, "why_no_straggler", "source"} from each rank's record: {"rank",
    "host", "steps": [[step, step seconds, seconds in collectives], ...]} of its timed steps."""
    timed = [r for r in records if r.get("steps")]
    if not timed:
        return None
    by_rank = {r["rank"]: {s: (seconds, wait) for s, seconds, wait in r["steps"]} for r in timed}
    ranks = [
        {
            "rank": r["rank"],
            "host": r.get("host"),
            "steps": len(r["steps"]),
            "compute_s": spread([seconds - wait for _, seconds, wait in r["steps"]]).as_dict(),
            "wait_s": spread([wait for _, _, wait in r["steps"]]).as_dict(),
        }
        for r in sorted(timed, key=lambda r: r["rank"])
    ]
    straggler, why = _straggler(by_rank, {r["rank"]: r.get("host") for r in timed})
    return {"ranks": ranks, "straggler": straggler, "why_no_straggler": why, "source": SOURCE}


def _straggler(by_rank: dict[int, dict[int, tuple[float, float]]], hosts: dict) -> tuple[dict | None, str | None]:
    if len(by_rank) < 2:
        return None, "one rank: nobody waits"
    common = sorted(set.intersection(*(set(steps) for steps in by_rank.values())))
    if not common:
        return None, "no step that every rank timed"
    compute = {rank: [steps[s][0] - steps[s][1] for s in common] for rank, steps in by_rank.items()}
    slowest = max(compute, key=lambda rank: (statistics.median(compute[rank]), -rank))
    excess = [
        compute[slowest][i] - statistics.median(compute[r][i] for r in compute if r != slowest)
        for i in range(len(common))
    ]
    gap = spread(excess)
    step = statistics.median(by_rank[slowest][s][0] for s in common)
    share = gap.median / step if step > 0 else 0.0
    if not sure(gap):
        return None, f"{len(common)} steps that every rank timed: too few to be sure of one (6 or more)"
    if gap.ci_low <= 0 or share < STRAGGLER_SHARE:
        return None, (
            f"no rank's compute exceeds the others' by {STRAGGLER_SHARE:.0%} of the step, surely "
            f"(the most: rank {slowest}, {share:.1%})"
        )
    return {
        "rank": slowest,
        "host": hosts.get(slowest),
        "by_s": gap.median,
        "by_interval_s": [gap.ci_low, gap.ci_high],
        "share_of_step": share,
        "steps": len(common),
    }, None


def _named(ranks: object) -> tuple[object, str, float, float] | None:
    """(rank, host, seconds, share of the step) of a result's straggler, where it names one
    whose figures are numbers (a result written by hand or by another version may not)."""
    s = ranks.get("straggler") if isinstance(ranks, dict) else None
    if not isinstance(s, dict):
        return None
    by, share = real_number(s.get("by_s")), real_number(s.get("share_of_step"))
    if by is None or share is None:
        return None
    return s.get("rank"), str(s.get("host") or "?"), by, share


def straggler_cell(ranks: object) -> str:
    """The straggler in a table's cell: "rank 1 on node2, 51 ms (67%)", or ""."""
    if (named := _named(ranks)) is None:
        return ""
    rank, host, by, share = named
    return f"rank {rank} on {host}, {by * 1e3:.3g} ms ({share:.0%})"


def straggler_line(ranks: object) -> str | None:
    """One line for a terminal: who the others wait for and how long a step, or None."""
    if (named := _named(ranks)) is None:
        return None
    rank, host, by, share = named
    return (
        f"straggler: rank {rank} on {host}; the others wait {by * 1e3:.3g} ms a step for it ({share:.0%} of the step)"
    )


def per_rank_line(ranks: object, most: int = 8) -> str | None:
    """Each rank's median compute / time in collectives, in ms, for up to `most` ranks."""
    rows = ranks.get("ranks") if isinstance(ranks, dict) else None
    cells = []
    for r in rows if isinstance(rows, list) else []:
        compute, wait = (_median(r.get(k)) if isinstance(r, dict) else None for k in FIGURES)
        if compute is not None and wait is not None:
            cells.append(f"{r.get('rank')}: {compute * 1e3:.3g} / {wait * 1e3:.3g}")
    if not cells:
        return None
    shown = ", ".join(cells[:most]) + (f", ... ({len(cells)} ranks)" if len(cells) > most else "")
    return f"per rank, median ms of compute / in collectives: {shown}"


def _median(figure: object) -> float | None:
    return real_number(figure.get("median")) if isinstance(figure, dict) else None
