"""SLURM through submitit, on the submitting host: one task per GPU, nodes = ceil(dp / gpus_per_node).

This module turns a trial into submitit's executor parameters and the equivalent sbatch
and srun options (for a user who wants to submit by hand), checks with sinfo that the
partition has nodes that can ever hold the request, submits trials (one job array per
set of equal resources) and returns at once, and later turns a job into result.json:
from the ranks' records and sacct's state once it has ended, or at once when SLURM says
it can never start. What runs inside each task is slurm_task.py.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import submitit

from orchestrator.core.files import atomic_write_json, read_json
from orchestrator.core.redact import secret_exports
from orchestrator.launchers.binding import Binding, trial_binding
from orchestrator.launchers.slurm_task import TASK_MODULE, SlurmTask, task_python
from orchestrator.records.results import Status, error_record, now
from orchestrator.records.trial_dir import TrialPaths
from orchestrator.spec import TrialSpec
from orchestrator.validation.checks import time_limit_s


def timeout_minutes(time: str) -> int:
    """SLURM's MM, HH:MM:SS or D-HH:MM:SS as whole minutes (rounded up)."""
    return math.ceil(time_limit_s(time) / 60)


def node_tasks(spec: TrialSpec) -> tuple[int, int]:
    """(tasks per node, CPUs per task): one task a rank, or with engine=accelerate one task a
    node holding its ranks' CPUs, which starts them through accelerate launch."""
    c = spec.cfg.cluster
    if spec.cfg.engine.name == "accelerate":
        return 1, c.cpus_per_task * spec.gpus_per_node
    return spec.gpus_per_node, c.cpus_per_task


def submitit_parameters(spec: TrialSpec, bind: Binding) -> dict:
    c = spec.cfg.cluster
    tasks, cpus = node_tasks(spec)
    params = {
        "nodes": spec.nodes,
        "tasks_per_node": tasks,
        "cpus_per_task": cpus,
        "timeout_min": timeout_minutes(c.time),
        "slurm_signal_delay_s": c.signal_delay_s,
        "slurm_setup": secret_exports(c.setup)[0],  # secrets go through sbatch's environment
        "slurm_srun_args": srun_options(spec, bind),
        "slurm_additional_parameters": {**c.additional_parameters, **bind.sbatch_options},
    }
    if spec.cfg.hardware.device.is_gpu:
        params["gpus_per_node"] = spec.gpus_per_node
    if c.mem_gb is not None:
        params["mem_gb"] = c.mem_gb
    if c.exclusive:  # no other job on its nodes, another trial of the same array neither
        params["slurm_exclusive"] = True
    for name in OPTIONAL_SBATCH:
        if getattr(c, name):
            params[f"slurm_{name}"] = getattr(c, name)
    return params


OPTIONAL_SBATCH = ("partition", "account", "qos", "constraint", "mem_per_gpu", "exclude", "gres", "comment")


def sbatch_options(spec: TrialSpec, bind: Binding, trial_dir: Path) -> list[str]:
    c = spec.cfg.cluster
    tasks, cpus = node_tasks(spec)
    opts = [f"--nodes={spec.nodes}", f"--ntasks-per-node={tasks}", f"--cpus-per-task={cpus}", f"--time={c.time}"]
    if spec.cfg.hardware.device.is_gpu:
        opts.append(f"--gpus-per-node={spec.gpus_per_node}")
    if c.mem_gb is not None:
        opts.append(f"--mem={int(c.mem_gb * 1024)}M")
    opts += [f"--{name.replace('_', '-')}={getattr(c, name)}" for name in OPTIONAL_SBATCH if getattr(c, name)]
    if c.exclusive:
        opts.append("--exclusive")
    # As the orchestrator submits it: SLURM warns the ranks (SIGUSR2) signal_delay_s before
    # the limit so that they checkpoint, and a preempted job is requeued, its log appended.
    opts += [
        f"--signal=USR2@{c.signal_delay_s}",
        "--requeue",
        "--open-mode=append",
        f"--output={TrialPaths(trial_dir).sbatch_output}",
    ]
    extra = {**c.additional_parameters, **bind.sbatch_options}
    return opts + [f"--{k.replace('_', '-')}={v}" for k, v in extra.items()]


def srun_options(spec: TrialSpec, bind: Binding) -> list[str]:
    """srun's options for the ranks' step, the same from submitit and launch.sh.

    --kill-on-bad-exit: a rank that dies ends the step's other tasks at once, where they
    would otherwise wait inside a collective until the process group's timeout with every
    GPU of the job idle. --cpus-per-task: since SLURM 22.05 srun no longer takes sbatch's
    (SRUN_CPUS_PER_TASK aside), so each task would get one CPU under OMP_NUM_THREADS of them.
    """
    c = spec.cfg.cluster
    return ["--kill-on-bad-exit=1", f"--cpus-per-task={node_tasks(spec)[1]}", *bind.srun_args, *c.srun_args]


def task_command(spec: TrialSpec, trial_dir: Path) -> list[str]:
    """What each SLURM task of `sbatch launch.sh` runs: the task that submitit's path runs
    too (slurm_task.py: rendezvous from SLURM's variables, the ranks' environment, the
    workload as its child)."""
    return [*task_python(spec), "-m", TASK_MODULE, str(trial_dir)]


def result_command(spec: TrialSpec, trial_dir: Path) -> list[str]:
    """launch.sh's line after srun: result.json from how the ranks ended (srun's exit code follows)."""
    return [*task_python(spec), "-m", TASK_MODULE, str(trial_dir), "--result"]


# --- can the partition ever hold it (sinfo) ---------------------------------------------


@dataclass(frozen=True)
class NodeShape:
    name: str
    cpus: int
    gpus: int


def partition_nodes(partition: str | None) -> list[NodeShape] | None:
    """The nodes of `partition` (None: the default one) as sinfo lists them; None when
    sinfo does not answer (no SLURM here, or the controller is down)."""
    argv = ["sinfo", "-h", "-N", "-o", "%N|%c|%G|%P"] + (["-p", partition] if partition else [])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_sinfo(proc.stdout, partition) if proc.returncode == 0 else None


def parse_sinfo(text: str, partition: str | None) -> list[NodeShape]:
    """Nodes from `sinfo -h -N -o %N|%c|%G|%P` lines (a node is listed once per partition)."""
    nodes = {}
    for line in text.splitlines():
        name, cpus, gres, part = (line.split("|") + ["", "", ""])[:4]
        if partition or part.endswith("*"):  # sinfo marks the default partition with *
            gpus = sum(int(n) for n in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", gres))
            nodes[name] = NodeShape(name=name, cpus=int(cpus), gpus=gpus)
    return list(nodes.values())


def partition_refusal(spec: TrialSpec, nodes: list[NodeShape]) -> str | None:
    """Why no node of the partition can ever hold one node's share of the trial, or None.

    Without this check SLURM accepts such a job and keeps it PENDING (reason
    PartitionConfig) for ever.
    """
    c, per_node = spec.cfg.cluster, spec.gpus_per_node
    where = f"partition {c.partition}" if c.partition else "the default partition"
    if not nodes:
        return f"cluster.partition={c.partition}: sinfo lists no node in {where}"
    cpus = max(n.cpus for n in nodes)
    if per_node > cpus:
        return (
            f"cluster.gpus_per_node={per_node}: {per_node} tasks per node (one per rank), but no node of {where} "
            f"has more than {cpus} CPUs; the most that fits is cluster.gpus_per_node={cpus} with cpus_per_task=1"
        )
    if per_node * c.cpus_per_task > cpus:
        return (
            f"cluster.cpus_per_task={c.cpus_per_task}: {per_node} tasks per node x {c.cpus_per_task} CPUs = "
            f"{per_node * c.cpus_per_task} CPUs per node, but no node of {where} has more than {cpus}; "
            f"the most that fits is cluster.cpus_per_task={cpus // per_node}"
        )
    cuda, gpus = spec.cfg.hardware.device.is_gpu, max(n.gpus for n in nodes)
    if cuda and per_node > gpus:
        return (
            f"cluster.gpus_per_node={per_node}: no node of {where} has more than {gpus} GPUs (sinfo's GRES); "
            f"the most that fits is cluster.gpus_per_node={gpus}"
        )
    able = [n for n in nodes if n.cpus >= per_node * c.cpus_per_task and (not cuda or n.gpus >= per_node)]
    if spec.nodes > len(able):
        return (
            f"parallel.dp={spec.dp}: {spec.nodes} nodes of {per_node} ranks, but {where} has {len(able)} node(s) "
            f"that can hold them; the largest that fits is parallel.dp={len(able) * per_node}"
        )
    return None


# --- submission (login node) ------------------------------------------------------------


def submit(trials: list[tuple[TrialSpec, Path]], logs: Path) -> list[str]:
    """Submit every trial; trials with the same resources go out as one job array.

    Returns at once; each trial directory gets slurm.json with its job id.
    """
    groups: dict[str, list[tuple[TrialSpec, Path]]] = {}
    for spec, trial_dir in trials:
        params = submitit_parameters(spec, trial_binding(spec))
        key = json.dumps(
            [params, spec.cfg.cluster.max_requeues, secret_exports(spec.cfg.cluster.setup)[1], task_python(spec)],
            sort_keys=True,
        )
        groups.setdefault(key, []).append((spec, trial_dir))
    job_ids = []
    for key, members in groups.items():
        params, max_requeues, secrets, _ = json.loads(key)
        python = shlex.join(task_python(members[0][0]))  # cluster.python is a submitit parameter too
        executor = submitit.AutoExecutor(
            folder=logs / "%j", cluster="slurm", slurm_max_num_timeout=max_requeues, slurm_python=python
        )
        executor.update_parameters(name="orchestrator", **params)
        # The ranks' save after SLURM's warning must end before the job does: leave 20 s.
        tasks = [SlurmTask.for_trial(s, d) for s, d in members]
        with _environment(secrets):  # sbatch passes its environment to the job (--export=ALL)
            if len(tasks) > 1:
                with executor.batch():
                    jobs = [executor.submit(task) for task in tasks]
            else:
                jobs = [executor.submit(tasks[0])]
        for (_, trial_dir), job in zip(members, jobs):
            atomic_write_json(
                TrialPaths(trial_dir).slurm_job,
                {"job_id": job.job_id, "logs": str(job.paths.folder), "array": len(members) > 1, "submitted_at": now()},
            )
            job_ids.append(job.job_id)
    return job_ids


@contextlib.contextmanager
def _environment(extra: dict[str, str]):
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


# --- state and results (login node) -------------------------------------------------------

RUNNING = {
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "CONFIGURING",
    "COMPLETING",
    "SUSPENDED",
    "RESIZING",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "SIGNALING",
    "STAGE_OUT",
}
ENDED = {
    "TIMEOUT": (Status.TIMEOUT, "the SLURM time limit ended it"),
    "CANCELLED": (Status.FAILED, "cancelled (scancel)"),
    "NODE_FAIL": (Status.FAILED, "a node failed"),
    "PREEMPTED": (Status.PREEMPTED, "preempted by SLURM"),
    "OUT_OF_MEMORY": (Status.OOM, "SLURM killed it for exceeding its memory"),
    "BOOT_FAIL": (Status.FAILED, "the node failed to boot"),
    "DEADLINE": (Status.TIMEOUT, "past its deadline"),
}


# Pending reasons that no amount of waiting clears: the job asks for what the partition or
# its limits can never give (slurm.conf(5), squeue(1) "JOB REASON CODES").
NEVER_STARTS = {
    "PartitionConfig": "it asks for more CPUs, GPUs, memory or nodes than the partition's nodes have",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows",
    "PartitionTimeLimit": "its time limit is beyond the partition's",
    "BadConstraints": "no node has the features (constraint) it asks for",
    "DependencyNeverSatisfied": "a job it depends on can never finish",
    "InvalidAccount": "the account is not valid",
    "InvalidQOS": "the QOS is not valid",
}


def job_state(job_id: str) -> tuple[str, str]:
    """(SLURM state, reason) from sacct; ("UNKNOWN", "") before sacct has the job."""
    return job_states([job_id])[job_id]


def job_states(job_ids: Iterable[str]) -> dict[str, tuple[str, str]]:
    """(SLURM state, reason) of every job, from one sacct call (and one squeue call for the
    pending ones), not one per job: a sweep's `wait` asks every poll, and on a shared
    cluster each sacct is a query of slurmdbd. ("UNKNOWN", "") for a job sacct does not
    have yet. A pending job's reason comes from squeue: the controller's live one (sacct's
    can say "None" for minutes after the scheduler has found that the job can never start)."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    out = subprocess.run(
        ["sacct", "-j", ",".join(ids), "-X", "-n", "-P", "-o", "JobID,State,Reason"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    states = dict.fromkeys(ids, ("UNKNOWN", ""))
    for line in out.splitlines():
        jid, state, reason = (line.split("|") + ["", ""])[:3]
        if jid in states:
            states[jid] = (state.split()[0] if state else "UNKNOWN", reason)
    live = _pending_reasons([j for j, (state, _) in states.items() if state == "PENDING"])
    return {
        j: (state, live.get(j) or reason) if state == "PENDING" else (state, reason)
        for j, (state, reason) in states.items()
    }


def _completed(trial_dir: Path, steps: int) -> bool:
    """Rank 0 wrote metrics.json, which it does only after the last of `steps`."""
    metrics = (read_json(TrialPaths(trial_dir).metrics) or {}).get("metrics") or {}
    return len(metrics.get("history") or []) >= steps or bool(metrics.get("timing_ci_met"))


def _submitit_cause(job: dict) -> str | None:
    """Why submitit ended task 0, from its result file ("Job not requeued because: timed-out
    too many times."), or None when it ended well or left nothing."""
    try:
        paths = submitit.core.utils.JobPaths(job["logs"], job_id=job["job_id"], task_id=0)
        outcome, detail = submitit.core.utils.pickle_load(paths.result_pickle)
    except Exception:  # noqa: BLE001 - no file, or one from another submitit version: no cause
        return None
    if outcome != "error":
        return None
    lines = [line.strip() for line in str(detail).strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else None


def _pending_reasons(job_ids: list[str]) -> dict[str, str]:
    """Why each pending job waits, as the controller says now (squeue's %r)."""
    if not job_ids:
        return {}
    try:
        proc = subprocess.run(
            ["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i|%r"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if proc.returncode != 0:
        return {}
    return {jid: reason for jid, _, reason in (line.partition("|") for line in proc.stdout.splitlines()) if reason}


def finalize(trial_dir: Path, state: str, reason: str) -> dict | None:
    """result.json for a submitted trial whose job has ended (None while it has not);
    state and reason: job_state() of its job."""
    from orchestrator.records.results import outcome_status, write_result
    from orchestrator.spec import load_spec

    job = json.loads(TrialPaths(trial_dir).slurm_job.read_text())
    never = state == "PENDING" and reason in NEVER_STARTS
    if (state in RUNNING and not never) or state == "UNKNOWN":
        return None
    spec = load_spec(trial_dir)
    plan = read_json(TrialPaths(trial_dir).plan)
    cause, completed = _submitit_cause(job), _completed(trial_dir, spec.cfg.run.steps)
    if never:  # end it now: `wait` would otherwise wait for ever
        subprocess.run(["scancel", job["job_id"]], capture_output=True, timeout=60)
        status, error = (
            Status.FAILED,
            error_record(
                "SlurmNeverStarts",
                f"SLURM can never start it: {NEVER_STARTS[reason]} (pending reason {reason}); cancelled",
            ),
        )
    elif completed:
        # Every step ran and rank 0 wrote the figures: whatever the job's end looked like
        # (a last warning with no requeue left fails submitit's task 0), the trial is done.
        status, error = Status.OK, None
    elif state == "COMPLETED":
        status, error = outcome_status(trial_dir, 0, timed_out=False)
    elif state in ENDED:
        status, what = ENDED[state]
        error = error_record(f"Slurm{state.title().replace('_', '')}", f"{what} (sacct: {state} {reason})")
    else:  # FAILED and anything else: the ranks' own records say why
        status, error = outcome_status(trial_dir, 1, timed_out=False)
        if error and error["type"] == "ProcessExit" and error["rank"] is None:
            error["message"] = f"the job failed (sacct: {state} {reason})"
    if status == "ok" and not (state == "COMPLETED" or completed):
        status = Status.FAILED  # never report as completed what did not complete
    if error and cause:
        error["message"] += f"; submitit: {cause}"
    return write_result(
        trial_dir,
        spec,
        plan,
        status,
        job["submitted_at"],
        error,
        slurm={"job_id": job["job_id"], "state": state, "reason": reason},
        host_load=read_json(TrialPaths(trial_dir).node_load),
    )  # None: no rank started
