"""The plan in the terminal: a trial's plan (memory, time, communication) and a sweep of plans.

Every figure printed here is a prediction, and the titles say so; the assumptions the plan
rests on are printed under it. What was measured is display.py's.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from orchestrator.config import Sharding, runs_as
from orchestrator.hydra_glue.compose import swept_values
from orchestrator.plan.prediction import HELD_OUT_ERROR, Plan
from orchestrator.run.display import gib, percent, trial_label
from orchestrator.spec import TrialSpec


def _host_memory_cells(h) -> tuple[str, str]:
    """A GPU trial's host memory on one node (plan/host_memory.py): the figure and its note."""
    what = ("its share of the model, as zero.Init builds it" if h.partitioned else "the whole model as built, fp32") + (
        ", then what offload keeps" if h.offloaded else ""
    )
    verdict = "unchecked" if h.capacity is None else "[green]fits[/green]" if h.fits else "[red]DOES NOT FIT[/red]"
    return gib(h.per_node), (
        f"{h.ranks_per_node} rank(s) x {gib(h.per_rank)} ({what}, and the process); "
        + (
            f"of {gib(h.capacity)}, {h.capacity_source}: {verdict}"
            if h.capacity is not None
            else f"{verdict}: {h.capacity_source}"
        )
    )


def show_plan(spec: TrialSpec, plan: Plan, out: Console) -> None:
    out.print(f"[bold]Plan (predicted)[/bold]  {trial_label(spec)}")
    out.print(
        f"{plan.parameters / 1e9:.3f} B parameters; {spec.world_size} ranks on {spec.nodes} node(s) x "
        f"{spec.gpus_per_node}; micro {spec.micro_batch_size} x grad-accum {spec.grad_accum_steps} x dp {spec.dp} "
        f"= global {spec.global_batch_size} sequences = {spec.tokens_per_step:,} tokens/step"
    )
    out.print(memory_table(spec, plan))
    out.print(time_table(spec, plan))
    if any(c.calls for c in plan.comm.collectives):
        out.print(comm_table(plan))
        for c in plan.comm.collectives:
            if c.busbw_note:
                out.print(f"[dim]{c.op}, {c.phase}: busbw {c.busbw_note}[/dim]")
    for w in plan.warnings:
        out.print(f"[yellow]warning:[/yellow] {w}")
    out.print("[dim]assumptions: " + "; ".join(plan.assumptions) + "[/dim]")


def memory_table(spec: TrialSpec, plan: Plan) -> Table:
    """Each part of a rank's memory, the total against the device, and the host's share."""
    m = plan.memory
    mem = Table(title=f"Memory per rank at the peak ({m.peak_phase}), predicted", title_justify="left")
    mem.add_column("component")
    mem.add_column("GiB", justify="right")
    mem.add_column("note")
    for name, value, note in _memory_rows(spec, plan):
        mem.add_row(name, gib(value), note)
    if m.offloaded:
        mem.add_row("offloaded to host", gib(m.offloaded), "not on the device")
    verdict = "[green]fits[/green]" if m.fits else "[red]DOES NOT FIT[/red]"
    mem.add_row(
        "[bold]total[/bold]",
        f"[bold]{gib(m.total)}[/bold]",
        f"of {gib(m.capacity)} capacity: {verdict} ({m.total / m.capacity:.0%})"
        + (
            f"; buffers hold {gib(m.untouched)} GiB more allocated but never written, which a CPU does not commit"
            if m.untouched
            else ""
        ),
    )
    mem.add_row(
        "[dim]= at the peak[/dim]",
        "",
        "[dim]"
        + " + ".join(f"{name} {gib(v)}" for name, v in m.at_peak())
        + " (the rows above are each one's own figure; not all are alive at once)[/dim]",
    )
    mem.add_row(
        "[dim]between steps[/dim]",
        f"[dim]{gib(m.static - m.untouched_static)}[/dim]",
        "[dim]model states and kept buffers, as after step()[/dim]",
    )
    if plan.host_memory is not None:
        mem.add_row("host, per node", *_host_memory_cells(plan.host_memory))
    return mem


def _memory_rows(spec: TrialSpec, plan: Plan) -> list[tuple[str, float, str]]:
    m = plan.memory
    z = spec.cfg.zero
    fsdp = runs_as(spec.cfg.engine.backend, z.stage) == Sharding.fsdp2
    sharding = (
        (
            f"FSDP2 fp32 shards, computing in {spec.precision}, "
            + ("resharded after forward" if z.stage == 3 else "kept from forward to backward")
        )
        if fsdp
        else f"ZeRO stage {z.stage}, {spec.precision}"
    )
    return [
        ("parameters", m.params, sharding),
        (
            "gradients",
            m.grads,
            (
                "unsharded, accumulated across micro batches"
                if spec.grad_accum_steps > 1
                else "the root's, unsharded during backward"
            )
            + "; fp32 shards at the step"
            if fsdp
            else "",
        ),
        (
            "optimizer states",
            m.optimizer,
            "Adam moments (the shards are the master weights)" if fsdp else "fp32 master + Adam moments",
        ),
        (
            "activations",
            m.activations,
            f"micro batch {spec.micro_batch_size}, recompute {spec.cfg.recompute.mode}, "
            f"{spec.cfg.model.attention} attention",
        ),
        (
            "recomputed block",
            m.recompute,
            "rebuilt one block at a time during backward"
            + ("" if m.peak_phase == "backward" else "; not alive at the peak"),
        ),
        (
            "loss backward",
            m.loss_backward,
            "fp32 gradients of nll_loss and log_softmax, at backward's start"
            + ("" if m.peak_phase == "loss backward" else "; not alive at the peak"),
        ),
        (
            "buffers",
            m.buffers - m.untouched,
            "unsharded root and blocks in flight, a block's gradients"
            if fsdp
            else "reduce buckets" + (", gathered parameters" if z.stage == 3 else ""),
        ),
        (
            "optimizer step",
            m.optimizer_step + m.optimizer_temporaries,
            "fp32 gradient copy and AdamW's temporaries inside step()"
            + ("" if m.peak_phase == "optimizer step" else "; not alive at the peak"),
        ),
        ("runtime", m.runtime, "CUDA context + NCCL" if spec.cfg.hardware.device.is_gpu else "Python process"),
    ]


def time_table(spec: TrialSpec, plan: Plan) -> Table:
    """The step's time: a micro batch's parts, communication, the optimizer, and what they give."""
    t = plan.time
    mb = t.micro_batch
    tt = Table(title="Time per optimizer step, predicted", title_justify="left")
    tt.add_column("")
    tt.add_column("value", justify="right")
    tt.add_column("note")
    tt.add_row("compute", f"{t.compute_s:.4g} s", f"{spec.grad_accum_steps} micro batch(es) of {mb.total_s:.4g} s:")
    for name, value, note in _micro_batch_rows(spec, plan):
        tt.add_row(name, f"{value:.4g} s", f"{value / mb.total_s:.0%} of a micro batch; {note}")
    tt.add_row("communication", f"{t.comm_s:.4g} s", f"{t.exposed_comm_s:.4g} s exposed")
    tt.add_row("optimizer step", f"{t.optimizer_s:.4g} s", t.optimizer_source or "memory-bound")
    tt.add_row("step", f"{t.step_s:.4g} s", "")
    tt.add_row("tokens/s/GPU", f"{t.tokens_per_sec_per_gpu:,.0f}", "")
    tt.add_row("MFU / HFU", f"{percent(t.mfu)} / {percent(t.hfu)}", "" if t.mfu is not None else "no published peak")
    tt.add_row("model FLOPs/token", f"{plan.flops.model_per_token:.4g}", f"attention: {plan.flops.attention_flops}")
    return tt


def _micro_batch_rows(spec: TrialSpec, plan: Plan) -> list[tuple[str, float, str]]:
    mb = plan.time.micro_batch
    how = "timed on this device" if mb.timed else None
    return [
        ("  GEMMs", mb.gemm_s, how or "shape-aware roofline"),
        ("  attention", mb.attention_s, f"{spec.cfg.model.attention}, {how or 'its own rate'}"),
        ("  memory-bound", mb.memory_bound_s, f"norms, activations, adds, loss{', ' + how if how else ''}"),
        (
            "  fixed per kernel",
            mb.overhead_s,
            f"{mb.kernels} kernels" + ("; in each timed kernel's time" if how else ""),
        ),
        *(
            [
                (
                    "  host issuing",
                    mb.host_wait_s,
                    f"the device waits for its host, which takes "
                    f"{mb.host_s:.4g} s to issue the kernels"
                    + (" and run the engine's hooks" if mb.timed else f" ({mb.kernels} at hardware.host_op_us)"),
                )
            ]
            if mb.host_wait_s > 0
            else []
        ),
        *(
            [
                (
                    "  between kernels",
                    mb.between_s,
                    "autograd, dispatch, modules' Python: a real "
                    "block and the model's ends timed whole, less their kernels"
                    if mb.between_s >= 0
                    else "below 0: the kernels timed alone sum to more than the real block and the model's "
                    "ends timed whole; the plan keeps the whole",
                )
            ]
            if mb.between_s is not None
            else []
        ),
        *(
            [
                (
                    "  engine",
                    mb.engine_s,
                    "the engine's hooks and buckets, timed as it runs them"
                    + ("; on the host, beside the device (not added)" if mb.host_s else ""),
                )
            ]
            if mb.engine_s
            else []
        ),
    ]


def comm_table(plan: Plan) -> Table:
    """Each kind of collective a step makes: where, how NCCL (gloo) runs it, what it costs."""
    table = Table(title="Communication per step, predicted", title_justify="left")
    for name in (
        "collective",
        "when",
        "level",
        "algorithm",
        "calls",
        "MB a call",
        "on the wire",
        "GB a rank",
        "busbw GB/s",
        "time s",
        "exposed s",
    ):
        table.add_column(name, justify="left" if name in ("collective", "when", "level", "algorithm") else "right")
    for c in plan.comm.collectives:
        table.add_row(
            c.op,
            c.phase,
            c.level,
            c.algorithm,
            f"{c.calls:,}",
            f"{c.bytes_per_call / 1e6:,.1f}",
            f"{c.dtype_bytes} B/elem",
            f"{c.bytes_per_rank / 1e9:.3g}",
            f"{c.busbw_gbps:,.4g}",
            f"{c.time_s:.3g}",
            f"{c.exposed_s:.3g}",
        )
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
    return [
        plan.time.tokens_per_sec_per_gpu / base[others(values)][1] if base[others(values)][1] else None
        for (_, plan), values in zip(points, swept)
    ]


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
        table.add_row(
            *[values.get(k, " ".join(spec.overrides)) for k in keys],
            gib(plan.memory.total),
            "yes" if plan.fits else "[red]no[/red]",
            f"{t.step_s:.4g}",
            f"{t.exposed_comm_s:.3g}",
            f"{t.tokens_per_sec_per_gpu:,.0f}",
            _vs_best(plan, best),
            percent(t.mfu),
            f"{eff:.0%}" if eff else "",
        )
    out.print(table)
    if close := [values for (_, plan), values in zip(points, swept) if _within_error(plan, best)]:
        if len(close) > 1:
            labels = [" ".join(f"{k}={v}" for k, v in values.items()) for values in close]
            out.print(
                f"{len(close)} points are planned within {HELD_OUT_ERROR:.0%} of the best ({'; '.join(labels)}): "
                "inside the plan's own error (its median miss on published runs it was not fitted on), so "
                "the plan does not rank them; measure them (orchestrator run -m) to choose"
            )
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
