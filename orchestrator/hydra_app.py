"""`orchestrator run | plan | translate`: the commands that take overrides, as Hydra apps.

Each reads its command line with Hydra's own argument parser, so every Hydra flag means
what it means in any Hydra app: --help and --hydra-help, --cfg job|hydra|all with
--resolve and --package, --info, -cp/-cn/-cd, --shell-completion, -m. Those that only
show something are handed to Hydra's entry (`hydra.main`) as they are.

What the command does is then, per command:
- run: every point is composed and validated first (a bad point fails the whole sweep in
  about a second, exit 2, nothing written), the output directory is claimed, and then
  `hydra.main` runs: Hydra composes, makes the directory (hydra.run.dir, or for -m
  hydra.sweep.dir/hydra.sweep.subdir) with its .hydra/, and calls `run_task`; for -m,
  Hydra's sweeper (basic, or a plugin such as Optuna) hands the points to our launcher
  plugin (hydra_plugins/orchestrator_launcher), which runs them here or submits them to
  SLURM.
- plan and translate launch nothing and make no output directory, so they compose every
  point with Hydra (compose.py: the same tree, overrides and sweep grammar) and print or
  write, without Hydra's run machinery. A sampling sweeper means nothing to them.

Our own flags (--out, --overwrite, --json) are taken off the command line before Hydra
reads it; `run --out DIR` is hydra.run.dir=DIR (hydra.sweep.dir=DIR with -m).

Hydra has no public API for its argument parser; `hydra_arguments` is its one use here.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from orchestrator.compose import (Source, compose_trial, expand_sweep, fixed_part, foreign_launcher, swept_values,
                                  use_source)
from orchestrator.display import console, show_plan, show_report, show_sweep, trial_label
from orchestrator.errors import ConfigError, PlanRefused
from orchestrator.files import atomic_write_text, read_json
from orchestrator.plan.planner import make_plan
from orchestrator.redact import redact
from orchestrator.report import collect
from orchestrator.config import OBJECTIVES
from orchestrator.results import Status, error_record, now, objective_value, write_result
from orchestrator.spec import TrialSpec, build_spec
from orchestrator.tracking import sync_hint
from orchestrator.translate import write_trial_files
from orchestrator.trial import check_runnable_here, run_trial, submit_trials, wait_for
from orchestrator.trial_dir import CLAIM, SWEEP_CLAIM, claim, writable_dir

OWN_FLAGS = {"run": {"--out": True, "--overwrite": False}, "plan": {"--json": False}, "translate": {"--out": True},
             "tune": {"--out": True, "--overwrite": False, "--trials": True, "--minutes": True}}
TUNER = "orchestrator_tune"  # hydra/sweeper=orchestrator_tune: hydra_plugins/orchestrator_tuner
COMMANDS = tuple(OWN_FLAGS)
OUR_LAUNCHER = "orchestrator"


@dataclass
class Invocation:
    """One command line: our own flags, and what its trials returned (read for the exit code)."""

    command: str
    flags: dict[str, str | bool] = field(default_factory=dict)
    group: str | None = None  # the W&B group of a sweep: its directory's name
    results: list[dict] = field(default_factory=list)
    trial_dirs: list[Path] = field(default_factory=list)
    hydra_subdir: str | None = ".hydra"  # hydra.output_subdir: written by us, redacted (write_hydra_files)
    submitted: int = 0


_current = Invocation("run")


def main(command: str, argv: list[str]) -> int:
    try:
        return _main(command, argv)
    finally:
        use_source(Source())  # the next command in this process reads conf/ again


def _main(command: str, argv: list[str]) -> int:
    global _current
    _current = Invocation(command)
    rest = _take_own_flags(_current, argv)
    args = hydra_arguments(rest)
    use_source(Source(config_dir=str(Path(args.config_path).resolve()) if args.config_path else "",
                      config_name=args.config_name or "config",
                      extra_dirs=(str(Path(args.config_dir).resolve()),) if args.config_dir else ()))
    if args.help or args.hydra_help or args.cfg or args.info or args.shell_completion:
        if args.overrides and not args.shell_completion:
            compose_trial(fixed_part(args.overrides))  # a bad override: exit 2 with our paragraph, not Hydra's 1
        _hydra(command, rest, _unused_task)
        return 0
    if command == "plan":
        return plan(args.overrides, args.multirun, bool(_current.flags.get("--json")))
    if command == "translate":
        if "--out" not in _current.flags:
            raise ConfigError("--out", "(missing)", "translate writes its files into a directory: --out DIR")
        return translate(args.overrides, args.multirun, _current.flags.get("--out"))
    if command == "tune":
        return tune(args.overrides, rest)
    return run(args.overrides, args.multirun, rest)


def hydra_arguments(argv: list[str]):
    """Hydra's own command-line parser (hydra.main's; not public API)."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser().parse_args(argv)


def _take_own_flags(invocation: Invocation, argv: list[str]) -> list[str]:
    own, rest, i = OWN_FLAGS[invocation.command], [], 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name in own and own[name]:  # takes a value: --out DIR or --out=DIR
            if not eq:
                if i + 1 >= len(argv):
                    raise ConfigError(name, "(nothing)", "a directory: --out DIR")
                value, i = argv[i + 1], i + 1
            invocation.flags[name] = value
        elif name in own and not eq:
            invocation.flags[name] = True
        else:
            rest.append(argv[i])
        i += 1
    return rest


def _hydra(command: str, argv: list[str], task) -> None:
    """Hand the command line to Hydra's entry, `hydra.main`, as a Hydra app would be run."""
    from hydra.core.plugins import Plugins

    from hydra_plugins.orchestrator_launcher.orchestrator_launcher import OrchestratorLauncher
    from hydra_plugins.orchestrator_tuner.orchestrator_tuner import TuneSweeper
    from orchestrator.compose import _source  # the tree the command line chose

    # Installed from the wheel Hydra finds the plugin itself; an editable install hides the
    # hydra_plugins namespace from its scan, so it is registered by hand (public API).
    Plugins.instance().register(OrchestratorLauncher)
    Plugins.instance().register(TuneSweeper)

    saved = sys.argv
    sys.argv = [f"orchestrator {command}", *with_overrides(argv, [f"hydra.job.name={command}"])]
    try:
        hydra.main(config_path=_source.primary, config_name=_source.config_name, version_base="1.3")(task)()
    finally:
        sys.argv = saved


def with_overrides(argv: list[str], extra: list[str]) -> list[str]:
    """argv with `extra` overrides added to its own: argparse (Hydra's parser) takes the
    overrides as one run of words, so they go right after the last one, or first."""
    overrides = hydra_arguments(argv).overrides
    at = max((i for i, a in enumerate(argv) if a in overrides), default=-1) + 1
    return argv[:at] + extra + argv[at:]


def _unused_task(cfg: DictConfig) -> None:
    raise AssertionError("Hydra only shows here (--cfg, --info, --help); it runs nothing")


# --- plan and translate -------------------------------------------------------------------


def specs_from(overrides: list[str], multirun: bool) -> list[TrialSpec]:
    """Every trial the command line asks for, composed and validated (ConfigError if not)."""
    sweep_files = [o for o in overrides if o.lstrip("+").partition("=")[0] == "sweep"]
    if sweep_files and not multirun:  # its axes would be silently ignored
        raise ConfigError("+sweep", sweep_files[0].partition("=")[2], "a sweep file runs with -m: add -m")
    points = expand_sweep(overrides) if multirun else [overrides]
    specs = []
    for i, point in enumerate(points):
        try:
            specs.append(build_spec(point))
        except ConfigError as exc:
            if len(points) > 1:
                exc.args = (f"sweep point {i + 1} of {len(points)} ({' '.join(point)}): {exc}",)
            raise
    return specs


def plan(overrides: list[str], multirun: bool, as_json: bool) -> int:
    points = [(spec, make_plan(spec)) for spec in specs_from(overrides, multirun)]
    if as_json:
        data = ([{"overrides": list(spec.overrides), "plan": p.as_dict()} for spec, p in points]
                if multirun else points[0][1].as_dict())
        print(json.dumps(data, indent=2))
    elif len(points) == 1 and not multirun:
        show_plan(*points[0], console())
    else:
        show_sweep(points, console())
    refused = [spec for spec, p in points if not p.fits]
    if refused:
        print(f"orchestrator plan: {len(refused)} of {len(points)} trial(s) do not fit in device memory "
              "(run.force=true launches anyway)", file=sys.stderr)
        return PlanRefused.exit_code
    return 0


def translate(overrides: list[str], multirun: bool, out_dir) -> int:
    specs = specs_from(overrides, multirun)
    out = writable_dir(Path(str(out_dir)), "--out")
    for i, spec in enumerate(specs):
        trial_dir = out / point_name(i, spec) if multirun else out
        files = write_trial_files(spec, trial_dir, plan=make_plan(spec).as_dict())
        print(f"{trial_label(spec)}\n  wrote {', '.join(p.name for p in files.written)} in {files.directory}")
        for w in files.warnings:
            print(f"  warning: {w}", file=sys.stderr)
    return 0


def point_name(index: int, spec: TrialSpec) -> str:
    """translate -m: a point's directory, its index then its overrides made file-name safe."""
    slug = re.sub(r"[^A-Za-z0-9_.=,-]+", "_", ",".join(spec.overrides))[:120]
    return f"{index}_{slug}" if slug else f"{index}"


# --- run ------------------------------------------------------------------------------------


def run(overrides: list[str], multirun: bool, argv: list[str]) -> int:
    settings = compose_trial(fixed_part(overrides))
    launcher = settings.hydra_choices.get("hydra/launcher")
    if launcher != OUR_LAUNCHER:
        raise foreign_launcher(str(launcher))
    sweeper = settings.hydra_choices.get("hydra/sweeper", "basic")
    sampler = multirun and sweeper != "basic"
    # A sampling sweeper (Optuna) chooses its points as it goes: only what they share can
    # be checked now; a sampled point that is invalid is reported to it as a failed trial.
    specs = [build_spec(fixed_part(overrides))] if sampler else specs_from(overrides, multirun)
    for spec in specs:
        check_runnable_here(spec)
    key = "sweep" if multirun else "run"
    named = [o for o in overrides if o.partition("=")[0] == f"hydra.{key}.dir"]
    out = _current.flags.get("--out")
    target = str(out) if out else settings.hydra_dirs[key]
    tuning = multirun and sweeper == TUNER
    overwrite = bool(_current.flags.get("--overwrite"))
    base = claim(Path(target), "--out" if out else f"hydra.{key}.dir", overwrite=overwrite, unique=not (out or named),
                 marker=SWEEP_CLAIM if multirun else CLAIM,
                 resume=tuning and not overwrite and (Path(target) / "tune.json").is_file())
    _current.group = base.name if (out or named) else "_".join(base.parts[-2:])  # multirun/DATE/TIME -> DATE_TIME
    # Hydra would write .hydra/ with the overrides as typed, secrets included; the trial
    # writes it instead, redacted (write_hydra_files), under the name Hydra would use.
    _current.hydra_subdir = settings.hydra_dirs.get("output_subdir")
    extra = [f"hydra.{key}.dir='{base.resolve()}'", "hydra.output_subdir=null"]
    if sampler and not tuning and not any(o.startswith("hydra.sweeper.direction=") for o in overrides):
        extra.append(f"hydra.sweeper.direction={OBJECTIVES[specs[0].cfg.run.objective][1]}")
    argv = with_overrides([a for a in argv if a not in named], extra)
    _hydra("run", argv, run_task)
    out_console = console()
    if _current.submitted:
        if not all(spec.cfg.cluster.wait for spec in specs):
            out_console.print(f"follow with: orchestrator status {base}   |   orchestrator wait {base}")
            return 0
        _current.results = wait_for(base, out_console)
        show_report(collect(base)[0], out_console)
    if hint := sync_hint(_current.trial_dirs):
        out_console.print(f"[dim]{hint}[/dim]")
    if tuning:  # a failed candidate is part of a search: only no winner at all is a failure
        return 0 if (read_json(base / "tune.json") or {}).get("winner") else 1
    return sweep_outcome(_current.results, base, out_console)


def tune(overrides: list[str], argv: list[str]) -> int:
    """`orchestrator tune`: `run -m` with the plan-guided search as Hydra's sweeper. The
    space is planned first, so an empty one, or one where nothing can run, says why before
    any directory is made; --out DIR holding an earlier tune resumes it."""
    from orchestrator.tune.space import plan_space

    if "-m" in argv or "--multirun" in argv:
        raise ConfigError("-m", "-m", "tune is always a multirun; leave -m out")
    plan_space([o for o in overrides if not o.startswith(("hydra.", "hydra/"))])
    budget = {"--trials": "budget_trials", "--minutes": "budget_min"}
    extra = [f"hydra/sweeper={TUNER}", *(f"hydra.sweeper.{field}={_current.flags[flag]}"
                                         for flag, field in budget.items() if flag in _current.flags)]
    return run([*overrides, *extra], True, with_overrides(["-m", *argv], extra))


def run_task(cfg: DictConfig) -> "Outcome":
    """`orchestrator run` without -m: Hydra calls this in the claimed hydra.run.dir."""
    spec = build_spec(list(HydraConfig.get().overrides.task))
    trial_dir = Path(HydraConfig.get().runtime.output_dir)
    _current.trial_dirs.append(trial_dir)
    write_hydra_files(trial_dir, cfg)
    if spec.cfg.cluster.name == "slurm":
        batch = Batch([tuple(spec.overrides)], 0, trial_dir, [(spec, trial_dir, None)])
        batch.submit()
        return Outcome(None, spec.cfg.run.objective)
    result = run_trial(spec, trial_dir, console())
    _current.results.append(result)
    return Outcome(result, spec.cfg.run.objective)


def write_hydra_files(trial_dir: Path, cfg: DictConfig) -> None:
    """The trial's .hydra/ (config.yaml, hydra.yaml, overrides.yaml, as Hydra writes them),
    with every secret masked (redact.py): Hydra's own copy would hold the values typed."""
    if _current.hydra_subdir is None:
        return
    hydra_cfg = OmegaConf.to_container(HydraConfig.get(), resolve=False)
    hydra_cfg["output_subdir"] = _current.hydra_subdir
    files = {"config.yaml": OmegaConf.to_container(cfg, resolve=False, enum_to_str=True), "hydra.yaml": {"hydra": hydra_cfg},
             "overrides.yaml": list(HydraConfig.get().overrides.task)}
    folder = trial_dir / _current.hydra_subdir
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        atomic_write_text(folder / name, OmegaConf.to_yaml(OmegaConf.create(redact(data))))


def redact_sweep_record(sweep_dir: Path) -> None:
    """Hydra's basic sweeper saves the sweep's config as multirun.yaml, secrets as typed:
    rewritten masked before any point runs."""
    path = sweep_dir / "multirun.yaml"
    if path.is_file():
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        atomic_write_text(path, OmegaConf.to_yaml(OmegaConf.create(redact(data))))


def sweep_outcome(results: list[dict], base: Path, out) -> int:
    if len(results) > 1:
        failed = [r for r in results if r["status"] != "ok"]
        out.print(f"sweep: {len(results) - len(failed)} ok, {len(failed)} not ({', '.join(r['status'] for r in failed)})"
                  f" in {base}" if failed else f"sweep: all {len(results)} ok in {base}")
    codes = {r["exit_code"] for r in results} or {0}
    return 1 if codes - {0, 3} else max(codes)  # a failure outranks a refusal


class Outcome:
    """What a trial returns to Hydra. As a float it is the sweep's objective (Optuna reads
    float(return_value)); a trial that did not end ok has none, so the sampler records a
    failed trial rather than a number."""

    def __init__(self, result: dict | None, objective: str):
        self.result, self.objective = result, objective

    def __float__(self) -> float:
        value = objective_value(self.result, self.objective) if self.result else None
        if value is None:
            raise TypeError(str(self))
        return float(value)

    def __str__(self) -> str:
        r = self.result or {}
        if r.get("status") != "ok":
            return f"trial {r.get('status', 'submitted')}: {((r.get('error') or {}).get('message') or '')[:200]}"
        return f"{self.objective}={objective_value(r, self.objective)}"


# --- the launcher plugin's side -------------------------------------------------------------


@dataclass
class Batch:
    """A batch of sweep points the launcher plugin was handed, run the orchestrator's way."""

    overrides: list[tuple[str, ...]]
    first: int
    base: Path
    to_submit: list = field(default_factory=list)
    swept: list[dict[str, str]] = field(default_factory=list)  # per point: the values that differ

    def __post_init__(self) -> None:
        self.swept = swept_values(self.overrides)

    @classmethod
    def of(cls, job_overrides: Sequence[Sequence[str]], first: int, base: Path) -> "Batch":
        return cls([tuple(o) for o in job_overrides], first, base)

    @property
    def job_id(self) -> str:
        return self.base.name

    def info(self, i: int) -> dict:
        """The W&B group, name and swept values of point i."""
        swept = self.swept[i]
        name = ",".join(f"{k}={v}" for k, v in swept.items()) or " ".join(self.overrides[i]) or "default"
        return {"group": _current.group, "name": name[:120], "index": self.first + i, "swept": swept}

    @staticmethod
    def on_slurm(cfg: DictConfig) -> bool:
        return cfg.cluster.name == "slurm"

    def _claim(self, cfg: DictConfig) -> tuple[TrialSpec | None, Path]:
        try:
            trial_dir = claim(Path(HydraConfig.get().runtime.output_dir), "hydra.sweep.subdir")
        except ConfigError as exc:  # another run holds it: stop, as before anything ran
            print(f"orchestrator run: {exc}", file=sys.stderr)
            raise SystemExit(exc.exit_code) from None
        _current.trial_dirs.append(trial_dir)
        write_hydra_files(trial_dir, cfg)
        try:
            return build_spec(list(HydraConfig.get().overrides.task)), trial_dir
        except ConfigError as exc:  # only a sampled point can be invalid here: recorded, and a failed trial
            result = write_result(trial_dir, None, None, Status.REFUSED, now(), error_record("ConfigError", str(exc)),
                                  exit_code=exc.exit_code)
            console().print(f"[red]invalid point[/red] {trial_dir.name}: {exc}")
            _current.results.append(result)
            return None, trial_dir

    def run(self, i: int, cfg: DictConfig) -> Outcome:
        """A local point, run to its end (the task Hydra's run_job calls)."""
        spec, trial_dir = self._claim(cfg)
        if spec is None:
            return Outcome(_current.results[-1], "tokens_per_sec_per_gpu")
        result = run_trial(spec, trial_dir, console(), self.info(i))
        _current.results.append(result)
        return Outcome(result, spec.cfg.run.objective)

    def prepare(self, i: int, cfg: DictConfig) -> Outcome:
        """A SLURM point: its directory now, its submission with the others (submit)."""
        spec, trial_dir = self._claim(cfg)
        if spec is None:
            return Outcome(_current.results[-1], "tokens_per_sec_per_gpu")
        self.to_submit.append((spec, trial_dir, self.info(i)))
        return Outcome(None, spec.cfg.run.objective)

    def submit(self) -> None:
        if self.to_submit:
            refused = submit_trials(self.to_submit, self.base / "slurm-logs", console())
            _current.results.extend(refused)
            _current.submitted += len(self.to_submit) - len(refused)

