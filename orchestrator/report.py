"""`orchestrator report DIR`: every result.json below DIR as one table, CSV, Markdown and plots.

Rows are sorted by measured tokens/s/GPU (trials that did not run last, with their
cause). The swept values are the overrides that differ between the trials. The plots
are plots.py's. Where `orchestrator calibrate` has fitted a trial's hardware, its row
also says what the calibrated preset predicts now (the trial is planned again for that,
and only then).
"""

from __future__ import annotations

import csv
import io
import json
import sys
import functools
from pathlib import Path

from orchestrator.calibrate import calibrated_params, calibrated_step_s
from orchestrator.compose import swept_values
from orchestrator.files import atomic_write_text
from orchestrator.plots import report_plots
from orchestrator.trial_dir import SweepPaths, TrialPaths, trials_below

COLUMNS = ("status", "tokens_per_sec_per_gpu", "mfu", "hfu", "step_time_s", "predicted_step_s", "calibrated_step_s",
           "peak_bytes",
           "predicted_peak_bytes", "activation_bytes", "predicted_activation_bytes", "error")


def collect(directory: Path, warn=None) -> tuple[list[dict], list[dict]]:
    """(rows, results): one row per result.json below `directory`, best first. A file that
    is not a readable result is skipped, and named to `warn` (stderr by default)."""
    paths, results = [], []
    for path in (TrialPaths(d).result for d in trials_below(directory)):
        if not path.is_file():
            continue
        try:
            result = json.loads(path.read_text())
            if not isinstance(result, dict) or "status" not in result:
                raise ValueError("not a result (no status)")
        except (OSError, ValueError) as exc:
            (warn or _stderr)(f"warning: skipped {path}: {type(exc).__name__}: {exc}")
            continue
        paths.append(path)
        results.append(result)
    swept = swept_values([tuple(r.get("overrides", [])) for r in results])
    fitted = functools.lru_cache(maxsize=None)(calibrated_params)  # a preset file read once per report
    rows = [_row(r, p.parent, directory, s, fitted) for r, p, s in zip(results, paths, swept)]
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["status"] != "ok", -(rows[i]["tokens_per_sec_per_gpu"] or 0)))
    return [rows[i] for i in order], [results[i] for i in order]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _row(result: dict, trial_dir: Path, base: Path, swept: dict, fitted) -> dict:
    m, plan = result.get("metrics") or {}, result.get("plan") or {}
    mem, error = m.get("memory") or {}, result.get("error")
    hardware = ((result.get("config") or {}).get("hardware") or {}).get("name")
    params = fitted(hardware) if result["status"] == "ok" and hardware else None
    return {"trial": str(trial_dir.relative_to(base)) or ".", **swept, "status": result["status"],
            "tokens_per_sec_per_gpu": m.get("tokens_per_sec_per_gpu"), "mfu": m.get("mfu"), "hfu": m.get("hfu"),
            "step_time_s": m.get("step_time_s"), "predicted_step_s": plan.get("time", {}).get("step_s"),
            # after `orchestrator calibrate`: what the calibrated preset predicts for it now
            "calibrated_step_s": calibrated_step_s(trial_dir, params) if params else None,
            "peak_bytes": mem.get("peak_bytes"), "predicted_peak_bytes": plan.get("memory", {}).get("total"),
            "activation_bytes": mem.get("activation_bytes"),
            "predicted_activation_bytes": plan.get("memory", {}).get("activations"),
            "error": f"{error['type']}: {error['message'][:120]}" if error else ""}


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
    return [paths.report_csv, paths.report_md, *report_plots(results, labels, paths)]


def _markdown(rows: list[dict], fields: list[str]) -> str:
    lines = ["# Trials, best tokens/s/GPU first", "",
             "Measured figures from each result.json; `predicted_*` from the plan it ran against; `calibrated_step_s` what the preset fitted by `orchestrator calibrate` predicts now.", "",
             "| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
    lines += ["| " + " | ".join(_cell(row.get(f)) for f in fields) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value).replace("|", "/")
