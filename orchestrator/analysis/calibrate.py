"""`orchestrator calibrate [DIR...] [--csv FILE]`: fit a hardware kind's parameters to measured steps.

The step-time model (plan/compute.py) has seven parameters per hardware preset: the share
of the peak large GEMMs reach, the same for those whose right operand is stored k x n, the
GEMM size at which half of it is reached, fused
attention's forward and backward rates, the share of the memory bandwidth memory-bound
kernels reach, and the fixed cost per kernel. Their defaults in a preset are published or
fitted figures; this command fits them to the trials a user ran.

For each hardware name found among the ok trials under DIR it minimises the squared
log-ratio of predicted to measured step time (a coordinate search in log space within
`BOUNDS`), then writes the preset, fitted, as `hardware/NAME-calibrated.yaml` in the user's config
directory (`user_conf_dir()`), which every later composition searches: `hardware=NAME-calibrated`
chooses it, `hardware=auto` prefers it to NAME, and the plan says "calibrated on N trials".
Where the trials span several ranks (or nodes), the network is fitted too: each level's bus
bandwidth, the inter-node hop latency and the fixed cost per collective call (plan/collectives.py),
so multi-node trials calibrate the links as nccl-tests would. The peak and the memory
bandwidth are not fitted.

--csv FILE takes measurements this tool did not make (another framework's runs, a W&B
export, a published table): one row per run, each column a Hydra override key (a group
holding a preset name, such as `zero` or `hardware`, or a field, such as `model.hidden` or
`parallel.dp`), plus `tokens_per_sec_per_gpu` or `step_time_s`. Every row is composed and
validated like a trial before anything is fitted; a bad row exits 2 naming the row and the field.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from orchestrator.analysis.fit_inputs import MeasuredTrial, csv_trials, measured_trials
from orchestrator.config import KernelSource
from orchestrator.core.errors import ConfigError
from orchestrator.core.files import real_number
from orchestrator.hardware_presets import (
    PLAUSIBLE,
    calibrated_preset,
    preset_lock,
    writable_preset_dir,
    write_calibrated_preset,
)
from orchestrator.hydra_glue.compose import MAX_POINTS, plain_dict
from orchestrator.hydra_glue.conf_tree import user_conf_dir
from orchestrator.measure.trial_measurements import machine_facts
from orchestrator.plan.planner import make_plan
from orchestrator.plan.prediction import planned_step_s
from orchestrator.plan.rates import kn_efficiency
from orchestrator.records.trial_dir import check_path
from orchestrator.spec import TrialSpec, load_spec

FITTED = (
    "compute_efficiency",
    "gemm_kn_efficiency",
    "gemm_half_dim",
    "attention_efficiency",
    "attention_backward_efficiency",
    "memory_efficiency",
    "op_overhead_us",
)
# A fit stays within what the config accepts (hardware_presets.PLAUSIBLE): a calibrated preset is
# always one the plan takes.
LINK_PARAMS = ("intra_node.busbw_gbps", "inter_node.busbw_gbps", "inter_node.latency_us", "collective_overhead_us")
BOUNDS = {name: PLAUSIBLE[name] for name in FITTED + LINK_PARAMS}
SENSITIVITY = 0.01  # a parameter that moves no trial's step time by 1 % (for a x4 change) is not seen


@dataclass(frozen=True)
class Calibration:
    hardware: str
    params: dict[str, float]
    trials: list[MeasuredTrial]
    before: list[float]  # predicted / measured step time, per trial, with the preset's parameters
    after: list[float]  # the same with the fitted ones
    preset_path: Path
    fitted: tuple[str, ...] = ()  # the parameters the trials determine, fitted
    not_determined: tuple[str, ...] = ()  # kept at the preset's values: no trial's step depends on them enough
    at_bound: tuple[str, ...] = ()  # fitted to the edge of BOUNDS: the model cannot explain the trials there


def with_params(spec: TrialSpec, params: dict) -> TrialSpec:
    """The trial with its hardware's parameters replaced; a dotted name ("inter_node.busbw_gbps")
    is a field of one network level."""
    hw = spec.cfg.hardware
    flat = {k: v for k, v in params.items() if "." not in k}
    levels: dict[str, dict] = {}
    for key, value in params.items():
        if "." in key:
            level, field = key.split(".", 1)
            levels.setdefault(level, {})[field] = value
    # A calibration fits the preset's parameters: its plans (and the preset it writes)
    # estimate the kernels from them rather than time them.
    hw = dataclasses.replace(
        hw,
        **flat,
        **{lv: dataclasses.replace(getattr(hw, lv), **f) for lv, f in levels.items()},
        kernels=KernelSource.preset,
    )
    return dataclasses.replace(spec, cfg=dataclasses.replace(spec.cfg, hardware=hw))


def current_params(hw, names: tuple[str, ...] = FITTED) -> dict[str, float]:
    """A preset's parameters as the fit starts from them (a null k x n rate: every other GEMM's)."""

    def value(name: str) -> float:
        if name == "gemm_kn_efficiency":
            return float(kn_efficiency(hw))
        level, _, field = name.rpartition(".")
        return float(getattr(getattr(hw, level), field) if level else getattr(hw, name))

    return {k: value(k) for k in names}


def fitted_names(trials: list[MeasuredTrial]) -> tuple[str, ...]:
    """The compute parameters, and the network's where the trials can tell them: a level's
    bandwidth only if some trial's ranks cross it."""
    ranks = any(t.spec.world_size > 1 for t in trials)
    nodes = any(t.spec.nodes > 1 for t in trials)
    shared_nodes = any(t.spec.world_size > t.spec.nodes for t in trials)  # ranks that talk inside a node
    links = {
        "intra_node.busbw_gbps": shared_nodes,
        "inter_node.busbw_gbps": nodes,
        "inter_node.latency_us": nodes,
        "collective_overhead_us": ranks,
    }
    return FITTED + tuple(name for name in LINK_PARAMS if links[name])


def predicted_step_s(spec: TrialSpec, params: dict, timed_batches: tuple[int, ...] = ()) -> float:
    """The step `params` predict for the trial; at the timed steps' global batches where
    they are given (a warm-up's), as the trial's measured median was taken over them."""
    fitted = with_params(spec, params)
    plan = make_plan(fitted, machine_facts(fitted))  # planned as it ran: nothing timed again
    return planned_step_s(
        {
            "batch": plan.batch,
            "time": {"step_s": plan.time.step_s, "added_micro_batch_s": plan.time.added_micro_batch_s},
        },
        timed_batches,
    )


def fit(
    cost: Callable[[dict], float],
    start: dict,
    bounds: dict = BOUNDS,
    names: tuple[str, ...] = FITTED,
    max_evals: int = 2000,
) -> dict:
    """Minimise cost(params) over `names`: each parameter in turn multiplied or divided by a
    step that starts at 2 and shrinks (as its square root) when no move helps; at most
    `max_evals` evaluations of the cost."""
    best, value = dict(start), cost(start)
    step, evals = 2.0, 1
    while step > 1.01 and evals < max_evals:
        improved = False
        for name in names:
            low, high = bounds[name]
            for factor in (step, 1 / step):
                x = best[name] * factor if best[name] else (1.0 if factor > 1 else 0.0)
                trial = {**best, name: min(high, max(low, x))}
                if trial[name] == best[name]:
                    continue  # at its bound already
                v, evals = cost(trial), evals + 1
                if v < value * (1 - 1e-4) - 1e-8:  # a real gain: no crawling along a flat direction
                    best, value, improved = trial, v, True
        if not improved:
            step = math.sqrt(step)
    return best


def fit_in_stages(trials: list[MeasuredTrial], start: dict, names: tuple[str, ...]) -> dict:
    """Fit `names` (the others stay at `start`): compute first, on the trials that stay
    inside one node (all of them if none does), then the network on every trial with the
    compute held: fitted jointly, a slow network and a slow GEMM explain the same step, and
    the fit would trade one for the other."""
    compute = tuple(k for k in names if k in FITTED)
    links = tuple(k for k in names if k not in FITTED)
    inside = [t for t in trials if t.spec.nodes == 1] or trials
    params = fit(lambda p: log_error(inside, p), start, names=compute) if compute else dict(start)
    return fit(lambda p: log_error(trials, p), params, names=links) if links else params


def log_error(trials: list[MeasuredTrial], params: dict) -> float:
    return sum(math.log(predicted_step_s(t.spec, params, t.timed_batches) / t.step_s) ** 2 for t in trials)


def calibrate(
    dirs: list[Path], csv_path: Path | None = None, warn: Callable[[str], None] = print, max_rows: int = MAX_POINTS
) -> list[Calibration]:
    for d in dirs:
        check_path(d, "DIR")
        if not d.is_dir():
            raise ConfigError("DIR", str(d), "a directory holding trials (a run's --out, or a sweep's)")
    found = measured_trials(dirs, warn)
    for name, rows in (csv_trials(csv_path, max_rows, warn) if csv_path else {}).items():
        found.setdefault(name, []).extend(rows)
    if not found:
        raise ConfigError(
            "DIR",
            " ".join(map(str, dirs)),
            "no ok trial with a measured step time below it; run some first (orchestrator run ... --out DIR)",
        )
    writable_preset_dir()  # checked before the fit, not after it
    out = []
    for name, trials in sorted(found.items()):
        with preset_lock(name):
            out.append(calibrate_one(name, trials))
    return out


def calibrate_one(name: str, trials: list[MeasuredTrial]) -> Calibration:
    """Fit what the trials determine; the rest keeps the preset's values."""
    hw = trials[0].spec.cfg.hardware
    start = current_params(hw, fitted_names(trials))
    seen, unseen = determined(trials, start)
    params = fit_in_stages(trials, start, seen)
    ratio = lambda p: [predicted_step_s(t.spec, p, t.timed_batches) / t.step_s for t in trials]  # noqa: E731
    path = write_preset(trials[0].spec, params, len(trials), seen)
    at_bound = tuple(k for k in seen if params[k] in BOUNDS[k] and params[k] != start[k])
    return Calibration(
        hardware=name,
        params=params,
        trials=trials,
        before=ratio(start),
        after=ratio(params),
        preset_path=path,
        fitted=seen,
        not_determined=unseen,
        at_bound=at_bound,
    )


def determined(trials: list[MeasuredTrial], params: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the parameters these trials determine, those they cannot). A parameter's column is
    its effect on every trial's log step time when it is divided or multiplied by 4 (the
    larger: a network hidden behind compute at the preset's values shows only when slowed).
    Columns are taken greedily, largest first, each with what the ones taken already explain
    removed (Gram-Schmidt with pivoting), while one still moves some trial by SENSITIVITY
    with most of its effect its own, and fewer than one per trial are taken: n trials
    cannot determine more than n parameters."""
    base = np.log([predicted_step_s(t.spec, params, t.timed_batches) for t in trials])
    columns = {}
    for name in params:
        low, high = BOUNDS[name]
        moves = [min(high, max(low, params[name] * f)) for f in (0.25, 4.0)] if params[name] else [0.01 * high]
        effects = [
            np.log([predicted_step_s(t.spec, {**params, name: x}, t.timed_batches) for t in trials]) - base
            for x in moves
        ]
        columns[name] = max(effects, key=lambda e: np.abs(e).max())
    taken: list[str] = []
    basis: list[np.ndarray] = []
    while len(taken) < min(len(trials), len(params)):
        residual = {n: c - sum((c @ b) * b for b in basis) for n, c in columns.items() if n not in taken}
        own = {
            n: r
            for n, r in residual.items()
            if np.abs(r).max() >= SENSITIVITY and np.linalg.norm(r) >= 0.2 * np.linalg.norm(columns[n])
        }
        if not own:
            break
        name = max(own, key=lambda n: np.abs(own[n]).max())
        taken.append(name)
        basis.append(own[name] / np.linalg.norm(own[name]))
    return tuple(n for n in params if n in taken), tuple(n for n in params if n not in taken)


def write_preset(spec: TrialSpec, params: dict, n_trials: int, fitted: tuple[str, ...] = ()) -> Path:
    """The trial's hardware preset with the fitted parameters, in the user's config dir."""
    hw = with_params(spec, params).cfg.hardware
    data = plain_dict(OmegaConf.structured(hw))
    when = datetime.date.today().isoformat()
    data["calibrated_on"] = f"{n_trials} trials ({when})"
    header = (
        f"# Written by `orchestrator calibrate` on {when}: the {hw.name} preset with its parameters\n"
        f"# ({', '.join(fitted or params)}) fitted to {n_trials} measured trials.\n"
    )
    return write_calibrated_preset(hw.name, data, header)


def calibrated_params(hardware_name: str) -> dict | None:
    """The fitted parameters of NAME-calibrated in the user's config dir, if calibrated."""
    data = calibrated_preset(hardware_name, user_conf_dir())  # ConfigError naming the file if it is not one
    if data is None:
        return None

    def value(name: str):
        level, _, field = name.rpartition(".")
        if not level:
            return data.get(name)
        return group.get(field) if isinstance(group := data.get(level), dict) else None

    return {k: number for k in FITTED + LINK_PARAMS if (number := real_number(value(k))) is not None}


def calibrated_step_s(trial_dir: Path, params: dict, batches: tuple[int, ...] = ()) -> float | None:
    """The step time calibrated `params` predict for a trial that ran (report's "after"),
    at its timed steps' global `batches`."""
    try:
        spec = load_spec(trial_dir)
    except (OSError, ValueError, KeyError):
        return None
    return predicted_step_s(spec, params, batches)
