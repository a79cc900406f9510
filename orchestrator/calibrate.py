"""`orchestrator calibrate DIR...`: fit a hardware kind's step-time parameters to measured trials.

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
The peak, the memory bandwidth and the links are not fitted.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from omegaconf import OmegaConf

from orchestrator.compose import user_conf_dir
from orchestrator.errors import ConfigError
from orchestrator.files import atomic_write_text, read_json
from orchestrator.hardware import calibrated_name
from orchestrator.plan.planner import kn_efficiency, make_plan
from orchestrator.spec import TrialSpec, load_spec
from orchestrator.trial_dir import TrialPaths, trials_below

FITTED = ("compute_efficiency", "gemm_kn_efficiency", "gemm_half_dim", "attention_efficiency",
          "attention_backward_efficiency", "memory_efficiency", "op_overhead_us")
# Physically plausible ranges: a share of a peak is at most 0.9 of it, a GEMM saturates
# somewhere below a few thousand rows, a kernel's fixed cost is under a few milliseconds
# even for an eager CPU op with engine hooks.
BOUNDS = {"compute_efficiency": (0.02, 0.9), "gemm_kn_efficiency": (0.02, 0.9), "gemm_half_dim": (0.0, 4096.0),
          "attention_efficiency": (0.02, 0.9), "attention_backward_efficiency": (0.02, 0.9),
          "memory_efficiency": (0.05, 0.9), "op_overhead_us": (0.0, 2000.0)}


@dataclass(frozen=True)
class Measured:
    trial_dir: Path
    spec: TrialSpec
    step_s: float  # measured, seconds per optimizer step


@dataclass(frozen=True)
class Calibration:
    hardware: str
    params: dict[str, float]
    trials: list[Measured]
    before: list[float]  # predicted / measured step time, per trial, with the preset's parameters
    after: list[float]  # the same with the fitted ones
    preset_path: Path


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
    hw = dataclasses.replace(hw, **flat, **{lv: dataclasses.replace(getattr(hw, lv), **f) for lv, f in levels.items()})
    return dataclasses.replace(spec, cfg=dataclasses.replace(spec.cfg, hardware=hw))


def current_params(hw) -> dict[str, float]:
    """A preset's step-time parameters as the fit starts from them (a null k x n rate: every other GEMM's)."""
    return {k: float(kn_efficiency(hw) if k == "gemm_kn_efficiency" else getattr(hw, k)) for k in FITTED}


def predicted_step_s(spec: TrialSpec, params: dict) -> float:
    return make_plan(with_params(spec, params)).time.step_s


def fit(cost: Callable[[dict], float], start: dict, bounds: dict = BOUNDS, names: tuple[str, ...] = FITTED) -> dict:
    """Minimise cost(params) over `names`: each parameter in turn multiplied or divided by a
    step that starts at 2 and shrinks (as its square root) when no move helps."""
    best, value = dict(start), cost(start)
    step = 2.0
    while step > 1.01:
        improved = False
        for name in names:
            low, high = bounds[name]
            for factor in (step, 1 / step):
                x = best[name] * factor if best[name] else (1.0 if factor > 1 else 0.0)
                trial = {**best, name: min(high, max(low, x))}
                v = cost(trial)
                if v < value - 1e-12:
                    best, value, improved = trial, v, True
        if not improved:
            step = math.sqrt(step)
    return best


def log_error(trials: list[Measured], params: dict) -> float:
    return sum(math.log(predicted_step_s(t.spec, params) / t.step_s) ** 2 for t in trials)


def measured_trials(dirs: list[Path]) -> dict[str, list[Measured]]:
    """Ok trials with a measured step time under `dirs`, by hardware name."""
    found: dict[str, list[Measured]] = {}
    for trial_dir in (t for d in dirs for t in trials_below(d)):
        result = read_json(TrialPaths(trial_dir).result)
        step = (result or {}).get("metrics", {}).get("step_time_s")
        if not result or result.get("status") != "ok" or not step:
            continue
        spec = load_spec(trial_dir)
        found.setdefault(spec.cfg.hardware.name, []).append(Measured(trial_dir, spec, float(step)))
    return found


def calibrate(dirs: list[Path]) -> list[Calibration]:
    for d in dirs:
        if not d.is_dir():
            raise ConfigError("DIR", str(d), "a directory holding trials (a run's --out, or a sweep's)")
    found = measured_trials(dirs)
    if not found:
        raise ConfigError("DIR", " ".join(map(str, dirs)), "no ok trial with a measured step time below it; "
                          "run some first (orchestrator run ... --out DIR)")
    out = []
    for name, trials in sorted(found.items()):
        hw = trials[0].spec.cfg.hardware
        start = current_params(hw)
        params = fit(lambda p: log_error(trials, p), start)
        ratio = lambda p: [predicted_step_s(t.spec, p) / t.step_s for t in trials]  # noqa: E731
        path = write_preset(trials[0].spec, params, len(trials))
        out.append(Calibration(hardware=name, params=params, trials=trials, before=ratio(start), after=ratio(params),
                               preset_path=path))
    return out


def write_preset(spec: TrialSpec, params: dict, n_trials: int) -> Path:
    """The trial's hardware preset with the fitted parameters, in the user's config dir."""
    hw = dataclasses.replace(spec.cfg.hardware, **params)
    data = OmegaConf.to_container(OmegaConf.structured(hw), enum_to_str=True)
    when = datetime.date.today().isoformat()
    data["calibrated_on"] = f"{n_trials} trials ({when})"
    path = user_conf_dir() / "hardware" / f"{calibrated_name(hw.name)}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# Written by `orchestrator calibrate` on {when}: the {hw.name} preset with its step-time\n"
              f"# parameters ({', '.join(FITTED)}) fitted to {n_trials} measured trials.\n")
    atomic_write_text(path, header + OmegaConf.to_yaml(OmegaConf.create(data)))
    return path


def calibrated_params(hardware_name: str) -> dict | None:
    """The fitted parameters of NAME-calibrated in the user's config dir, if calibrated."""
    path = user_conf_dir() / "hardware" / f"{calibrated_name(hardware_name)}.yaml"
    if not path.is_file():
        return None
    data = OmegaConf.to_container(OmegaConf.load(path))
    return {k: float(data[k]) for k in FITTED if data.get(k) is not None}


def calibrated_step_s(trial_dir: Path, params: dict) -> float | None:
    """The step time calibrated `params` predict for a trial that ran (report's "after")."""
    try:
        spec = load_spec(trial_dir)
    except (OSError, ValueError, KeyError):
        return None
    return predicted_step_s(spec, params)
