"""One rank of a trial: `python -m orchestrator.workload.train TRIAL_DIR` under a launcher.

It loads the trial (config.yaml + trial.json), builds the engine, trains run.steps
optimizer steps on the global-batch schedule, and measures: the time of every step
(device synchronised), activation and static memory, peak memory. Rank 0 gathers what
every rank saw and writes metrics.json; the launcher turns it into result.json.

Output: each rank's stdout/stderr go to logs/rank{R}.log. Rank 0 also writes one
progress line per step, prefixed "ORCH|", to the launcher's pipe. A rank that fails
writes errors/rank{R}.json (type, message, traceback, whether it was out of memory)
before exiting non-zero, which makes torchrun end the other ranks.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import math
import platform
import signal
import socket
import sys
import time
import traceback
from contextlib import nullcontext
from pathlib import Path

from orchestrator.errors import Interrupted
from orchestrator.trial_dir import TrialPaths

PROGRESS = "ORCH|"


def main() -> None:
    from orchestrator.workload import warning

    warning.listen()  # before any thread exists: SLURM's warning must never kill the rank or its children
    die_with_parent()  # the launcher killed outright (SIGKILL) must not leave this rank running
    Interrupted.install()  # SIGTERM / SIGINT from the launcher: record it and close the W&B run
    trial_dir = Path(sys.argv[1]).resolve()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    console = os.fdopen(os.dup(1), "w", buffering=1)  # the launcher's pipe, before the redirect
    _redirect_output(TrialPaths(trial_dir).rank_log(rank))
    try:
        train(trial_dir, rank, world, console if rank == 0 else None)
    except BaseException as exc:  # noqa: BLE001 - every failure is recorded, then ends the rank
        _record_failure(trial_dir, rank, exc)
        _leave(exc.exit_code if isinstance(exc, Interrupted) else 1, console)
    _leave(0, console)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send `sig` to this process when its parent (torchrun, the SLURM task)
    dies (prctl PR_SET_PDEATHSIG); elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the request: nobody will send it
        os.kill(os.getpid(), sig)


def _leave(code: int, console) -> None:
    """Exit without running C++ static destructors: gloo's and DeepSpeed's threads can abort
    a process at interpreter exit ("terminate called without an active exception") after
    the work is done. Everything worth keeping is flushed (and written atomically) first."""
    for stream in (console, sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def train(trial_dir: Path, rank: int, world: int, console) -> None:
    import torch
    import torch.distributed as dist

    from orchestrator.files import atomic_write_json
    from orchestrator.spec import load_spec
    from orchestrator.tracking import Tracker
    from orchestrator.workload.engines import make_engine

    spec = load_spec(trial_dir)
    paths = TrialPaths(trial_dir)
    meta = json.loads(paths.meta.read_text())
    plan = json.loads(paths.plan.read_text()) if paths.plan.is_file() else None
    cuda = spec.cfg.hardware.device == "cuda"
    if cuda:
        from orchestrator.workload.placement import cuda_device_index

        device = torch.device("cuda", cuda_device_index(os.environ, torch.cuda.device_count()))
    else:
        device = torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(spec.cfg.run.seed)  # dropout and data; the weights draw from the seed in build_model
    if spec.cfg.run.gc_collect_every:
        gc.disable()
    tracker = Tracker(spec, trial_dir, meta.get("sweep", {})) if rank == 0 else None
    try:
        engine = make_engine(spec, trial_dir, device)
        history, memory, restarts = run_steps(spec, engine, trial_dir, rank, world, device, console, tracker)
        from orchestrator.workload import measure

        peak = measure.peak_bytes(device)
        mine = {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(), "peak_bytes": peak,
                "affinity": sorted(os.sched_getaffinity(0))}
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
        dist.barrier()  # every rank is done with every collective before any leaves
        if rank != 0:
            return
        metrics = summarize(spec, history, world, cuda, trial_dir, {**memory, "peak_bytes": peak})
        metrics["engine"] = engine.describe()
        metrics.update(restarts)
        env = {"versions": _versions(), "hosts": sorted({r["host"] for r in everyone}), "world_size": world,
               "ranks": everyone, "affinity": {str(r["rank"]): r["affinity"] for r in everyone},
               "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "threads_per_rank": torch.get_num_threads()}
        atomic_write_json(TrialPaths(trial_dir).metrics, {"metrics": metrics, "env": env})
        if tracker:
            tracker.finish(metrics, plan, "ok")
    except BaseException as exc:
        if tracker:  # the W&B run ends with the cause and a non-zero exit code
            Interrupted.ignore()  # nothing more may interrupt the closing of the run
            status = "interrupted" if isinstance(exc, Interrupted) else "oom" if is_out_of_memory(exc) else "failed"
            tracker.finish(None, plan, status)
        raise


def run_steps(spec, engine, trial_dir: Path, rank: int, world: int, device, console, tracker):
    """run.steps optimizer steps on the schedule: (history, memory measured, restarts).

    The memory figures are taken once: activations on the first micro batch, the static
    census after the first optimizer step, and on a CPU the live-tensor peak of the second
    step when it is a warm-up step (the profiler that sees it slows it)."""
    import torch

    from orchestrator.plan.batch import batch_sizes_per_step
    from orchestrator.workload import checkpoint, measure
    from orchestrator.workload.data import batches

    run = spec.cfg.run
    sizes = batch_sizes_per_step(spec.schedule, run.steps, spec.cfg.model.seq_len)
    seen = list(itertools.accumulate(size * spec.cfg.model.seq_len for size in sizes))  # tokens after each step
    checkpointing = bool(run.checkpoint_every) or spec.cfg.cluster.name == "slurm"
    state = checkpoint.resume(engine, trial_dir, rank) if checkpointing else None
    history = state["history"] if state else []
    nonfinite = [h["step"] for h in history if not math.isfinite(h["loss"] if h["loss"] is not None else math.nan)]
    memory = {key: (state or {}).get(key) for key in ("activation_bytes", "static_bytes", "live_peak_bytes",
                                                         "live_peak_at")}
    resumed_at = [*(state or {}).get("resumed_at", []), *([state["step"]] if state else [])]
    on_warning = list((state or {}).get("on_warning", []))  # checkpoints SLURM's warning asked for
    # When each checkpoint this run resumed from was complete (wall clock): a requeue should follow at once.
    resumed_from_saved_at = [*(state or {}).get("resumed_from_saved_at", []), *([state["written_at"]] if state else [])]
    consumed = sum(h["global_batch_size"] // (spec.micro_batch_size * world) for h in history)
    data = iter(batches(spec, rank, world, consumed))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    profiler = _profiler(trial_dir, run.steps) if run.profile and rank == 0 else nullcontext()
    with profiler as prof:
        for step in range(len(history), run.steps):
            engine.set_global_batch(sizes[step])
            grad_accum = sizes[step] // (spec.micro_batch_size * world)
            if run.fail_at_step == step and run.fail_rank == rank:
                _fail(run.fail_mode)
            sync()
            started_at, start = time.time(), time.perf_counter()
            losses = []
            # The CPU's live-tensor peak, on the second step if it is not timed: the static
            # census is then exactly what was alive when it began.
            watch = (device.type == "cpu" and step == 1 and step < run.warmup_steps and not run.profile
                     and memory["live_peak_bytes"] is None and memory["static_bytes"] is not None)
            with measure.AllocatorPeak() if watch else nullcontext() as allocator:
                for micro in range(grad_accum):
                    tokens = next(data).to(device, non_blocking=run.pin_memory)
                    first = memory["activation_bytes"] is None and micro == 0
                    with measure.ActivationCensus() if first else nullcontext() as census:
                        loss = engine.forward(tokens)
                    if first:
                        memory["activation_bytes"] = census.bytes
                    engine.backward_and_step(loss)
                    losses.append(loss.detach())
            if watch:
                memory["live_peak_bytes"] = memory["static_bytes"] + allocator.growth
                memory["live_peak_at"] = allocator.where
            if run.step_sleep_s:
                time.sleep(run.step_sleep_s)
            sync()
            seconds = time.perf_counter() - start
            loss_value = float(torch.stack(losses).float().mean())
            if not math.isfinite(loss_value):
                nonfinite.append(step)
            if memory["static_bytes"] is None:  # after the first optimizer step, no batch in flight
                memory["static_bytes"] = measure.static_bytes(device.type)
            # The batch the engine stepped on: the micro batches all ranks really ran, and
            # the engine's own train_batch_size.
            ran = grad_accum * spec.micro_batch_size * world
            history.append({"step": step, "loss": loss_value, "step_time_s": seconds,
                            "global_batch_size": ran, "engine_global_batch_size": engine.engine_global_batch(),
                            "tokens_per_sec_per_gpu": ran * spec.cfg.model.seq_len / seconds / world,
                            "tokens_seen": seen[step], "lr": engine.learning_rate(), "timed": step >= run.warmup_steps,
                            "started_at": started_at})  # wall clock: step to step includes the bookkeeping
            if console:
                console.write(PROGRESS + json.dumps({**history[-1], "steps": run.steps}) + "\n")
            if tracker:
                tracker.log_step(history[-1])
            if nonfinite and run.stop_on_nonfinite_loss:
                raise NonFiniteLoss(f"the loss is {loss_value} at step {step + 1} of {run.steps} (run.lr={run.lr}); "
                                    "run.stop_on_nonfinite_loss=false trains on")
            if checkpointing and step + 1 < run.steps and (why := checkpoint.wanted(step, run.checkpoint_every, device)):
                if why == checkpoint.WARNED:
                    on_warning.append(step + 1)
                checkpoint.save(engine, trial_dir, rank, {
                    "step": step + 1, "history": history, **memory, "resumed_at": resumed_at, "on_warning": on_warning,
                    "resumed_from_saved_at": resumed_from_saved_at}, warned=why == checkpoint.WARNED)
            if run.gc_collect_every and (step + 1) % run.gc_collect_every == 0:
                gc.collect()
            if prof is not None:
                prof.step()
    return history, memory, {"restarts": len(resumed_at), "resumed_at_steps": resumed_at,
                             "checkpoints_on_warning": on_warning, "resumed_from_saved_at": resumed_from_saved_at,
                             "nonfinite_loss_steps": nonfinite}


def summarize(spec, history: list[dict], world: int, cuda: bool, trial_dir: Path, memory: dict) -> dict:
    """The measured figures of result.json, over the timed steps."""
    import torch

    from orchestrator import hardware
    from orchestrator.plan.flops import flops_per_token

    run = spec.cfg.run
    timed = [h for h in history if h["timed"]]
    seconds = sum(h["step_time_s"] for h in timed)
    tokens = sum(h["global_batch_size"] for h in timed) * spec.cfg.model.seq_len
    model_flops, hardware_flops, _ = flops_per_token(spec.cfg.model, spec.cfg.recompute.mode)
    peak_tflops, peak_source = hardware.peak_tflops(spec.cfg.hardware, spec.precision, torch.get_num_threads())
    per_gpu = tokens / seconds / world if seconds else 0.0
    return {
        "tokens_per_sec": tokens / seconds if seconds else 0.0,
        "tokens_per_sec_per_gpu": per_gpu,
        "tflops_per_gpu": model_flops * per_gpu / 1e12,
        "mfu": model_flops * per_gpu / (peak_tflops * 1e12),
        "hfu": hardware_flops * per_gpu / (peak_tflops * 1e12),
        "peak_tflops": peak_tflops,
        "peak_source": peak_source,
        "step_time_s": seconds / len(timed) if timed else None,
        "step_times_s": [h["step_time_s"] for h in history],
        "steps": run.steps,
        "timed_steps": len(timed),
        "tokens": tokens,
        "loss_first": history[0]["loss"],
        "loss_last": history[-1]["loss"],
        "losses": [h["loss"] for h in history],
        "global_batch_sizes": [h["global_batch_size"] for h in history],
        "memory": {**memory, "peak_source": "CUDA allocator max_memory_allocated" if cuda else "max RSS of rank 0",
                   "live_peak_source": None if memory.get("live_peak_bytes") is None else
                   "static census + the CPU allocator's most bytes held during step 2 (torch.profiler memory events)"},
        "history": history,
        "tuning": {"compile": run.compile, "gc_collect_every": run.gc_collect_every,
                   "gc_enabled": gc.isenabled(), "dataloader_workers": run.dataloader_workers,
                   "pin_memory": run.pin_memory,
                   "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") if cuda else None,
                   "profile": str(trial_dir / "profile") if run.profile else None},
    }


def _profiler(trial_dir: Path, steps: int):
    """torch.profiler with 000's schedule: skip 1 step, warm up 1, record 3."""
    import torch.profiler as tp

    return tp.profile(activities=[tp.ProfilerActivity.CPU] + ([tp.ProfilerActivity.CUDA] if _has_cuda() else []),
                      schedule=tp.schedule(wait=1, warmup=1, active=min(3, max(1, steps - 2)), repeat=1),
                      on_trace_ready=tp.tensorboard_trace_handler(str(trial_dir / "profile")), record_shapes=True)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


class NonFiniteLoss(FloatingPointError):
    """The loss became NaN or infinite (run.stop_on_nonfinite_loss ends the trial on it)."""


def _fail(mode: str) -> None:
    """run.fail_at_step: fail for real, the way a crashing rank does."""
    if mode == "exit":
        os._exit(3)
    if mode == "oom":
        import torch

        torch.empty(2**62, dtype=torch.uint8)  # a host (or device) allocation that cannot succeed
    raise RuntimeError("injected failure (run.fail_at_step)")


def _redirect_output(log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    oom_types = tuple(t for t in (_torch_oom(), MemoryError) if t is not None)
    return isinstance(exc, oom_types) or "out of memory" in text or "can't allocate memory" in text


def _torch_oom():
    import torch

    return getattr(torch, "OutOfMemoryError", None)


def _record_failure(trial_dir: Path, rank: int, exc: BaseException) -> None:
    """errors/rank{R}.json. On a full disk it may not be written: the launcher then says so."""
    from orchestrator.files import atomic_write_json

    try:
        traceback.print_exc()
        atomic_write_json(TrialPaths(trial_dir).rank_error(rank), {
            "type": type(exc).__name__, "message": str(exc)[:2000], "rank": rank, "oom": is_out_of_memory(exc),
            "traceback": traceback.format_exc()[-8000:], "time": time.time(), "host": socket.gethostname(),
            **({"signal": str(exc)} if isinstance(exc, Interrupted) else {})})
    except OSError:
        pass


def _versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("torch", "deepspeed", "accelerate", "transformers", "hydra-core"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


if __name__ == "__main__":
    main()
