"""Every reliance on W&B's internals, in one place (tests/test_wandb_compat.py checks it).

- `import_wandb`: `wandb.init` imports W&B's launch package on every call
  (`wandb.sdk.launch.inputs.internal`, to apply a launch job's staged inputs, which a
  trial never has). Its pydantic models read their fields' docstrings with
  `inspect.getsource`, and `inspect.getmodule` walks every module loaded: importing it
  took 0.16 CPU-s in a bare interpreter and 0.9 after torch, transformers and DeepSpeed
  (3,400 modules), on the 2-core AMD EPYC (2026-11-28). Rank 0 imports it before torch,
  and the launcher server imports it once for every rank it forks (a forked rank 0 paid
  1-2 CPU-s of its trial's 2-4 for it: docs/measurements.md, "Costs of every trial that
  were not the trial's").
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

# What wandb.init imports when it is first called, beside wandb itself.
INIT_IMPORTS = ("wandb.sdk.launch.inputs.internal",)


def import_wandb(mode: str) -> ModuleType | None:
    """wandb and what its init imports, for a run in `mode` (None where it is disabled).
    WANDB_MODE is set before the import, so offline never opens a connection, not even at
    exit."""
    if mode == "disabled":
        return None
    os.environ["WANDB_MODE"] = mode
    os.environ.setdefault("WANDB_SILENT", "true")
    wandb = importlib.import_module("wandb")
    for name in INIT_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:  # another W&B version: its init imports what it needs (tests say so)
            pass
    return wandb
