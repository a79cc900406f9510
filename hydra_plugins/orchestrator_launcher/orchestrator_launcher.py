"""hydra/launcher=orchestrator: the Hydra launcher plugin every `orchestrator run -m` sweep goes through.

Hydra's sweeper (the basic one, or a plugin such as Optuna) hands it a batch of points.
Each point is composed (Hydra's config loader), validated and given its directory
(hydra.sweep.dir/hydra.sweep.subdir, with .hydra/) by Hydra's own `run_job`. Then:
- cluster=local: the points run one after the other on this machine (torchrun or
  accelerate), each to its result.json;
- cluster=slurm: every point's files are written, then all are submitted at once through
  submitit as one job array, and the launcher returns without waiting (unless
  cluster.wait=true).

The work on the points is orchestrator/run/sweep_batch.py's; this class is only Hydra's
side of it. A point whose config is invalid (possible only with a sampling sweeper: the basic
sweeper's points are all validated before anything starts) is returned as failed, so
Optuna records a failed trial and samples on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from orchestrator.core.errors import ConfigError
from orchestrator.hydra_glue import hydra_registry
from orchestrator.hydra_glue.hydra_errors import config_error
from orchestrator.run.sweep_batch import SweepBatch, redact_sweep_record

hydra_registry.register()  # hydra/launcher=orchestrator, whichever app discovers this plugin first


class OrchestratorLauncher(Launcher):
    def __init__(self, group: str | None = None, hydra_subdir: str | None = ".hydra") -> None:
        """group, hydra_subdir: LauncherConfig's fields, set by the command that started the sweep."""
        self.group, self.hydra_subdir = group, hydra_subdir
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        batch = SweepBatch(
            [tuple(o) for o in job_overrides],
            initial_job_idx,
            Path(str(self.config.hydra.sweep.dir)),
            group=self.group,
            hydra_subdir=self.hydra_subdir,
            fixed=frozenset(map(str, self.config.hydra.overrides.task)),
        )
        redact_sweep_record(batch.base)  # the basic sweeper's multirun.yaml, before any point runs
        returns: list[JobReturn] = []
        for i, overrides in enumerate(job_overrides):
            try:
                point_cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            except Exception as exc:  # a sampled point Hydra cannot compose: a failed trial, not a crash
                error = exc if isinstance(exc, ConfigError) else config_error(exc, list(overrides))
                returns.append(_failed(overrides, error))
                continue
            with open_dict(point_cfg):
                point_cfg.hydra.job.id = f"{batch.job_id}_{initial_job_idx + i}"
                point_cfg.hydra.job.num = initial_job_idx + i
            returns.append(
                run_job(
                    hydra_context=self.hydra_context,
                    task_function=batch.task(i, point_cfg),
                    config=point_cfg,
                    job_dir_key="hydra.sweep.dir",
                    job_subdir_key="hydra.sweep.subdir",
                )
            )
        batch.submit()  # the SLURM points, as one array; nothing if all ran here
        return returns


def _failed(overrides: Sequence[str], exc: ConfigError) -> JobReturn:
    ret = JobReturn(overrides=list(overrides), status=JobStatus.FAILED)
    ret.return_value = exc
    return ret
