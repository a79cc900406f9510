"""Every plot the orchestrator draws: matplotlib, Agg backend, PNG files written atomically.

The report's (`orchestrator report DIR`):
  scaling.png                 tokens/s/GPU and MFU (with their interval and what it covers) and
                              scaling efficiency against DP degree, one line per configuration
  predicted_vs_measured.png   peak and activation memory, and step time, measured
                              against the plan, with the identity line
  warmup.png                  the global batch of every step against tokens consumed
  buckets.png                 step time and exposed communication against the reduce bucket
                              size, a line per configuration and node count that ran at several
                              bucket sizes, measured beside planned
and a tune's (tune.png): the search in the order it ran, and its predictions against
what was measured.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import Sharding, runs_as
from orchestrator.records.trial_dir import SweepPaths
from orchestrator.workload.rank_steps import measured_exposed, planned_exposed


def _pyplot():
    """matplotlib's pyplot on the Agg backend (files only, never a window), imported when a
    plot is drawn: its import costs a command that draws none (plan, run, status) a second."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def report_plots(results: list[dict], labels: list[str], paths: SweepPaths) -> list[Path]:
    """The report's three plots of the ok results. labels: what distinguishes each result
    (its swept values), for legends."""
    ok = [(r, label) for r, label in zip(results, labels) if r["status"] == "ok" and r.get("metrics")]
    if not ok:
        return []
    results_ok = [r for r, _ in ok]
    plots = [
        scaling_plot(ok, paths.scaling_png),
        predicted_vs_measured_plot(results_ok, paths.predicted_png),
        warmup_plot(ok, paths.warmup_png),
    ]
    points = [
        BucketPoint(
            series(r, label, "zero.reduce_bucket_size"),
            r["config"]["zero"]["reduce_bucket_size"],
            r["plan"]["time"]["step_s"],
            r["metrics"].get("step_time_s"),
            planned_exposed(r["plan"])[0],
            measured_exposed(r["metrics"].get("ranks")),
        )
        for r, label in ok
        if (r.get("plan") or {}).get("parallel")
        and (r.get("plan") or {}).get("time")
        and uses_reduce_buckets(r["config"])
    ]
    # a line is a configuration at several bucket sizes: one that ran at one size (an engine
    # beside another, each at its own default) compares no bucket sizes, and is not drawn
    buckets: dict[str, set[int]] = defaultdict(set)
    for point in points:
        buckets[point.series].add(point.bucket)
    if points := [p for p in points if len(buckets[p.series]) > 1]:
        plots.append(bucket_plot(points, paths.buckets_png))
    return plots


def uses_reduce_buckets(config: dict) -> bool:
    """FSDP2 reduce-scatters per block, whatever zero.reduce_bucket_size says: not a bucket point."""
    engine = config.get("engine") or {}
    backend = "fsdp" if engine.get("name") == "fsdp" else engine.get("backend", "deepspeed")
    return runs_as(backend, config["zero"]["stage"]) != Sharding.fsdp2


def series(result: dict, label: str, x_key: str) -> str:
    """The line a result belongs to, one per configuration: what tells it apart (label: its
    swept values), less the key on the x axis (dp 1 and dp 2 are two bucket lines, and two
    engines two scaling lines, not one)."""
    rest = [part for part in label.split(", ") if part and not part.startswith(f"{x_key}=")]
    if x_key == "zero.reduce_bucket_size":  # where buckets stop paying moves with the node count
        rest.append(f"{result['plan']['parallel']['nodes']} node(s)")
    return ", ".join(rest) or "the sweep"


def natural(text: str) -> list:
    """A sort key that orders numbers by value: dp=2 before dp=16, 4 node(s) before 32."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


@dataclass(frozen=True)
class BucketPoint:
    series: str  # the configuration and node count it belongs to: one line each
    bucket: int  # zero.reduce_bucket_size, elements
    predicted_s: float  # step time
    measured_s: float | None = None
    predicted_exposed_s: float | None = None  # communication a step not hidden under compute
    measured_exposed_s: float | None = None  # metrics.ranks.exposed_comm (workload/rank_steps.py)


def bucket_plot(points: list[BucketPoint], path: Path, title: str = "") -> Path:
    """Step time and, where the points have it, exposed communication against the reduce
    bucket size, a line per configuration and node count (the series): predicted (dashed)
    and measured (solid) where the trials ran. Where larger buckets stop paying is where a
    line stops falling; the exposed panel says whether it is communication that stopped."""
    lines: dict[str, list[BucketPoint]] = defaultdict(list)
    for p in points:
        lines[p.series].append(p)
    exposed = any(p.predicted_exposed_s is not None or p.measured_exposed_s is not None for p in points)
    fig, panels = _pyplot().subplots(1, 2 if exposed else 1, figsize=(13 if exposed else 7, 4.5), squeeze=False)
    figures = [("predicted_s", "measured_s", "step time (s)", 1.0)]
    if exposed:
        figures.append(("predicted_exposed_s", "measured_exposed_s", "exposed communication a step (ms)", 1e3))
    for ax, (planned, measured, ylabel, scale) in zip(panels[0], figures):
        for i, (name, line) in enumerate(sorted(lines.items(), key=lambda item: natural(item[0]))):
            line.sort(key=lambda p: p.bucket)
            for key, style, kind in ((planned, "--", "predicted"), (measured, "-", "measured")):
                xy = [(p.bucket, v * scale) for p in line if (v := getattr(p, key)) is not None]
                if xy:
                    marker = "x" if kind == "predicted" else "o"
                    ax.plot(*zip(*xy), linestyle=style, marker=marker, color=f"C{i % 10}", label=f"{name}, {kind}")
        ax.set_xscale("log")
        ax.set(xlabel="zero.reduce_bucket_size (elements)", ylabel=ylabel)
        ax.margins(x=0.08, y=0.12)
        ax.grid(alpha=0.3)
    panels[0][0].set_title(title or "Step time against the gradient bucket size")
    if exposed:
        panels[0][1].set_title("Exposed communication against the gradient bucket size")
    # one legend below the panels, off the data: the lines are the same series in each
    handles, labels = panels[0][0].get_legend_handles_labels()
    panels[0][0].legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    return save_figure(fig, path)


@dataclass(frozen=True)
class ScalingPoint:
    """One trial on the scaling plot: measured (the median with its interval) and planned."""

    dp: int
    tps: float  # tokens/s/GPU, the median of the timed steps
    low: float  # its interval
    high: float
    covered: float  # the interval's confidence (what the timed steps give)
    mfu: float | None  # None: no published peak for this GPU
    noisy: bool
    planned_tps: float | None
    planned_mfu: float | None

    @classmethod
    def of(cls, result: dict) -> ScalingPoint:
        plan, m = (result.get("plan") or {}).get("time") or {}, result["metrics"]
        spread = m.get("tokens_per_sec_per_gpu_spread") or {}
        tps = m["tokens_per_sec_per_gpu"]
        return cls(
            result["config"]["parallel"]["dp"],
            tps,
            spread.get("ci_low", tps),
            spread.get("ci_high", tps),
            spread.get("confidence", 0.0),
            m.get("mfu"),
            bool(m.get("noisy")),
            plan.get("tokens_per_sec_per_gpu"),
            plan.get("mfu"),
        )


ABOVE_100 = 100.5  # a scaling efficiency past this (past rounding) is marked: noise or another step, not a speed-up


def scaling_plot(ok: list[tuple[dict, str]], path: Path) -> Path:
    """tokens/s/GPU, MFU and scaling efficiency against the DP degree, a line per
    configuration (what tells the trials apart less dp; ok: results with their labels):
    measured (solid; the median with its interval as error bars, labelled with the confidence
    the steps give; MFU with the same interval, which it is in proportion to) and the plan's
    prediction for the same trials (dashed). A noisy trial is ringed in red; an efficiency
    above 100 % is marked red. Legends sit below the panels, never over the data."""
    lines: dict[str, list[ScalingPoint]] = defaultdict(list)
    for r, label in ok:
        lines[series(r, label, "parallel.dp")].append(ScalingPoint.of(r))
    fig, panels = _pyplot().subplots(1, 3, figsize=(15, 5.5))
    above = False
    for i, (name, points) in enumerate(sorted(lines.items(), key=lambda item: natural(item[0]))):
        points.sort(key=lambda p: p.dp)
        above = _draw_scaling_line(panels, name, points, f"C{i % 10}") or above
    if above:
        panels[2].axhline(
            100,
            color="grey",
            linestyle=":",
            linewidth=1,
            label="100 %: red above it is noise or another step, not a speed-up",
        )
    dps = sorted({r["config"]["parallel"]["dp"] for r, _ in ok})
    for ax, title, ylabel in zip(
        panels,
        ("Throughput per GPU", "Model FLOPs utilisation", "Scaling efficiency"),
        ("tokens/s/GPU", "MFU (%)", "tokens/s/GPU vs smallest DP (%)"),
    ):
        ax.set(title=title, xlabel="data-parallel degree (ranks)", ylabel=ylabel)
        ax.set_xscale("log", base=2)
        ax.set_xticks(dps, [str(d) for d in dps])
        ax.margins(x=0.12, y=0.15)  # room for the points' labels inside the axes
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    return save_figure(fig, path)


def _label_point(ax, text: str, x: float, y: float, colour: str, last: bool) -> None:
    """A point's figure beside it, to its left where it is a line's last (to its right it would
    run past the axes, over the next panel)."""
    ax.annotate(
        text,
        (x, y),
        textcoords="offset points",
        xytext=(-4, 4) if last else (4, 4),
        ha="right" if last else "left",
        fontsize=7,
        color=colour,
    )


def _known(values: list[float | None]) -> list[float] | None:
    """Every value, or None where one is unknown: a line is drawn whole or not at all."""
    return None if any(v is None for v in values) else [v for v in values if v is not None]


def _draw_scaling_line(panels, name: str, points: list[ScalingPoint], colour: str) -> bool:
    """One configuration's line on the three panels; whether an efficiency went above 100 %."""
    a, b, c = panels
    dp, tps = [p.dp for p in points], [p.tps for p in points]
    below, over = [max(0.0, p.tps - p.low) for p in points], [max(0.0, p.high - p.tps) for p in points]
    covered = [p.covered for p in points]
    # what the error bars cover is what the fewest timed steps give (four: 88 %), not a fixed 95 %
    bars = f"interval of the median, {min(covered):.0%}" + (
        f"-{max(covered):.0%}" if max(covered) > min(covered) else ""
    )
    a.errorbar(dp, tps, yerr=[below, over], marker="o", capsize=3, color=colour, label=f"{name}, measured ({bars})")
    for x, y in zip(dp, tps):
        _label_point(a, f"{y:,.0f}", x, y, colour, last=x == dp[-1])
    if rings := [(p.dp, p.tps) for p in points if p.noisy]:
        a.scatter(*zip(*rings), s=160, facecolors="none", edgecolors="red", label="noisy: its steps scatter")
    if (measured_mfu := _known([p.mfu for p in points])) is not None:  # tokens/s times a constant: alike scaled
        mfu = [100 * m for m in measured_mfu]
        b.errorbar(
            dp,
            mfu,
            yerr=[[m * d / t for m, d, t in zip(mfu, below, tps)], [m * u / t for m, u, t in zip(mfu, over, tps)]],
            marker="o",
            capsize=3,
            color=colour,
            label=f"{name}, measured ({bars})",
        )
    efficiency = [100 * t / tps[0] for t in tps]
    c.plot(dp, efficiency, marker="o", color=colour, label=f"{name}, measured")
    for x, e in zip(dp, efficiency):
        _label_point(c, f"{e:.0f} %", x, e, "red" if e > ABOVE_100 else colour, last=x == dp[-1])
    planned = _known([p.planned_tps for p in points])
    if planned and all(planned):
        a.plot(dp, planned, linestyle="--", marker="x", color=colour, label=f"{name}, predicted")
        if (planned_mfu := _known([p.planned_mfu for p in points])) is not None:
            b.plot(
                dp,
                [100 * m for m in planned_mfu],
                linestyle="--",
                marker="x",
                color=colour,
                label=f"{name}, predicted",
            )
        c.plot(
            dp,
            [100 * t / planned[0] for t in planned],
            linestyle="--",
            marker="x",
            color=colour,
            label=f"{name}, predicted",
        )
    return any(e > ABOVE_100 for e in efficiency)


def predicted_vs_measured_plot(ok: list[dict], path: Path) -> Path:
    """Peak and activation memory, and step time: measured against the plan, with the identity line."""
    fig, (a, b) = _pyplot().subplots(1, 2, figsize=(11, 5))
    memory = []
    for key, plan_key, label in (("peak_bytes", "total", "peak"), ("activation_bytes", "activations", "activations")):
        pairs = [
            (r["plan"]["memory"][plan_key] / 2**20, r["metrics"]["memory"][key] / 2**20)
            for r in ok
            if r.get("plan") and r["metrics"]["memory"].get(key)
        ]
        if pairs:
            a.scatter(*zip(*pairs), label=label)
            memory += pairs
    times = [(r["plan"]["time"]["step_s"], r["metrics"]["step_time_s"]) for r in ok if r.get("plan")]
    if times:  # results without a plan (an older or foreign result.json) have nothing to set against
        b.scatter(*zip(*times), label="step time", color="tab:green")
    for ax, pairs, title, unit in ((a, memory, "Memory per rank", "MiB"), (b, times, "Step time", "s")):
        identity_line(ax, [v for pair in pairs for v in pair])
        ax.set(title=title, xlabel=f"predicted ({unit})", ylabel=f"measured ({unit})", xscale="log", yscale="log")
        ax.grid(alpha=0.3)
        ax.legend()
    return save_figure(fig, path)


def warmup_plot(ok: list[tuple[dict, str]], path: Path) -> Path:
    """The global batch of every step against the tokens consumed, a line per distinct schedule."""
    curves: dict[tuple, list[str]] = defaultdict(list)  # one line per distinct schedule
    for r, label in ok:
        sizes = r["metrics"]["global_batch_sizes"]
        consumed = [0]
        for size in sizes[:-1]:
            consumed.append(consumed[-1] + size * r["config"]["model"]["seq_len"])
        curves[(tuple(consumed), tuple(sizes))].append(label)
    fig, ax = _pyplot().subplots(figsize=(8, 5))
    for (consumed, sizes), labels in curves.items():
        label = labels[0] if len(labels) == 1 else f"{len(labels)} trials, e.g. {labels[0]}"
        ax.step(consumed, sizes, where="post", marker=".", label=label[:90])
    ax.set(title="Global batch per optimizer step", xlabel="tokens consumed", ylabel="global batch (sequences)")
    ax.grid(alpha=0.3)
    if len(curves) <= 10:
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=1, frameon=False)
    return save_figure(fig, path)


def identity_line(ax, values: list[float]) -> None:
    positive = [v for v in values if v > 0] or [1.0]
    lo, hi = min(positive) / 1.5, max(positive) * 1.5
    ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", linewidth=1, label="measured = predicted")


def save_figure(fig, path: Path) -> Path:
    """The figure as a PNG, written atomically (a reader never sees half a file)."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")  # what sits outside the axes (legends, labels) is kept whole
    _pyplot().close(fig)
    tmp.replace(path)
    return path


def tune_plot(ran: list[dict], path: Path) -> Path:
    """A tune's search: measured tokens/s/GPU of the candidates in the order they ran, with
    the best so far; and predicted (plan, calibrated) against measured. ran: tune.json's
    rows of the candidates that ran, in that order."""
    fig, (a, b) = _pyplot().subplots(1, 2, figsize=(12, 4.5))
    best, running = 0.0, []
    for i, r in enumerate(ran):
        value = r["measured_tokens_per_sec_per_gpu"]
        a.scatter([i + 1], [value or 0], color="tab:blue" if value else "tab:red", marker="o" if value else "x")
        best = max(best, value or 0)
        running.append(best)
    a.step(range(1, len(ran) + 1), running, where="post", color="tab:green", label="best so far")
    a.set(title="The search", xlabel="candidate run (in order)", ylabel="measured tokens/s/GPU (x: failed / OOM)")
    values = []
    for key, label in (
        ("predicted_tokens_per_sec_per_gpu", "plan"),
        ("calibrated_tokens_per_sec_per_gpu", "calibrated"),
    ):
        pairs = [
            (r[key], r["measured_tokens_per_sec_per_gpu"])
            for r in ran
            if r[key] and r["measured_tokens_per_sec_per_gpu"]
        ]
        if pairs:
            b.scatter(*zip(*pairs), label=label)
            values += [v for p in pairs for v in p]
    identity_line(b, values)
    b.set(
        title="Predicted against measured",
        xlabel="predicted tokens/s/GPU",
        ylabel="measured tokens/s/GPU",
        xscale="log",
        yscale="log",
    )
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path)
