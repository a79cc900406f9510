"""A trial directory: claimed by exactly one run, and the files that say what it holds.

`claim(path)` makes the directory this run's, atomically: a new directory is created
with mkdir (of two runs racing for one path, exactly one succeeds), an existing empty one
is taken by creating claim.json (sweep.json for a sweep's directory) with O_EXCL. A directory that
holds a trial already is refused (TrialDirHeld, exit 2) unless the user asks to replace it
(`--overwrite`): the old trial is then moved aside and deleted before the new one starts, so old and
new never mix.

claim.json says who runs the trial (pid, host, start). A local trial whose claim names a
process that is gone and which has no result.json was interrupted without a record (the
orchestrator was killed): `status` and `wait` then record it as interrupted.

result.reserve holds disk space for result.json from the start: when the file system
fills up during the trial, deleting the reserve frees room for the result.
"""

from __future__ import annotations

import datetime as dt
import errno
import itertools
import json
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.errors import ConfigError
from orchestrator.core.files import read_json, remove_tree
from orchestrator.core.process import start_ticks

CLAIM = "claim.json"
SWEEP_CLAIM = "sweep.json"  # a sweep's own directory: the trials are its sub-directories
RESERVE_BYTES_PER_STEP = 600  # result.json carries the history twice over (metrics and steps)


@dataclass(frozen=True)
class TrialPaths:
    """Every file of a trial directory, named here and nowhere else (as submitit's JobPaths);
    tests/test_structure.py fails on a trial file's name written in any other module.

    Written before launch (translate): config.yaml, trial.json, plan.json, ds_config.json,
    accelerate_config.yaml, launch.json, launch.sh, EXPLAIN.md, and .hydra/ (Hydra's names,
    masked); while it runs: plan-at-submit.json (SLURM), node-load.json, claim.json, result.reserve,
    logs/, errors/, checkpoint/, metrics.json (rank 0), slurm.json, wandb_run.json, wandb/,
    profile/; at its end: result.json."""

    root: Path

    config = property(lambda self: self.root / "config.yaml")  # the resolved trial
    meta = property(lambda self: self.root / "trial.json")  # overrides, choices, sweep point
    plan = property(lambda self: self.root / "plan.json")
    # SLURM with measured kernels: the submitting host's plan, kept when the allocated node
    # re-plans into plan.json; written last, so it also says the node's plan is there.
    plan_at_submit = property(lambda self: self.root / "plan-at-submit.json")
    ds_config = property(lambda self: self.root / "ds_config.json")
    accelerate_config = property(lambda self: self.root / "accelerate_config.yaml")
    launch_json = property(lambda self: self.root / "launch.json")
    launch_sh = property(lambda self: self.root / "launch.sh")
    explain = property(lambda self: self.root / "EXPLAIN.md")
    claim = property(lambda self: self.root / CLAIM)
    reserve = property(lambda self: self.root / "result.reserve")  # disk space held for result.json
    metrics = property(lambda self: self.root / "metrics.json")
    slurm_job = property(lambda self: self.root / "slurm.json")
    # how busy rank 0's node (a local trial's host) was before its ranks started: result.json's
    # host_load, and rank 0's W&B summary
    node_load = property(lambda self: self.root / "node-load.json")
    wandb_run = property(lambda self: self.root / "wandb_run.json")  # the W&B run id a requeued job resumes
    wandb_dir = property(lambda self: self.root / "wandb")  # W&B's own files (offline runs)
    result = property(lambda self: self.root / "result.json")
    logs = property(lambda self: self.root / "logs")
    launcher_log = property(lambda self: self.root / "logs" / "launcher.log")
    # `sbatch launch.sh`: the job's own output (sbatch --output; %j is the job id), and the
    # requeue that its rank 0 asked for on SLURM's warning (then the job's end writes no result)
    sbatch_output = property(lambda self: self.root / "logs" / "sbatch-%j.out")
    requeue_asked = property(lambda self: self.root / "requeue-asked.json")
    errors = property(lambda self: self.root / "errors")
    earlier_errors = property(lambda self: self.root / "errors" / "earlier")  # from attempts before a requeue
    checkpoint = property(lambda self: self.root / "checkpoint")  # the engine's state, per step tag
    checkpoint_latest = property(lambda self: self.root / "checkpoint" / "latest.json")  # written last: it counts
    profile = property(lambda self: self.root / "profile")  # torch.profiler traces (run.profile)

    def rank_log(self, rank: int | None) -> Path:
        return self.launcher_log if rank is None else self.logs / f"rank{rank}.log"

    def rank_error(self, rank: int) -> Path:
        return self.errors / f"rank{rank}.json"

    def rank_running(self, rank: int) -> Path:
        """Present from a rank's start until it leaves through Python (an error or not): one
        still there after the launch ended died without its exit path (os._exit, a signal,
        the OOM killer), which torchrun's summary may not name (it names one failure)."""
        return self.logs / f"rank{rank}.running"

    def ranks_still_running(self) -> set[int]:
        """The ranks whose running marker (above) outlived them."""
        return {int(p.name.removeprefix("rank").removesuffix(".running")) for p in self.logs.glob("rank*.running")}

    def earlier_rank_error(self, rank: int, stamp: float) -> Path:
        return self.earlier_errors / f"rank{rank}.{stamp:.0f}.json"

    def checkpoint_rng(self, tag: str, rank: int) -> Path:
        return self.checkpoint / tag / f"rng{rank}.pt"

    def hydra_files(self, subdir: str) -> dict[str, Path]:
        """.hydra/ under the name the user gave it: the three files Hydra itself writes."""
        return {name: self.root / subdir / f"{name}.yaml" for name in ("config", "hydra", "overrides")}

    def markers(self) -> tuple[Path, ...]:
        """The files only a trial writes (.hydra/ alone is not a trial)."""
        return self.meta, self.result, self.slurm_job, self.claim

    def holds_trial(self) -> bool:
        return self.root.is_dir() and any(p.exists() for p in self.markers())


@dataclass(frozen=True)
class SweepPaths:
    """Every file a sweep (or a tune) keeps in its own directory, beside its trials'
    directories: named here and nowhere else."""

    root: Path

    claim = property(lambda self: self.root / SWEEP_CLAIM)
    multirun_yaml = property(lambda self: self.root / "multirun.yaml")  # Hydra's record of the sweep, masked
    slurm_logs = property(lambda self: self.root / "slurm-logs")  # submitit's folder, one per job
    tune_json = property(lambda self: self.root / "tune.json")  # the search's state: resumes from it
    tune_md = property(lambda self: self.root / "tune.md")
    tune_png = property(lambda self: self.root / "tune.png")
    report_csv = property(lambda self: self.root / "report.csv")
    report_md = property(lambda self: self.root / "report.md")
    scaling_png = property(lambda self: self.root / "scaling.png")
    predicted_png = property(lambda self: self.root / "predicted_vs_measured.png")
    warmup_png = property(lambda self: self.root / "warmup.png")
    buckets_png = property(lambda self: self.root / "buckets.png")


HOLDS_A_TRIAL = tuple(p.name for p in TrialPaths(Path()).markers())


class TrialDirHeld(ConfigError):
    """The directory holds a trial already, and replacing it was not asked for."""


def holds_trial(path: Path) -> bool:
    return TrialPaths(path).holds_trial()


def trials_below(path: Path) -> list[Path]:
    """Every trial directory at or below `path` (links not followed). A running trial
    deletes old checkpoints while this walks, so a folder that vanishes on the way is passed
    over, never an error."""
    markers, found, todo = set(HOLDS_A_TRIAL), [], [str(path)]
    while todo:  # a stack, not os.walk: Python 3.11's walk recurses, and a tree 1,500 deep ends it
        folder = todo.pop()
        try:
            with os.scandir(folder) as entries:
                names = {e.name: e.is_dir(follow_symlinks=False) for e in entries}
        except OSError:
            continue
        if markers & {name for name, is_dir in names.items() if not is_dir}:
            found.append(Path(folder))
        todo += [os.path.join(folder, name) for name, is_dir in names.items() if is_dir]
    return sorted(found)


NAME_MAX, PATH_MAX = 255, 4096  # bytes: Linux's limits on a file name and a whole path


def check_path(path: Path, field: str) -> Path:
    """`path` if the file system can hold it, else ConfigError naming the part that is too long."""
    long_part = next((p for p in Path(path).parts if len(p.encode()) > NAME_MAX), None)
    if long_part is not None or len(str(path).encode()) > PATH_MAX:
        what = (
            f"one name in it is {len(long_part.encode())} bytes"
            if long_part
            else f"it is {len(str(path).encode())} bytes"
        )
        raise ConfigError(
            field, str(path), f"a path of names of at most {NAME_MAX} bytes, at most {PATH_MAX} in all; {what}"
        )
    return path


def claim(
    path: Path,
    field: str,
    overwrite: bool = False,
    unique: bool = False,
    marker: str = CLAIM,
    resume: bool = False,
    others_files: bool = False,
) -> Path:
    """Make `path` this run's trial (or sweep) directory and return it.

    field: how the user named it (--out) for messages. unique: a default path
    (outputs/DATE/TIME); if another run holds it (started in the same second), take
    PATH_1, PATH_2, ... instead. resume: carry on a run in `path` (a tune): what it holds
    stays, and only a claimant still alive refuses. others_files: files that are not a
    trial's may be there already (a sweep point's directory, where Hydra's log starts
    first); otherwise a directory holding the user's own files is refused, never taken.
    """
    check_path(path, field)
    check_room(path, field)
    inside = next((p for p in path.absolute().parents if holds_trial(p)), None)
    if inside is not None:  # its status, report and --overwrite would take this one along
        raise ConfigError(
            field, str(path), f"a directory outside any trial, but {inside} is a trial's; choose a directory beside it"
        )
    if not (others_files or resume or holds_trial(path) or SweepPaths(path).claim.exists()):
        if path.is_dir() and (own := sorted(p.name for p in path.iterdir())):
            raise ConfigError(
                field,
                str(path),
                f"a new or empty directory, but it holds {len(own)} file(s) of "
                f"another kind ({', '.join(own[:3])}{', ...' if len(own) > 3 else ''}); "
                "choose another directory",
            )
    if resume:
        held = path / marker
        if held.exists() and not claimant_gone(read_json(held) or {}):
            raise TrialDirHeld(
                field,
                str(path),
                "a directory no other run is using, but a run that is still alive "
                f"holds it ({held}); wait for it, or choose another directory",
            )
        held.unlink(missing_ok=True)
        return _claim(path, field, False, marker, check_held=False)
    if not unique:
        return _claim(path, field, overwrite, marker)
    for n in itertools.count():
        try:
            return _claim(path if n == 0 else path.with_name(f"{path.name}_{n}"), field, False, marker)
        except TrialDirHeld:
            continue
    raise AssertionError("unreachable")


def _claim(path: Path, field: str, overwrite: bool, marker: str, check_held: bool = True) -> Path:
    if path.exists() and not path.is_dir():
        raise ConfigError(field, str(path), "a directory, but it is a file; choose another path")
    below = trials_below(path) if path.is_dir() else []
    if check_held and (holds_trial(path) or SweepPaths(path).claim.exists() or below):
        if not overwrite:
            held = "a trial" if holds_trial(path) else f"a sweep of {len(below)} trial(s)" if below else "a sweep"
            raise TrialDirHeld(
                field,
                str(path),
                f"a directory no earlier run used, but it holds {held}; choose "
                "another directory, or add --overwrite to delete what it holds and run this in its place",
            )
        _remove(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir()
        except FileExistsError:
            pass  # an existing empty directory: claim.json decides below
        fd = os.open(path / marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise TrialDirHeld(
            field,
            str(path),
            "a directory no other run is using, but another run claimed it a moment ago; choose another directory",
        ) from None
    except OSError as exc:
        raise ConfigError(field, str(path), f"a directory this user can create and write ({exc.strerror})") from None
    with os.fdopen(fd, "w") as f:
        json.dump(claim_record(), f)
    return path


def writable_dir(path: Path, field: str) -> Path:
    """A directory to write configs into (translate --out): created if need be."""
    check_path(path, field)
    if path.exists() and not path.is_dir():
        raise ConfigError(field, str(path), "a directory, but it is a file; choose another path")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise ConfigError(field, str(path), f"a directory this user can create and write ({exc.strerror})") from None
    return path


MIN_FREE_BYTES = 2**20  # a trial's files and result.json (the tiny trial's take about 150 KB); its logs
# and checkpoints grow from there, and result.reserve keeps room for the result when they fill the rest


def check_room(path: Path, field: str) -> None:
    """The file system `path` lands on has room for a trial: a nearly full one failed mid-way,
    two tracebacks and no result.json; refused before anything is written."""
    existing = next((p for p in (path.absolute(), *path.absolute().parents) if p.exists()), None)
    if existing is None:
        return
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return
    if free < MIN_FREE_BYTES:
        raise ConfigError(
            field,
            str(path),
            f"a directory on a file system with room for a trial (at least "
            f"{MIN_FREE_BYTES >> 20} MB free for its files and result.json); {existing} has "
            f"{free >> 10:,} KB free",
        )


def claim_record() -> dict:
    return {
        "pid": os.getpid(),
        "pid_start": start_ticks(os.getpid()),
        "host": socket.gethostname(),
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def claimant_gone(record: dict) -> bool:
    """Whether the process that claimed a trial has ended (only knowable on its own host).
    The process is its pid and its start time (`pid_start`): a live process under the same
    pid that started at another time (the pid reused, or a claim naming pid 1) is not it.
    A record that names no process (not an object, no whole pid above 0, no start time
    where /proc has them) cannot be held by a live run: gone."""
    pid = record.get("pid") if isinstance(record, dict) else None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return True
    if record.get("host") != socket.gethostname():
        return False
    if start_ticks(os.getpid()) is not None:  # /proc tells each process's start
        running = start_ticks(pid)
        return running is None or record.get("pid_start") != running
    try:  # no /proc (not Linux): the pid alone
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


def reserve(path: Path, steps: int) -> None:
    """Hold room for result.json; a file system that is already full leaves no reserve."""
    size = 64 * 1024 + RESERVE_BYTES_PER_STEP * steps
    held = TrialPaths(path).reserve
    try:
        with open(held, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, size)
    except OSError:
        held.unlink(missing_ok=True)


def release(path: Path) -> None:
    TrialPaths(path).reserve.unlink(missing_ok=True)


def disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _remove(path: Path) -> None:
    """Move the old trial aside in one rename, then delete it: nothing of it stays to mix."""
    aside = path.with_name(f".{path.name}.replaced-{os.getpid()}")
    os.rename(path, aside)
    remove_tree(aside)
