"""Where the config tree lives: the shipped conf/ (or what -cp / -cn / -cd name), the
user's own presets searched before it, and the preset names of each group."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.files import xdg_dir

_PACKAGE = Path(__file__).resolve().parent.parent  # orchestrator/
_REPO = _PACKAGE.parent
CONFIG_NAME = "config"  # the tree's primary config (Hydra's --config-name)


def conf_dir() -> Path:
    """The config tree: $ORCHESTRATOR_CONF, the installed copy, or the checkout's conf/.

    conf/sweep is a link to the top-level sweeps/, so `+sweep=NAME` is a plain Hydra group.
    The wheel ships conf/ as orchestrator/conf (setup.py).
    """
    if env := os.environ.get("ORCHESTRATOR_CONF"):
        return Path(env).resolve()
    installed = _PACKAGE / "conf"
    return installed if (installed / f"{CONFIG_NAME}.yaml").is_file() else _REPO / "conf"


def user_conf_dir() -> Path:
    """The user's own presets ($ORCHESTRATOR_USER_CONF, or ~/.config/orchestrator/conf):
    searched before the shipped ones, and where `orchestrator calibrate` writes."""
    if env := os.environ.get("ORCHESTRATOR_USER_CONF"):
        return Path(env).resolve()
    return xdg_dir("XDG_CONFIG_HOME", ".config") / "orchestrator" / "conf"


@dataclass(frozen=True)
class Source:
    """Where the config tree is read from: Hydra's --config-path, --config-name and
    --config-dir (more preset folders, searched first)."""

    config_dir: str = ""  # absolute; "" = conf_dir()
    config_name: str = CONFIG_NAME
    extra_dirs: tuple[str, ...] = ()  # -cd's, then the user's own (user_conf_dir) where it exists

    @property
    def primary(self) -> str:
        return self.config_dir or str(conf_dir())


def with_user_presets(source: Source) -> Source:
    user = user_conf_dir()
    if not user.is_dir() or str(user) in source.extra_dirs:
        return source
    return dataclasses.replace(source, extra_dirs=(*source.extra_dirs, str(user)))


_source = with_user_presets(Source())


def current_source() -> Source:
    """The tree the command line chose (what `use_source` was last given)."""
    return _source


def use_source(source: Source) -> None:
    """The tree every later composition reads (the command line's -cp / -cn / -cd)."""
    global _source
    _source = with_user_presets(source)


def presets(group: str) -> list[str]:
    """The preset names of a config group, as `orchestrator --help` lists them."""
    dirs = [Path(_source.primary), *map(Path, _source.extra_dirs)]
    return sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")})
