"""What the terminal shows: rich tables for a plan and for a sweep of plans.

Every figure printed here is a prediction, and the titles say so; the assumptions the
plan rests on are printed under it.
"""

from __future__ import annotations

import math
import sys

from rich.console import Console
from rich.table import Table

from orchestrator.compose import swept_values
from orchestrator.config import Sharding, runs_as
from orchestrator.hardware import calibrated_name
from orchestrator.plan.memory import GIB
from orchestrator.plan.prediction import HELD_OUT_ERROR, Plan, planned_for_timed_steps
from orchestrator.spec import TrialSpec
from orchestrator.trial_dir import TrialPaths


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
    return (f"model={spec.choices.get('model')} {engine}zero.stage={c.zero.stage} recompute={c.recompute.mode} "
            f"dp={spec.dp} hardware={calibrated_name(c.hardware.name) if c.hardware.calibrated_on else c.hardware.name} "
            f"precision={spec.precision}")


def _host_memory_cells(h) -> tuple[str, str]:
    """A GPU trial's host memory on one node (plan/host_memory.py): the figure and its note."""
    what = ("its share of the model, as zero.Init builds it" if h.partitioned else "the whole model as built, fp32") \
        + (", then what offload keeps" if h.offloaded else "")
    verdict = "unchecked" if h.capacity is None else "[green]fits[/green]" if h.fits else "[red]DOES NOT FIT[/red]"
    return gib(h.per_node), (f"{h.ranks_per_node} rank(s) x {gib(h.per_rank)} ({what}, and the process); "
                             + (f"of {gib(h.capacity)}, {h.capacity_source}: {verdict}" if h.capacity is not None
                                else f"{verdict}: {h.capacity_source}"))


def show_plan(spec: TrialSpec, plan: Plan, out: Console) -> None:
    m, t = plan.memory, plan.time
    out.print(f"[bold]Plan (predicted)[/bold]  {trial_label(spec)}")
    out.print(f"{plan.parameters / 1e9:.3f} B parameters; {spec.world_size} ranks on {spec.nodes} node(s) x "
              f"{spec.gpus_per_node}; micro {spec.micro_batch_size} x grad-accum {spec.grad_accum_steps} x dp {spec.dp} "
              f"= global {spec.global_batch_size} sequences = {spec.tokens_per_step:,} tokens/step")

    mem = Table(title=f"Memory per rank at the peak ({m.peak_phase}), predicted", title_justify="left")
    mem.add_column("component")
    mem.add_column("GiB", justify="right")
    mem.add_column("note")
    z = spec.cfg.zero
    fsdp = runs_as(spec.cfg.engine.backend, z.stage) == Sharding.fsdp2
    sharding = (f"FSDP2 fp32 shards, computing in {spec.precision}, " + ("resharded after forward" if z.stage == 3
                else "kept from forward to backward")) if fsdp else f"ZeRO stage {z.stage}, {spec.precision}"
    rows = [("parameters", m.params, sharding),
            ("gradients", m.grads, ("unsharded, accumulated across micro batches" if spec.grad_accum_steps > 1 else
                                    "the root's, unsharded during backward") + "; fp32 shards at the step" if fsdp else ""),
            ("optimizer states", m.optimizer, "Adam moments (the shards are the master weights)" if fsdp
             else "fp32 master + Adam moments"),
            ("activations", m.activations, f"micro batch {spec.micro_batch_size}, recompute {spec.cfg.recompute.mode}, "
                                           f"{spec.cfg.model.attention} attention"),
            ("recomputed block", m.recompute, "rebuilt one block at a time during backward" +
             ("" if m.peak_phase == "backward" else "; not alive at the peak")),
            ("loss backward", m.loss_backward, "fp32 gradients of nll_loss and log_softmax, at backward's start" +
             ("" if m.peak_phase == "loss backward" else "; not alive at the peak")),
            ("buffers", m.buffers - m.untouched, "unsharded root and blocks in flight, a block's gradients" if fsdp
             else "reduce buckets" + (", gathered parameters" if z.stage == 3 else "")),
            ("optimizer step", m.optimizer_step + m.optimizer_temporaries,
             "fp32 gradient copy and AdamW's temporaries inside step()" +
             ("" if m.peak_phase == "optimizer step" else "; not alive at the peak")),
            ("runtime", m.runtime, "CUDA context + NCCL" if spec.cfg.hardware.device.is_gpu else "Python process")]
    for name, value, note in rows:
        mem.add_row(name, gib(value), note)
    if m.offloaded:
        mem.add_row("offloaded to host", gib(m.offloaded), "not on the device")
    verdict = "[green]fits[/green]" if m.fits else "[red]DOES NOT FIT[/red]"
    mem.add_row("[bold]total[/bold]", f"[bold]{gib(m.total)}[/bold]",
                f"of {gib(m.capacity)} capacity: {verdict} ({m.total / m.capacity:.0%})"
                + (f"; buffers hold {gib(m.untouched)} GiB more allocated but never written, which a CPU "
                   "does not commit" if m.untouched else ""))
    mem.add_row("[dim]= at the peak[/dim]", "", "[dim]" + " + ".join(f"{name} {gib(v)}" for name, v in m.at_peak())
                + " (the rows above are each one's own figure; not all are alive at once)[/dim]")
    mem.add_row("[dim]between steps[/dim]", f"[dim]{gib(m.static - m.untouched_static)}[/dim]",
                "[dim]model states and kept buffers, as after step()[/dim]")
    if plan.host_memory is not None:
        mem.add_row("host, per node", *_host_memory_cells(plan.host_memory))
    out.print(mem)

    mb = t.micro_batch
    tt = Table(title="Time per optimizer step, predicted", title_justify="left")
    tt.add_column("")
    tt.add_column("value", justify="right")
    tt.add_column("note")
    tt.add_row("compute", f"{t.compute_s:.4g} s", f"{spec.grad_accum_steps} micro batch(es) of {mb.total_s:.4g} s:")
    how = "timed on this device" if mb.timed else None
    for name, value, note in [("  GEMMs", mb.gemm_s, how or "shape-aware roofline"),
                              ("  attention", mb.attention_s, f"{spec.cfg.model.attention}, {how or 'its own rate'}"),
                              ("  memory-bound", mb.memory_bound_s, f"norms, activations, adds, loss{', ' + how if how else ''}"),
                              ("  fixed per kernel", mb.overhead_s,
                               f"{mb.kernels} kernels" + ("; in each timed kernel's time" if how else "")),
                              *([("  host issuing", mb.host_wait_s, f"the device waits for its host, which takes "
                                  f"{mb.host_s:.4g} s to issue the kernels" + (" and run the engine's hooks" if mb.timed
                                  else f" ({mb.kernels} at hardware.host_op_us)"))]
                                if mb.host_wait_s > 0 else []),
                              *([("  between kernels", mb.between_s, "autograd, dispatch, modules' Python: a real "
                                  "block and the model's ends timed whole, less their kernels" if mb.between_s >= 0 else
                                  "below 0: the kernels timed alone sum to more than the real block and the model's "
                                  "ends timed whole; the plan keeps the whole")]
                                if mb.between_s is not None else []),
                              *([("  engine", mb.engine_s, "the engine's hooks and buckets, timed as it runs them"
                                  + ("; on the host, beside the device (not added)" if mb.host_s else ""))]
                                if mb.engine_s else [])]:
        tt.add_row(name, f"{value:.4g} s", f"{value / mb.total_s:.0%} of a micro batch; {note}")
    tt.add_row("communication", f"{t.comm_s:.4g} s", f"{t.exposed_comm_s:.4g} s exposed")
    tt.add_row("optimizer step", f"{t.optimizer_s:.4g} s", t.optimizer_source or "memory-bound")
    tt.add_row("step", f"{t.step_s:.4g} s", "")
    tt.add_row("tokens/s/GPU", f"{t.tokens_per_sec_per_gpu:,.0f}", "")
    tt.add_row("MFU / HFU", f"{percent(t.mfu)} / {percent(t.hfu)}", "" if t.mfu is not None else "no published peak")
    tt.add_row("model FLOPs/token", f"{plan.flops.model_per_token:.4g}", f"attention: {plan.flops.attention_flops}")
    out.print(tt)
    if any(c.calls for c in plan.comm.collectives):
        out.print(comm_table(plan))
        for c in plan.comm.collectives:
            if c.busbw_note:
                out.print(f"[dim]{c.op}, {c.phase}: busbw {c.busbw_note}[/dim]")
    for w in plan.warnings:
        out.print(f"[yellow]warning:[/yellow] {w}")
    out.print("[dim]assumptions: " + "; ".join(plan.assumptions) + "[/dim]")


def comm_table(plan: Plan) -> Table:
    """Each kind of collective a step makes: where, how NCCL (gloo) runs it, what it costs."""
    table = Table(title="Communication per step, predicted", title_justify="left")
    for name in ("collective", "when", "level", "algorithm", "calls", "MB a call", "on the wire", "GB a rank",
                 "busbw GB/s", "time s", "exposed s"):
        table.add_column(name, justify="left" if name in ("collective", "when", "level", "algorithm") else "right")
    for c in plan.comm.collectives:
        table.add_row(c.op, c.phase, c.level, c.algorithm, f"{c.calls:,}", f"{c.bytes_per_call / 1e6:,.1f}",
                      f"{c.dtype_bytes} B/elem", f"{c.bytes_per_rank / 1e9:.3g}", f"{c.busbw_gbps:,.4g}",
                      f"{c.time_s:.3g}", f"{c.exposed_s:.3g}")
    return table


def scaling_efficiency(points: list[tuple[TrialSpec, Plan]], swept: list[dict]) -> list[float | None]:
    """tokens/s/GPU against the smallest dp among the points that differ only in dp."""
    def others(values: dict) -> tuple:
        return tuple(sorted((k, v) for k, v in values.items() if k != "parallel.dp"))

    base: dict[tuple, tuple[int, float]] = {}
    for (spec, plan), values in zip(points, swept):
        key, dp = others(values), spec.dp
        if key not in base or dp < base[key][0]:
            base[key] = (dp, plan.time.tokens_per_sec_per_gpu)
    return [plan.time.tokens_per_sec_per_gpu / base[others(values)][1] if base[others(values)][1] else None
            for (_, plan), values in zip(points, swept)]


def show_sweep(points: list[tuple[TrialSpec, Plan]], out: Console) -> None:
    """One row per point: where memory runs out and where scaling stops paying."""
    swept = swept_values([spec.overrides for spec, _ in points])
    keys = list(swept[0]) or ["overrides"]
    table = Table(title=f"Sweep of {len(points)} plans, predicted", title_justify="left")
    for key in keys:
        table.add_column(key, justify="right")
    for name in ("memory GiB", "fits", "step s", "exposed comm s", "tokens/s/GPU", "vs best", "MFU", "scaling"):
        table.add_column(name, justify="right")
    efficiency = scaling_efficiency(points, swept)
    best = max((plan.time.tokens_per_sec_per_gpu for _, plan in points if plan.fits), default=0.0)
    for (spec, plan), values, eff in zip(points, swept, efficiency):
        t = plan.time
        table.add_row(*[values.get(k, " ".join(spec.overrides)) for k in keys], gib(plan.memory.total),
                      "yes" if plan.fits else "[red]no[/red]", f"{t.step_s:.4g}", f"{t.exposed_comm_s:.3g}",
                      f"{t.tokens_per_sec_per_gpu:,.0f}", _vs_best(plan, best), percent(t.mfu),
                      f"{eff:.0%}" if eff else "")
    out.print(table)
    if close := [values for (_, plan), values in zip(points, swept) if _within_error(plan, best)]:
        if len(close) > 1:
            labels = [" ".join(f"{k}={v}" for k, v in values.items()) for values in close]
            out.print(f"{len(close)} points are planned within {HELD_OUT_ERROR:.0%} of the best ({'; '.join(labels)}): "
                      "inside the plan's own error (its median miss on published runs it was not fitted on), so "
                      "the plan does not rank them; measure them (orchestrator run -m) to choose")
    for (spec, plan), values in zip(points, swept):
        if not plan.fits:  # the point's own way out, as a single plan would print it
            label = " ".join(f"{k}={v}" for k, v in values.items()) or " ".join(spec.overrides)
            out.print(f"[red]{label}[/red] does not fit; {plan.fitting_changes}")
    if "parallel.dp" in keys:
        out.print("[dim]scaling: tokens/s/GPU against the smallest dp of the same other values[/dim]")
    out.print("[dim]assumptions: " + "; ".join(points[0][1].assumptions) + "[/dim]")


def _within_error(plan: Plan, best: float) -> bool:
    """A fitting plan whose tokens/s/GPU is within the plan's own error of the best one."""
    return plan.fits and best > 0 and plan.time.tokens_per_sec_per_gpu >= best * (1 - HELD_OUT_ERROR)


def _vs_best(plan: Plan, best: float) -> str:
    if not plan.fits or not best:
        return ""
    share = plan.time.tokens_per_sec_per_gpu / best
    return f"{share:.0%}" + (" ~" if _within_error(plan, best) else "")


def show_progress(p: dict, out: Console) -> None:
    timing = "" if p["timed"] else "  (timing warm-up)"
    loss = f"{p['loss']:.4f}" if math.isfinite(p["loss"]) else f"[bold red]{p['loss']} (not finite)[/bold red]"
    out.print(f"  step {p['step'] + 1}/{p['steps']}  loss {loss}  batch {p['global_batch_size']}  "
              f"{p['step_time_s']:.3f} s  {p['tokens_per_sec_per_gpu']:,.0f} tokens/s/GPU{timing}")


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
        out.print(f"  [bold red]warning:[/bold red] the loss was not finite at {len(steps)} step(s), first at step "
                  f"{steps[0] + 1} (result.json: metrics.nonfinite_loss_steps)")
    table = Table(title="Measured, with the plan's prediction beside it", title_justify="left")
    for name in ("", "measured", "predicted"):
        table.add_column(name, justify="right" if name else "left")
    pm = plan.get("memory", {})
    # the plan's figures for the steps that were timed, each at its own global batch
    pt = planned_for_timed_steps(plan, m.get("history")) if plan.get("time") and plan.get("batch") else {}
    table.add_row("tokens/s/GPU", f"{m['tokens_per_sec_per_gpu']:,.0f}", f"{pt.get('tokens_per_sec_per_gpu') or 0:,.0f}")
    table.add_row("step time", f"{m['step_time_s']:.4g} s" + _interval(m.get("step_time_spread")),
                  f"{pt.get('step_s', 0):.4g} s" + ("" if pt.get("at_full_batch", True) else " (at the timed steps' batch)"))
    table.add_row("MFU / HFU", f"{percent(m['mfu'])} / {percent(m['hfu'])}",
                  f"{percent(pt.get('mfu'))} / {percent(pt.get('hfu'))}")
    mem = m["memory"]
    table.add_row("activations", human_bytes(mem["activation_bytes"] or 0), human_bytes(pm.get("activations", 0)))
    table.add_row("static (between steps)", human_bytes(mem["static_bytes"] or 0), human_bytes(pm.get("static", 0)))
    table.add_row("peak", human_bytes(mem["peak_bytes"]), human_bytes(pm.get("total", 0)))
    if mem.get("live_peak_bytes"):  # a CPU's allocator count, against the plan less the Python process
        table.add_row("peak of live tensors", human_bytes(mem["live_peak_bytes"]),
                      human_bytes(pm.get("total", 0) - pm.get("runtime", 0)))
    table.add_row("loss", f"{_loss(m['loss_first'])} -> {_loss(m['loss_last'])}", "")
    out.print(table)
    if m.get("noisy"):
        out.print(f"  [bold yellow]noisy:[/bold yellow] {m['noisy']}")
    spread = m.get("step_time_spread") or {}
    out.print(f"[dim]peak for MFU: {m['peak_tflops']:.4g} TFLOPS ({m['peak_source']}); the median of {m['timed_steps']} "
              f"timed steps of {m['steps']}" + (f", in brackets its interval ({spread['confidence']:.0%} confidence)"
                                               if _interval(spread) else "") + f"; peak memory: {mem['peak_source']}"
              + (f"; live tensors: {mem['live_peak_source']}, reached in {' > '.join((mem.get('live_peak_at') or '?').split(' > ')[-2:])}"
                 if mem.get("live_peak_bytes") else "") + "[/dim]")


LABEL_MAX = 48  # a trial's name longer than this is listed under its table, whole


def _short_labels(labels: list[str]) -> tuple[list[str], list[str]]:
    """(what the table shows, the lines under it): a long trial name (a deep path, a sweep
    point named by many overrides) would wrap mid-name in a table and could not be copied;
    it shows as [n] there and whole, on one line, below."""
    shown, below = [], []
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
    table = Table(title=f"{len(rows)} trials, best tokens/s/GPU first (predicted = the plan"
                  + ("; calibrated = the preset `orchestrator calibrate` fitted)" if calibrated else ")"), title_justify="left")
    for name in ("trial", "status", *swept, "tokens/s/GPU", "vs best", "host busy", "MFU", "HFU", "step s",
                 "interval", "predicted s", *(["calibrated s"] if calibrated else []), "peak", "predicted peak", "cause"):
        table.add_column(name, justify="left" if name in ("trial", "status", "cause") else "right")
    labels, below = _short_labels([r["trial"] for r in rows])
    for r, label in zip(rows, labels):
        def num(key, fmt):
            return "" if r.get(key) is None else fmt.format(r[key])
        table.add_row(label, r["status"] + (", noisy" if r.get("noisy") else ""), *[str(r.get(k, "")) for k in swept],
                      num("tokens_per_sec_per_gpu", "{:,.0f}"), r.get("vs_best", ""), r.get("host_busy", ""),
                      num("mfu", "{:.1%}"), num("hfu", "{:.1%}"), num("step_time_s", "{:.4g}"),
                      r.get("step_time_interval", ""), num("predicted_step_s", "{:.4g}"),
                      *([num("calibrated_step_s", "{:.4g}")] if calibrated else []),
                      human_bytes(r["peak_bytes"]) if r.get("peak_bytes") else "",
                      human_bytes(r["predicted_peak_bytes"]) if r.get("predicted_peak_bytes") else "", r["error"])
    out.print(table)
    _print_below(below, out)


def _interval(spread: dict | None) -> str:
    """' [low-high]': the median's interval, where there is one to give."""
    if not spread or spread["n"] < 2:
        return ""
    return f" [{spread['ci_low']:.4g}-{spread['ci_high']:.4g}]"


def _loss(value: float | None) -> str:
    return "not finite" if value is None or not math.isfinite(value) else f"{value:.4f}"  # null in strict JSON


def show_states(rows: list[tuple[str, str, str, str]], out: Console) -> None:
    table = Table(title="Trials", title_justify="left")
    for name in ("trial", "SLURM job", "state", "cause"):
        table.add_column(name)
    labels, below = _short_labels([row[0] for row in rows])
    for row, label in zip(rows, labels):
        colour = {"ok": "green", "failed": "red", "oom": "red", "timeout": "red"}.get(row[2])
        table.add_row(label, row[1], f"[{colour}]{row[2]}[/{colour}]" if colour else row[2], row[3])
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
        out.print(f"not determined by these {len(c.trials)} trials, kept at the preset's values: "
                  + ", ".join(f"hardware.{k}={c.params[k]:.3g}" for k in c.not_determined)
                  + " (trials that differ in what these govern would determine them)")
    if c.at_bound:
        out.print("[yellow]at the edge of its range[/yellow] (the model cannot explain these trials within it): "
                  + ", ".join(f"hardware.{k}={c.params[k]:.3g}" for k in c.at_bound))
    out.print(f"wrote {c.preset_path} (hardware=auto now picks it; or choose hardware={c.preset_path.stem})")


def show_links(rows: list, predicted: list[float], inside, between, out: Console) -> None:
    """`calibrate --links`: each measurement as nccl-tests prints it, and the fitted levels."""
    table = Table(title="Collectives, measured (algbw, busbw as nccl-tests defines them)", title_justify="left")
    for name in ("op", "ranks", "nodes", "MB", "time ms", "algbw GB/s", "busbw GB/s", "fitted / measured"):
        table.add_column(name, justify="left" if name == "op" else "right")
    for m, p in zip(rows, predicted):
        table.add_row(m.op, str(m.ranks), str(m.nodes), f"{m.bytes / 2**20:,.0f}", f"{m.seconds * 1e3:.3g}",
                      f"{m.algbw / 1e9:.4g}", f"{m.busbw / 1e9:.4g}", f"{p / m.seconds:.2f}" if m.seconds else "")
    out.print(table)
    out.print(f"inside a node: {inside.busbw / 1e9:.4g} GB/s busbw, {inside.latency * 1e6:.3g} us a hop"
              + (f"; between nodes: {between.busbw / 1e9:.4g} GB/s busbw, {between.latency * 1e6:.3g} us a hop"
                 if between else ""))


def show_bus_table(table, out: Console) -> None:
    """A network table as the plan will read it: bus bandwidth per collective and node count."""
    t = Table(title="Network table: bus bandwidth (GB/s) by message size", title_justify="left")
    for name in ("collective", "nodes", "ranks per node", "sizes", "busbw smallest", "busbw largest", "busbw max"):
        t.add_column(name, justify="left" if name == "collective" else "right")
    for (op, nodes, rpn), curve in sorted(table.curves.items()):
        t.add_row(op, str(nodes), str(rpn), f"{human_bytes(curve[0][0], 'g')}-{human_bytes(curve[-1][0], 'g')} ({len(curve)})",
                  f"{curve[0][1] / 1e9:.4g}", f"{curve[-1][1] / 1e9:.4g}", f"{max(b for _, b in curve) / 1e9:.4g}")
    out.print(t)

