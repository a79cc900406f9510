"""One rank of a trial: `python -m orchestrator.workload.train TRIAL_DIR` under a launcher.

It loads the trial (config.yaml + trial.json), chooses its device once (workload/device.py),
builds the engine, trains run.steps optimizer steps on the global-batch schedule, and
measures: the time of every step (device synchronised), activation and static memory,
peak memory. Rank 0 gathers what every rank saw and writes metrics.json; the launcher
turns it into result.json. What happens around a step (memory probes, progress and W&B,
checkpoints) is a named hook each, in workload/hooks.py.

Output: each rank's stdout/stderr go to logs/rank{R}.log. Rank 0 also writes one
progress line per step, prefixed "ORCH|", to the launcher's pipe. A rank that fails
writes errors/rank{R}.json (type, message, traceback, whether it was out of memory)
before exiting non-zero, which makes torchrun end the other ranks.

torch is imported inside the functions: SIGUSR2 must be blocked (warning.listen) before
anything that may start a thread.
"""

from __future__ import annotations

import gc
import itertools
import json
import multiprocessing
import os
import resource
import socket
import sys
import time
import traceback
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from orchestrator.core.errors import Interrupted
from orchestrator.core.process import die_with_parent, flush, leave, redirect_output
from orchestrator.records.trial_dir import TrialPaths
from orchestrator.records.trial_meta import TrialMeta
from orchestrator.workload import warning


def main() -> None:
    # The collector stays off until the engine is built: importing torch, transformers and
    # DeepSpeed allocates millions of objects, which each collection would walk again (a
    # rank starts about 1.3 CPU-s sooner on a 2-core machine: docs/measurements.md).
    gc.disable()
    warning.listen()  # before any thread exists: SLURM's warning must never kill the rank or its children
    die_with_parent()  # the launcher killed outright (SIGKILL) must not leave this rank running
    Interrupted.install()  # SIGTERM / SIGINT from the launcher: record it and close the W&B run
    trial_dir = Path(sys.argv[1]).resolve()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    console = os.fdopen(os.dup(1), "w", buffering=1)  # the launcher's pipe, before the redirect
    paths = TrialPaths(trial_dir)
    redirect_output(paths.rank_log(rank))
    running = _mark_running(paths.rank_running(rank))
    code = 0
    try:
        train(trial_dir, rank, world, console if rank == 0 else None)
    except BaseException as exc:  # noqa: BLE001 - every failure is recorded, then ends the rank
        _record_failure(trial_dir, rank, exc)
        code = exc.exit_code if isinstance(exc, Interrupted) else 1
    running.unlink(missing_ok=True)
    if code or not forked():
        leave(code, console)
    flush(console)  # torchrun waits for this function's return; multiprocessing then calls os._exit


def forked() -> bool:
    """Whether this rank is a fork of torchrun itself (launchers/forked.py), not a new interpreter."""
    return multiprocessing.parent_process() is not None


def train(trial_dir: Path, rank: int, world: int, console) -> None:
    from orchestrator.spec import load_spec
    from orchestrator.workload.wandb_compat import import_wandb

    spec = load_spec(trial_dir)
    if rank == 0:  # before torch, where W&B's imports cost a fifth (wandb_compat)
        import_wandb(spec.cfg.logger.mode)

    import torch
    import torch.distributed as dist

    from orchestrator.core.files import atomic_write_json
    from orchestrator.measure import host_load
    from orchestrator.workload.device import Device
    from orchestrator.workload.engines import import_libraries, make_engine
    from orchestrator.workload.rank_steps import rank_steps
    from orchestrator.workload.summary import summarize, versions
    from orchestrator.workload.tracking import Tracker

    paths = TrialPaths(trial_dir)
    meta = TrialMeta.read(trial_dir)
    plan = json.loads(paths.plan.read_text()) if paths.plan.is_file() else None
    device = Device.for_rank(spec.cfg.hardware.device, os.environ)
    torch.manual_seed(spec.cfg.run.seed)  # dropout and data; the weights draw from the seed in build_model
    tracker = Tracker(spec, trial_dir, meta.sweep) if rank == 0 else None
    try:
        # Every object the imports made (some 700,000: torch, transformers, the engine) goes to
        # the collector's permanent generation, which no collection walks again: the static
        # census (memory_census.static_bytes) and each full collection during the steps cost a
        # rank about 0.9 s of CPU less (docs/measurements.md). Done before the trial's first
        # tensor exists, so the census still sees every tensor of the trial.
        import_libraries(spec)
        gc.freeze()
        engine = make_engine(spec, trial_dir, device)
        if not spec.cfg.run.gc_collect_every:  # else run_steps collects every so many steps itself
            gc.enable()
        ticks = host_load.cpu_ticks()  # the node's load over the steps, per node in W&B and result.json
        state = run_steps(spec, engine, trial_dir, rank, world, device, console, tracker)
        peak = device.peak_bytes()
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, _rank_record(rank, peak, state.own_steps, host_load.node_load(ticks)))
        dist.barrier()  # every rank is done with every collective before any leaves
        if rank != 0:
            return
        metrics = summarize(spec, state.history, world, device, trial_dir, {**state.memory, "peak_bytes": peak})
        metrics["ranks"] = rank_steps(everyone)
        metrics["nodes"] = host_load.by_node(everyone)
        for record in everyone:  # result.json keeps each rank's figures, not its every step
            del record["steps"]
        metrics["engine"] = engine.describe()
        metrics.update(state.restarts())
        env = {
            "versions": versions(),
            "hosts": sorted({r["host"] for r in everyone}),
            "world_size": world,
            "ranks": everyone,
            "affinity": {str(r["rank"]): r["affinity"] for r in everyone},
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "threads_per_rank": torch.get_num_threads(),
        }
        atomic_write_json(paths.metrics, {"metrics": metrics, "env": env})
        if tracker:
            tracker.finish(metrics, plan, "ok")
    except BaseException as exc:
        if tracker:  # the W&B run ends with the cause and a non-zero exit code
            Interrupted.ignore()  # nothing more may interrupt the closing of the run
            tracker.finish(None, plan, ended_status(exc, paths, world))
        raise


def _rank_record(rank: int, peak: int, steps: list, node_load: dict) -> dict:
    """What a rank says of itself at its end, gathered by rank 0 into result.json's env.ranks
    (and its timed steps, [step, seconds, seconds in collectives, those by kind], into
    metrics.ranks; its node's load over the steps, into metrics.nodes)."""
    return {
        "steps": steps,
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "peak_bytes": peak,
        # the host's peak too: a GPU rank builds its model there first (plan/host_memory.py)
        "host_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux reports KiB
        "affinity": sorted(os.sched_getaffinity(0)),
        "forked": forked(),
        "node_load": node_load,
    }


def run_steps(spec, engine, trial_dir: Path, rank: int, world: int, device, console, tracker):
    """run.steps optimizer steps on the schedule, from a checkpoint where there is one: the RunState."""
    from orchestrator.plan.batch import batch_sizes_per_step, grad_accum_steps
    from orchestrator.workload.collective_wait import CollectiveWait
    from orchestrator.workload.data import batches
    from orchestrator.workload.hooks import Checkpointer, MemoryProbes, Reporter
    from orchestrator.workload.rank_steps import AGREEMENT

    run, seq_len = spec.cfg.run, spec.cfg.model.seq_len
    sizes = batch_sizes_per_step(spec.schedule, run.steps, seq_len)
    seen = list(itertools.accumulate(size * seq_len for size in sizes))  # tokens after each step
    checkpointer = Checkpointer(
        engine,
        trial_dir,
        rank,
        device,
        run.checkpoint_every,
        enabled=bool(run.checkpoint_every) or spec.cfg.cluster.name == "slurm",
    )
    state = checkpointer.resume()
    probes, report = MemoryProbes(device, run, state.memory), Reporter(run, console, tracker)
    consumed = sum(grad_accum_steps(h["global_batch_size"], spec.micro_batch_size, world) for h in state.history)
    data = iter(batches(spec, rank, world, consumed))
    profiling = _profiler(trial_dir, run.steps, device) if run.profile and rank == 0 else nullcontext()
    with profiling as profiler, CollectiveWait(device) as collectives:
        for step in range(len(state.history), run.steps):
            engine.set_global_batch(sizes[step])
            grad_accum = grad_accum_steps(sizes[step], spec.micro_batch_size, world)
            if run.fail_at_step == step and run.fail_rank == rank:
                _fail(run.fail_mode)
            collectives.start_step()
            started_at, start = time.time(), device.clock()
            losses = []
            with probes.around_step(step):
                for micro in range(grad_accum):
                    tokens = next(data).to(device.torch, non_blocking=run.pin_memory)
                    with probes.around_forward(micro):
                        loss = engine.forward(tokens)
                    engine.backward_and_step(loss)
                    losses.append(loss.detach())
            if run.step_sleep_s and run.slow_rank in (None, rank):
                time.sleep(run.step_sleep_s)
            with collectives.as_kind(AGREEMENT):
                save = checkpointer.due(step, run.steps)
            seconds = device.clock() - start
            waited = collectives.step_seconds()
            probes.after_step()
            ran = grad_accum * spec.micro_batch_size * world
            state.add(_step_record(spec, engine, step, ran, (seconds, waited), losses, seen[step], started_at))
            report(state.history[-1], state)
            checkpointer(step, state, save)
            if run.gc_collect_every and (step + 1) % run.gc_collect_every == 0:
                gc.collect()
            if profiler is not None:
                profiler.step()
            if run.timing_ci is not None and timing_known(state.history, run, device):
                break  # every rank at the same step: rank 0's times decide for all
    return state


def timing_known(history: list[dict], run, device) -> bool:
    """run.timing_ci: whether rank 0's timed steps pin the median now, agreed by every rank."""
    import torch
    import torch.distributed as dist

    from orchestrator.core.timing_stats import precise_enough

    timed = [h["step_time_s"] for h in history if h["timed"]]
    known = precise_enough(timed, run.timing_ci, run.min_timed_steps)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        flag = torch.tensor([int(known)], device=device.torch)
        dist.broadcast(flag, src=0)
        known = bool(flag.item())
    return known


def _step_record(spec, engine, step: int, ran: int, times: tuple, losses: list, seen: int, started_at: float) -> dict:
    """One step of the history. ran: the micro batches all ranks really ran, in sequences;
    times: the step's seconds and its seconds in collectives (and by kind); engine_global_batch_size: the
    engine's own train_batch_size, to check they agree."""
    import torch

    run, (seconds, (waited, kinds)) = spec.cfg.run, times
    return {
        "step": step,
        "loss": float(torch.stack(losses).float().mean()),
        "step_time_s": seconds,
        "collective_wait_s": waited,  # this rank's (rank 0's in the history): workload/collective_wait.py
        "collective_wait_by_kind_s": kinds,
        "global_batch_size": ran,
        "engine_global_batch_size": engine.engine_global_batch(),
        "tokens_per_sec_per_gpu": ran * spec.cfg.model.seq_len / seconds / spec.world_size,
        "tokens_seen": seen,
        "lr": engine.learning_rate(),
        "timed": step >= run.warmup_steps,
        "started_at": started_at,
    }  # wall clock: step to step includes the bookkeeping


def _profiler(trial_dir: Path, steps: int, device):
    """torch.profiler on a schedule: skip 1 step (allocation, the libraries choosing kernels),
    warm up 1, record 3."""
    import torch.profiler as tp

    return tp.profile(
        activities=device.profiler_activities(),
        schedule=tp.schedule(wait=1, warmup=1, active=min(3, max(1, steps - 2)), repeat=1),
        on_trace_ready=tp.tensorboard_trace_handler(str(TrialPaths(trial_dir).profile)),
        record_shapes=True,
    )


def _fail(mode: str) -> None:
    """run.fail_at_step: fail for real, the way a crashing rank does."""
    if mode == "exit":
        os._exit(3)
    import torch

    if mode == "oom":
        torch.empty(2**62, dtype=torch.uint8)  # a host (or device) allocation that cannot succeed
    if mode == "grow":  # as a leak does: until the kernel's OOM killer picks this rank first
        Path("/proc/self/oom_score_adj").write_text("1000")
        held = []
        while True:
            held.append(torch.ones(2**26, dtype=torch.uint8))  # 64 MiB, every page touched
    raise RuntimeError("injected failure (run.fail_at_step)")


def ended_status(exc: BaseException, paths: TrialPaths, world: int) -> str:
    """The trial's status as this rank sees it end. A SIGTERM that follows another rank's
    failure is the launcher ending the survivors (torchrun does so once a rank exits non-zero;
    which of that and the failed collective reaches this rank first is a race): the trial
    failed as that rank did, whose error file is written before it exits."""
    if isinstance(exc, Interrupted):
        for other in range(world):
            try:
                error = json.loads(paths.rank_error(other).read_text())
            except (OSError, ValueError):
                continue
            if error.get("type") != Interrupted.__name__:
                return "oom" if error.get("oom") else "failed"
        return "interrupted"
    return "oom" if is_out_of_memory(exc) else "failed"


def is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    oom_types = tuple(t for t in (_torch_oom(), MemoryError) if t is not None)
    return isinstance(exc, oom_types) or "out of memory" in text or "can't allocate memory" in text


def _torch_oom():
    import torch

    return getattr(torch, "OutOfMemoryError", None)


def _mark_running(marker: Path) -> Path:
    """TrialPaths.rank_running: made at the start, removed on the way out through Python."""
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:  # a full disk: the launcher then names the rank from torchrun's summary alone
        pass
    return marker


def _record_failure(trial_dir: Path, rank: int, exc: BaseException) -> None:
    """errors/rank{R}.json. On a full disk it may not be written: the launcher then says so."""
    from orchestrator.core.files import atomic_write_json

    try:
        traceback.print_exc()
        atomic_write_json(
            TrialPaths(trial_dir).rank_error(rank),
            {
                "type": type(exc).__name__,
                "message": str(exc)[:2000],
                "rank": rank,
                "oom": is_out_of_memory(exc),
                "traceback": traceback.format_exc()[-8000:],
                "time": time.time(),
                "host": socket.gethostname(),
                **({"signal": str(exc)} if isinstance(exc, Interrupted) else {}),
            },
        )
    except OSError:
        pass


if __name__ == "__main__":
    main()
