"""The launcher's work: the points Hydra hands over, each claimed, validated and run.

Hydra's launcher plugin (hydra_plugins/orchestrator_launcher) makes one `SweepBatch` per
batch of sweep points its sweeper hands it; `orchestrator run` without -m makes one for
its single trial. Each point gets its directory claimed (a sweep's points; a single run's
directory was claimed by the command), its .hydra/ written with every secret masked, and
then runs here to its result.json (cluster=local) or is queued and submitted with the
batch's other points as one SLURM job array (cluster=slurm).

Everything a batch needs comes in explicitly: the sweep's directory, its W&B group and the
name of Hydra's output subdirectory arrive through the launcher's own config
(hydra.launcher.group, hydra.launcher.hydra_subdir: `hydra_registry.LauncherConfig`, which Hydra hands
the plugin's constructor). What the points did
goes back to the command the way it goes to every later reader: as the files of each
trial (result.json, slurm.json), which the command reads when Hydra returns.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from orchestrator.core.errors import ConfigError
from orchestrator.core.files import atomic_write_text
from orchestrator.core.redact import redact
from orchestrator.hydra_glue.compose import plain_dict, swept_values
from orchestrator.hydra_glue.hydra_registry import fit_name, whole_numbers
from orchestrator.records.results import Status, error_record, now, objective_value, write_result
from orchestrator.records.trial_dir import SweepPaths, TrialPaths, claim
from orchestrator.run.display import console
from orchestrator.run.trial import run_trial, submit_trials
from orchestrator.spec import REPEAT, TrialSpec, build_spec


class TaskReturn:
    """What a point returns to Hydra. As a float it is the sweep's objective (Optuna reads
    float(return_value)); a point that did not end ok has none, so a sampling sweeper
    records a failed trial rather than a number."""

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


@dataclass
class SweepBatch:
    """Points of one sweep (or the one point of a plain run), run the orchestrator's way.

    base: the sweep's directory (a plain run's: the trial's own). group: the W&B group of
    the sweep's runs. hydra_subdir: the name Hydra would give .hydra/ (None: write none).
    single: a plain run, whose directory the command claimed and which has no sweep record.
    fixed: the command line's overrides, which no point's name repeats.
    """

    overrides: list[tuple[str, ...]]
    first: int
    base: Path
    group: str | None = None
    hydra_subdir: str | None = ".hydra"
    single: bool = False
    to_submit: list = field(default_factory=list)
    fixed: frozenset[str] = frozenset()  # the sweep's command-line overrides: what no point tried
    swept: list[dict[str, str]] = field(default_factory=list)  # per point: what it tried

    def __post_init__(self) -> None:
        # What a point tried: the values that differ within the batch, and every override the
        # command line did not fix (a tune round of one candidate tried its whole key, not nothing).
        self.swept = [
            {
                o.partition("=")[0]: whole_numbers(o.partition("=")[2])
                for o in point
                if o.partition("=")[0] in differ or o not in self.fixed
            }
            for point, differ in zip(self.overrides, swept_values(self.overrides))
        ]

    @property
    def job_id(self) -> str:
        return self.base.name

    def task(self, i: int, cfg: DictConfig) -> Callable[[DictConfig], TaskReturn]:
        """The task Hydra's run_job calls for point i: run it now, or queue it for SLURM."""
        return (lambda c: self.queue(i, c)) if cfg.cluster.name == "slurm" else (lambda c: self.run(i, c))

    def run(self, i: int, cfg: DictConfig) -> TaskReturn:
        """A local point, run to its end."""
        spec, trial_dir, refused = self._start(cfg)
        if spec is None:
            return TaskReturn(refused, "tokens_per_sec_per_gpu")
        return TaskReturn(run_trial(spec, trial_dir, console(), self.info(i)), spec.cfg.run.objective)

    def queue(self, i: int, cfg: DictConfig) -> TaskReturn:
        """A SLURM point: its directory now, its submission with the others (submit)."""
        spec, trial_dir, refused = self._start(cfg)
        if spec is None:
            return TaskReturn(refused, "tokens_per_sec_per_gpu")
        self.to_submit.append((spec, trial_dir, self.info(i)))
        return TaskReturn(None, spec.cfg.run.objective)

    def submit(self) -> None:
        """Every queued SLURM point, planned and submitted at once (refusals are recorded)."""
        if self.to_submit:
            submit_trials(self.to_submit, SweepPaths(self.base).slurm_logs, console())
            self.to_submit = []

    def info(self, i: int) -> dict | None:
        """The W&B group, name and swept values of point i (a plain run has none); where a
        swept secret is masked, the point's number among those it masks alike (masked_point)."""
        if self.single:
            return None
        swept = redact(self.swept[i])  # the run's name and trial.json: a swept secret stays masked
        name = ",".join(f"{k}={v}" for k, v in swept.items()) or " ".join(self.overrides[i]) or "default"
        number = masked_point(self.base, {k: v for k, v in self.swept[i].items() if k != REPEAT})
        if number is not None:
            name = f"{name} #{number}"
        return {
            "group": self.group,
            "name": fit_name(name),
            "index": self.first + i,
            "swept": swept,
            **({"masked_point": number} if number is not None else {}),
        }

    def _start(self, cfg: DictConfig) -> tuple[TrialSpec | None, Path, dict | None]:
        """Claim the point's directory, write its .hydra/, validate it: (spec, directory,
        the recorded refusal where it is invalid)."""
        trial_dir = Path(HydraConfig.get().runtime.output_dir)
        if not self.single:
            try:
                inside_the_sweep(trial_dir, self.base)
                trial_dir = claim(trial_dir, "hydra.sweep.subdir", others_files=True)
            except ConfigError as exc:  # another run holds it: stop, as before anything ran
                print(f"orchestrator run: {exc}", file=sys.stderr)
                raise SystemExit(exc.exit_code) from None
        write_hydra_files(trial_dir, cfg, self.hydra_subdir)
        try:
            return build_spec(list(HydraConfig.get().overrides.task)), trial_dir, None
        except ConfigError as exc:  # only a sampled point can be invalid here: recorded, a failed trial
            result = write_result(
                trial_dir,
                None,
                None,
                Status.REFUSED,
                now(),
                error_record("ConfigError", str(exc)),
                exit_code=exc.exit_code,
            )
            console().print(f"[red]invalid point[/red] {trial_dir.name}: {exc}")
            return None, trial_dir, result


# Masked, two points that differ only in a swept secret look alike: one W&B job type, one
# report row pooled as repeats. Each gets a number instead (#1, #2, in the order first seen),
# which tells them apart and says nothing of the secret. Counted in this process, which runs
# every batch of a Hydra sweep; the values themselves are kept only in its memory.
_SECRET_POINTS: dict[tuple[str, str], list[str]] = {}


def masked_point(sweep_dir: Path, point: dict[str, str]) -> int | None:
    """The number of `point` (swept values, the repeat left out) among the points of its sweep
    that mask alike, or None where no value of it is masked."""
    masked = redact(point)
    if masked == point:
        return None
    seen = _SECRET_POINTS.setdefault((str(sweep_dir), repr(sorted(masked.items()))), [])
    raw = repr(sorted(point.items()))
    if raw not in seen:
        seen.append(raw)
    return seen.index(raw) + 1


def inside_the_sweep(trial_dir: Path, sweep_dir: Path) -> None:
    """A point's directory is one name directly inside its sweep's (hydra.sweep.subdir may
    be any interpolation, and a swept value any string): else ConfigError, before anything
    is written there."""
    if trial_dir.resolve().parent != sweep_dir.resolve():
        raise ConfigError(
            "hydra.sweep.subdir",
            str(trial_dir),
            f"one directory name inside the sweep's directory "
            f"{sweep_dir}, with no / or .. in it (the default, NUM_OVERRIDES, makes one)",
        )


def write_hydra_files(trial_dir: Path, cfg: DictConfig, subdir: str | None) -> None:
    """The trial's .hydra/ (config.yaml, hydra.yaml, overrides.yaml, as Hydra writes them),
    with every secret masked (redact.py): Hydra's own copy would hold the values typed."""
    if subdir is None:
        return
    hydra_cfg = {**plain_dict(HydraConfig.get(), resolve=False), "output_subdir": subdir}
    paths = TrialPaths(trial_dir).hydra_files(subdir)
    files = {
        "config": plain_dict(cfg, resolve=False),
        "hydra": {"hydra": hydra_cfg},
        "overrides": list(HydraConfig.get().overrides.task),
    }
    paths["config"].parent.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        atomic_write_text(paths[name], OmegaConf.to_yaml(OmegaConf.create(redact(data))))


def redact_sweep_record(sweep_dir: Path) -> None:
    """Hydra's basic sweeper saves the sweep's config as multirun.yaml, secrets as typed:
    rewritten masked before any point runs."""
    path = SweepPaths(sweep_dir).multirun_yaml
    if path.is_file():
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        atomic_write_text(path, OmegaConf.to_yaml(OmegaConf.create(redact(data))))
