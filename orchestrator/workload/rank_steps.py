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
AGREEMENT = "step agreement"  # the kind of the step's closing agreement (collective_wait.py)
FIGURES = ("compute_s", "wait_s")  # what metrics.ranks gives of each rank: a spread each
SOURCE = "each rank's clock around torch.distributed's collectives (workload/collective_wait.py)"


def rank_steps(records: list[dict]) -> dict | None:
    """{"ranks": each rank's compute and wait (median and spread), "straggler": the rank the
    others wait for or None, "why_no_straggler", "exposed_comm", "source"} from each rank's
    record: {"rank", "host", "steps": [[step, step seconds, seconds in collectives, those
    by kind], ...]} of its timed steps."""
    timed = [r for r in records if r.get("steps")]
    if not timed:
        return None
    by_rank = {r["rank"]: {s[0]: (s[1], s[2]) for s in r["steps"]} for r in timed}
    ranks = [
        {
            "rank": r["rank"],
            "host": r.get("host"),
            "steps": len(r["steps"]),
            "compute_s": spread([s[1] - s[2] for s in r["steps"]]).as_dict(),
            "wait_s": spread([s[2] for s in r["steps"]]).as_dict(),
        }
        for r in sorted(timed, key=lambda r: r["rank"])
    ]
    straggler, why = _straggler(by_rank, {r["rank"]: r.get("host") for r in timed})
    return {
        "ranks": ranks,
        "straggler": straggler,
        "why_no_straggler": why,
        "exposed_comm": exposed_comm(timed),
        "source": SOURCE,
    }


def exposed_comm(timed: list[dict]) -> dict | None:
    """The step's exposed communication, measured: the seconds in collectives of the rank that
    waits least (the last to reach each collective waits for the transfer alone, not for
    another rank), median over its steps, in all and by kind; the step's closing agreement
    apart (AGREEMENT: the orchestrator's own). None where the ranks kept no kinds."""
    if not timed or any(len(s) < 4 or not isinstance(s[3], dict) for r in timed for s in r["steps"]):
        return None
    least = min(timed, key=lambda r: (statistics.median(s[2] for s in r["steps"]), r["rank"]))
    steps = [s[3] for s in least["steps"]]
    kinds = sorted({k for kinds in steps for k in kinds if k != AGREEMENT})
    return {
        "rank": least["rank"],
        "exposed_s": statistics.median(sum(v for k, v in kinds_.items() if k != AGREEMENT) for kinds_ in steps),
        "by_kind_s": {k: statistics.median(kinds_.get(k, 0.0) for kinds_ in steps) for k in kinds},
        "agreement_s": statistics.median(kinds_.get(AGREEMENT, 0.0) for kinds_ in steps),
        "source": "the seconds in collectives of the rank that waits least, median of its timed steps",
    }


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


def planned_exposed(plan: object) -> tuple[float | None, dict[str, float]]:
    """The plan's exposed communication a step, in all and by kind (plan.json's comm)."""
    comm = plan.get("comm") if isinstance(plan, dict) else None
    if not isinstance(comm, dict):
        return None, {}
    kinds: dict[str, float] = {}
    for c in comm.get("collectives") or []:
        if isinstance(c, dict) and isinstance(c.get("op"), str) and (t := real_number(c.get("exposed_s"))) is not None:
            kinds[c["op"]] = kinds.get(c["op"], 0.0) + t
    return real_number(comm.get("exposed_s")), kinds


def measured_exposed(ranks: object) -> float | None:
    """The measured exposed communication a step (seconds) of a result's metrics.ranks, or None."""
    measured = ranks.get("exposed_comm") if isinstance(ranks, dict) else None
    return real_number(measured.get("exposed_s")) if isinstance(measured, dict) else None


def exposed_line(ranks: object, plan: object) -> str | None:
    """Exposed communication by kind, measured beside planned, for a terminal."""
    measured = ranks.get("exposed_comm") if isinstance(ranks, dict) else None
    if not isinstance(measured, dict) or not isinstance(measured.get("by_kind_s"), dict):
        return None
    _, planned = planned_exposed(plan)
    ms = lambda x: "-" if x is None else f"{x * 1e3:.3g}"  # noqa: E731
    kinds = sorted(set(measured["by_kind_s"]) | set(planned))
    cells = [f"{k} {ms(real_number(measured['by_kind_s'].get(k)))} / {ms(planned.get(k))}" for k in kinds]
    return (
        f"exposed communication a step, ms measured / planned: {', '.join(cells) or 'none'} "
        f"(measured on rank {measured.get('rank')}, the one that waits least; "
        f"the step's closing agreement {ms(real_number(measured.get('agreement_s')))} ms more)"
    )
