"""`orchestrator run | plan | translate | tune`: the commands that take overrides, as Hydra apps.

Each reads its command line with Hydra's own argument parser, so every Hydra flag means
what it means in any Hydra app: --help and --hydra-help, --cfg job|hydra|all with
--resolve and --package, --info, -cp/-cn/-cd, --shell-completion, -m. Those that only
show something are handed to Hydra's entry (`hydra.main`) as they are.

What the command does is then, per command:
- run: every point is composed and validated first (a bad point fails the whole sweep in
  about a second, exit 2, nothing written), the output directory is claimed, and then
  `hydra.main` runs: Hydra composes, makes the directory (hydra.run.dir, or for -m
  hydra.sweep.dir/hydra.sweep.subdir) and calls `run_task`; for -m, Hydra's sweeper
  (basic, or a plugin such as Optuna) hands the points to our launcher plugin
  (hydra_plugins/orchestrator_launcher). Either way a `SweepBatch` (sweep_batch.py) runs
  each point here or submits it to SLURM, and when Hydra returns the command reads what
  the points did from their files (result.json, slurm.json).
- tune: `run -m` with the plan-guided search as Hydra's sweeper
  (hydra_plugins/orchestrator_tuner).
- plan and translate launch nothing and make no output directory, so they compose every
  point with Hydra (compose.py: the same tree, overrides and sweep grammar) and print or
  write, without Hydra's run machinery. A sampling sweeper means nothing to them.

Our own flags (--out, --overwrite, --json, --trials, --minutes) are taken off the command
line before Hydra reads it; `run --out DIR` is hydra.run.dir=DIR (hydra.sweep.dir=DIR with -m).
Hydra's private API (its argument parser) is reached through hydra_compat.py only.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.orchestrator_launcher.orchestrator_launcher import OrchestratorLauncher
from hydra_plugins.orchestrator_tuner.orchestrator_tuner import TuneSweeper
from orchestrator.analysis.report import COLUMNS, collect
from orchestrator.analysis.tune.record import resumable_tune, same_space, tune_budget
from orchestrator.analysis.tune.space import plan_space
from orchestrator.config import OBJECTIVES
from orchestrator.core.errors import ConfigError, PlanRefused
from orchestrator.core.files import read_json, strict_json
from orchestrator.hydra_glue.compose import (
    MAX_POINTS,
    PROGRESS_EVERY_S,
    compose_trial,
    expand_sweep,
    fixed_part,
    searchpath_overrides,
)
from orchestrator.hydra_glue.conf_tree import CONFIG_NAME, Source, current_source, use_source
from orchestrator.hydra_glue.hydra_compat import hydra_arguments
from orchestrator.hydra_glue.hydra_errors import foreign_launcher
from orchestrator.hydra_glue.hydra_registry import override_key
from orchestrator.measure.host_load import available_bytes
from orchestrator.records.results import exit_code_of, result_or_none
from orchestrator.records.trial_dir import CLAIM, SWEEP_CLAIM, SweepPaths, TrialPaths, claim, trials_below, writable_dir
from orchestrator.records.trial_meta import sweep_point
from orchestrator.run.display import console, show_report, trial_label
from orchestrator.run.plan_display import show_plan, show_sweep
from orchestrator.run.planning import plan_trial
from orchestrator.run.sweep_batch import SweepBatch, TaskReturn
from orchestrator.run.trial import check_runnable_here, refusal, wait_for
from orchestrator.run.trial_files import write_trial_files
from orchestrator.spec import TrialSpec, build_spec
from orchestrator.workload.tracking import sync_hint

OWN_FLAGS = {
    "run": {"--out": True, "--overwrite": False, "--max-points": True},
    "plan": {"--json": False, "--max-points": True},
    "translate": {"--out": True, "--max-points": True},
    "tune": {"--out": True, "--overwrite": False, "--trials": True, "--minutes": True},
}
# What each command's --help says of its own flags (conf/config.yaml's help template asks
# for them through the orchestrator.flags resolver): one command's flags, not every one's.
FLAGS_HELP = {
    "run": "--out DIR      where the trial (or, with -m, the sweep) goes: hydra.run.dir / hydra.sweep.dir\n"
    "  --overwrite    replace the trial a directory already holds\n"
    "  --max-points N refuse a sweep of more points (default 10,000)",
    "plan": "--json         the plan (or every point's) as strict JSON on stdout\n"
    "  --max-points N refuse a sweep of more points (default 10,000)",
    "translate": "--out DIR      where the files go (required): config.yaml, ds_config.json, launch.sh, ...\n"
    "  --max-points N refuse a sweep of more points (default 10,000)",
    "tune": "--out DIR      the search's directory; the same --out again resumes it\n"
    "  --overwrite    start over in a directory that holds a search\n"
    "  --trials N     run at most N candidates for real (default 8)\n"
    "  --minutes M    start no new round after M minutes",
}
assert set(FLAGS_HELP) == set(OWN_FLAGS)
SAY_SIZE_FROM = 100  # a sweep of this many points or more says its size before validating
TUNER = "orchestrator_tune"  # hydra/sweeper=orchestrator_tune: hydra_plugins/orchestrator_tuner
COMMANDS = tuple(OWN_FLAGS)
OUR_LAUNCHER = "orchestrator"


def main(command: str, argv: list[str]) -> int:
    try:
        return _main(command, argv)
    finally:
        use_source(Source())  # the next command in this process reads conf/ again


def _main(command: str, argv: list[str]) -> int:
    flags, rest = _take_own_flags(command, argv)
    args = hydra_arguments(rest)
    use_source(
        Source(
            config_dir=str(Path(args.config_path).resolve()) if args.config_path else "",
            config_name=args.config_name or CONFIG_NAME,
            extra_dirs=(str(Path(args.config_dir).resolve()),) if args.config_dir else (),
        )
    )
    if args.help or args.hydra_help or args.cfg or args.info or args.shell_completion:
        if args.overrides and not args.shell_completion:
            compose_trial(fixed_part(args.overrides))  # a bad override: exit 2 with our paragraph, not Hydra's 1
        _hydra(command, rest, _unused_task)
        return 0
    if command == "plan":
        return plan(args.overrides, args.multirun, bool(flags.get("--json")), max_points(flags))
    if command == "translate":
        if "--out" not in flags:
            raise ConfigError("--out", "(missing)", "translate writes its files into a directory: --out DIR")
        return translate(args.overrides, args.multirun, flags["--out"], max_points(flags))
    if command == "tune":
        return tune(args.overrides, rest, flags)
    return run(args.overrides, args.multirun, rest, flags)


def _take_own_flags(command: str, argv: list[str]) -> tuple[dict[str, str | bool], list[str]]:
    """(our flags, the rest for Hydra): --out DIR or --out=DIR, --json, ..."""
    own, rest, i = OWN_FLAGS[command], [], 0
    flags: dict[str, str | bool] = {}
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name in own and own[name]:  # takes a value: --out DIR or --out=DIR
            if not eq:
                if i + 1 >= len(argv):
                    raise ConfigError(name, "(nothing)", "a directory: --out DIR")
                value, i = argv[i + 1], i + 1
            flags[name] = value
        elif name in own and not eq:
            flags[name] = True
        else:
            rest.append(argv[i])
        i += 1
    return flags, rest


def _hydra(command: str, argv: list[str], task) -> None:
    """Hand the command line to Hydra's entry, `hydra.main`, as a Hydra app would be run."""
    # Installed from the wheel Hydra finds the plugins itself; an editable install hides the
    # hydra_plugins namespace from its scan, so they are registered by hand (public API).
    Plugins.instance().register(OrchestratorLauncher)
    Plugins.instance().register(TuneSweeper)
    OmegaConf.register_new_resolver("orchestrator.flags", lambda name: FLAGS_HELP.get(name, ""), replace=True)
    source = current_source()
    saved = sys.argv
    # the extra preset folders too: `hardware=NAME-calibrated` from `orchestrator calibrate`
    # lives in the user's (conf_tree.user_conf_dir), which hydra.main alone would not search
    extra = [f"hydra.job.name={command}", *searchpath_overrides(source)]
    sys.argv = [f"orchestrator {command}", *with_overrides(argv, extra)]
    try:
        hydra.main(config_path=source.primary, config_name=source.config_name, version_base="1.3")(task)()
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


def specs_from(overrides: list[str], multirun: bool, max_points: int = MAX_POINTS) -> list[TrialSpec]:
    """Every trial the command line asks for, composed and validated (ConfigError if not).
    A sweep says how many points it has first, and how far its validation is as it goes."""
    sweep_files = [o for o in overrides if override_key(o) == "sweep"]
    if sweep_files and not multirun:  # its axes would be silently ignored
        raise ConfigError("+sweep", sweep_files[0].partition("=")[2], "a sweep file runs with -m: add -m")
    points = expand_sweep(overrides) if multirun else [overrides]
    if len(points) > max_points:
        raise ConfigError(
            "sweep",
            f"{len(points):,} points",
            f"at most --max-points={max_points:,} (each point is "
            "validated and planned before anything runs, about 10 ms each); raise the cap with "
            f"--max-points {len(points)} if this many is meant",
        )
    if len(points) >= SAY_SIZE_FROM:
        print(f"sweep: {len(points):,} points, each validated before anything runs", file=sys.stderr)
    specs, started, said = [], time.monotonic(), time.monotonic()
    for i, point in enumerate(points):
        try:
            specs.append(build_spec(point))
        except ConfigError as exc:
            if len(points) > 1:
                exc.args = (f"sweep point {i + 1} of {len(points)} ({' '.join(point)}): {exc}",)
            raise
        if time.monotonic() - said >= PROGRESS_EVERY_S:
            said, rate = time.monotonic(), (i + 1) / (time.monotonic() - started)
            print(
                f"  validated {i + 1:,} of {len(points):,} ({(len(points) - i - 1) / rate:,.0f} s to go; "
                "Ctrl-C stops, nothing has run)",
                file=sys.stderr,
            )
    return specs


def max_points(flags: dict) -> int:
    text = str(flags.get("--max-points", MAX_POINTS)).strip()
    if not text.isdigit() or int(text) < 1:
        raise ConfigError("--max-points", text, f"a whole number of sweep points >= 1 (default {MAX_POINTS:,})")
    return int(text)


def plan(overrides: list[str], multirun: bool, as_json: bool, most: int = MAX_POINTS) -> int:
    points = [(spec, plan_trial(spec)) for spec in specs_from(overrides, multirun, most)]
    if as_json:
        data = (
            [{"overrides": list(spec.overrides), "plan": p.as_dict()} for spec, p in points]
            if multirun
            else points[0][1].as_dict()
        )
        print(strict_json(data))
    elif len(points) == 1 and not multirun:
        show_plan(*points[0], console())
    else:
        show_sweep(points, console())
    # run's own verdict (device memory, the node's host memory; a local CPU trial's ranks against
    # what this host has free): `plan` never says fits where `run` refuses
    free = (
        available_bytes()
        if any(s.cfg.cluster.name == "local" and not s.cfg.hardware.device.is_gpu for s, _ in points)
        else None
    )
    refused = [
        why
        for spec, p in points
        if (why := refusal(spec, p, free_bytes=free if not spec.cfg.hardware.device.is_gpu else None))
    ]
    if refused:
        print(
            f"orchestrator plan: {len(refused)} of {len(points)} trial(s) would be refused by run: {refused[0]}",
            file=sys.stderr,
        )
        return PlanRefused.exit_code
    return 0


def translate(overrides: list[str], multirun: bool, out_dir, most: int = MAX_POINTS) -> int:
    specs = specs_from(overrides, multirun, most)
    out = writable_dir(Path(str(out_dir)), "--out")
    refused = 0
    for i, spec in enumerate(specs):
        trial_dir = out / point_name(i, spec) if multirun else out
        plan = plan_trial(spec)
        files = write_trial_files(spec, trial_dir, plan=plan.as_dict())
        print(f"{trial_label(spec)}\n  wrote {', '.join(p.name for p in files.written)} in {files.directory}")
        for w in files.warnings:
            print(f"  warning: {w}", file=sys.stderr)
        # The files are written either way (to read, to change by hand), but what `run` would
        # say of them is said here too: a trial the plan refuses is not a trial to submit.
        if why := refusal(spec, plan):
            refused += 1
            print(f"  refused by the plan (run would not launch it): {why}", file=sys.stderr)
    if refused:
        print(
            f"orchestrator translate: {refused} of {len(specs)} trial(s) written but refused by the plan",
            file=sys.stderr,
        )
        return PlanRefused.exit_code
    return 0


def point_name(index: int, spec: TrialSpec) -> str:
    """translate -m: a point's directory, its index then its overrides made file-name safe."""
    slug = re.sub(r"[^A-Za-z0-9_.=,-]+", "_", ",".join(spec.overrides))[:120]
    return f"{index}_{slug}" if slug else f"{index}"


# --- run ------------------------------------------------------------------------------------


def run(overrides: list[str], multirun: bool, argv: list[str], flags: dict) -> int:
    settings = compose_trial(fixed_part(overrides))
    launcher = settings.hydra_choices.get("hydra/launcher")
    if launcher != OUR_LAUNCHER:
        raise foreign_launcher(str(launcher))
    sweeper = settings.hydra_choices.get("hydra/sweeper", "basic")
    sampler = multirun and sweeper != "basic"
    # A sampling sweeper (Optuna) chooses its points as it goes: only what they share can
    # be checked now; a sampled point that is invalid is reported to it as a failed trial.
    specs = [build_spec(fixed_part(overrides))] if sampler else specs_from(overrides, multirun, max_points(flags))
    for spec in specs:
        check_runnable_here(spec)
    key = "sweep" if multirun else "run"
    named = [o for o in overrides if o.partition("=")[0] == f"hydra.{key}.dir"]
    out = flags.get("--out")
    target = str(out) if out else settings.hydra_dirs[key]
    tuning = multirun and sweeper == TUNER
    overwrite = bool(flags.get("--overwrite"))
    base = claim(
        Path(target),
        "--out" if out else f"hydra.{key}.dir",
        overwrite=overwrite,
        unique=not (out or named),
        marker=SWEEP_CLAIM if multirun else CLAIM,
        resume=tuning and not overwrite and resumable_tune(Path(target)),
    )
    # W&B's group: the sweep by name (+sweep=NAME, else the keys swept) and when it started;
    # a plain run keeps its directory's name.
    # A resumed tune keeps the group its first rounds ran in: one search, one W&B group.
    group = (resumed_group(base) if tuning else None) or (
        f"{sweep_label(overrides)}-{time.strftime('%Y-%m-%d_%H-%M-%S')}"
        if multirun
        else base.name
        if (out or named)
        else "_".join(base.parts[-2:])
    )
    # Hydra would write .hydra/ with the overrides as typed, secrets included; each trial
    # writes it instead, masked (sweep_batch.write_hydra_files), under the name Hydra would use.
    subdir = settings.hydra_dirs.get("output_subdir")
    extra = [
        f"hydra.{key}.dir='{base.resolve()}'",
        "hydra.output_subdir=null",
        f"hydra.launcher.group='{group}'",
        "hydra.launcher.hydra_subdir=" + ("null" if subdir is None else f"'{subdir}'"),
    ]
    if multirun:  # a point's directory is named by what was swept: the fixed overrides left out
        extra.append(f"hydra.job.config.override_dirname.exclude_keys=[{','.join(dirname_excluded(overrides))}]")
    if sampler and not tuning and not any(o.startswith("hydra.sweeper.direction=") for o in overrides):
        extra.append(f"hydra.sweeper.direction={OBJECTIVES[specs[0].cfg.run.objective][1]}")
    _hydra("run", with_overrides([a for a in argv if a not in named], extra), run_task)
    return _finish(base, specs, tuning)


def sweep_label(overrides: list[str]) -> str:
    """A sweep's name: +sweep=NAME's NAME, else the keys the command line sweeps."""
    named = [o.partition("=")[2] for o in overrides if override_key(o) == "sweep"]
    fixed = set(fixed_part(overrides))
    swept = [override_key(o) for o in overrides if o not in fixed and not o.startswith("hydra")]
    return named[0] if named else ",".join(swept) or "sweep"


def dirname_excluded(overrides: list[str]) -> list[str]:
    """Keys left out of a sweep point's directory name: setup lines (they may hold secrets)
    and every override that is the same at every point."""
    fixed = [override_key(o) for o in fixed_part(overrides) if not o.startswith("hydra")]
    return list(dict.fromkeys(["cluster.setup", *fixed]))


def _finish(base: Path, specs: list[TrialSpec], tuning: bool) -> int:
    """After Hydra returns: wait for SLURM where asked, say how the sweep went, the exit code.
    What each point did is in its files: result.json, or slurm.json for one submitted."""
    out = console()
    dirs = trials_below(base)
    if any(TrialPaths(d).slurm_job.is_file() for d in dirs):
        if not all(spec.cfg.cluster.wait for spec in specs):
            out.print(f"follow with: orchestrator status {base}   |   orchestrator wait {base}")
            return 0
        wait_for(base, out)
        show_report(collect(base)[0], COLUMNS, out)
    if hint := sync_hint(dirs):
        out.print(f"[dim]{hint}[/dim]")
    if tuning:  # a failed candidate is part of a search: only no winner at all is a failure
        return 0 if (read_json(SweepPaths(base).tune_json) or {}).get("winner") else 1
    return sweep_outcome([r for r in map(result_or_none, dirs) if r], base, out)


def tune(overrides: list[str], argv: list[str], flags: dict) -> int:
    """`orchestrator tune`: `run -m` with the plan-guided search as Hydra's sweeper. The
    budget and the space are checked first, so an empty space, or one where nothing can
    run, says why before any directory is made; --out DIR holding an earlier tune of the
    same space resumes it (another space is refused, naming the difference)."""
    if "-m" in argv or "--multirun" in argv:
        raise ConfigError("-m", "-m", "tune is always a multirun; leave -m out")
    budget = tune_budget(flags)
    space = plan_space([o for o in overrides if not o.startswith(("hydra.", "hydra/"))], check_runnable_here)
    if "--out" in flags and not flags.get("--overwrite") and resumable_tune(Path(flags["--out"])):
        same_space(Path(flags["--out"]), space)
    extra = [f"hydra/sweeper={TUNER}", *(f"hydra.sweeper.{name}={value}" for name, value in budget.items())]
    return run([*overrides, *extra], True, with_overrides(["-m", *argv], extra), flags)


def run_task(cfg: DictConfig) -> TaskReturn:
    """`orchestrator run` without -m: Hydra calls this in the claimed hydra.run.dir."""
    hydra_cfg = HydraConfig.get()
    batch = SweepBatch(
        [tuple(hydra_cfg.overrides.task)],
        0,
        Path(hydra_cfg.runtime.output_dir),
        group=hydra_cfg.launcher.get("group"),
        hydra_subdir=hydra_cfg.launcher.get("hydra_subdir"),
        single=True,
    )
    returned = batch.task(0, cfg)(cfg)
    batch.submit()
    return returned


def resumed_group(base: Path) -> str | None:
    """The W&B group the trials already below `base` ran in (trial.json's sweep.group), if any."""
    for trial_dir in trials_below(base):
        sweep = sweep_point(trial_dir)
        if isinstance(sweep.get("group"), str) and sweep["group"]:
            return sweep["group"]
    return None


def sweep_outcome(results: list[dict], base: Path, out) -> int:
    """Say how a sweep went; its exit code (a failure outranks a refusal)."""
    if len(results) > 1:
        failed = [r for r in results if r.get("status") != "ok"]
        out.print(
            f"sweep: {len(results) - len(failed)} ok, {len(failed)} not "
            f"({', '.join(str(r.get('status')) for r in failed)}) in {base}"
            if failed
            else f"sweep: all {len(results)} ok in {base}"
        )
    codes = {exit_code_of(r) for r in results} or {0}
    return 1 if codes - {0, 3} else max(codes)
