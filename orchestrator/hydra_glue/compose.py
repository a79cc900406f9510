"""From command-line overrides to composed configs, through Hydra.

This module owns the meeting point with Hydra's config machinery: composing the tree
(conf_tree.py says where it lives) with a trial's overrides (Hydra's Compose API), and
expanding a multirun sweep into its points (Hydra's own BasicSweeper, so `a=1,2 b=x,y`,
`range(...)`, `glob(...)` and a sweep file's `hydra.sweeper.params` mean exactly what
they mean to Hydra). Hydra's and OmegaConf's exceptions become one-paragraph
ConfigErrors in hydra_errors.py.

Two steps have no public Hydra API (applying value overrides to a composed config, and
splitting a sweep into its points): they go through hydra_compat.py, as every private
Hydra call does.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from orchestrator import config
from orchestrator.core.errors import ConfigError, one_of
from orchestrator.hydra_glue import hydra_registry
from orchestrator.hydra_glue.conf_tree import Source, current_source, presets
from orchestrator.hydra_glue.hydra_compat import apply_value_changes, hydra_config_as, split_sweep
from orchestrator.hydra_glue.hydra_errors import config_error


def plain_dict(node: Any, resolve: bool = True) -> dict:
    """A composed config (or a part of one) as plain Python: dicts, lists, enums as their strings."""
    data = OmegaConf.to_container(node, resolve=resolve, enum_to_str=True)
    assert isinstance(data, dict), type(data)  # a DictConfig always gives a dict
    return data


@dataclass(frozen=True)
class Composed:
    """One composed trial: the config, the preset chosen per group, the overrides, and
    Hydra's own settings for it (run and sweep directories, launcher, sweeper)."""

    cfg: DictConfig
    choices: dict[str, str]
    overrides: tuple[str, ...]
    sweep_params: dict[str, str]
    hydra_choices: dict[str, str] = field(default_factory=dict)
    hydra_dirs: dict = field(default_factory=dict)  # run, sweep: hydra.run.dir / sweep.dir resolved; output_subdir
    # The groups this point's value changes set (zero for zero.stage=2): the rest are the
    # cached base's, whose typed values `typed_groups` keeps for every point composed on it
    # (checks.typed_config fills and reads it).
    changed: frozenset[str] = frozenset()
    typed_groups: dict = field(default_factory=dict, compare=False)


def compose_trial(overrides: list[str]) -> Composed:
    """Compose conf/config.yaml with `overrides`; raise ConfigError on any bad input.

    The config returned is the caller's own copy. Where it is only read, `composing` saves
    the copy (a third of the time of planning a point)."""
    with composing(overrides) as composed:
        return dataclasses.replace(composed, cfg=copy.deepcopy(composed.cfg), typed_groups={})


@contextlib.contextmanager
def composing(overrides: list[str] | tuple[str, ...]) -> Iterator[Composed]:
    """The composed config of `overrides`, to read inside the `with` block only.

    Composition is Hydra's. Group choices and appends (model=..., +sweep=...) go through
    Hydra's compose, cached per distinct set; plain value changes (zero.stage=2) are then
    applied with Hydra's own override applier onto that cached config, and undone when the
    block ends, so a 1,000-point sweep over values composes once instead of 1,000 times.
    """
    overrides = list(overrides)
    try:
        parsed = [_parse(o) for o in overrides]
    except OverrideParseException as exc:
        raise config_error(exc, overrides) from None
    _reject_deletions(parsed)
    _reject_null_groups(parsed)
    _reject_paths(parsed)
    structural = tuple(o.input_line for o in parsed if not _is_value_change(o))
    base = _compose_with_hydra(current_source(), structural)
    changes = [o for o in parsed if _is_value_change(o)]
    saved = [_saved(base.cfg, o.key_or_group) for o in changes]
    try:
        try:
            apply_value_changes(changes, base.cfg)
        except (HydraException, OmegaConfBaseException) as exc:
            raise config_error(exc, overrides) from None
        yield dataclasses.replace(
            base, overrides=tuple(overrides), changed=frozenset(o.key_or_group.split(".")[0] for o in changes)
        )
    finally:
        for key, node in reversed(saved):
            _restore(base.cfg, key, node)


_ABSENT = object()


def _saved(cfg: DictConfig, key: str) -> tuple[str, object]:
    """A copy of the node at dotted `key` as it is now (_ABSENT where there is none)."""
    parent_key, _, name = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key, throw_on_missing=False) if parent_key else cfg
    if not isinstance(parent, DictConfig) or name not in parent:
        return key, _ABSENT
    return key, copy.deepcopy(parent._get_node(name))


def _restore(cfg: DictConfig, key: str, node: object) -> None:
    parent_key, _, name = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key, throw_on_missing=False) if parent_key else cfg
    if not isinstance(parent, DictConfig):
        return
    with open_dict(parent):
        if node is _ABSENT:
            parent.pop(name, None)
        else:
            parent[name] = node


def _reject_paths(parsed: list[Override]) -> None:
    """A group, a key or a preset name is a name of this config tree, never a path out of it
    (model=../config) nor longer than a file name may be."""
    for o in parsed:
        key, value = o.key_or_group, o.input_line.partition("=")[2] if o.input_line else ""
        for what, name in (
            ("a config key", key),
            ("a preset name", value if not (_is_value_change(o) or key.startswith("hydra.")) else ""),
        ):
            if ".." in name.split("/") or len(name.encode()) > 255:
                raise ConfigError(key, value, f"{what} of this config tree: no '..', at most 255 bytes")


@functools.lru_cache(maxsize=4096)
def _parse(override: str) -> Override:
    """One override parsed by Hydra's grammar, cached: a sweep repeats each value many times."""
    return OverridesParser.create().parse_overrides([override])[0]


@contextlib.contextmanager
def _session(source: Source) -> Iterator[None]:
    """Hydra initialised on `source` (GlobalHydra holds its config loader meanwhile)."""
    hydra_registry.register()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=source.primary, version_base=None):
            yield
    finally:
        GlobalHydra.instance().clear()


def searchpath_overrides(source: Source) -> list[str]:
    """Hydra's override that searches the source's extra preset folders (-cd's, the user's own)."""
    return [f"hydra.searchpath=[{','.join('file://' + d for d in source.extra_dirs)}]"] if source.extra_dirs else []


@functools.lru_cache(maxsize=256)
def _compose_with_hydra(source: Source, overrides: tuple[str, ...]) -> Composed:
    try:
        with _session(source):
            cfg = compose(
                source.config_name, overrides=list(overrides) + searchpath_overrides(source), return_hydra_config=True
            )
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise config_error(exc, list(overrides)) from None
    except OSError as exc:  # a group or preset name past the file system's limits
        raise ConfigError(
            "override", exc.filename or "", f"a config group and preset of this tree ({exc.strerror})"
        ) from None
    except yaml.YAMLError as exc:  # a preset file (ours or one on hydra.searchpath) that is not YAML
        mark = getattr(exc, "problem_mark", None)
        where = f"{mark.name}, line {mark.line + 1}" if mark else "a preset file"
        raise ConfigError("preset file", where, f"not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    choices = {g: str(c) for g, c in cfg.hydra.runtime.choices.items() if not g.startswith("hydra/")}
    hydra_choices = {g: str(c) for g, c in cfg.hydra.runtime.choices.items() if g.startswith("hydra/")}
    params = {str(k): str(v) for k, v in (cfg.hydra.sweeper.get("params") or {}).items()}
    try:
        with hydra_config_as(cfg):  # for ${hydra:...} in a directory's name
            dirs = {key: str(OmegaConf.select(cfg, f"hydra.{key}.dir")) for key in ("run", "sweep")}
        dirs["output_subdir"] = cfg.hydra.output_subdir  # .hydra, or None: Hydra writes none
    except OmegaConfBaseException as exc:
        raise config_error(exc, list(overrides)) from None
    with open_dict(cfg):
        del cfg["hydra"]
    return Composed(
        cfg=cfg, choices=choices, overrides=overrides, sweep_params=params, hydra_choices=hydra_choices, hydra_dirs=dirs
    )


def _reject_null_groups(parsed: list[Override]) -> None:
    """`logger=null`: Hydra would drop the group; every group of the schema is needed."""
    for o in parsed:
        key = o.key_or_group
        if o.type == OverrideType.CHANGE and key in config.GROUPS and o.value() is None:
            raise ConfigError(
                key,
                None,
                f"every config group needs a preset: {one_of(presets(key))}"
                + (" (logger.mode=disabled turns W&B off)" if key == "logger" else ""),
            )


def _reject_deletions(parsed: list[Override]) -> None:
    """`~model` or `~run.lr`: every group and field of the schema is needed, so a deletion
    could only fall back to the schema's defaults without saying so."""
    for o in parsed:
        if o.type == OverrideType.DEL and not o.key_or_group.startswith("hydra"):
            key = o.key_or_group
            instead = (
                f"choose another preset ({key}=NAME; {one_of(presets(key))})"
                if key in config.GROUPS
                else f"set its fields ({key}.FIELD=VALUE)"
                if key in config.FIELD_GROUPS
                else f"set a value ({key}=VALUE)"
            )
            raise ConfigError(
                f"~{key}", "(delete)", f"every config group and field is needed, so nothing can be deleted; {instead}"
            )


def _is_value_change(o: Override) -> bool:
    """`a.b=value`: a field of a group, not a group choice, append, deletion or sweep."""
    key = o.key_or_group
    return (
        o.type == OverrideType.CHANGE
        and o.package is None
        and not o.is_sweep_override()
        and "." in key
        and not key.startswith("hydra.")
    )


def fixed_part(overrides: list[str]) -> list[str]:
    """The overrides of a multirun that are the same at every point (no sweep syntax)."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as exc:
        raise config_error(exc, overrides) from None
    return [str(o.input_line) for o in parsed if not o.is_sweep_override()]  # parsed from a line: it has one


MAX_POINTS = 10_000  # a sweep (or a tune's space) past this many points is refused unless --max-points says so
PROGRESS_EVERY_S = 5.0  # a long validation (a sweep's points, a CSV's rows) says how far it is, this often


def expand_sweep(overrides: list[str]) -> list[list[str]]:
    """The override list of every point of a multirun, in Hydra's (basic sweeper's) order."""
    fixed = fixed_part(overrides)
    # A sweep file (+sweep=NAME) declares its axes in hydra.sweeper.params. An axis the
    # command line also names is taken from the command line alone (Hydra would sweep
    # the product of both and then let the last win, running duplicate points).
    named = {hydra_registry.override_key(o) for o in overrides}
    from_file = [f"{k}={v}" for k, v in compose_trial(fixed).sweep_params.items() if k not in named]
    with _session(current_source()):  # glob() lists a group's presets through the config loader
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        try:
            everything = parser.parse_overrides(from_file + list(overrides))
            batches = split_sweep(everything)
        except OverrideParseException as exc:
            raise config_error(exc, from_file + list(overrides)) from None
        except HydraException as exc:
            if "INTERVAL_SWEEP" in str(exc):
                line = next((o for o in overrides if "interval(" in o), "interval(...)")
                key, _, value = line.partition("=")
                raise ConfigError(
                    key,
                    value,
                    "interval() is a range to sample from, which the basic sweeper cannot "
                    "enumerate; sample it with a sweeper plugin (hydra/sweeper=optuna), or list "
                    "values: a,b,c or range(start,stop,step)",
                ) from None
            raise config_error(exc, overrides) from None
    return [list(point) for batch in batches for point in batch]


def swept_values(points: list[tuple[str, ...]]) -> list[dict[str, str]]:
    """For each point, the overrides whose value differs between points, or that some points
    set and others do not (two sweeps read together: zero.stage=1 only in the second tells
    its rows apart): what was swept (a whole number as one: Hydra writes a swept 1e4 as 10000.0)."""
    seen: dict[str, set] = {}
    having: dict[str, int] = {}
    for point in points:
        for key in {o.partition("=")[0] for o in point}:
            having[key] = having.get(key, 0) + 1
        for o in point:
            key, _, value = o.partition("=")
            seen.setdefault(key, set()).add(value)
    swept = [k for k, values in seen.items() if len(values) > 1 or having[k] < len(points)]
    return [
        {k: hydra_registry.whole_numbers(v) for k, _, v in (o.partition("=") for o in point) if k in swept}
        for point in points
    ]
