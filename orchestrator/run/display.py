"""What the terminal shows of what ran: a trial's progress and result, the report's table,
trials' states, a calibration's fit, measured links and network tables; and the formatters
(gib, percent, trial_label) that plan_display.py, the plan's side, shares.

A measured figure is shown with how it was measured; a predicted one is labelled so.
"""

from __future__ import annotations

import math
import sys

from rich.console import Console
from rich.table import Table

from orchestrator.config import GIB
from orchestrator.core.files import real_number
from orchestrator.hardware_presets import calibrated_name
from orchestrator.plan.prediction import planned_for_timed_steps
from orchestrator.records.trial_dir import TrialPaths
from orchestrator.spec import TrialSpec
from orchestrator.workload.rank_steps import exposed_line, per_rank_line, planned_exposed, straggler_line


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    # Piped output keeps whole table rows rather than 80-column wrapping.
    return Console(file=stream, width=None if stream.isatty() else 140, highlight=False)


def gib(x: float) -> str:
    return f"{x / GIB:,.2f}"


def percent(x: float | None) -> str:
    """MFU and the like; None where there is no published peak to divide by."""
    return "unknown" if x is None else f"{x:.1%}"


def human_bytes(x: float, digits: str = ",.2f") -> str:
    """Bytes in the largest binary unit they reach, formatted with `digits` (a size of a
    table's range: "g", 16 MiB)."""
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= size:
            return f"{x / size:{digits}} {unit}"
    return f"{x:,.0f} B"


def trial_label(spec: TrialSpec) -> str:
    c = spec.cfg
    engine = "" if c.engine.name == "deepspeed" else f"engine={c.engine.name} "
    replicate = f" replicate={spec.layout.replicate} (shard {spec.layout.shard})" if spec.layout.hybrid else ""
    hardware = calibrated_name(c.hardware.name) if c.hardware.calibrated_on else c.hardware.name
    return (
        f"model={spec.choices.get('model')} {engine}zero.stage={c.zero.stage} recompute={c.recompute.mode} "
        f"dp={spec.dp}{replicate} hardware={hardware} precision={spec.precision}"
    )


def show_progress(p: dict, out: Console) -> None:
    timing = "" if p["timed"] else "  (timing warm-up)"
    loss = f"{p['loss']:.4f}" if math.isfinite(p["loss"]) else f"[bold red]{p['loss']} (not finite)[/bold red]"
    out.print(
        f"  step {p['step'] + 1}/{p['steps']}  loss {loss}  batch {p['global_batch_size']}  "
        f"{p['step_time_s']:.3f} s  {p['tokens_per_sec_per_gpu']:,.0f} tokens/s/GPU{timing}"
    )


def show_result(result: dict, trial_dir, out: Console) -> None:
    status = result.get("status")
    colour = "green" if status == "ok" else "red"
    out.print(f"[bold {colour}]{status}[/bold {colour}]  {TrialPaths(trial_dir).result}")
    if isinstance(e := result.get("error"), dict) and e:
        rank = f" on rank {e['rank']}" if e.get("rank") is not None else ""
        out.print(f"  {e.get('type')}{rank}: {e.get('message')}")
    m, plan = result.get("metrics"), result.get("plan") or {}
    if not m:
        return
    if m.get("nonfinite_loss_steps"):
        steps = m["nonfinite_loss_steps"]
        out.print(
            f"  [bold red]warning:[/bold red] the loss was not finite at {len(steps)} step(s), first at step "
            f"{steps[0] + 1} (result.json: metrics.nonfinite_loss_steps)"
        )
    table = Table(title="Measured, with the plan's prediction beside it", title_justify="left")
    for name in ("", "measured", "predicted"):
        table.add_column(name, justify="right" if name else "left")
    pm = plan.get("memory", {})
    # the plan's figures for the steps that were timed, each at its own global batch
    pt = planned_for_timed_steps(plan, m.get("history")) if plan.get("time") and plan.get("batch") else {}
    table.add_row(
        "tokens/s/GPU", f"{m['tokens_per_sec_per_gpu']:,.0f}", f"{pt.get('tokens_per_sec_per_gpu') or 0:,.0f}"
    )
    table.add_row(
        "step time",
        f"{m['step_time_s']:.4g} s" + _interval(m.get("step_time_spread")),
        f"{pt.get('step_s', 0):.4g} s" + ("" if pt.get("at_full_batch", True) else " (at the timed steps' batch)"),
    )
    table.add_row(
        "MFU / HFU",
        f"{percent(m['mfu'])} / {percent(m['hfu'])}",
        f"{percent(pt.get('mfu'))} / {percent(pt.get('hfu'))}",
    )
    mem = m["memory"]
    table.add_row("activations", human_bytes(mem["activation_bytes"] or 0), human_bytes(pm.get("activations", 0)))
    table.add_row("static (between steps)", human_bytes(mem["static_bytes"] or 0), human_bytes(pm.get("static", 0)))
    table.add_row("peak", human_bytes(mem["peak_bytes"]), human_bytes(pm.get("total", 0)))
    if mem.get("live_peak_bytes"):  # a CPU's allocator count, against the plan less the Python process
        table.add_row(
            "peak of live tensors",
            human_bytes(mem["live_peak_bytes"]),
            human_bytes(pm.get("total", 0) - pm.get("runtime", 0)),
        )
    exposed = (m.get("ranks") or {}).get("exposed_comm") or {}
    if real_number(exposed.get("exposed_s")) is not None:
        planned = planned_exposed(plan)[0]
        table.add_row(
            "exposed communication",
            f"{exposed['exposed_s'] * 1e3:.3g} ms",
            "" if planned is None else f"{planned * 1e3:.3g} ms",
        )
    table.add_row("loss", f"{_loss(m['loss_first'])} -> {_loss(m['loss_last'])}", "")
    out.print(table)
    if m.get("noisy"):
        out.print(f"  [bold yellow]noisy:[/bold yellow] {m['noisy']}")
    if line := straggler_line(m.get("ranks")):
        out.print(f"  [bold yellow]{line}[/bold yellow]", highlight=False)
    if line := per_rank_line(m.get("ranks")):
        out.print(f"  [dim]{line}[/dim]", highlight=False)
    if line := exposed_line(m.get("ranks"), plan):
        out.print(f"  [dim]{line}[/dim]", highlight=False)
    spread = m.get("step_time_spread") or {}
    out.print(
        f"[dim]peak for MFU: {m['peak_tflops']:.4g} TFLOPS ({m['peak_source']}); the median of {m['timed_steps']} "
        f"timed steps of {m['steps']}"
        + (f", in brackets its interval ({spread['confidence']:.0%} confidence)" if _interval(spread) else "")
        + f"; peak memory: {mem['peak_source']}"
        + (
            f"; live tensors: {mem['live_peak_source']}, reached in "
            f"{' > '.join((mem.get('live_peak_at') or '?').split(' > ')[-2:])}"
            if mem.get("live_peak_bytes")
            else ""
        )
        + "[/dim]"
    )


LABEL_MAX = 48  # a trial's name longer than this is listed under its table, whole


def _short_labels(labels: list[str]) -> tuple[list[str], list[str]]:
    """(what the table shows, the lines under it): a long trial name (a deep path, a sweep
    point named by many overrides) would wrap mid-name in a table and could not be copied;
    it shows as [n] there and whole, on one line, below."""
    shown: list[str] = []
    below: list[str] = []
    for label in labels:
        if len(label) <= LABEL_MAX:
            shown.append(label)
        else:
            below.append(f"[{len(below) + 1}] {label}")
            shown.append(f"[{len(below)}]")
    return shown, below


def _print_below(lines: list[str], out: Console) -> None:
    for line in lines:  # soft_wrap: no line break inserted, so the terminal's copy is the whole path
        out.print(line, soft_wrap=True, markup=False, highlight=False)


def show_report(rows: list[dict], columns: tuple[str, ...], out: Console) -> None:
    """The report's table: swept values (a row's keys other than the report's `columns`),
    then measured and predicted figures."""
    fixed = {"trial", *columns}
    swept = [k for k in rows[0] if k not in fixed]
    calibrated = any(r.get("calibrated_step_s") is not None for r in rows)
    exposed = any(r.get("exposed_comm_s") is not None for r in rows)
    straggling = any(r.get("straggler") for r in rows)
    table = Table(
        title=f"{len(rows)} trials, best tokens/s/GPU first (predicted = the plan"
        + ("; calibrated = the preset `orchestrator calibrate` fitted)" if calibrated else ")"),
        title_justify="left",
    )
    for name in (
        "trial",
        "status",
        *swept,
        "tokens/s/GPU",
        "vs best",
        "host busy",
        "MFU",
        "HFU",
        "step s",
        "interval",
        "predicted s",
        *(["calibrated s"] if calibrated else []),
        "peak",
        "predicted peak",
        *(["exposed ms (plan)"] if exposed else []),
        *(["straggler"] if straggling else []),
        "cause",
    ):
        table.add_column(name, justify="left" if name in ("trial", "status", "cause") else "right")
    labels, below = _short_labels([r["trial"] for r in rows])
    for r, label in zip(rows, labels):

        def num(key, fmt, r=r):
            return "" if r.get(key) is None else fmt.format(r[key])

        table.add_row(
            label,
            r["status"] + (", noisy" if r.get("noisy") else ""),
            *[str(r.get(k, "")) for k in swept],
            num("tokens_per_sec_per_gpu", "{:,.0f}"),
            r.get("vs_best", ""),
            r.get("host_busy", ""),
            num("mfu", "{:.1%}"),
            num("hfu", "{:.1%}"),
            num("step_time_s", "{:.4g}"),
            r.get("step_time_interval", ""),
            num("predicted_step_s", "{:.4g}"),
            *([num("calibrated_step_s", "{:.4g}")] if calibrated else []),
            human_bytes(r["peak_bytes"]) if r.get("peak_bytes") else "",
            human_bytes(r["predicted_peak_bytes"]) if r.get("predicted_peak_bytes") else "",
            *([_exposed_cell(r)] if exposed else []),
            *([r.get("straggler", "")] if straggling else []),
            r["error"],
        )
    out.print(table)
    _print_below(below, out)


def _exposed_cell(r: dict) -> str:
    """Exposed communication a step, measured (the plan's), in ms."""
    measured, planned = r.get("exposed_comm_s"), r.get("predicted_exposed_comm_s")
    if measured is None:
        return ""
    return f"{measured * 1e3:.3g}" + ("" if planned is None else f" ({planned * 1e3:.3g})")


def _interval(spread: dict | None) -> str:
    """' [low-high]': the median's interval, where there is one to give."""
    if not spread or spread["n"] < 2:
        return ""
    return f" [{spread['ci_low']:.4g}-{spread['ci_high']:.4g}]"


def _loss(value: float | None) -> str:
    return "not finite" if value is None or not math.isfinite(value) else f"{value:.4f}"  # null in strict JSON


def show_states(rows: list[tuple[str, str, str, str, str]], out: Console) -> None:
    """`orchestrator status`: (trial, SLURM job, state, cause, straggler) a row."""
    table = Table(title="Trials", title_justify="left")
    for name in ("trial", "SLURM job", "state", "cause", "straggler (others wait a step)"):
        table.add_column(name)
    labels, below = _short_labels([row[0] for row in rows])
    for row, label in zip(rows, labels):
        colour = {"ok": "green", "failed": "red", "oom": "red", "timeout": "red"}.get(row[2])
        table.add_row(label, row[1], f"[{colour}]{row[2]}[/{colour}]" if colour else row[2], row[3], row[4])
    out.print(table)
    _print_below(below, out)


def show_calibration(c, out: Console) -> None:
    """`orchestrator calibrate`: the fitted parameters and predicted / measured step time per trial."""
    within = lambda ratios: sum(abs(r - 1) <= 0.25 for r in ratios)  # noqa: E731
    table = Table(title=f"{c.hardware}: step time predicted / measured, {len(c.trials)} trials", title_justify="left")
    for name in ("trial", "measured s", "before", "after"):
        table.add_column(name, justify="right" if name != "trial" else "left")
    for t, before, after in zip(c.trials, c.before, c.after):
        table.add_row(" ".join(t.spec.overrides)[:70] or t.source, f"{t.step_s:.4g}", f"{before:.2f}", f"{after:.2f}")
    out.print(table)
    out.print(f"within +-25 %: {within(c.before)} of {len(c.trials)} before, {within(c.after)} after")
    out.print("fitted: " + (", ".join(f"hardware.{k}={c.params[k]:.3g}" for k in c.fitted) or "nothing"))
    if c.not_determined:
        out.print(
            f"not determined by these {len(c.trials)} trials, kept at the preset's values: "
            + ", ".join(f"hardware.{k}={c.params[k]:.3g}" for k in c.not_determined)
            + " (trials that differ in what these govern would determine them)"
        )
    if c.at_bound:
        out.print(
            "[yellow]at the edge of its range[/yellow] (the model cannot explain these trials within it): "
            + ", ".join(f"hardware.{k}={c.params[k]:.3g}" for k in c.at_bound)
        )
    out.print(f"wrote {c.preset_path} (hardware=auto now picks it; or choose hardware={c.preset_path.stem})")


def show_links(rows: list, predicted: list[float], inside, between, out: Console) -> None:
    """`calibrate --links`: each measurement as nccl-tests prints it, and the fitted levels."""
    table = Table(title="Collectives, measured (algbw, busbw as nccl-tests defines them)", title_justify="left")
    for name in ("op", "ranks", "nodes", "MB", "time ms", "algbw GB/s", "busbw GB/s", "fitted / measured"):
        table.add_column(name, justify="left" if name == "op" else "right")
    for m, p in zip(rows, predicted):
        table.add_row(
            m.op,
            str(m.ranks),
            str(m.nodes),
            f"{m.bytes / 2**20:,.0f}",
            f"{m.seconds * 1e3:.3g}",
            f"{m.algbw / 1e9:.4g}",
            f"{m.busbw / 1e9:.4g}",
            f"{p / m.seconds:.2f}" if m.seconds else "",
        )
    out.print(table)
    out.print(
        f"inside a node: {inside.busbw / 1e9:.4g} GB/s busbw, {inside.latency * 1e6:.3g} us a hop"
        + (
            f"; between nodes: {between.busbw / 1e9:.4g} GB/s busbw, {between.latency * 1e6:.3g} us a hop"
            if between
            else ""
        )
    )


def show_bus_table(table, out: Console) -> None:
    """A network table as the plan will read it: bus bandwidth per collective and node count."""
    t = Table(title="Network table: bus bandwidth (GB/s) by message size", title_justify="left")
    for name in ("collective", "nodes", "ranks per node", "sizes", "busbw smallest", "busbw largest", "busbw max"):
        t.add_column(name, justify="left" if name == "collective" else "right")
    for (op, nodes, rpn), curve in sorted(table.curves.items()):
        t.add_row(
            op,
            str(nodes),
            str(rpn),
            f"{human_bytes(curve[0][0], 'g')}-{human_bytes(curve[-1][0], 'g')} ({len(curve)})",
            f"{curve[0][1] / 1e9:.4g}",
            f"{curve[-1][1] / 1e9:.4g}",
            f"{max(b for _, b in curve) / 1e9:.4g}",
        )
    out.print(t)
