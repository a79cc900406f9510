"""Secrets never reach a file, a log, W&B or the terminal: values of anything named like a
key, token, password or secret are replaced by `***` wherever they leave the process.

A name is secret when one of its parts (split on _ . - and case) is key, apikey, token,
password, passwd, secret, credential(s), pat (a personal access token), auth or
authorization, or ends in password, passwd, apikey, secret or token: WANDB_API_KEY,
HF_TOKEN, db.password, PGPASSWORD, MYAPIKEY, GH_PAT. The parts must match whole (or end
the part), so tokens_per_sec or ramp_tokens stay as they are. In text (setup lines, srun
arguments, overrides, messages), `NAME=VALUE`, `NAME: VALUE`, `'NAME': 'VALUE'`,
`--NAME VALUE`, `Bearer VALUE`, the password of a URL (`https://user:PASS/WORD@host`, up
to its `@`), a token standing as a URL's user, and a token whose format names it
(`ghp_...`, `hf_...`, `AKIA...`) are redacted wherever they sit: the value of a name that
is not secret is searched too (`logger.group=https://x/hook?api_key=...`). In a list,
`--NAME` followed by its value as the next item is masked too. Beside these rules,
detect-secrets' format detectors (cloud, forge, chat and payment services' tokens) mask
the credentials whose format they know (_DETECTORS).

`RedactedOutput` applies the same to everything the CLI prints (error paragraphs, Hydra's
`--cfg job`, tables), so a terminal, a CI log or a SLURM output file holds no secret either.

The SLURM job still needs the real value of a setup line `export NAME=VALUE` that holds a
secret (in its name or its value): such a line is passed to sbatch through its environment
instead of the script (secret_exports).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import re
import sys
from collections.abc import Iterator
from typing import Any, TextIO

MASK = "***"
SECRET_PARTS = {
    "key",
    "apikey",
    "token",
    "password",
    "passwd",
    "pwd",
    "pass",
    "passphrase",
    "secret",
    "credential",
    "credentials",
    "pat",
    "auth",
    "authorization",
    "cookie",
    "sessionid",
    "sig",
    "signature",
}
SECRET_ENDINGS = ("password", "passwd", "passphrase", "apikey", "secret", "token")
SECRET_PAIRS = {("session", "id"), ("session", "key"), ("session", "token")}  # session_id, SESSION-KEY
_NAME = r"[A-Za-z_][\w.-]*"
# A value runs to the next space or quote: a secret cut at `,` `[` or `]` would leave its rest
# in clear (a name that is not secret has its value searched again, so nothing is lost).
_VALUE = r"(?:\"[^\"]*\"|'[^']*'|[^\s\"']+)"
# $TOKEN, ${TOKEN}, $(cmd: names a secret, holds none. An environment variable's name is upper
# case (POSIX's convention for the environment): `$ecret` is a password that starts with `$`.
_REFERENCE = re.compile(r"[\"']?\$(?:\{?[A-Z_][A-Z0-9_]*\}?[\"']?$|\()")
# NAME=VALUE, NAME: VALUE, and the dict / JSON spelling 'NAME': 'VALUE'
_ASSIGNMENT = re.compile(rf"({_NAME})([\"']?\s*[=:]\s*)({_VALUE})")
_FLAG = re.compile(rf"(--?{_NAME})(\s+)({_VALUE})")
_EXPORT = re.compile(rf"^\s*export\s+({_NAME})=({_VALUE})\s*$")
_BEARER = re.compile(r"\b(Bearer|Basic)(\s+)([A-Za-z0-9._~+/=-]{6,})", re.IGNORECASE)
# An Authorization header of any scheme (token, ApiKey, Digest, AWS4-HMAC-SHA256): all after the name.
_AUTHORIZATION = re.compile(r"\b((?:Proxy-)?Authorization)([\"']?\s*[:=]\s*)([^\r\n]+)", re.IGNORECASE)
# The password of a URL runs to its '@' (RFC 3986 forbids an unescaped '/' there, but users
# write one: s3://ak:SEC/RET@host); a user alone as long as a token is one (https://TOKEN@host).
# The password ends at the last '@' before the host, which holds none (p@ss@host: the password is p@ss).
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@\"']*:)([^\s\"']+)(@)(?=[^@\s\"'/]*(?:[/\s\"']|$))")
_URL_TOKEN_USER = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/\s:@\"']{16,})(@)")
# A credential needs no name where its own format says what it is: GitHub's, Hugging Face's,
# OpenAI's and Slack's tokens, AWS's access key ids (each service documents its prefix).
_KNOWN_TOKEN = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|hf_[A-Za-z0-9]{20,}"
    r"|sk-[A-Za-z0-9_-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}"
    r"|glpat-[A-Za-z0-9_-]{20,}|npm_[A-Za-z0-9]{36}"  # GitLab's and npm's tokens
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})\b"  # a JWT: header.payload.sig
    r"|hooks\.slack\.com/services/[A-Za-z0-9/]+"
)  # a Slack webhook's path is its credential


# detect-secrets (Yelp) keeps detectors for credentials by their format: cloud (AWS, Azure
# storage keys, IBM), forges and registries (GitHub, GitLab, npm, PyPI, Artifactory), chat and
# payment services (Slack, Discord, Telegram, Twilio, SendGrid, Mailchimp, Stripe, Square),
# JWTs and basic-auth URLs. They run beside the rules above, for the formats these do not
# know. Left out: its keyword detector (the names above do that for every spelling, in any
# text, not per file type), its entropy detectors (a run id, a hash in a directory's name,
# a sweep's override would be masked) and public IPs (a node's address is no secret).
_DETECTORS = (
    "aws.AWSKeyDetector",
    "artifactory.ArtifactoryDetector",
    "azure_storage_key.AzureStorageKeyDetector",
    "basic_auth.BasicAuthDetector",
    "cloudant.CloudantDetector",
    "discord.DiscordBotTokenDetector",
    "github_token.GitHubTokenDetector",
    "gitlab_token.GitLabTokenDetector",
    "ibm_cloud_iam.IbmCloudIamDetector",
    "ibm_cos_hmac.IbmCosHmacDetector",
    "jwt.JwtTokenDetector",
    "mailchimp.MailchimpDetector",
    "npm.NpmDetector",
    "openai.OpenAIDetector",
    "pypi_token.PypiTokenDetector",
    "sendgrid.SendGridDetector",
    "slack.SlackDetector",
    "softlayer.SoftlayerDetector",
    "square_oauth.SquareOAuthDetector",
    "stripe.StripeDetector",
    "telegram_token.TelegramBotTokenDetector",
    "twilio.TwilioKeyDetector",
)
_SHORTEST_CREDENTIAL = 8  # a detector's shorter match is a part of its pattern (a quote), never a credential


@functools.lru_cache(maxsize=1)
def _detectors() -> tuple:
    """detect-secrets' format detectors, imported on first use (about 0.15 s: it brings requests)."""
    return tuple(
        getattr(importlib.import_module(f"detect_secrets.plugins.{module}"), name)()
        for module, name in (d.rsplit(".", 1) for d in _DETECTORS)
    )


def _detected(text: str) -> str:
    """`text` with what detect-secrets' detectors find in it masked."""
    found = {
        secret
        for detector in _detectors()
        for secret in detector.analyze_string(text)
        if len(secret) >= _SHORTEST_CREDENTIAL and secret != MASK
    }
    for secret in sorted(found, key=len, reverse=True):  # a longer one first: a shorter may be its part
        text = text.replace(secret, MASK)
    return text


def is_secret_name(name: str) -> bool:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name.lstrip("-"))  # apiKey -> api_Key
    parts = [part.lower() for part in re.split(r"[_.\-\s]+", spaced)]
    if parts[-1] in ("error", "exception", "warning"):  # KeyError: 'x' names an exception, holds no key
        return False
    if name in ("PWD", "OLDPWD"):  # the shell's working directory, not ODBC's pwd= password
        return False
    # "per token" is a unit (flops.model_per_token), not a credential
    return any(
        (part in SECRET_PARTS or part.endswith(SECRET_ENDINGS)) and parts[i - 1 : i] != ["per"]
        for i, part in enumerate(parts)
    ) or any(pair in SECRET_PAIRS for pair in zip(parts, parts[1:]))


def redact_text(text: str) -> str:
    """`text` with every secret masked, wherever it sits: a value that is not secret itself
    (logger.group=URL, --url URL) is searched again, so a credential nested inside it
    (the URL's ?api_key=..., its password) is found too."""

    def mask(m: re.Match) -> str:
        name, sep, value = m.groups()
        if not is_secret_name(name):
            return f"{name}{sep}{redact_text(value)}" if value else m.group(0)
        if _REFERENCE.match(value):  # $TOKEN, $(cmd): names a secret, holds none ($ecret! holds one)
            return m.group(0)
        quote = value[0] if value[0] in "\"'" else ""
        return f"{name}{sep}{quote}{MASK}{quote}"

    text = _AUTHORIZATION.sub(rf"\1\2{MASK}", text)
    text = _KNOWN_TOKEN.sub(MASK, _BEARER.sub(rf"\1\2{MASK}", text))
    text = _URL_TOKEN_USER.sub(rf"\1{MASK}\3", _URL_PASSWORD.sub(rf"\1{MASK}\3", text))
    return _detected(_FLAG.sub(mask, _ASSIGNMENT.sub(mask, text)))


def redact(data: Any) -> Any:
    """A copy of plain data (dicts, lists, strings) with every secret value masked."""
    if isinstance(data, dict):
        return {k: MASK if is_secret_name(str(k)) and v not in (None, "") else redact(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        out = [redact(v) for v in data]
        for i, item in enumerate(data[:-1]):  # ["--token", "X"]: the flag's value is the next item
            if isinstance(item, str) and re.fullmatch(rf"--?{_NAME}", item) and is_secret_name(item):
                out[i + 1] = MASK
        return out
    if isinstance(data, str):
        return redact_text(data)
    return data


def secret_export(line: str) -> tuple[str, str] | None:
    """(NAME, VALUE) of a setup line `export NAME=VALUE` that holds a secret, in its name
    (HF_TOKEN=...) or anywhere in its value (DATABASE_URL=postgres://u:PASSWORD@db): such a
    line reaches the job through its environment, never a file."""
    m = _EXPORT.match(line)
    if not m or redact_text(line) == line:
        return None
    return m.group(1), m.group(2).strip("'\"")


def secret_exports(setup: list[str]) -> tuple[list[str], dict[str, str]]:
    """(setup lines without secret exports, those exports as environment variables)."""
    kept, env = [], {}
    for line in setup:
        if (export := secret_export(line)) is None:
            kept.append(line)
            continue
        env[export[0]] = export[1]
        kept.append(f"# export {export[0]}={MASK}  (not written to files: set in sbatch's environment)")
    return kept, env


class RedactedOutput(io.TextIOBase):
    """A text stream that writes to `stream` with every secret masked, a line at a time
    (a partial line waits for its end or a flush, so a value split across writes is still
    seen whole when it is written in one line)."""

    def __init__(self, stream: TextIO):
        self.stream, self._pending = stream, ""

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        if lines:
            self.stream.write("\n".join(redact_text(line) for line in lines) + "\n")
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self.stream.write(redact_text(self._pending))
            self._pending = ""
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")


@contextlib.contextmanager
def redacted_output() -> Iterator[None]:
    """sys.stdout and sys.stderr masked for the duration (the CLI's whole command)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactedOutput(saved[0]), RedactedOutput(saved[1])
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = saved
