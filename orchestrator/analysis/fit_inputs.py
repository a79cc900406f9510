"""What a fit of a hardware preset takes: measured trials (each a TrialSpec and its measured
step), read from the trial directories below a folder, or from a CSV of runs this tool did
not make (a column per override key, and tokens/s/GPU or the step time). calibrate.py fits
them; tune's search fits the same way.
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.errors import ConfigError
from orchestrator.core.files import read_text, real_number
from orchestrator.hydra_glue.compose import MAX_POINTS, PROGRESS_EVERY_S
from orchestrator.plan.prediction import timed_batches
from orchestrator.records.results import read_result
from orchestrator.records.trial_dir import TrialPaths, trials_below
from orchestrator.spec import TrialSpec, build_spec, load_spec
from orchestrator.validation.checks import number_from_text

MEASURED_COLUMNS = ("tokens_per_sec_per_gpu", "step_time_s")
STEP_RANGE_S = (1e-5, 1e5)  # a step from ten microseconds to a day: outside it, a figure is not a measurement


@dataclass(frozen=True)
class MeasuredTrial:
    source: str  # the trial's directory, or "FILE row N"
    spec: TrialSpec
    step_s: float  # measured, seconds per optimizer step
    # the global batch of each timed step (a warm-up's are smaller); () for a CSV row: the full batch
    timed_batches: tuple[int, ...] = ()


def measured_trials(dirs: list[Path], warn: Callable[[str], None]) -> dict[str, list[MeasuredTrial]]:
    """Ok trials with a plausible measured step time under `dirs`, by hardware name. A trial
    whose files cannot be read, or whose figures are not plausible, is skipped and named
    to `warn`; the fit goes on with the rest."""
    found: dict[str, list[MeasuredTrial]] = {}
    for trial_dir in (t for d in dirs for t in trials_below(d)):
        try:
            result = read_result(trial_dir)
        except (OSError, ValueError, RecursionError) as exc:
            warn(f"warning: skipped {TrialPaths(trial_dir).result}: {type(exc).__name__}: {exc}")
            continue
        if result is None:
            continue
        if result.get("status") != "ok":
            continue
        metrics = m if isinstance(m := result.get("metrics"), dict) else {}
        try:
            spec = load_spec(trial_dir)
            # measured first: a trial refused here must not leave its hardware an empty list
            trial = MeasuredTrial(
                str(trial_dir),
                spec,
                plausible_step_s(metrics.get("step_time_s")),
                tuple(timed_batches(metrics.get("history"))),
            )
            found.setdefault(spec.cfg.hardware.name, []).append(trial)
        except ConfigError as exc:
            warn(f"warning: skipped {trial_dir}: {exc}")
    return found


def plausible_step_s(step: object) -> float:
    """A measured step time in seconds: a finite number within STEP_RANGE_S, else ConfigError."""
    number = real_number(step)
    if number is None or not STEP_RANGE_S[0] <= number <= STEP_RANGE_S[1]:
        raise ConfigError(
            "metrics.step_time_s", step, f"a measured step time from {STEP_RANGE_S[0]:g} to {STEP_RANGE_S[1]:g} seconds"
        )
    return number


def csv_trials(
    path: Path, max_rows: int = MAX_POINTS, warn: Callable[[str], None] = print
) -> dict[str, list[MeasuredTrial]]:
    """The rows of a CSV of measured runs, each composed and validated as a trial, by hardware
    name. Read as trial files are (files.read_text: a regular file, no link followed, bounded:
    a FIFO or /dev/zero is refused, not waited on), a byte-order mark ignored; at most
    `max_rows` rows (each is a plan in the fit), their validation's progress said."""
    try:
        text = read_text(path).removeprefix("\ufeff")  # Excel's UTF-8 CSVs start with one
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except (OSError, csv.Error, UnicodeDecodeError) as exc:
        raise ConfigError(
            "--csv", str(path), f"a readable CSV file ({getattr(exc, 'strerror', None) or exc})"
        ) from None
    header = next(csv.reader(io.StringIO(text, newline="")), [])
    if twice := sorted({c for c in header if header.count(c) > 1}):  # DictReader would keep the last silently
        raise ConfigError(
            "--csv", str(path), f"a header that names each column once; {', '.join(twice)} is there more than once"
        )
    if not rows or not any(c in rows[0] for c in MEASURED_COLUMNS):
        raise ConfigError(
            "--csv", str(path), f"a header of override keys and one of {', '.join(MEASURED_COLUMNS)}, and a row per run"
        )
    if len(rows) > max_rows:
        raise ConfigError(
            "--csv",
            f"{path} ({len(rows):,} rows)",
            f"at most --max-rows={max_rows:,} rows (each is "
            f"validated and planned at every step of the fit); --max-rows {len(rows)} if all are meant",
        )
    found: dict[str, list[MeasuredTrial]] = {}
    started = said = time.monotonic()
    for number, row in enumerate(rows, start=2):  # row 1 is the header
        where = f"{path.name} row {number}"
        overrides = [
            f"{key}={value}"
            for key, value in row.items()
            if key not in MEASURED_COLUMNS and key and value not in (None, "")
        ]
        try:
            spec = build_spec(overrides)
        except ConfigError as exc:
            raise ConfigError(exc.field, exc.value, exc.allowed, where=where) from None
        step = _measured_step_s(row, spec, where)
        found.setdefault(spec.cfg.hardware.name, []).append(MeasuredTrial(where, spec, step))
        if time.monotonic() - said >= PROGRESS_EVERY_S:
            said, done = time.monotonic(), number - 1
            warn(
                f"  validated {done:,} of {len(rows):,} rows of {path.name} "
                f"({(len(rows) - done) * (said - started) / done:,.0f} s to go)"
            )
    return found


def _measured_step_s(row: dict, spec: TrialSpec, where: str) -> float:
    """Seconds per optimizer step from the row's step_time_s, or from its tokens/s/GPU."""
    for column in MEASURED_COLUMNS:
        text = (row.get(column) or "").strip()
        if not text:
            continue
        value = number_from_text(text)
        if value is None or value <= 0:
            raise ConfigError(column, text, "a positive number", where=where)
        step = value if column == "step_time_s" else spec.tokens_per_step / (value * spec.world_size)
        try:
            return plausible_step_s(step)
        except ConfigError as exc:
            raise ConfigError(column, text, exc.allowed, where=where) from None
    raise ConfigError(" or ".join(MEASURED_COLUMNS), "(empty)", "a measurement in every row", where=where)
