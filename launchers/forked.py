"""torchrun whose ranks are forks of one process that has imported what they import.

A rank's first seconds are imports: torch, transformers' model module and the engine
(DeepSpeed, FSDP2), 6-7 s of CPU on a 2-core AMD EPYC, paid again by every rank of every
trial (docs/measurements.md, "Ranks forked from one launcher"). On a CPU host this module
imports them once, then runs torchrun itself (`torch.distributed.run.main`, what the
`torchrun` command runs) with torchrun's own flags `--start-method=fork --run-path`: each
rank is a fork of this process that runs the workload's file (workload/train.py) with its
imports already done. The rest is torchrun's: the rendezvous, each rank's environment,
ending the others when one fails, the failure summary.

`python -m orchestrator.launchers.forked TORCHRUN_FLAGS... TRIAL_DIR`, as launchers/local.py
writes it. Only where the trial's device is a CPU: CUDA may not be used in a child whose
parent initialised it, and importing DeepSpeed on a GPU host asks CUDA for its devices;
there the ranks start as new interpreters (torchrun's default).
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path


def torchrun_argv(argv: list[str]) -> list[str]:
    """torchrun's arguments for `argv` (its flags, the trial directory last): the workload's
    file run in each forked rank, the trial directory its one argument."""
    from orchestrator.workload import train

    *flags, trial_dir = argv
    return [*flags, "--start-method=fork", "--run-path", train.__file__, trial_dir]


def main(argv: list[str]) -> None:
    from orchestrator.process import collector_paused
    from orchestrator.spec import load_spec
    from orchestrator.workload.engines import import_libraries

    with collector_paused():  # the imports' objects are not walked, then frozen (workload/train.py says why)
        try:
            import_libraries(load_spec(Path(argv[-1])))
        except Exception:  # noqa: BLE001 - each rank imports again and records the cause as its own failure
            pass
        gc.freeze()

    from torch.distributed.run import main as torchrun

    torchrun(torchrun_argv(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
