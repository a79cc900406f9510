"""What a tune leaves in its directory, and how it picks up from there.

tune.json  the whole search: every candidate with its plan, calibrated prediction,
           measurement or the reason it was dropped; the calibrated parameters, the
           rounds, why it stopped, its wall-clock time and the winner.
tune.md    the same table, readable.
tune.png   the search: measured tokens/s/GPU in the order the candidates ran (with the
           best so far), and predicted (plan and calibrated) against measured.
Each candidate that ran is an ordinary trial directory below (0/, 1/, ...), so
`orchestrator report DIR` and `orchestrator calibrate DIR` read them as any sweep's;
report also renders tune.md and tune.png again from tune.json.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from orchestrator.analysis.plots import tune_plot
from orchestrator.analysis.tune.search import CandidateRun, Search
from orchestrator.analysis.tune.space import Space
from orchestrator.config import GIB
from orchestrator.core.errors import ConfigError
from orchestrator.core.files import atomic_write_json, atomic_write_text, read_json, real_number
from orchestrator.core.redact import redact, redact_text
from orchestrator.measure.host_load import BUSY_SHARE
from orchestrator.plan.prediction import timed_batches
from orchestrator.records.results import result_or_none
from orchestrator.records.trial_dir import SweepPaths, TrialPaths, holds_trial, trials_below
from orchestrator.validation.checks import number_from_text


def resume(base: Path, search: Search) -> int:
    """Record the candidates an earlier run of this search finished; the next job number.
    A record of the wrong shape (edited, or another tool's) is read as far as it is right."""
    # result.json keeps the overrides masked (redact.py), so candidates are matched masked too
    by_overrides = {tuple(redact_text(o) for o in c.overrides): c for c in search.space.candidates}
    previous = read_json(SweepPaths(base).tune_json)
    previous = previous if isinstance(previous, dict) else {}
    rows = r if isinstance(r := previous.get("rows"), list) else []
    rounds = {
        row["trial_dir"]: row["round"]
        for row in rows
        if isinstance(row, dict) and isinstance(row.get("trial_dir"), str) and _count(row.get("round")) is not None
    }
    numbers = [-1]
    for trial_dir in trials_below(base):
        if (number := job_number(trial_dir)) is not None:
            numbers.append(number)
        result = result_or_none(trial_dir)
        if result is None or not isinstance(result.get("overrides"), list):
            continue
        candidate = by_overrides.get(tuple(str(o) for o in result["overrides"]))
        if candidate is not None and result.get("status") != "interrupted":
            search.record(candidate, outcome(result, trial_dir, rounds.get(str(trial_dir), 0)))
    search.rounds = _count(previous.get("rounds")) or 0
    search.elapsed_s = _seconds(previous.get("elapsed_s")) or 0.0
    return max(numbers) + 1


def _seconds(value: object) -> float | None:
    """value as a finite number >= 0, or None."""
    number = real_number(value)
    return number if number is not None and number >= 0 else None


def _count(value: object) -> int | None:
    """value as a whole number >= 0, or None (a bool, a string or a negative is not one)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def tune_budget(flags: dict) -> dict[str, float | int]:
    """The sweeper's budget from --trials N (a whole number >= 1) and --minutes M (> 0)."""
    budget: dict[str, float | int] = {}
    if "--trials" in flags:
        text = str(flags["--trials"]).strip()
        if not text.isdigit() or int(text) < 1:
            raise ConfigError("--trials", flags["--trials"], "a whole number of trials >= 1, e.g. --trials 8")
        budget["budget_trials"] = int(text)
    if "--minutes" in flags:
        minutes = number_from_text(flags["--minutes"])
        if minutes is None or minutes <= 0:
            raise ConfigError(
                "--minutes", flags["--minutes"], "minutes > 0, e.g. --minutes 30 (leave it out for no limit)"
            )
        budget["budget_min"] = minutes
    return budget


def resumable_tune(base: Path) -> bool:
    """Whether `base` holds an earlier tune to carry on (its tune.json), and is not itself a
    trial's directory (a tune.json there is not a tune to take over)."""
    return SweepPaths(base).tune_json.is_file() and not holds_trial(base)


def same_space(base: Path, space: Space) -> None:
    """Refuse to resume the tune in `base` with another space: its record would be replaced."""
    path = SweepPaths(base).tune_json
    previous = read_json(path)
    if not isinstance(previous, dict) or not isinstance(previous.get("axes", {}), dict):
        raise ConfigError(
            "--out",
            str(base),
            f"a directory holding a tune, but {path} is not a tune record; "
            "choose another directory, or add --overwrite to start over",
        )
    fixed, axes = redact(list(space.fixed)), redact(dict(space.axes))
    was_fixed, was_axes = previous.get("fixed") or [], previous.get("axes") or {}
    differ = [f"{o} no longer fixed" for o in was_fixed if o not in fixed]
    differ += [f"{o} fixed now" for o in fixed if o not in was_fixed]
    differ += [
        f"{k}: {was_axes.get(k)} then, {axes.get(k)} now"
        for k in {**was_axes, **axes}
        if was_axes.get(k) != axes.get(k)
    ]
    if differ:
        raise ConfigError(
            "--out",
            str(base),
            "the same search space to resume the tune there, but it differs ("
            + "; ".join(differ)
            + "); choose another directory, or add --overwrite to start over",
        )


def job_number(trial_dir: Path) -> int | None:
    """hydra.sweep.subdir starts with hydra.job.num (conf/config.yaml)."""
    head = trial_dir.name.split("_")[0]
    return int(head) if head.isdigit() else None


def outcome(result: dict, trial_dir: Path, round_: int) -> CandidateRun:
    metrics = result["metrics"] if isinstance(result.get("metrics"), dict) else {}
    error = result["error"] if isinstance(result.get("error"), dict) else {}
    return CandidateRun(
        str(result.get("status", "unknown")),
        str(trial_dir),
        round_,
        _seconds(metrics.get("tokens_per_sec_per_gpu")),
        _seconds(metrics.get("step_time_s")),
        str(error.get("message") or "")[:300],
        tuple(timed_batches(metrics.get("history"))),
    )


def take(base: Path, search: Search, batch: list, returns: Sequence, out: Console) -> None:
    """Record what the launcher's jobs gave; SLURM jobs are waited for first."""
    from orchestrator.run.trial import wait_for

    dirs = [
        Path(ret.hydra_cfg.hydra.runtime.output_dir) if getattr(ret, "hydra_cfg", None) else None for ret in returns
    ]
    if any(d is not None and not TrialPaths(d).result.is_file() for d in dirs):
        wait_for(base, out)  # submitted to SLURM: a round needs its measurements
    for candidate, trial_dir, ret in zip(batch, dirs, returns):
        result = result_or_none(trial_dir) if trial_dir else None
        if result is None or trial_dir is None:  # Hydra could not even compose it
            search.record(
                candidate, CandidateRun("failed", str(trial_dir or ""), search.rounds, error=str(ret.return_value))
            )
        else:
            search.record(candidate, outcome(result, trial_dir, search.rounds))


def winner(search: Search) -> dict | None:
    best = search.best()
    if best is None:
        return None
    c, o = best
    paths = TrialPaths(Path(o.trial_dir))
    configs = [str(p) for p in (paths.ds_config, paths.accelerate_config) if p.is_file()]
    return {
        "candidate": c.label(),
        "overrides": list(c.overrides),
        "trial_dir": o.trial_dir,
        "busy_hosts": busy_hosts(search),
        "measured_tokens_per_sec_per_gpu": o.tokens_per_sec_per_gpu,
        "predicted_tokens_per_sec_per_gpu": c.predicted_tokens_per_sec_per_gpu,
        "engine_configs": configs,
        "launch_script": str(paths.launch_sh) if paths.launch_sh.is_file() else None,
        "command": "orchestrator run " + " ".join(c.overrides),
    }


def busy_hosts(search: Search) -> str:
    """Where every candidate that ran ok started on a busy host (host_load.py's threshold),
    what that was: then the winner may be the one that drew a quiet moment. '' otherwise."""
    shares = []
    for _, o in search.measured_ok():
        load = (result_or_none(Path(o.trial_dir)) or {}).get("host_load")
        shares.append(load.get("busy_share") if isinstance(load, dict) else None)
    numbers = [n for n in map(real_number, shares) if n is not None]
    if not numbers or len(numbers) < len(shares) or min(numbers) < BUSY_SHARE:
        return ""
    return (
        f"every candidate that ran started on a busy host ({min(numbers):.0%}-{max(numbers):.0%} of its cores "
        "already in use): the winner may be the one that drew a quiet moment; run the best few again on a "
        "quiet host"
    )


def write(base: Path, search: Search) -> list[Path]:
    rows = search.table()
    state = {
        "fixed": search.space.fixed,
        "axes": search.space.axes,
        "candidates": len(rows),
        "fitting": len(search.space.fitting),
        "ran": len(search.outcomes),
        "rounds": search.rounds,
        "stopped": search.stopped,
        "elapsed_s": search.elapsed_s,
        "calibrated_params": search.params,
        "uncertainty": search.uncertainty,
        "oom_bound_gib": search.oom_bound / GIB if search.oom_bound else None,
        "winner": winner(search),
        "rows": rows,
    }
    state = redact(state)  # a secret in the fixed overrides stays out of tune.json and tune.md
    atomic_write_json(SweepPaths(base).tune_json, state)
    return [SweepPaths(base).tune_json, *render(base, state)]


def render(base: Path, state: dict | None = None) -> list[Path]:
    """tune.md and tune.png from the search's state, read from tune.json when not given
    (`orchestrator report` on a tune's directory)."""
    state = state or read_json(SweepPaths(base).tune_json)
    if not state:
        return []
    paths = SweepPaths(base)
    atomic_write_text(paths.tune_md, markdown(state))
    ran = sorted(
        (r for r in state["rows"] if r["round"] is not None), key=lambda r: job_number(Path(r["trial_dir"])) or 0
    )
    return [paths.tune_md, tune_plot(ran, paths.tune_png)]


def markdown(state: dict) -> str:
    def cell(v):
        return "" if v is None else f"{v:,.0f}" if isinstance(v, float) else str(v)

    lines = [
        f"# tune: {state['ran']} of {state['fitting']} fitting candidates ran ({state['candidates']} in the space)",
        "",
        f"Stopped: {state['stopped'] or 'running'}. Wall clock {state['elapsed_s']:.0f} s.",
        "",
    ]
    if w := state["winner"]:
        lines += [
            f"Winner: `{w['candidate']}`, {w['measured_tokens_per_sec_per_gpu']:,.0f} tokens/s/GPU measured; "
            f"`{w['command']}`",
            "",
        ]
    keys = [
        "candidate",
        "status",
        "predicted_tokens_per_sec_per_gpu",
        "calibrated_tokens_per_sec_per_gpu",
        "measured_tokens_per_sec_per_gpu",
        "round",
        "reason",
    ]
    lines += [
        "| " + " | ".join(["candidate", "status", "plan tok/s/GPU", "calibrated", "measured", "round", "why"]) + " |",
        "|" + "---|" * len(keys),
    ]
    ordered = sorted(
        state["rows"],
        key=lambda r: (
            r["measured_tokens_per_sec_per_gpu"] is None,
            -(r["calibrated_tokens_per_sec_per_gpu"] or r["predicted_tokens_per_sec_per_gpu"] or 0),
        ),
    )
    lines += ["| " + " | ".join(cell(r[k]) for k in keys) + " |" for r in ordered]
    return "\n".join(lines) + "\n"


def show_ranking(search: Search, out: Console, top: int = 10) -> None:
    space = search.space
    dropped = len(space.candidates) - len(space.fitting)
    out.print(
        f"[bold]tune[/bold]: {len(space.candidates)} candidates planned, {len(space.fitting)} fit, "
        f"{dropped} dropped (does not fit, invalid, or the same in effect as another; tune.md says why each)"
    )
    table = Table(title=f"Fastest by the plan (predicted), of {len(space.fitting)}", title_justify="left")
    for column in ("candidate", "tokens/s/GPU", "GiB/rank"):
        table.add_column(column, justify="left" if column == "candidate" else "right")
    for c in sorted(search.runnable(), key=search.predicted, reverse=True)[:top]:
        table.add_row(c.label(), f"{search.predicted(c):,.0f}", f"{(c.predicted_memory or 0) / GIB:.2f}")
    out.print(table)


def show_winner(base: Path, search: Search, out: Console) -> None:
    w = winner(search)
    out.print(f"tune stopped: {search.stopped}; {len(search.outcomes)} candidate(s) ran in {search.elapsed_s:.0f} s")
    if w is None:
        out.print("[red]no candidate ran ok[/red]: tune.md has each one's cause")
        return
    out.print(
        f"[bold green]winner[/bold green] {w['candidate']}: {w['measured_tokens_per_sec_per_gpu']:,.1f} "
        f"tokens/s/GPU measured (plan predicted {w['predicted_tokens_per_sec_per_gpu']:,.1f})"
    )
    if w["busy_hosts"]:
        out.print(f"[yellow]warning:[/yellow] {w['busy_hosts']}")
    for config in w["engine_configs"]:
        out.print(f"  engine config: {config}")
    if w["launch_script"]:
        out.print(f"  launch: {w['launch_script']}")
    out.print(f"  again: {w['command']}")
    out.print(f"  the search: {SweepPaths(base).tune_md}, {SweepPaths(base).tune_png}")
