"""Hydra's and OmegaConf's exceptions, said as one ConfigError paragraph (exit 2) that
names the field, the value and what is allowed."""

from __future__ import annotations

import re

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf

from orchestrator import config
from orchestrator.core.errors import ConfigError, did_you_mean, one_of
from orchestrator.hydra_glue.conf_tree import presets
from orchestrator.hydra_glue.hydra_registry import override_key


def config_error(exc: Exception, overrides: list[str]) -> ConfigError:
    """Hydra's or OmegaConf's exception, said as one ConfigError paragraph (exit 2)."""
    cause = exc.__cause__ or exc
    text = str(exc)
    if isinstance(exc, MissingConfigException) and (m := re.search(r"Could not find '(.+)/([^/']+)'", text)):
        group, option = m.groups()
        if group == "hydra/launcher":
            return foreign_launcher(option)
        options = exc.options or presets(group)
        return ConfigError(
            group,
            option,
            f"config group '{group}' has the presets {one_of(options)}"
            f"{did_you_mean(option, options)} (or add conf/{group}/{option}.yaml)",
        )
    if "Config group override must be a string" in text:
        return ConfigError("config group", "null", "every config group needs a preset")
    if m := re.search(r"Key '([^']+)' not in '(\w+)'", str(cause)):
        key = _full_key(cause) or m.group(1)
        value = _value_of(key, overrides)
        return _unknown_key_error(key, value)
    if m := re.search(r"Invalid value '(.*)', expected one of \[(.*)\]", str(cause)):
        allowed = m.group(2).split(", ")  # a StrEnum field of config.py
        return ConfigError(
            _full_key(cause) or "?", m.group(1), f"one of {one_of(allowed)}{did_you_mean(m.group(1), allowed)}"
        )
    if "could not be converted to" in str(cause) or "is not Optional" in str(cause):
        key = _full_key(cause) or "?"
        kind = re.search(r"converted to (\w+)", str(cause))
        wanted = {"Integer": "a whole number", "Float": "a number", "Boolean": "true or false"}.get(
            kind.group(1) if kind else "", "a value of the field's type"
        )
        if "is not Optional" in str(cause):
            wanted = "a value (this field cannot be null)"
        return ConfigError(key, _value_of(key, overrides), f"expected {wanted}")
    if "Ambiguous value" in text:
        line = re.search(r"argument '([^']+)'", text)
        key, _, value = (line.group(1) if line else "?=?").partition("=")
        return ConfigError(
            key,
            value,
            "a comma sweeps over values; add -m to run a sweep, "
            "or quote the value for a string, or write [a,b] for a list",
        )
    if isinstance(exc, OverrideParseException):
        bad = next((o for o in overrides if not _parses(o)), " ".join(overrides))
        return ConfigError(
            "override",
            bad,
            f"not Hydra override syntax ({text.splitlines()[0]}); quote values "
            "with special characters: key='a b', key=[\"--flag=x\"]",
        )
    first = text.splitlines()[0] if text else type(exc).__name__
    return ConfigError("config", " ".join(overrides) or "(defaults)", first)


def foreign_launcher(name: str) -> ConfigError:
    return ConfigError(
        "hydra/launcher",
        name,
        "trials are launched by the orchestrator's own launcher, which knows "
        "their ranks, engines and results; say where they run with cluster=local (torchrun here) or "
        "cluster=slurm (submitit, job arrays, requeue)",
    )


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
        if override_key(o) == key:
            return o.partition("=")[2]
    return "?"


def _unknown_key_help(parent: str) -> str:
    if not parent:
        return f"not a config group or field; the groups are {one_of(config.GROUPS + config.FIELD_GROUPS)}"
    fields = fields_of(parent)
    return f"'{parent}' has no such field; its fields are {one_of(fields)}" if fields else "no such field"


def _unknown_key_error(key: str, value: str) -> ConfigError:
    parent, _, name = key.rpartition(".")
    known = fields_of(parent) if parent else list(config.GROUPS + config.FIELD_GROUPS)
    return ConfigError(key, value, _unknown_key_help(parent) + did_you_mean(name, known))


def fields_of(path: str) -> list[str]:
    """Field names of the schema node at a dotted path ('zero', 'hardware.intra_node')."""
    node = OmegaConf.structured(config.TrialConfig)
    for part in path.split("."):
        node = node.get(part) if isinstance(node, DictConfig) else None
        if node is None:
            return []
    return [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
