"""Every use of Hydra's private API, in one place.

Hydra has no public API for four things the orchestrator needs, so each is wrapped here
and nowhere else, and tests/test_hydra_compat.py checks each against the hydra-core
range pyproject allows (>=1.3.2,<1.4). A new hydra-core that moves one of them breaks
that test, not a user's sweep.

- `hydra_arguments`: the command-line parser `hydra.main` uses, so `run`, `plan`,
  `translate` and `tune` read their flags exactly as any Hydra app does.
- `apply_value_changes`: applying plain `a.b=value` overrides onto an already composed
  config (Hydra's config loader does this as its last step of composing), which lets a
  1,000-point sweep over values compose once.
- `split_sweep`: the basic sweeper's expansion of a multirun into its points, so
  `a=1,2 b=x,y`, `range()` and `glob()` mean what they mean to Hydra.
- `hydra_config_as`: HydraConfig's process-wide state, set for a moment so that a
  `${hydra:...}` interpolation in a directory's name resolves outside a Hydra run.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Sequence

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig


def hydra_arguments(argv: Sequence[str]) -> argparse.Namespace:
    """argv parsed as `hydra.main` parses it: overrides, -m, --cfg, -cp/-cn/-cd, ..."""
    return get_args_parser().parse_args(list(argv))


def apply_value_changes(changes: list[Override], cfg: DictConfig) -> None:
    """Apply parsed `key=value` overrides onto `cfg` in place, with Hydra's own rules
    (type checks of the structured schema, `+key` appends, `++key` forces)."""
    ConfigLoaderImpl._apply_overrides_to_config(changes, cfg)


def split_sweep(parsed: list[Override]) -> list[list[list[str]]]:
    """The points of a multirun in the basic sweeper's order, as one batch of override lists."""
    return BasicSweeper.split_arguments(parsed, max_batch_size=None)


@contextlib.contextmanager
def hydra_config_as(cfg: DictConfig) -> Iterator[None]:
    """HydraConfig holds `cfg` inside the block; whatever it held before (a job Hydra is
    running now, whose task may be composing) is put back after."""
    running = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(cfg)
    try:
        yield
    finally:
        HydraConfig.instance().cfg = running
