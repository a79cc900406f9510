"""Checks on single values and on the composed tree, each raising a ConfigError that names
the field, the value and what is allowed. spec.py applies them field by field."""

from __future__ import annotations

import copy
import math
from collections.abc import Collection
from dataclasses import fields, is_dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from orchestrator.core.errors import ConfigError, did_you_mean, one_of


def reject_unknown_keys(node: DictConfig, prefix: str = "", skip: Collection[str] = ()) -> None:
    """`+model.foo=1` slips past Hydra's struct mode; the dataclass schema has the last word.
    Children named in `skip` are known to be checked already (a group converted earlier)."""
    kind = OmegaConf.get_type(node)
    allowed = [f.name for f in fields(kind)] if is_dataclass(kind) else None
    for item, value in node.items_ex(resolve=False):
        key = str(item)
        path = f"{prefix}.{key}" if prefix else key
        if allowed is not None and key not in allowed:
            raise ConfigError(
                path,
                value,
                f"'{prefix or 'the config'}' has no such field; its fields are "
                f"{one_of(allowed)}{did_you_mean(key, allowed)}",
            )
        if isinstance(value, DictConfig) and not value._is_none() and key not in skip:
            reject_unknown_keys(value, path)


def typed_config(cfg: DictConfig, reuse: dict[str, Any], changed: Collection[str]) -> Any:
    """The composed tree as its dataclasses, interpolations resolved; a key the schema does
    not have, an interpolation that cannot resolve (`${oc.env:NOPE}`, `${model.nope}`, a
    value that refers to itself) and NaN or infinity anywhere are refused: no field of a
    trial means either.

    OmegaConf's conversion is most of the time a sweep point takes to validate, and in a
    sweep over values most groups are the same at every point. `reuse` keeps each group's
    typed value across the points composed on one base (compose.Composed.typed_groups): a
    group is converted again only where a value change of this point touched it (`changed`)
    or it holds an interpolation (which may read a group that changed)."""
    kept = {k: v for k, v in reuse.items() if k not in changed}
    reject_unknown_keys(cfg, skip=kept)
    groups: dict[str, Any] = {}
    schema: Any = OmegaConf.get_type(cfg)  # the TrialConfig dataclass the tree was made from
    for f in fields(schema):
        if f.name in kept:
            groups[f.name] = copy.deepcopy(kept[f.name])  # the caller's own: spec.py sets aliases on it
            continue
        groups[f.name] = _converted(cfg, f.name)
        _reject_nonfinite(groups[f.name], f.name)
        if f.name not in changed and not _interpolates(cfg, f.name):
            reuse[f.name] = copy.deepcopy(groups[f.name])
    return schema(**groups)


def _converted(cfg: DictConfig, key: str) -> Any:
    try:
        node = cfg[key]
        return OmegaConf.to_object(node) if isinstance(node, DictConfig) else node
    except OmegaConfBaseException as exc:
        where = getattr(exc, "full_key", None) or key
        raise ConfigError(
            where, _raw(cfg, where), f"its interpolation cannot be resolved ({str(exc).splitlines()[0]})"
        ) from None


def _reject_nonfinite(node: Any, path: str) -> None:
    items = (
        [(f.name, getattr(node, f.name)) for f in fields(node)]
        if is_dataclass(node)
        else node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else []
    )
    for k, v in items:
        _reject_nonfinite(v, f"{path}[{k}]" if isinstance(node, list) else f"{path}.{k}")
    if isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(path, node, "a finite number (NaN and infinity mean nothing here)")


def _interpolates(node: Any, key: Any) -> bool:
    """Whether `node[key]` is, or holds anywhere below it, an interpolation."""
    if OmegaConf.is_interpolation(node, key):
        return True
    if OmegaConf.is_missing(node, key):
        return False
    child = node[key]  # not an interpolation: read as written
    if not isinstance(child, (DictConfig, ListConfig)):
        return False
    keys = child.keys() if isinstance(child, DictConfig) else range(len(child))
    return any(_interpolates(child, k) for k in keys)


def _raw(cfg: DictConfig, key: str) -> Any:
    """A field's value as written, interpolation unresolved ('?' if there is no such field)."""
    node: Any = cfg
    try:
        for part in key.split("."):
            node = node._get_node(part)
        return node._value()
    except (AttributeError, KeyError, OmegaConfBaseException):
        return "?"


def number_from_text(text: str) -> float | None:
    """A flag's or a CSV cell's text as a finite number, else None (the caller names the field
    and what it allows)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def check_choice(value: Any, field: str, allowed: tuple) -> Any:
    if value not in allowed:
        raise ConfigError(field, value, f"one of {one_of(allowed)}{did_you_mean(value, allowed)}")
    return value


def positive(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(field, value, "a whole number >= 1")
    return value


def at_most(value: int, field: str, limit: int) -> int:
    if value > limit:
        raise ConfigError(field, value, f"a whole number from 1 to {limit:,}; the nearest valid value is {limit}")
    return value


def time_limit_s(time: str) -> int:
    """SLURM's MM, HH:MM:SS or D-HH:MM:SS in seconds (MM:SS with one colon)."""
    days, _, clock = time.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if len(parts) == 1:
        seconds = parts[0] * 60
    else:
        parts = [0] * (3 - len(parts)) + parts
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return int(days or 0) * 86400 + seconds


def above_zero(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(field, value, "a number > 0")
    return value


def whole_number(value: Any, field: str, minimum: int) -> int:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and float(value).is_integer()
    if not ok or value < minimum:
        raise ConfigError(field, value, f"a whole number of elements >= {minimum} (5e8 and 500000000 both work)")
    return int(value)
