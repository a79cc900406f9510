"""The SLURM node's own plan: `python -m orchestrator.run.node_plan TRIAL_DIR`, started by rank 0's
task before the ranks (launchers/slurm_task.plan_on_the_node), in a process of its own with the
ranks' environment. It times the trial's kernels on the allocated node and writes plan.json
(the submitted plan is kept beside it by the task). Launch starts it as it starts a rank, by its
module's name: the launch layer imports nothing of orchestration.
"""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.core.files import atomic_write_json
from orchestrator.records.trial_dir import TrialPaths
from orchestrator.run.planning import plan_trial
from orchestrator.spec import load_spec


def main(argv: list[str] | None = None) -> None:
    (trial_dir,) = argv if argv is not None else sys.argv[1:]
    paths = TrialPaths(Path(trial_dir).resolve())
    atomic_write_json(paths.plan, plan_trial(load_spec(paths.root), on_the_node=True).as_dict())


if __name__ == "__main__":
    main()
