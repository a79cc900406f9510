"""W&B: one run per trial, opened by rank 0 of the workload (the other ranks open none).

Offline by default: WANDB_MODE is set before wandb is imported, so nothing touches the
network, not even at exit; the run directory is TRIAL_DIR/wandb and `wandb sync` uploads
it later. online needs WANDB_API_KEY (checked before launch); disabled writes nothing.

The run carries what a user filters and groups on: group = the sweep (logger.group or
the multirun directory's name), a short name from the swept overrides, tags, and the
resolved config once, nested as the config groups are (W&B shows and filters on it as
zero.stage, parallel.dp, ...), with the preset chosen per group under choices/ and the
derived numbers (world size, precision, batch) under derived/. The history of every
step is under train/, against train/tokens_seen as its x-axis (define_metric). The
summary holds the measured figures under perf/ (every rank's compute and time in
collectives under perf/rank/R/ with its host, the rank the others wait for under
perf/straggler/, each node's load over the steps under perf/node/HOST/), the
plan's predictions under plan/, and the status. Nothing from the environment goes in:
no key, token or password can reach it.

One trial is one run also across a SLURM requeue: the run id is kept in the trial directory
(wandb_run.json) and the requeued rank 0 resumes that run (resume="allow"); offline, each
attempt writes its own offline-run-* directory under the same id, and `wandb sync`
uploads them into the one run.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

from orchestrator.core.files import atomic_write_json, read_json, real_number
from orchestrator.core.redact import redact
from orchestrator.hydra_glue.hydra_registry import fit_name
from orchestrator.records.trial_dir import TrialPaths
from orchestrator.spec import REPEAT, TrialSpec
from orchestrator.workload.rank_steps import FIGURES
from orchestrator.workload.wandb_compat import import_wandb

HISTORY_KEYS = (
    "loss",
    "step_time_s",
    "collective_wait_s",  # rank 0's; every rank's median is in the summary (perf/rank/R/...)
    "tokens_per_sec_per_gpu",
    "global_batch_size",
    "lr",
    "tokens_seen",
)
SUMMARY_KEYS = (
    "tokens_per_sec",
    "tokens_per_sec_per_gpu",
    "tflops_per_gpu",
    "mfu",
    "hfu",
    "step_time_s",
    "tokens",
    "loss_first",
    "loss_last",
    "peak_tflops",
)


def run_config(spec: TrialSpec) -> dict:
    """The resolved trial, nested as its config groups, once; the presets chosen; and the
    numbers derived from it that a user compares runs on."""
    return {
        **spec.resolved(),
        "choices": dict(spec.choices),
        "derived": {
            "world_size": spec.world_size,
            "nodes": spec.nodes,
            "precision": spec.precision,
            "micro_batch_size": spec.micro_batch_size,
            "grad_accum_steps": spec.grad_accum_steps,
            "global_batch_size": spec.global_batch_size,
            "tokens_per_step": spec.tokens_per_step,
        },
    }


def rank_figures(ranks: dict | None) -> dict:
    """Every rank's median compute and time in collectives (perf/rank/R/...), and the
    straggler the others wait for (perf/straggler/...; perf/straggler/named always there)."""
    if not isinstance(ranks, dict):
        return {}
    out: dict = {}
    for r in ranks.get("ranks") or []:
        out.update({f"perf/rank/{r['rank']}/{k}": r[k]["median"] for k in FIGURES})
        out[f"perf/rank/{r['rank']}/host"] = r.get("host")
    exposed = ranks.get("exposed_comm")
    if isinstance(exposed, dict):  # measured; the plan's is plan/exposed_comm_s
        out["perf/exposed_comm_s"] = exposed["exposed_s"]
        out.update({f"perf/exposed_comm/{k}_s": v for k, v in exposed["by_kind_s"].items()})
    straggler = ranks.get("straggler")
    out["perf/straggler/named"] = isinstance(straggler, dict)
    if isinstance(straggler, dict):
        out.update({f"perf/straggler/{k}": straggler[k] for k in ("rank", "host", "by_s", "share_of_step")})
    return out


def node_figures(nodes: dict | None) -> dict:
    """Each node's load over the steps (perf/node/HOST/...: its cores' busy share, its memory
    in use, its ranks), from every rank's own reading of its node (measure/host_load.by_node)."""
    out: dict = {}
    for host, n in (nodes or {}).items():
        out.update(
            {f"perf/node/{host}/{k}": n[k] for k in ("cpu_busy_share", "memory_used_bytes") if n.get(k) is not None}
        )
        out[f"perf/node/{host}/ranks"] = ",".join(map(str, n["ranks"]))
    return out


def summary(metrics: dict | None, plan: dict | None, status: str) -> dict:
    """Measured under perf/, predicted under plan/: the same figure never shares a name."""
    out: dict = {"status": status}
    if metrics:
        out.update({f"perf/{k}": metrics[k] for k in SUMMARY_KEYS if metrics.get(k) is not None})
        out.update({f"perf/memory/{k}": v for k, v in metrics["memory"].items() if isinstance(v, (int, float))})
        for name in ("step_time", "tokens_per_sec_per_gpu"):  # the median's spread and interval
            spread = metrics.get("step_time_spread" if name == "step_time" else f"{name}_spread")
            if spread:
                out.update({f"perf/{name}_{k}": spread[k] for k in ("q1", "q3", "ci_low", "ci_high", "confidence")})
        out["perf/noisy"] = bool(metrics.get("noisy"))  # always there: a run without it is not a quiet one
        if metrics.get("noisy"):
            out["perf/noisy_why"] = metrics["noisy"]
        out.update(rank_figures(metrics.get("ranks")))
        out.update(node_figures(metrics.get("nodes")))
        if steps := metrics.get("nonfinite_loss_steps"):
            out.update({"perf/nonfinite_loss_steps": len(steps), "perf/nonfinite_loss_first_step": steps[0] + 1})
    if plan:
        out.update(
            {
                "plan/parameters": plan["parameters"],
                "plan/fits": plan["memory"]["fits"],
                "plan/memory_total": plan["memory"]["total"],
                "plan/activations": plan["memory"]["activations"],
            }
        )
        out.update({f"plan/{k}": v for k, v in plan["time"].items()})
    return out


def point_type(sweep: dict) -> str:
    """The run's W&B job_type: "trial", or where a sweep repeats its points (run.repeat) the
    point's swept values without the repeat, so that W&B groups a point's repeats as one
    (by job type, within the sweep's group; sweep_batch.masked_point numbers points that
    differ only in a masked secret). W&B keeps 64 characters of a job type: a
    longer one ends in a hash of the whole."""
    swept = sweep.get("swept") or {}
    if REPEAT not in swept:
        return "trial"
    point = ",".join(f"{k}={v}" for k, v in swept.items() if k != REPEAT) or "point"
    if sweep.get("masked_point"):  # its secret masked: told from the points masked alike by number
        point += f" #{sweep['masked_point']}"
    if len(point) <= 64:
        return point
    return f"{point[:55]}-{hashlib.sha1(point.encode()).hexdigest()[:8]}"


class Tracker:
    """Rank 0's W&B run; a no-op when logger.mode=disabled."""

    def __init__(self, spec: TrialSpec, trial_dir: Path, sweep: dict):
        logger = spec.cfg.logger
        self.run, self.trial_dir = None, trial_dir
        if logger.mode == "disabled":
            return
        wandb = import_wandb(logger.mode)
        assert wandb is not None  # only a disabled logger has none
        self.run = wandb.init(  # names and tags masked as the config is (redact.py)
            id=run_id(trial_dir),
            resume="allow",
            project=logger.project,
            entity=logger.entity,
            dir=str(trial_dir),
            mode=logger.mode,
            group=redact(logger.group or sweep.get("group")),
            job_type=point_type(sweep),
            name=redact(run_name(spec, trial_dir, sweep)),
            tags=redact(
                [
                    *logger.tags,
                    spec.choices.get("model", ""),
                    f"zero{spec.cfg.zero.stage}",
                    spec.cfg.engine.name,
                    f"cluster:{spec.cfg.cluster.name}",
                    *([f"sweep:{sweep['group']}"] if sweep.get("group") else []),
                ]
            ),
            config=run_config(spec),
            settings=wandb.Settings(console="off"),
        )
        # The step history against tokens seen, so runs with different batch sizes line up.
        self.run.define_metric("train/tokens_seen")
        self.run.define_metric("train/*", step_metric="train/tokens_seen")
        # a step's own figure of what perf/ summarises (the median of the timed steps) has no
        # summary: W&B would show the last step's beside it, and nothing would say which is the figure
        for key in set(HISTORY_KEYS) & set(SUMMARY_KEYS):
            self.run.define_metric(f"train/{key}", step_metric="train/tokens_seen", summary="none")

    def log_step(self, record: dict) -> None:
        if self.run is not None:
            # Under train/: a history key would shadow the summary's figure of the same name.
            self.run.log({f"train/{k}": record[k] for k in HISTORY_KEYS}, step=record["step"])

    def finish(self, metrics: dict | None, plan: dict | None, status: str) -> None:
        if self.run is None:
            return
        self.run.summary.update(summary(metrics, plan, status))
        load = read_json(TrialPaths(self.trial_dir).node_load) or {}  # written by the launcher before the ranks
        if (share := real_number(load.get("busy_share"))) is not None:
            self.run.summary["perf/host_busy_share"] = (
                share  # a steady load slows every step alike: no scatter shows it
            )
        self.run.finish(exit_code=0 if status == "ok" else 1)
        self.run = None


def run_name(spec: TrialSpec, trial_dir: Path, sweep: dict) -> str:
    """What the run is called in W&B: a sweep point's swept values, else the trial's own
    overrides, else its directory's name (a plain run had none)."""
    return sweep.get("name") or fit_name(" ".join(spec.overrides)) or trial_dir.name


def run_id(trial_dir: Path) -> str:
    """The trial's W&B run id: the one an earlier attempt of it chose, else a new one
    (8 characters of [0-9a-f], as W&B's own ids)."""
    path = TrialPaths(trial_dir).wandb_run
    try:
        return json.loads(path.read_text())["id"]
    except (OSError, ValueError, KeyError):
        chosen = uuid.uuid4().hex[:8]
        atomic_write_json(path, {"id": chosen})
        return chosen


def sync_hint(trial_dirs: list[Path]) -> str | None:
    """How to upload the offline runs of these trials, or None if there are none."""
    runs = {p.name.rsplit("-", 1)[-1] for d in trial_dirs for p in TrialPaths(d).wandb_dir.glob("offline-run-*")}
    if not runs:
        return None
    wandb = TrialPaths(Path()).wandb_dir.name
    pattern = (
        f"{trial_dirs[0].parent}/*/{wandb}/offline-run-*"
        if len(trial_dirs) > 1
        else f"{trial_dirs[0]}/{wandb}/offline-run-*"
    )
    return f"W&B: {len(runs)} offline run(s) written; upload them with: wandb sync {pattern}"
