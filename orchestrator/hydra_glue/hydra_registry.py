"""What the orchestrator registers with Hydra: the trial's schema, its plugins' configs, a resolver.

`register()` runs before any composition (compose.py) and when Hydra discovers either
plugin, whichever comes first; registering twice is harmless.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from orchestrator.config import TrialConfig
from orchestrator.core.redact import redact_text


@dataclass
class LauncherConfig:
    """hydra/launcher=orchestrator: the launcher plugin every `run -m` goes through. Where
    and how a trial runs is the `cluster` group; these two fields are set by the command
    (orchestrator/commands.py) for the sweep it started, not by a user."""

    _target_: str = "hydra_plugins.orchestrator_launcher.orchestrator_launcher.OrchestratorLauncher"
    group: str | None = None  # the W&B group of the sweep's runs: its directory's name
    hydra_subdir: str | None = ".hydra"  # hydra.output_subdir as the user set it: written masked by the trial


@dataclass
class TuneConfig:
    """hydra/sweeper=orchestrator_tune: the plan-guided search `orchestrator tune` runs
    (orchestrator/analysis/tune/). Its space is the command line's: see tune/space.py."""

    _target_: str = "hydra_plugins.orchestrator_tuner.orchestrator_tuner.TuneSweeper"
    budget_trials: int = 8  # at most this many candidates run for real
    budget_min: float | None = None  # and no new round starts after this many minutes
    batch_size: int = 2  # candidates per round (a SLURM round runs them at once)


def register() -> None:
    """Make the schema known to Hydra as `trial` (conf/config.yaml's first default), the
    launcher plugin's config as hydra/launcher=orchestrator and the search's as
    hydra/sweeper=orchestrator_tune."""
    store = ConfigStore.instance()
    store.store(name="trial", node=TrialConfig)
    if not OmegaConf.has_resolver("orchestrator.dirname"):
        OmegaConf.register_new_resolver("orchestrator.dirname", dirname)
    store.store(group="hydra/launcher", name="orchestrator", node=LauncherConfig, provider="orchestrator")
    store.store(group="hydra/sweeper", name="orchestrator_tune", node=TuneConfig, provider="orchestrator")


def override_key(override: str) -> str:
    """The config key an override sets, its prefix left out (Hydra's grammar: `+key=v` adds,
    `++key=v` forces, `~key` deletes): decided here for every reader of an override."""
    return override.partition("=")[0].lstrip("+~")


def whole_numbers(text: str) -> str:
    """`10000.0` as `10000`, wherever a value in `text` is a whole number written as a float
    (Hydra writes a swept 1e4 so): in a point's name, W&B and the report."""
    return re.sub(r"(?<![\w.])(-?\d+)\.0+(?![\w.])", r"\1", text)


# What may not stand in one path component: a separator would nest a point's directory, or
# with `..` put it outside its sweep; control characters break the terminal and the logs.
NOT_IN_A_NAME = re.compile(r"[/\\\x00-\x1f\x7f]")


def fit_name(text: str, limit: int = 120) -> str:
    """`text` within `limit` bytes: what is cut is replaced by a hash of the whole, so two
    names that differ past the cut stay two names."""
    if len(text.encode()) <= limit:
        return text
    head = text.encode()[: limit - 9].decode(errors="ignore")  # whole characters, within the bytes
    return f"{head}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def dirname(overrides: str, limit: int = 120) -> str:
    """hydra.job.override_dirname as one safe path component: its secrets masked (redact.py:
    a directory's name is written into every launch file), every separator and control
    character a `_` (a swept value is any string: `a/b` or `../../x` must not nest a point
    or place it outside its sweep), cut to fit a file name (255 bytes) with a hash of what
    was cut, so two points never share a name (and the point's number leads the name anyway)."""
    return fit_name(NOT_IN_A_NAME.sub("_", whole_numbers(redact_text(overrides))), limit)
