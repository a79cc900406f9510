"""One trial end to end: plan, translate, launch, collect, result.json.

Locally the CLI calls `run_trial` once per point of a sweep; a point that is refused or
fails is recorded with its cause and the sweep goes on. On SLURM `submit_trials` hands
the points to the cluster and returns; `wait_for` / `collect_state` later turn each
finished job into its result.json.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import shutil
import time
from collections import Counter
from pathlib import Path

from rich.console import Console

from orchestrator.config import GIB
from orchestrator.core.errors import ConfigError, Interrupted
from orchestrator.core.files import atomic_write_json, read_json, read_text
from orchestrator.launchers import slurm
from orchestrator.launchers.local import run_local
from orchestrator.measure import hardware, host_load, memory_cgroup
from orchestrator.plan.batch import batch_sizes_per_step
from orchestrator.plan.prediction import Plan, planned_steps_s
from orchestrator.records.results import Status, error_record, now, outcome_status, read_result, write_result
from orchestrator.records.trial_dir import TrialPaths, claimant_gone, reserve, trials_below
from orchestrator.run.display import show_progress, show_result, trial_label
from orchestrator.run.plan_display import show_plan
from orchestrator.run.planning import plan_trial
from orchestrator.run.trial_files import TrialFiles, write_trial_files
from orchestrator.spec import TrialSpec, load_spec


def refusal(
    spec: TrialSpec, plan: Plan, nodes: list[slurm.NodeShape] | None = None, free_bytes: int | None = None
) -> str | None:
    """Why the plan (or, for SLURM, the partition's `nodes` from sinfo; for a local CPU
    trial, the host's `free_bytes`) refuses this trial, or None."""
    if spec.cfg.run.force:
        return None
    if not plan.fits:
        return (
            f"does not fit: predicted {plan.memory.total / GIB:.2f} GiB per rank > "
            f"{plan.memory.capacity / GIB:.2f} GiB capacity; {plan.fitting_changes}; "
            "run.force=true launches anyway"
        )
    if why := host_memory_refusal(spec, plan, free_bytes):
        return why
    if nodes is not None and (why := slurm.partition_refusal(spec, nodes)):
        return f"SLURM could never start it: {why}; run.force=true submits anyway"
    return None


def host_memory_refusal(spec: TrialSpec, plan: Plan, free_bytes: int | None) -> str | None:
    """A node's ranks share its host memory: a local CPU trial's all together against what
    this host has free now (other processes hold the rest), not a per-rank share of its size;
    a GPU trial's as built and offloaded (plan.host_memory) against what the node grants, and
    here also against what this host has free."""
    host = plan.host_memory
    if host is not None and host.capacity is not None and not host.fits:
        return (
            f"the node's host memory: {host.ranks_per_node} rank(s) x {host.per_rank / GIB:.2f} GiB = "
            f"{host.per_node / GIB:.2f} GiB > {host.capacity / GIB:.2f} GiB ({host.capacity_source}), each rank "
            f"building the model in fp32 ({host.built / GIB:.2f} GiB)"
            f"{' and keeping what offload moves' if host.offloaded else ''}; zero=stage3 with engine=deepspeed "
            "builds it partitioned, or ask SLURM for more (cluster.mem_gb); run.force=true launches anyway"
        )
    if spec.cfg.cluster.name != "local" or free_bytes is None:
        return None
    each = host.per_rank if host else plan.memory.total
    need = each * spec.gpus_per_node
    if need <= free_bytes:
        return None
    return (
        f"the host has {free_bytes / GIB:.2f} GiB free and the plan needs {need / GIB:.2f} GiB "
        f"({spec.gpus_per_node} rank(s) x {each / GIB:.2f} GiB): the kernel's OOM killer would end it; "
        "free memory, or run.force=true launches anyway"
    )


def cost_line(spec: TrialSpec, plan: Plan, free_bytes: int | None) -> str:
    """What the trial will cost, said before it starts: its steps' time and its peak (for a
    local CPU trial, its ranks' against the host's `free_bytes`)."""
    m, steps = plan.memory, spec.cfg.run.steps
    each = planned_steps_s(plan.as_dict(), batch_sizes_per_step(spec.schedule, steps, spec.cfg.model.seq_len))
    total = math.fsum(each)
    a_step = f"{each[0]:.3g}" if min(each) == max(each) else f"{min(each):.3g}-{max(each):.3g}"
    warm = "" if min(each) == max(each) else " as the batch warms up"
    when = f"{total / 3600:.1f} h" if total >= 7200 else f"{total / 60:.1f} min" if total >= 120 else f"{total:.3g} s"
    where = (
        f"of {m.capacity / GIB:.2f} GiB"
        if spec.cfg.hardware.device.is_gpu or spec.cfg.cluster.name != "local"
        else f"x {spec.gpus_per_node} rank(s) on a host with {(free_bytes or 0) / GIB:.2f} GiB free"
    )
    up_to = "up to " if spec.cfg.run.timing_ci is not None else ""
    return (
        f"planned: {a_step} s a step{warm}, about {when} for {up_to}{steps} steps (start-up not counted); "
        f"peak {m.total / GIB:.2f} GiB per rank {where}"
    )


def check_runnable_here(spec: TrialSpec, visible_gpus: int | None = None) -> None:
    """A local GPU trial needs a GPU of its own for each rank, and the tools its NUMA binding
    calls on (plan and translate need nothing). visible_gpus: what this process sees
    (torch.cuda.device_count(), which respects CUDA_VISIBLE_DEVICES); None asks torch."""
    if spec.cfg.cluster.name != "local" or not spec.cfg.hardware.device.is_gpu:
        return
    gpus = hardware.local_gpu_count() if visible_gpus is None else visible_gpus
    if gpus == 0:
        raise ConfigError(
            "hardware",
            spec.cfg.hardware.name,
            "this machine has no GPU to run it on; use hardware=auto "
            "or cpu here (plan and translate take any hardware)",
        )
    if spec.world_size > gpus:
        raise ConfigError(
            "parallel.dp",
            spec.dp,
            f"at most {gpus}, the GPUs this host makes visible (one a rank; "
            "CUDA_VISIBLE_DEVICES narrows them): two ranks on one GPU would each time the other's "
            f"kernels and share its memory; the nearest valid value is parallel.dp={gpus}",
        )
    numa = spec.cfg.numa.mode
    if numa != "none" and spec.cfg.engine.name != "accelerate" and shutil.which("numactl") is None:
        raise ConfigError(
            "numa.mode",
            numa,
            "none, or install numactl first (apt-get install numactl): torchrun's "
            "--numa-binding runs each rank under the numactl command, which this host lacks",
        )
    if numa != "none" and spec.cfg.engine.name == "accelerate" and importlib.util.find_spec("pynvml") is None:
        raise ConfigError(
            "numa.mode",
            numa,
            "none, or install nvidia-ml-py first (pip install nvidia-ml-py): "
            "accelerate launch --enable_cpu_affinity reads each GPU's NUMA node through NVML",
        )


def plan_and_write(
    spec: TrialSpec, trial_dir: Path, out: Console, sweep: dict | None, nodes: list[slurm.NodeShape] | None = None
) -> tuple[dict | None, TrialFiles | None, dict]:
    """Plan the trial and write its files: (the refused result if the plan says no, files, plan)."""
    started = now()
    reserve(trial_dir, spec.cfg.run.steps)
    plan = plan_trial(spec)
    free = host_load.available_bytes()  # read once: the refusal and the cost line say the same figure
    if message := refusal(spec, plan, nodes, free):
        if sweep is None:  # one trial: its whole plan, then why; a sweep's points one line each
            show_plan(spec, plan, out)
            out.print(f"[red]refused:[/red] {message}")
        else:
            out.print(f"[red]refused:[/red] {trial_label(spec)}: {message} (its plan: result.json in {trial_dir})")
        refused = write_result(
            trial_dir, spec, plan.as_dict(), Status.REFUSED, started, error_record("PlanRefused", message)
        )
        return refused, None, plan.as_dict()
    files = write_trial_files(spec, trial_dir, plan=plan.as_dict(), sweep=sweep)
    out.print(f"[dim]{cost_line(spec, plan, free)}[/dim]")
    for warning in files.warnings:
        out.print(f"[yellow]warning:[/yellow] {warning}")
    return None, files, plan.as_dict()


def _progress(last: dict, out: Console, progress: dict) -> None:
    """Rank 0's progress line: kept (an interruption says how far it got) and shown."""
    last.update(progress)
    show_progress(progress, out)


def run_trial(spec: TrialSpec, trial_dir: Path, out: Console, sweep: dict | None = None) -> dict:
    """Run a local trial (in the directory claimed for it) to its end. sweep: the point's
    W&B group, name and swept values. Interrupted (Ctrl-C, SIGTERM) ends the ranks, records
    the trial as interrupted and goes on up to the command."""
    started = now()
    refused, files, plan = plan_and_write(spec, trial_dir, out, sweep)
    if refused or files is None:
        return refused or {}
    assert files.command is not None  # a local trial's files hold its command
    out.print(f"[bold]run[/bold] {trial_dir}")
    load = host_load.measure()
    atomic_write_json(TrialPaths(trial_dir).node_load, load.as_dict())  # rank 0 logs it with the run (W&B)
    if warning := load.warning():
        out.print(f"[yellow]warning:[/yellow] {warning}")
    timeout = spec.cfg.run.timeout_min * 60 if spec.cfg.run.timeout_min else None
    last: dict = {}
    kills = memory_cgroup.oom_kills()
    try:
        outcome = run_local(files.command, trial_dir, timeout, functools.partial(_progress, last, out))
    except Interrupted as exc:
        done = f"after step {last['step'] + 1} of {spec.cfg.run.steps}" if last else "before its first step"
        error = error_record(
            "Interrupted",
            f"interrupted by {exc} {done}",
            log=TrialPaths(trial_dir).launcher_log,
            signal=str(exc),
            last_step=last.get("step"),
        )
        show_result(
            write_result(
                trial_dir,
                spec,
                plan,
                Status.INTERRUPTED,
                started,
                error,
                exit_code=exc.exit_code,
                host_load=load.as_dict(),
            ),
            trial_dir,
            out,
        )
        raise
    after = memory_cgroup.oom_kills()
    status, failure = outcome_status(
        trial_dir,
        outcome.returncode,
        outcome.timed_out,
        oom_killed=kills is not None and after is not None and after > kills,
    )
    if status == Status.OOM and failure and failure["type"] == "OutOfMemory":  # what it had reached
        failure["message"] += (
            f", after step {last['step'] + 1} of {spec.cfg.run.steps}" if last else ", before its first step"
        )
    result = write_result(trial_dir, spec, plan, status, started, failure, host_load=load.as_dict())
    show_result(result, trial_dir, out)
    return result


def submit_trials(points: list[tuple[TrialSpec, Path, dict]], logs: Path, out: Console) -> list[dict]:
    """Plan and write every trial, submit the ones that fit; returns the refused results."""
    refused, to_submit = [], []
    partitions = {p: slurm.partition_nodes(p) for p in {spec.cfg.cluster.partition for spec, _, _ in points}}
    for spec, trial_dir, sweep in points:
        result, _, _ = plan_and_write(spec, trial_dir, out, sweep, partitions[spec.cfg.cluster.partition])
        if result:
            refused.append(result)
        else:
            to_submit.append((spec, trial_dir))
    if to_submit:
        job_ids = slurm.submit(to_submit, logs)
        out.print(f"submitted {len(job_ids)} trial(s) to SLURM: jobs {', '.join(job_ids)}")
    return refused


def collect_states(dirs: list[Path]) -> dict[Path, tuple[str, dict | None]]:
    """collect_state of every trial, with SLURM asked once for all their jobs."""
    jobs = [job for d in dirs if (job := _unfinished_job(d))]
    known = slurm.job_states(jobs)
    return {d: collect_state(d, known) for d in dirs}


def _unfinished_job(trial_dir: Path) -> str | None:
    """The SLURM job of a trial without a result yet (None: none, or not readable)."""
    paths = TrialPaths(trial_dir)
    try:
        if paths.result.exists() or paths.result.is_symlink() or not paths.slurm_job.is_file():
            return None
        return str(json.loads(read_text(paths.slurm_job))["job_id"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None  # collect_state says what is wrong with it


def collect_state(trial_dir: Path, known: dict[str, tuple[str, str]] | None = None) -> tuple[str, dict | None]:
    """(state, result): a result's status once there is one, else the SLURM job's state
    (from `known`, collect_states' one query, where it has the job), else whether the
    local run that claimed it still runs. A file that cannot be read gives the state
    "unreadable" and a result that names it (nothing is written)."""
    paths = TrialPaths(trial_dir)
    path = paths.result
    try:
        if (result := read_result(trial_dir)) is not None:
            return result["status"], result
        path = paths.slurm_job
        if not (path.is_file() or path.is_symlink()):
            return _local_state(trial_dir)
        job = str(json.loads(read_text(path))["job_id"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        return "unreadable", {
            "status": "unreadable",
            "exit_code": 1,
            "error": {"type": "UnreadableFile", "message": f"{path}: {type(exc).__name__}: {exc}", "rank": None},
        }
    state, reason = (known or {}).get(job) or slurm.job_state(job)  # asked once per poll: finalize decides from it
    if result := slurm.finalize(trial_dir, state, reason):
        return result["status"], result
    if state == "UNKNOWN":
        return "submitted", None  # sacct learns of a job a moment later
    return state.lower() + (f" ({reason})" if reason and reason != "None" else ""), None  # pending (Resources)


def _local_state(trial_dir: Path) -> tuple[str, dict | None]:
    paths = TrialPaths(trial_dir)
    if not (paths.claim.exists() or paths.claim.is_symlink()):
        return "not submitted", None
    claimed = read_json(paths.claim) or {}  # unreadable, or not ours: no live process claims it
    if not claimant_gone(claimed):
        return f"running (pid {claimed['pid']} on {claimed['host']})", None
    # The orchestrator that ran it is gone without writing a result (SIGKILL, a crash, a
    # reboot), or its claim.json names no process that could be alive: record that, so
    # that `wait` ends and the sweep's report has the point.
    try:
        spec = load_spec(trial_dir) if paths.meta.is_file() else None
    except (ConfigError, OSError, ValueError, KeyError, TypeError):
        spec = None  # its config.yaml is corrupt too: the result says what is known
    pid = claimed.get("pid")
    who = (
        f"pid {pid} on {claimed.get('host')}"
        if isinstance(pid, int) and pid > 0
        else f"{paths.claim} names no process: pid {pid!r}"
    )
    message = (
        f"the orchestrator that ran it ({who}) ended without recording a result: "
        "it was killed, or its machine went down"
    )
    started = s if isinstance(s := claimed.get("started_at"), str) else now()
    result = write_result(
        trial_dir,
        spec,
        read_json(paths.plan),
        Status.INTERRUPTED,
        started,
        error_record("Interrupted", message, log=paths.launcher_log, signal=None),
    )
    return "interrupted", result


def wait_for(directory: Path, out: Console, poll_s: float = 2.0, timeout_s: float | None = None) -> list[dict]:
    """Poll until every trial below `directory` has its result.json."""
    deadline = time.monotonic() + timeout_s if timeout_s is not None else None
    shown, warned = "", set()
    while True:
        states = collect_states(trials_below(directory))
        for d, (state, result) in states.items():
            if state == "unreadable" and result and d not in warned:
                out.print(f"[yellow]warning:[/yellow] skipped {result['error']['message']}")
                warned.add(d)
        waiting = [d for d, (_, result) in states.items() if result is None]
        line = ", ".join(f"{n} {s}" for s, n in Counter(s for s, _ in states.values()).items())
        if line != shown:
            out.print(f"  {line}")
            shown = line
        if not waiting:
            return [result for _, result in states.values() if result is not None]
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"{len(waiting)} trial(s) still not done below {directory}")
        time.sleep(poll_s)
