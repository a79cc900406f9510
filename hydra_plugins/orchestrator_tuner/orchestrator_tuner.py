"""hydra/sweeper=orchestrator_tune: the plan-guided search, as a Hydra sweeper plugin.

`orchestrator tune OVERRIDES` is `orchestrator run -m hydra/sweeper=orchestrator_tune
OVERRIDES`; either way this sweeper plans the whole space (orchestrator/analysis/tune/space.py),
then hands the launcher (ours: here or on SLURM) a few candidates per round, learns from
what they measured (orchestrator/analysis/tune/search.py) and chooses the next ones, until its
budget is spent or nothing left could beat the best. After every round it writes the
search into the sweep directory (tune.json, tune.md, tune.png; orchestrator/analysis/tune/record.py),
so an interrupted search resumes from there without running a finished candidate again.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from orchestrator.hydra_glue import hydra_registry

hydra_registry.register()  # hydra/sweeper=orchestrator_tune, whichever app discovers this plugin first


class TuneSweeper(Sweeper):
    def __init__(self, budget_trials: int = 8, budget_min: float | None = None, batch_size: int = 2) -> None:
        self.budget_trials, self.budget_min, self.batch_size = budget_trials, budget_min, batch_size
        self.config: DictConfig | None = None
        self.launcher = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        from orchestrator.analysis.tune import record
        from orchestrator.analysis.tune.search import Search
        from orchestrator.analysis.tune.space import plan_space
        from orchestrator.run.display import console

        assert self.config is not None and self.launcher is not None
        base = Path(str(self.config.hydra.sweep.dir))
        out = console()
        started = time.monotonic()
        search = Search(plan_space(list(arguments)))
        next_num = record.resume(base, search)
        if search.outcomes:
            out.print(f"resuming {base}: {len(search.outcomes)} candidate(s) already ran")
            search.calibrate()
        record.show_ranking(search, out)
        record.write(base, search)  # from now on `--out` again resumes, even before a trial ends
        while len(search.outcomes) < self.budget_trials:
            if self.budget_min is not None and time.monotonic() - started >= 60 * self.budget_min:
                search.stopped = f"the time budget ({self.budget_min:g} min) is spent"
                break
            batch = search.next_batch(min(self.batch_size, self.budget_trials - len(search.outcomes)))
            if not batch:
                search.stopped = "no candidate left could beat the best measured, by the calibrated model"
                break
            search.rounds += 1
            out.print(f"[bold]round {search.rounds}[/bold]: " + "; ".join(c.label() for c in batch))
            returns = self.launcher.launch([list(c.overrides) for c in batch], initial_job_idx=next_num)
            next_num += len(batch)
            record.take(base, search, batch, returns, out)
            search.calibrate()
            search.elapsed_s += time.monotonic() - started
            started = time.monotonic()
            record.write(base, search)
        else:
            search.stopped = f"the trial budget ({self.budget_trials}) is spent"
        search.elapsed_s += time.monotonic() - started
        record.write(base, search)
        record.show_winner(base, search, out)
        return search
