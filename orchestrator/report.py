"""`orchestrator report DIR`: every result.json below DIR as one table, CSV, Markdown and plots.

Rows are sorted by measured tokens/s/GPU (trials that did not run last, with their
cause). The swept values are the overrides that differ between the trials. Plots
(matplotlib, Agg backend, PNG):
  scaling.png                 tokens/s/GPU, MFU and scaling efficiency against DP degree,
                              one line per reduce bucket size
  predicted_vs_measured.png   peak and activation memory, and step time, measured
                              against the plan, with the identity line
  warmup.png                  the global batch of every step against tokens consumed
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections import defaultdict
from pathlib import Path

from orchestrator.calibrate import calibrated_step_s
from orchestrator.compose import swept_values
from orchestrator.files import atomic_write_text

COLUMNS = ("status", "tokens_per_sec_per_gpu", "mfu", "hfu", "step_time_s", "predicted_step_s", "calibrated_step_s",
           "peak_bytes",
           "predicted_peak_bytes", "activation_bytes", "predicted_activation_bytes", "error")


def collect(directory: Path, warn=None) -> tuple[list[dict], list[dict]]:
    """(rows, results): one row per result.json below `directory`, best first. A file that
    is not a readable result is skipped, and named to `warn` (stderr by default)."""
    paths, results = [], []
    for path in sorted(directory.rglob("result.json")):
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
    rows = [_row(r, p.parent, directory, s) for r, p, s in zip(results, paths, swept)]
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["status"] != "ok", -(rows[i]["tokens_per_sec_per_gpu"] or 0)))
    return [rows[i] for i in order], [results[i] for i in order]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _row(result: dict, trial_dir: Path, base: Path, swept: dict) -> dict:
    m, plan = result.get("metrics") or {}, result.get("plan") or {}
    mem, error = m.get("memory") or {}, result.get("error")
    return {"trial": str(trial_dir.relative_to(base)) or ".", **swept, "status": result["status"],
            "tokens_per_sec_per_gpu": m.get("tokens_per_sec_per_gpu"), "mfu": m.get("mfu"), "hfu": m.get("hfu"),
            "step_time_s": m.get("step_time_s"), "predicted_step_s": plan.get("time", {}).get("step_s"),
            # after `orchestrator calibrate`: what the calibrated preset predicts for it now
            "calibrated_step_s": calibrated_step_s(trial_dir) if result["status"] == "ok" else None,
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
    atomic_write_text(directory / "report.csv", text.getvalue())
    atomic_write_text(directory / "report.md", _markdown(rows, fields))
    fixed = {"trial", *COLUMNS}
    labels = [", ".join(f"{k}={v}" for k, v in row.items() if k not in fixed) or row["trial"] for row in rows]
    return [directory / "report.csv", directory / "report.md", *plots(results, labels, directory)]


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


# --- plots ---------------------------------------------------------------------------


def plots(results: list[dict], labels: list[str], directory: Path) -> list[Path]:
    """labels: what distinguishes each result (its swept values), for legends."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    ok = [(r, label) for r, label in zip(results, labels) if r["status"] == "ok" and r.get("metrics")]
    if not ok:
        return []
    results_ok = [r for r, _ in ok]
    return [_scaling(results_ok, directory), _predicted_vs_measured(results_ok, directory), _warmup(ok, directory)]


def _scaling(ok: list[dict], directory: Path) -> Path:
    import matplotlib.pyplot as plt

    lines: dict[int, list[tuple[int, float, float]]] = defaultdict(list)
    for r in ok:
        lines[r["config"]["zero"]["reduce_bucket_size"]].append(
            (r["config"]["parallel"]["dp"], r["metrics"]["tokens_per_sec_per_gpu"], r["metrics"]["mfu"]))
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.5))
    for bucket, points in sorted(lines.items()):
        points.sort()
        dp, tps, mfu = zip(*points)
        label = f"reduce bucket {bucket:.0e} elements"
        a.plot(dp, tps, marker="o", label=label)
        b.plot(dp, [100 * x for x in mfu], marker="o", label=label)
        c.plot(dp, [100 * t / tps[0] for t in tps], marker="o", label=label)
    for ax, title, ylabel in ((a, "Throughput per GPU", "tokens/s/GPU"), (b, "Model FLOPs utilisation", "MFU (%)"),
                              (c, "Scaling efficiency", "tokens/s/GPU vs smallest DP (%)")):
        ax.set(title=title, xlabel="data-parallel degree (ranks)", ylabel=ylabel)
        ax.set_xscale("log", base=2)
        dps = sorted({r["config"]["parallel"]["dp"] for r in ok})
        ax.set_xticks(dps, [str(d) for d in dps])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, directory / "scaling.png")


def _predicted_vs_measured(ok: list[dict], directory: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 5))
    memory = []
    for key, plan_key, label in (("peak_bytes", "total", "peak"), ("activation_bytes", "activations", "activations")):
        pairs = [(r["plan"]["memory"][plan_key] / 2**20, r["metrics"]["memory"][key] / 2**20) for r in ok
                 if r.get("plan") and r["metrics"]["memory"].get(key)]
        if pairs:
            a.scatter(*zip(*pairs), label=label)
            memory += pairs
    times = [(r["plan"]["time"]["step_s"], r["metrics"]["step_time_s"]) for r in ok if r.get("plan")]
    b.scatter(*zip(*times), label="step time", color="tab:green")
    for ax, pairs, title, unit in ((a, memory, "Memory per rank", "MiB"), (b, times, "Step time", "s")):
        _identity(ax, [v for pair in pairs for v in pair])
        ax.set(title=title, xlabel=f"predicted ({unit})", ylabel=f"measured ({unit})", xscale="log", yscale="log")
        ax.grid(alpha=0.3)
        ax.legend()
    return _save(fig, directory / "predicted_vs_measured.png")


def _warmup(ok: list[tuple[dict, str]], directory: Path) -> Path:
    import matplotlib.pyplot as plt

    curves: dict[tuple, list[str]] = defaultdict(list)  # one line per distinct schedule
    for r, label in ok:
        sizes = r["metrics"]["global_batch_sizes"]
        consumed = [0]
        for size in sizes[:-1]:
            consumed.append(consumed[-1] + size * r["config"]["model"]["seq_len"])
        curves[(tuple(consumed), tuple(sizes))].append(label)
    fig, ax = plt.subplots(figsize=(8, 5))
    for (consumed, sizes), labels in curves.items():
        label = labels[0] if len(labels) == 1 else f"{len(labels)} trials, e.g. {labels[0]}"
        ax.step(consumed, sizes, where="post", marker=".", label=label[:90])
    ax.set(title="Global batch per optimizer step", xlabel="tokens consumed", ylabel="global batch (sequences)")
    ax.grid(alpha=0.3)
    if len(curves) <= 10:
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=1, frameon=False)
    return _save(fig, directory / "warmup.png")


def _identity(ax, values: list[float]) -> None:
    positive = [v for v in values if v > 0] or [1.0]
    lo, hi = min(positive) / 1.5, max(positive) * 1.5
    ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", linewidth=1, label="measured = predicted")


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path
