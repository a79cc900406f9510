"""hydra/launcher=orchestrator: the Hydra launcher plugin every `orchestrator run -m` sweep goes through.

Hydra's sweeper (the basic one, or a plugin such as Optuna) hands it a batch of points.
Each point is composed (Hydra's config loader), validated and given its directory
(hydra.sweep.dir/hydra.sweep.subdir, with .hydra/) by Hydra's own `run_job`. Then:
- cluster=local: the points run one after the other on this machine (torchrun or
  accelerate), each to its result.json;
- cluster=slurm: every point's files are written, then all are submitted at once through
  submitit as one job array, and the launcher returns without waiting (unless
  cluster.wait=true).

A point whose config is invalid (possible only with a sampling sweeper: the basic
sweeper's points are all validated before anything starts) is returned as failed, so
Optuna records a failed trial and samples on.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Sequence

from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from orchestrator import config
from orchestrator.compose import config_error
from orchestrator.errors import ConfigError

log = logging.getLogger(__name__)
config.register()  # hydra/launcher=orchestrator, whichever app discovers this plugin first


class OrchestratorLauncher(Launcher):
    def __init__(self) -> None:
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from orchestrator import hydra_app  # the orchestrator's side: what a point is and how it runs

        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        sweep = hydra_app.Batch.of(job_overrides, initial_job_idx, Path(str(self.config.hydra.sweep.dir)))
        hydra_app.redact_sweep_record(sweep.base)  # the basic sweeper's multirun.yaml, before any point runs
        returns: list[JobReturn] = []
        for i, overrides in enumerate(job_overrides):
            try:
                point_cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            except Exception as exc:  # a sampled point Hydra cannot compose: a failed trial, not a crash
                error = exc if isinstance(exc, ConfigError) else config_error(exc, list(overrides))
                returns.append(_failed(overrides, error))
                continue
            with open_dict(point_cfg):
                point_cfg.hydra.job.id = f"{sweep.job_id}_{initial_job_idx + i}"
                point_cfg.hydra.job.num = initial_job_idx + i
            task = functools.partial(sweep.prepare if sweep.on_slurm(point_cfg) else sweep.run, i)
            returns.append(run_job(hydra_context=self.hydra_context, task_function=task, config=point_cfg,
                                   job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir"))
        sweep.submit()  # the SLURM points, as one array; nothing if all ran here
        return returns


def _failed(overrides: Sequence[str], exc: ConfigError) -> JobReturn:
    ret = JobReturn(overrides=list(overrides), status=JobStatus.FAILED)
    ret.return_value = exc
    return ret
