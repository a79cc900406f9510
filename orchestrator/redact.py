"""Secrets never reach a file, a log or W&B: values of anything named like a key, token,
password or secret are replaced by `***` wherever a trial's config is written.

A name is secret when one of its parts (split on _ . - and case) is key, apikey, token,
password, passwd, secret or credential(s): WANDB_API_KEY, HF_TOKEN, db.password. The
parts must match whole, so tokens_per_sec or ramp_tokens stay as they are. In text
(setup lines, srun arguments, overrides), `NAME=VALUE`, `NAME: VALUE` and `--NAME VALUE`
are redacted.

The SLURM job still needs the real value of a setup line `export NAME=VALUE`: such a line
is passed to sbatch through its environment instead of the script (secret_exports).
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
SECRET_PARTS = {"key", "apikey", "token", "password", "passwd", "secret", "credential", "credentials"}
_NAME = r"[A-Za-z_][\w.-]*"
_VALUE = r"(?:\"[^\"]*\"|'[^']*'|[^\s,\]\[\"']+)"
_ASSIGNMENT = re.compile(rf"({_NAME})(\s*[=:]\s*)({_VALUE})")
_FLAG = re.compile(rf"(--?{_NAME})(\s+)({_VALUE})")
_EXPORT = re.compile(rf"^\s*export\s+({_NAME})=({_VALUE})\s*$")


def is_secret_name(name: str) -> bool:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name.lstrip("-"))  # apiKey -> api_Key
    return any(part.lower() in SECRET_PARTS for part in re.split(r"[_.\-\s]+", spaced))


def redact_text(text: str) -> str:
    def mask(m: re.Match) -> str:
        return f"{m.group(1)}{m.group(2)}{MASK}" if is_secret_name(m.group(1)) else m.group(0)

    return _FLAG.sub(mask, _ASSIGNMENT.sub(mask, text))


def redact(data: Any) -> Any:
    """A copy of plain data (dicts, lists, strings) with every secret value masked."""
    if isinstance(data, dict):
        return {k: MASK if is_secret_name(str(k)) and v not in (None, "") else redact(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [redact(v) for v in data]
    if isinstance(data, str):
        return redact_text(data)
    return data


def secret_exports(setup: list[str]) -> tuple[list[str], dict[str, str]]:
    """(setup lines without secret exports, those exports as environment variables)."""
    kept, env = [], {}
    for line in setup:
        m = _EXPORT.match(line)
        if m and is_secret_name(m.group(1)):
            env[m.group(1)] = m.group(2).strip("'\"")
            kept.append(f"# export {m.group(1)}={MASK}  (not written to files: set in sbatch's environment)")
        else:
            kept.append(line)
    return kept, env
