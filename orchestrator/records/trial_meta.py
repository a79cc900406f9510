"""trial.json: what a trial was made from, beside its config.yaml.

Written once, by translate/ before launch; read back by the spec (a rank, a report, calibrate
rebuild the trial from it), by rank 0 (its W&B run's group and name) and by the commands that
group trials (a resumed sweep's W&B group, points told apart by a masked secret). This module
owns its keys: `overrides` (the command line's, as typed but masked), `choices` (the preset
chosen in each config group) and `sweep` (the point's W&B group, name, index, swept values,
masked; {} for a single trial).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.core.files import read_json, read_text
from orchestrator.records.trial_dir import TrialPaths


@dataclass(frozen=True)
class TrialMeta:
    overrides: tuple[str, ...]
    choices: dict[str, str]
    sweep: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"overrides": list(self.overrides), "choices": dict(self.choices), "sweep": self.sweep}

    @classmethod
    def read(cls, trial_dir: Path) -> TrialMeta:
        """The trial's trial.json; OSError, ValueError, KeyError or TypeError where it is not one."""
        data = json.loads(read_text(TrialPaths(trial_dir).meta))
        sweep = data.get("sweep") or {}
        if not isinstance(sweep, dict):
            raise TypeError(f"trial.json's sweep is a {type(sweep).__name__}, not a mapping")
        return cls(tuple(str(o) for o in data["overrides"]), dict(data["choices"]), sweep)


def sweep_point(trial_dir: Path) -> dict:
    """The trial's sweep point as trial.json has it; {} where there is none or it cannot be read
    (a listing of many trials goes on past one damaged file)."""
    data = read_json(TrialPaths(trial_dir).meta)
    sweep = data.get("sweep") if isinstance(data, dict) else None
    return sweep if isinstance(sweep, dict) else {}
