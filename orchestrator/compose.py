"""From command-line overrides to composed configs, through Hydra.

This module owns the meeting point with Hydra: where the config tree lives, composing
`conf/config.yaml` with a trial's overrides (Hydra's Compose API), expanding a multirun
sweep into its points (Hydra's own BasicSweeper, so `a=1,2 b=x,y`, `range(...)`,
`glob(...)` and a sweep file's `hydra.sweeper.params` mean exactly what they mean to
Hydra), and turning Hydra's and OmegaConf's exceptions into one-paragraph ConfigErrors.
"""

from __future__ import annotations

import copy
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from orchestrator import config
from orchestrator.errors import ConfigError, one_of

_REPO = Path(__file__).resolve().parent.parent


def conf_dir() -> Path:
    """The config tree: $ORCHESTRATOR_CONF, the installed copy, or the checkout's conf/.

    conf/sweep is a link to the top-level sweeps/, so `+sweep=NAME` is a plain Hydra group.
    The wheel ships conf/ as orchestrator/conf (setup.py).
    """
    if env := os.environ.get("ORCHESTRATOR_CONF"):
        return Path(env).resolve()
    installed = Path(__file__).resolve().parent / "conf"
    return installed if (installed / "config.yaml").is_file() else _REPO / "conf"


def presets(group: str) -> list[str]:
    """The preset names of a config group, as `orchestrator --help` lists them."""
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


@dataclass(frozen=True)
class Composed:
    """One composed trial: the config, the preset chosen per group, the overrides."""

    cfg: DictConfig
    choices: dict[str, str]
    overrides: tuple[str, ...]
    sweep_params: dict[str, str]


def compose_trial(overrides: list[str]) -> Composed:
    """Compose conf/config.yaml with `overrides`; raise ConfigError on any bad input.

    Composition is Hydra's. Group choices and appends (model=..., +sweep=...) go through
    Hydra's compose, cached per distinct set; plain value changes (zero.stage=2) are then
    applied with Hydra's own override applier, so a 1,000-point sweep over values
    composes once instead of 1,000 times.
    """
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as exc:
        raise _translate(exc, overrides) from None
    _reject_deletions(parsed)
    structural = tuple(o.input_line for o in parsed if not _is_value_change(o))
    base = _compose_with_hydra(str(conf_dir()), structural)
    cfg = copy.deepcopy(base.cfg)
    try:
        ConfigLoaderImpl._apply_overrides_to_config([o for o in parsed if _is_value_change(o)], cfg)
    except (HydraException, OmegaConfBaseException) as exc:
        raise _translate(exc, overrides) from None
    return Composed(cfg=cfg, choices=base.choices, overrides=tuple(overrides), sweep_params=base.sweep_params)


@functools.lru_cache(maxsize=256)
def _compose_with_hydra(config_dir: str, overrides: tuple[str, ...]) -> Composed:
    config.register()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as exc:
        raise _translate(exc, list(overrides)) from None
    except yaml.YAMLError as exc:  # a preset file (ours or one on hydra.searchpath) that is not YAML
        mark = getattr(exc, "problem_mark", None)
        where = f"{mark.name}, line {mark.line + 1}" if mark else "a preset file"
        raise ConfigError("preset file", where, f"not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    finally:
        GlobalHydra.instance().clear()
    choices = {g: str(c) for g, c in cfg.hydra.runtime.choices.items() if not g.startswith("hydra/")}
    params = {str(k): str(v) for k, v in (cfg.hydra.sweeper.get("params") or {}).items()}
    with open_dict(cfg):
        del cfg["hydra"]
    return Composed(cfg=cfg, choices=choices, overrides=overrides, sweep_params=params)


def _reject_deletions(parsed: list[Override]) -> None:
    """`~model` or `~run.lr`: every group and field of the schema is needed, so a deletion
    could only fall back to the schema's defaults without saying so."""
    for o in parsed:
        if o.type == OverrideType.DEL and not o.key_or_group.startswith("hydra"):
            key = o.key_or_group
            instead = (f"choose another preset ({key}=NAME; {one_of(presets(key))})" if key in config.GROUPS
                       else f"set its fields ({key}.FIELD=VALUE)" if key in config.FIELD_GROUPS
                       else f"set a value ({key}=VALUE)")
            raise ConfigError(f"~{key}", "(delete)", f"every config group and field is needed, so nothing can be "
                              f"deleted; {instead}")


def _is_value_change(o: Override) -> bool:
    """`a.b=value`: a field of a group, not a group choice, append, deletion or sweep."""
    key = o.key_or_group
    return (o.type == OverrideType.CHANGE and o.package is None and not o.is_sweep_override()
            and "." in key and not key.startswith("hydra."))


def expand_sweep(overrides: list[str]) -> list[list[str]]:
    """The override list of every point of a multirun, in Hydra's order."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
    except OverrideParseException as exc:
        raise _translate(exc, overrides) from None
    # A sweep file (+sweep=NAME) declares its axes in hydra.sweeper.params. An axis the
    # command line also names is taken from the command line alone (Hydra would sweep
    # the product of both and then let the last win, running duplicate points).
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    named = {o.key_or_group for o in parsed}
    from_file = [f"{k}={v}" for k, v in compose_trial(fixed).sweep_params.items() if k not in named]
    try:
        everything = parser.parse_overrides(from_file + list(overrides))
    except OverrideParseException as exc:
        raise _translate(exc, from_file) from None
    batches = BasicSweeper.split_arguments(everything, max_batch_size=None)
    return [list(point) for batch in batches for point in batch]


def swept_values(points: list[tuple[str, ...]]) -> list[dict[str, str]]:
    """For each point, the overrides whose value differs between points: what was swept."""
    seen: dict[str, set] = {}
    for point in points:
        for o in point:
            key, _, value = o.partition("=")
            seen.setdefault(key, set()).add(value)
    swept = [k for k, values in seen.items() if len(values) > 1]
    return [{k: v for k, _, v in (o.partition("=") for o in point) if k in swept} for point in points]


# --- Hydra's exceptions, said in one paragraph ------------------------------------------


def _translate(exc: Exception, overrides: list[str]) -> ConfigError:
    cause = exc.__cause__ or exc
    text = str(exc)
    if isinstance(exc, MissingConfigException) and (m := re.search(r"Could not find '([^/']+)/([^']+)'", text)):
        group, option = m.groups()
        return ConfigError(group, option, f"config group '{group}' has the presets {one_of(exc.options or presets(group))} "
                           f"(or add conf/{group}/{option}.yaml)")
    if m := re.search(r"Key '([^']+)' not in '(\w+)'", str(cause)):
        key = _full_key(cause) or m.group(1)
        value = _value_of(key, overrides)
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        return ConfigError(key, value, _unknown_key_help(parent))
    if "could not be converted to" in str(cause) or "is not Optional" in str(cause):
        key = _full_key(cause) or "?"
        kind = re.search(r"converted to (\w+)", str(cause))
        wanted = {"Integer": "a whole number", "Float": "a number", "Boolean": "true or false"}.get(
            kind.group(1) if kind else "", "a value of the field's type")
        if "is not Optional" in str(cause):
            wanted = "a value (this field cannot be null)"
        return ConfigError(key, _value_of(key, overrides), f"expected {wanted}")
    if "Ambiguous value" in text:
        line = re.search(r"argument '([^']+)'", text)
        key, _, value = (line.group(1) if line else "?=?").partition("=")
        return ConfigError(key, value, "a comma sweeps over values; add -m to run a sweep, "
                           "or quote the value for a string, or write [a,b] for a list")
    if isinstance(exc, OverrideParseException):
        bad = next((o for o in overrides if not _parses(o)), " ".join(overrides))
        return ConfigError("override", bad, f"not Hydra override syntax ({text.splitlines()[0]}); quote values "
                           "with special characters: key='a b', key=[\"--flag=x\"]")
    first = text.splitlines()[0] if text else type(exc).__name__
    return ConfigError("config", " ".join(overrides) or "(defaults)", first)


def _parses(override: str) -> bool:
    try:
        OverridesParser.create().parse_overrides([override])
        return True
    except OverrideParseException:
        return False


def _full_key(cause: BaseException) -> str | None:
    m = re.search(r"full_key: (\S+)", str(cause))
    return m.group(1) if m else None


def _value_of(key: str, overrides: list[str]) -> str:
    for o in overrides:
        k, _, v = o.lstrip("+~").partition("=")
        if k == key:
            return v
    return "?"


def _unknown_key_help(parent: str) -> str:
    if not parent:
        return (f"not a config group or field; the groups are {one_of(config.GROUPS + config.FIELD_GROUPS)}")
    fields = fields_of(parent)
    return f"'{parent}' has no such field; its fields are {one_of(fields)}" if fields else "no such field"


def fields_of(path: str) -> list[str]:
    """Field names of the schema node at a dotted path ('zero', 'hardware.intra_node')."""
    node = OmegaConf.structured(config.TrialConfig)
    for part in path.split("."):
        node = node.get(part) if isinstance(node, DictConfig) else None
        if node is None:
            return []
    return [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
