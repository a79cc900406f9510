"""`orchestrator report DIR`: every result.json below DIR as one table, CSV, Markdown and plots.

Rows are sorted by measured tokens/s/GPU (trials that did not run last, with their
cause). The swept values are the overrides that differ between the trials. The plots
are plots.py's. Where `orchestrator calibrate` has fitted a trial's hardware, its row
also says what the calibrated preset predicts now (the trial is planned again for that,
and only then).
"""

from __future__ import annotations

import copy
import csv
import functools
import io
import sys
from pathlib import Path

from orchestrator.analysis.calibrate import calibrated_params, calibrated_step_s
from orchestrator.analysis.plots import report_plots
from orchestrator.core.errors import ConfigError
from orchestrator.core.files import atomic_write_text, real_number
from orchestrator.core.timing_stats import Spread, beyond_noise, spread, sure
from orchestrator.hydra_glue.compose import swept_values
from orchestrator.plan.prediction import planned_for_timed_steps, timed_batches
from orchestrator.records.results import read_result
from orchestrator.records.trial_dir import SweepPaths, TrialPaths, trials_below
from orchestrator.records.trial_meta import sweep_point
from orchestrator.spec import REPEAT
from orchestrator.workload.rank_steps import measured_exposed, planned_exposed, straggler_cell

COLUMNS = (
    "status",
    "tokens_per_sec_per_gpu",
    "vs_best",
    "noisy",
    "host_busy",
    "mfu",
    "hfu",
    "step_time_s",
    "step_time_interval",
    "predicted_step_s",
    "calibrated_step_s",
    "peak_bytes",
    "predicted_peak_bytes",
    "activation_bytes",
    "predicted_activation_bytes",
    "exposed_comm_s",
    "predicted_exposed_comm_s",
    "straggler",
    "error",
)


def collect(directory: Path, warn=None) -> tuple[list[dict], list[dict]]:
    """(rows, results): one row per result.json below `directory`, best first. A file that
    is not a readable result is skipped, and named to `warn` (stderr by default); a field
    of the wrong type in a readable one is shown empty."""
    warn = warn or _stderr
    paths, results = [], []
    for path in (TrialPaths(d).result for d in trials_below(directory)):
        try:
            result = read_result(path.parent)
        except (OSError, ValueError, RecursionError) as exc:
            warn(f"warning: skipped {path}: {type(exc).__name__}: {exc}")
            continue
        if result is None:
            continue
        paths.append(path)
        results.append(result)
    swept = swept_values(
        [tuple(map(str, r["overrides"])) if isinstance(r.get("overrides"), list) else () for r in results]
    )
    fitted = functools.lru_cache(maxsize=None)(lambda name: _calibrated(name, warn))  # read once per report
    rows = [_row(r, p.parent, directory, s, fitted) for r, p, s in zip(results, paths, swept)]
    rows, results = group_repeats(rows, results, [_masked_point(p.parent) for p in paths])
    order = sorted(
        range(len(rows)), key=lambda i: (rows[i]["status"] != "ok", -(rows[i]["tokens_per_sec_per_gpu"] or 0))
    )
    rows, results = [rows[i] for i in order], [results[i] for i in order]
    # a spread counts only beside the figure it spreads (a result whose throughput is not one has none)
    spreads = [
        _spread(_obj(r.get("metrics")).get("tokens_per_sec_per_gpu_spread"))
        if row["status"] == "ok" and row["tokens_per_sec_per_gpu"] is not None
        else None
        for row, r in zip(rows, results)
    ]
    best = spreads[0] if rows and rows[0]["status"] == "ok" else None
    for row, its in zip(rows, spreads):
        row["vs_best"] = against_best(its, best)
    return rows, results


def _masked_point(trial_dir: Path) -> tuple | None:
    """(sweep group, number) of a point whose swept secret is masked (sweep_batch.masked_point), else None."""
    sweep = sweep_point(trial_dir)
    if isinstance(sweep.get("masked_point"), int):
        return str(sweep.get("group")), sweep["masked_point"]
    return None


def group_repeats(
    rows: list[dict], results: list[dict], masked_points: list[tuple | None] | None = None
) -> tuple[list[dict], list[dict]]:
    """Repeats of one point (ok trials differing only in run.repeat) as one row: its timed
    steps pooled into one median and interval, `repeats` counting them, the largest peak.
    Its result (for the plots) is the first repeat's with the pooled figures. masked_points:
    per trial, what tells apart points whose overrides mask alike (_masked_point)."""
    if not any(REPEAT in row for row in rows):
        return rows, results
    masked_points = masked_points or [None] * len(rows)
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(rows):
        # the point is every override but the repeat's, not the swept columns alone: two sweeps
        # that differ in a key only one of them set are two points (one set it, one did not)
        overrides = o if isinstance(o := results[i].get("overrides"), list) else []
        point = (*sorted(str(o) for o in overrides if not str(o).startswith(f"{REPEAT}=")), masked_points[i])
        groups.setdefault(point if row["status"] == "ok" else ("not ok", i), []).append(i)
    out_rows, out_results = [], []
    for members in groups.values():
        first = members[0]
        if len(members) == 1:
            out_rows.append({**rows[first], "repeats": 1})
            out_results.append(results[first])
            continue
        steps = [
            h
            for i in members
            for h in _obj(results[i].get("metrics")).get("history") or []
            if isinstance(h, dict)
            and h.get("timed")
            and _num(h.get("step_time_s"))
            and _num(h.get("tokens_per_sec_per_gpu"))
        ]
        step = spread([h["step_time_s"] for h in steps]) if steps else None
        throughput = spread([h["tokens_per_sec_per_gpu"] for h in steps]) if steps else None
        row, result = dict(rows[first]), copy.deepcopy(results[first])
        if step and throughput:
            scale = throughput.median / row["tokens_per_sec_per_gpu"] if row["tokens_per_sec_per_gpu"] else None
            row.update(
                step_time_s=step.median,
                tokens_per_sec_per_gpu=throughput.median,
                noisy=step.noisy() or "",
                step_time_interval=_interval(step),
                mfu=row["mfu"] * scale if row["mfu"] and scale else row["mfu"],
                hfu=row["hfu"] * scale if row["hfu"] and scale else row["hfu"],
            )
            result["metrics"].update(
                step_time_s=step.median,
                step_time_spread=step.as_dict(),
                tokens_per_sec_per_gpu=throughput.median,
                tokens_per_sec_per_gpu_spread=throughput.as_dict(),
                mfu=row["mfu"],
                hfu=row["hfu"],
            )  # the plots draw the pooled point, as the table
        peaks = [rows[i]["peak_bytes"] for i in members if rows[i]["peak_bytes"] is not None]
        row.update(
            trial=f"{row['trial']} (+{len(members) - 1} repeats)",
            repeats=len(members),
            peak_bytes=max(peaks) if peaks else None,
            straggler="; ".join(dict.fromkeys(c for i in members if (c := rows[i].get("straggler")))),
        )
        row.pop(REPEAT, None)
        out_rows.append(row)
        out_results.append(result)
    return out_rows, out_results


def against_best(spread: Spread | None, best: Spread | None) -> str:
    """Whether a trial's throughput is told apart from the best's by more than their
    intervals: "best", "slower" (beyond both intervals), "within noise", "too few steps to
    tell" (an interval covering less than CONFIDENCE: fewer than six timed steps), or ""
    (no spread)."""
    if spread is None or best is None:
        return ""
    if spread is best:
        return "best"
    if not (sure(spread) and sure(best)):
        return "too few steps to tell"
    return "slower" if beyond_noise(spread, best) else "within noise"


def _spread(value) -> Spread | None:
    """A result's spread, where it has a readable one (older results have none): every
    figure a number, the interval around the median."""
    try:
        s = Spread(**value) if isinstance(value, dict) else None
    except TypeError:
        return None
    if (
        s is None
        or not all(_num(x) is not None for x in (s.median, s.ci_low, s.ci_high))
        or not isinstance(s.confidence, (int, float))
        or not s.ci_low <= s.median <= s.ci_high
    ):
        return None
    return s


def _interval(s: Spread | None) -> str:
    """The median's interval and what it covers, as the tables show it."""
    return f"{s.ci_low:.4g}-{s.ci_high:.4g} s ({s.confidence:.0%}, {s.n} steps)" if s else ""


def _share(value) -> str:
    share = real_number(value)
    return f"{share:.0%}" if share is not None and 0 <= share <= 1 else ""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _calibrated(hardware: str, warn) -> dict | None:
    try:
        return calibrated_params(hardware)
    except ConfigError as exc:  # a calibrated preset that is not one: the report goes on without it
        warn(f"warning: {exc}")
        return None


def _obj(value) -> dict:
    return value if isinstance(value, dict) else {}


def _num(value) -> float | None:
    """A measured or predicted figure: a finite number above 0, else nothing (a string, a
    list, a zero or negative step a hand-edited result holds: none of them ranks a trial)."""
    number = real_number(value)
    return number if number is not None and number > 0 else None


def _row(result: dict, trial_dir: Path, base: Path, swept: dict, fitted) -> dict:
    m, plan = _obj(result.get("metrics")), _obj(result.get("plan"))
    mem, error, time_, planned_mem = (
        _obj(m.get("memory")),
        _obj(result.get("error")),
        _obj(plan.get("time")),
        _obj(plan.get("memory")),
    )
    hardware = _obj(_obj(result.get("config")).get("hardware")).get("name")
    params = fitted(hardware) if result["status"] == "ok" and isinstance(hardware, str) else None
    history = m.get("history") if isinstance(m.get("history"), list) else None
    planned = _num(time_.get("step_s")) is not None and all(
        isinstance(_obj(plan.get("batch")).get(k), int) and _obj(plan.get("batch"))[k] > 0
        for k in ("global_batch_size", "grad_accum_steps")
    )
    return {
        "trial": str(trial_dir.relative_to(base)) or ".",
        **swept,
        "status": result["status"],
        "tokens_per_sec_per_gpu": _num(m.get("tokens_per_sec_per_gpu")),
        "mfu": _num(m.get("mfu")),
        "hfu": _num(m.get("hfu")),
        "step_time_s": _num(m.get("step_time_s")),
        "noisy": m.get("noisy") if isinstance(m.get("noisy"), str) else "",
        # how busy the host was as the trial started (host_load.py): a steady load slows
        # every step alike, so the steps do not scatter, but the trial is not the point's
        "host_busy": _share(_obj(result.get("host_load")).get("busy_share")),
        "step_time_interval": _interval(_spread(m.get("step_time_spread"))),
        # the plan's step for the steps the trial timed (a warm-up's are shorter)
        "predicted_step_s": _num(planned_for_timed_steps(plan, history)["step_s"]) if planned else None,
        # after `orchestrator calibrate`: what the calibrated preset predicts for it now
        "calibrated_step_s": calibrated_step_s(trial_dir, params, tuple(timed_batches(history))) if params else None,
        "peak_bytes": _num(mem.get("peak_bytes")),
        "predicted_peak_bytes": _num(planned_mem.get("total")),
        "activation_bytes": _num(mem.get("activation_bytes")),
        "predicted_activation_bytes": _num(planned_mem.get("activations")),
        # the rank the others wait for, and how long a step (workload/rank_steps.py)
        "straggler": straggler_cell(m.get("ranks")),
        # communication not hidden under compute, a step: measured (rank_steps.exposed_comm), planned
        "exposed_comm_s": measured_exposed(m.get("ranks")),
        "predicted_exposed_comm_s": planned_exposed(plan)[0],
        "error": f"{error.get('type')}: {str(error.get('message'))[:120]}" if error else "",
    }


def write_report(directory: Path, rows: list[dict], results: list[dict]) -> list[Path]:
    fields = list(dict.fromkeys(k for row in rows for k in row))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    paths = SweepPaths(directory)
    atomic_write_text(paths.report_csv, text.getvalue())
    atomic_write_text(paths.report_md, _markdown(rows, fields))
    fixed = {"trial", *COLUMNS}
    labels = [", ".join(f"{k}={v}" for k, v in row.items() if k not in fixed) or row["trial"] for row in rows]
    shown = [r if r["status"] != "ok" or _plottable(r) else {**r, "status": "not plottable"} for r in results]
    return [paths.report_csv, paths.report_md, *report_plots(shown, labels, paths)]


def _plottable(result: dict) -> bool:
    """Whether an ok result holds every figure the plots draw, as numbers (a hand-edited or
    foreign result.json is in the table, but not drawn)."""
    try:
        m, c, plan = result["metrics"], result["config"], result.get("plan") or {}
        if m["mfu"] is not None and _num(m["mfu"]) is None:  # None: no published peak; the MFU plot leaves it out
            return False
        figures = [
            m["tokens_per_sec_per_gpu"],
            m["step_time_s"],
            c["parallel"]["dp"],
            c["zero"]["reduce_bucket_size"],
            c["model"]["seq_len"],
            *m["global_batch_sizes"],
        ]
        figures += [m["memory"][k] for k in ("peak_bytes", "activation_bytes") if m["memory"].get(k) is not None]
        if plan:
            figures += [plan["time"]["step_s"], plan["memory"]["total"], plan["memory"]["activations"]]
        return all(_num(x) is not None for x in figures)
    except (KeyError, TypeError, AttributeError):
        return False


def _markdown(rows: list[dict], fields: list[str]) -> str:
    lines = [
        "# Trials, best tokens/s/GPU first",
        "",
        "Measured figures from each result.json; `predicted_*` from the plan it ran against; "
        "`calibrated_step_s` what the preset fitted by `orchestrator calibrate` predicts now.",
        "",
        "| " + " | ".join(fields) + " |",
        "|" + "---|" * len(fields),
    ]
    lines += ["| " + " | ".join(_cell(row.get(f)) for f in fields) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value).replace("|", "/")
