"""Fault injection on local trials: real signals, concurrent processes, a read-only mount
and a full tmpfs. Each test asserts what is on disk afterwards: a result.json with the
cause (strict JSON), nothing earlier lost, no rank left running, no traceback shown."""

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.records.trial_dir import claim, trials_below
from tests.conftest import FP32, PRESET_KERNELS, run_cli, run_in_process

pytestmark = pytest.mark.slow
# Minutes of steps, ended by the test. One rank where the number of ranks is not the point:
# a rank's start-up is a third of a small trial's cost.
LONG = ["model=tiny", PRESET_KERNELS, FP32, "run.steps=3000", "parallel.dp=1"]


def start(*args: str) -> subprocess.Popen:
    """`orchestrator ARGS` in its own session, as a terminal would run it."""
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for_step(proc: subprocess.Popen, step: int, timeout: float = 180) -> list[str]:
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if f"step {step}/" in line:
            return lines
        assert line or proc.poll() is None, "".join(lines)
    raise AssertionError("no progress: " + "".join(lines))


def ranks_of(trial_dir: Path) -> list[int]:
    """Pids of processes still working on this trial directory."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if str(trial_dir).encode() in argv and b"orchestrator.workload.train" in argv:
            pids.append(int(cmdline.parent.name))
    return pids


def gone(trial_dir: Path, within: float = 30) -> bool:
    deadline = time.monotonic() + within
    while ranks_of(trial_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    return not ranks_of(trial_dir)


def strict(path: Path) -> dict:
    def no_constant(name):
        raise ValueError(f"{path} holds {name}: not strict JSON")

    return json.loads(path.read_text(), parse_constant=no_constant)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_sweep_records_the_point_and_closes_its_wandb_run(tmp_path, sig):
    proc = start("run", "-m", *LONG, "run.seed=1,2", "logger.mode=offline", "--out", str(tmp_path))
    wait_for_step(proc, 3)
    os.killpg(proc.pid, sig)  # Ctrl-C reaches the whole foreground group; SIGTERM from a scheduler
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 128 + sig, out
    assert f"interrupted by {signal.Signals(sig).name}" in out and "Traceback" not in out
    point = next(tmp_path.glob("0_*"))
    r = strict(point / "result.json")
    assert r["status"] == "interrupted" and r["exit_code"] == 128 + sig
    assert r["error"]["signal"] == signal.Signals(sig).name and r["error"]["last_step"] >= 2
    assert gone(point)
    (run_file,) = point.glob("wandb/offline-run-*/run-*.wandb")
    assert run_file.stat().st_size > 1_000  # the history is there (not 7 bytes), and the run was closed:
    assert "finishing run" in (point / "wandb" / "debug.log").read_text()
    assert not list(tmp_path.glob("1_*"))  # the sweep stopped where it was told to


SECOND_SIGNAL = """
import os, signal, sys, time
from orchestrator.core.errors import Interrupted
Interrupted.install()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
except Interrupted as first:
    os.kill(os.getpid(), signal.SIGTERM)  # a second, while the first is handled (a W&B run closing)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)  # time for Python to run a handler, were one still installed
    print("closed after", first)
"""


def test_a_second_signal_does_not_cut_short_what_the_first_set_going():
    proc = subprocess.run([sys.executable, "-c", SECOND_SIGNAL], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "closed after SIGTERM", proc.stdout + proc.stderr


def test_a_killed_orchestrator_takes_its_ranks_along_and_status_says_interrupted(cli, tmp_path):
    proc = start("run", *LONG, "logger.mode=disabled", "--out", str(tmp_path))
    wait_for_step(proc, 3)
    os.kill(proc.pid, signal.SIGKILL)  # no handler runs: only the kernel's PDEATHSIG is left
    proc.wait(timeout=30)
    assert gone(tmp_path), "ranks outlived the orchestrator"
    status = cli("status", str(tmp_path))
    assert status.returncode == 0 and "interrupted" in status.stdout
    done = cli("wait", str(tmp_path), "--timeout", "30")
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    r = strict(tmp_path / "result.json")
    assert r["status"] == "interrupted" and "ended without recording a result" in r["error"]["message"]


def test_two_runs_on_one_directory_never_share_it(tmp_path):
    out = tmp_path / "same"
    a = start("run", "model=tiny", PRESET_KERNELS, "run.steps=3", "parallel.dp=1", "run.seed=1", "--out", str(out))
    b = start("run", "model=tiny", PRESET_KERNELS, "run.steps=3", "parallel.dp=1", "run.seed=99", "--out", str(out))
    outs = [p.communicate(timeout=300)[0] for p in (a, b)]
    codes = sorted([a.returncode, b.returncode])
    assert codes == [0, 2], outs
    loser = outs[[a.returncode, b.returncode].index(2)]
    assert "--out" in loser and "Traceback" not in loser
    winner_seed = 1 if a.returncode == 0 else 99
    r = strict(out / "result.json")
    assert r["status"] == "ok" and r["config"]["run"]["seed"] == winner_seed
    assert len(list(out.glob("wandb/offline-run-*"))) == 1


def _claim_default(base: str, queue) -> None:
    queue.put(str(claim(Path(base), "--out", unique=True)))


def test_default_directories_claimed_at_the_same_second_differ(tmp_path):
    queue = multiprocessing.get_context("fork").Queue()
    procs = [
        multiprocessing.get_context("fork").Process(target=_claim_default, args=(str(tmp_path / "12-00-00"), queue))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    claimed = {queue.get(timeout=5) for _ in procs}
    assert len(claimed) == 4 and str(tmp_path / "12-00-00") in claimed


def test_reusing_a_trial_directory_is_refused_unless_asked_and_never_mixes(default_trial, tmp_path):
    tmp_path = tmp_path / "trial"
    shutil.copytree(default_trial, tmp_path)  # a trial that ran
    before = (tmp_path / "result.json").read_bytes()
    again = run_cli("run", "model=tiny", PRESET_KERNELS, "run.steps=3", "--out", str(tmp_path))
    assert again.returncode == 2 and "--overwrite" in again.stderr
    assert (tmp_path / "result.json").read_bytes() == before  # nothing of the old trial touched
    refused = run_cli(
        "run", "model=tiny", PRESET_KERNELS, "hardware.memory_gib=0.01", "--overwrite", "--out", str(tmp_path)
    )
    assert refused.returncode == 3, refused.stdout + refused.stderr
    r = strict(tmp_path / "result.json")
    assert r["status"] == "refused" and r["metrics"] is None  # not the old run's figures
    assert not (tmp_path / "logs").exists() and not (tmp_path / "wandb").exists()


@pytest.fixture
def mount(tmp_path):
    """Mount a tmpfs of this size and options at a fresh directory (root only)."""
    points = []

    def make(size: str, options: str = "") -> Path:
        point = tmp_path / f"mnt{len(points)}"
        point.mkdir()
        opts = f"size={size}" + (f",{options}" if options else "")
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(point)], capture_output=True, text=True)
        if proc.returncode:
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI runs as root and must mount a tmpfs: {proc.stderr}")
            pytest.skip(f"mounting a tmpfs needs root: {proc.stderr.strip()}")
        points.append(point)
        return point

    yield make
    for point in points:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def test_a_read_only_directory_is_refused_without_a_traceback(mount):
    read_only = mount("1M", "ro")
    proc = run_cli("run", "model=tiny", PRESET_KERNELS, "--out", str(read_only / "trial"))
    assert proc.returncode == 2 and "--out" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def fill(directory: Path) -> None:
    """Write to DIRECTORY until its file system has no byte left."""
    with open(directory / "filler", "wb", buffering=0) as f:
        for chunk in (65536, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                continue


def test_a_full_disk_still_leaves_a_result(mount):
    # The file system fills up while the trial trains (the test fills it once W&B's run file
    # exists); the space reserved for result.json at the start is what it is written into.
    # A step sleeps (run.step_sleep_s) so the trial is still training when the disk is full:
    # at least 4.8 s of sleep, where filling 4 MB takes milliseconds; few steps, so little
    # of it computes (40 steps of 0.1 s were 14 CPU-s of the rank).
    full = mount("4M")
    trial = full / "trial"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "model=tiny",
            PRESET_KERNELS,
            "run.steps=12",
            "run.step_sleep_s=0.4",
            "parallel.dp=1",
            "--out",
            str(trial),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not list((trial / "wandb").glob("offline-run-*/*.wandb")):
        assert proc.poll() is None and time.monotonic() < deadline, "the trial never started training"
        time.sleep(0.2)
    fill(full)
    said = proc.communicate(timeout=300)[0]
    assert "Traceback" not in said, said
    r = strict(trial / "result.json")  # whole, and it says why the trial failed
    assert r["status"] == "failed" and r["error"]["type"] == "DiskFull", r
    assert r["error"]["message"].startswith(f"the file system holding {trial} is full"), r["error"]


def test_a_diverging_loss_is_flagged_and_stops_the_trial(tmp_path):
    stopped = run_in_process(
        "run",
        "model=tiny",
        PRESET_KERNELS,
        "run.lr=1e6",
        "run.steps=8",
        FP32,
        "logger.mode=disabled",
        "parallel.dp=1",
        "--out",
        str(tmp_path / "stop"),
    )
    assert stopped.returncode == 1 and "not finite" in stopped.stdout, stopped.stdout
    r = strict(tmp_path / "stop" / "result.json")
    assert (
        r["status"] == "failed"
        and r["error"]["type"] == "NonFiniteLoss"
        and "run.lr=1000000.0" in r["error"]["message"]
    )
    kept = run_in_process(
        "run",
        "model=tiny",
        PRESET_KERNELS,
        "run.lr=1e6",
        "run.steps=8",
        FP32,
        "parallel.dp=1",
        "run.stop_on_nonfinite_loss=false",
        "--out",
        str(tmp_path / "keep"),
    )
    assert kept.returncode == 0, kept.stdout
    r = strict(tmp_path / "keep" / "result.json")
    steps = r["metrics"]["nonfinite_loss_steps"]
    assert steps and None in r["metrics"]["losses"]  # written as null, flagged beside it
    assert f"first at step {steps[0] + 1}" in kept.stdout


def test_status_report_and_wait_skip_a_corrupt_file_and_report_the_rest(cli, default_trial, tmp_path):
    first, second = tmp_path / "0_run.seed=1", tmp_path / "1_run.seed=2"  # a sweep of two trials that ran
    for point in (first, second):
        shutil.copytree(default_trial, point)
    (first / "result.json").write_text((first / "result.json").read_text()[:100])  # truncated
    for command in (["status"], ["report"], ["wait", "--timeout", "20"]):
        proc = cli(*command, str(tmp_path))
        said = proc.stdout + proc.stderr
        assert "Traceback" not in said and str(first / "result.json") in " ".join(said.split()), said
        assert second.name in said or "1 ok" in said or "ok" in said


def test_trials_below_passes_over_a_folder_deleted_while_it_walks(tmp_path, monkeypatch):
    # A running trial rotates its checkpoints: `wait` walking the sweep must not crash on one
    # that vanishes between being listed and being opened.
    trial = tmp_path / "sweep" / "0_x"
    (trial / "checkpoint" / "step20").mkdir(parents=True)
    (trial / "result.json").write_text("{}")
    real = os.scandir

    def vanishing(path="."):
        if str(path).endswith("step20"):
            shutil.rmtree(path)
        return real(path)

    monkeypatch.setattr(os, "scandir", vanishing)
    assert trials_below(tmp_path) == [trial]


def _memory_cgroup(name: str) -> Path | None:
    """A child of this process's v1 memory cgroup (the CI machine's kind), or None where there is none to make."""
    from orchestrator.measure import memory_cgroup

    line = next((x for x in Path("/proc/self/cgroup").read_text().splitlines() if ":memory:" in x), None)
    if line is None:
        return None
    parent = memory_cgroup.ROOT / "memory" / line.split(":", 2)[2].lstrip("/")
    try:
        (parent / name).mkdir()
    except OSError:
        return None
    return parent / name


@pytest.mark.parametrize("dp", [1, 2])
def test_a_rank_the_oom_killer_ends_is_recorded_oom_with_the_step_it_reached(tmp_path, dp):
    """A rank that takes host memory until the kernel's OOM killer ends it, under a 4 GiB
    memory cgroup the test makes (its limit, not the host's, so nothing else is touched).
    At dp 2 the last rank grows: its peer's collective breaks, and torchrun's summary names
    the peer (exit code 1), not the rank the OOM killer ended (3 of 3 runs before the fix)."""
    group = _memory_cgroup(f"orchestrator-oom-{os.getpid()}")
    if group is None:
        pytest.skip("no memory cgroup to make here (needs root and the v1 memory controller)")
    try:
        (group / "memory.limit_in_bytes").write_text(str(4 << 30))
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "run",
                "--out",
                str(tmp_path / "t"),
                "model=tiny",
                PRESET_KERNELS,
                f"parallel.dp={dp}",
                f"run.fail_rank={dp - 1}",
                "run.steps=4",
                "run.warmup_steps=1",
                "run.fail_at_step=2",
                "run.fail_mode=grow",
                "logger.mode=disabled",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
        )
        r = json.loads((tmp_path / "t" / "result.json").read_text())
        assert r["status"] == "oom" and r["error"]["type"] == "OutOfMemory", (r["error"], proc.stdout[-2000:])
        assert r["error"]["rank"] == dp - 1
        assert "OOM killer" in r["error"]["message"] and "after step 2 of 4" in r["error"]["message"]
        assert "Traceback" not in proc.stdout + proc.stderr
    finally:
        group.rmdir()


def test_a_library_that_fails_to_import_is_the_ranks_recorded_failure(tmp_path):
    """A CPU trial's launcher imports the ranks' libraries before it forks them
    (launchers/forked.py). Where an import fails there, the ranks still start and fail on
    it themselves: the result names the ImportError and its rank, as a rank that was a
    new interpreter would."""
    broken = tmp_path / "broken" / "deepspeed"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("this deepspeed cannot be imported (the test\'s)")\n')
    proc = run_cli(
        "run",
        "--out",
        str(tmp_path / "t"),
        "model=tiny",
        PRESET_KERNELS,
        "parallel.dp=1",
        "logger.mode=disabled",
        env={"PYTHONPATH": str(broken.parent)},
        timeout=300,
    )
    r = json.loads((tmp_path / "t" / "result.json").read_text())
    assert r["status"] == "failed" and r["error"]["type"] == "ImportError" and r["error"]["rank"] == 0, r["error"]
    assert "this deepspeed cannot be imported" in r["error"]["message"]
    assert "Traceback" not in proc.stdout


@pytest.mark.parametrize(
    "other, expected",
    [
        (None, "interrupted"),
        ({"type": "RuntimeError", "oom": False}, "failed"),
        ({"type": "OutOfMemoryError", "oom": True}, "oom"),
        ({"type": "Interrupted", "oom": False}, "interrupted"),
    ],
)
def test_a_rank_ended_because_another_failed_records_that_failure(tmp_path, other, expected):
    """torchrun SIGTERMs the survivors once a rank fails; rank 0, which holds the W&B run,
    may see that SIGTERM before the failed collective (a race a slow host loses): its run
    ends with the failed rank's cause, not "interrupted". A SIGTERM alone stays interrupted."""
    from orchestrator.core.errors import Interrupted
    from orchestrator.records.trial_dir import TrialPaths
    from orchestrator.workload.train import ended_status

    paths = TrialPaths(tmp_path)
    if other is not None:
        paths.rank_error(1).parent.mkdir(parents=True)
        paths.rank_error(1).write_text(json.dumps({**other, "rank": 1}))
    assert ended_status(Interrupted(signal.SIGTERM), paths, world=2) == expected
    assert ended_status(RuntimeError("boom"), paths, world=2) == "failed"  # its own failure is its own


TORCHRUN_NAMES_RANK_0 = """Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_03:41:02
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 10299)
"""


@pytest.mark.parametrize("rank1_left_through_python", [False, True])
def test_a_rank_gone_without_python_is_the_cause_even_where_torchrun_names_another(tmp_path, rank1_left_through_python):
    """Forked ranks: torchrun's summary names the one failure it saw first. Rank 1's os._exit
    reset rank 0's gloo connection, rank 0 recorded that and exited 1, and torchrun named rank
    0 alone (seen in the failing sweep of test_run.py): rank 1's running marker, left because
    it never came back through Python, still names it. A rank that did come back removed it."""
    from orchestrator.records.results import outcome_status
    from orchestrator.records.trial_dir import TrialPaths

    paths = TrialPaths(tmp_path)
    paths.logs.mkdir()
    paths.launcher_log.write_text(TORCHRUN_NAMES_RANK_0)
    paths.errors.mkdir()
    paths.rank_error(0).write_text(
        json.dumps(
            {"type": "RuntimeError", "message": "Connection reset by peer", "rank": 0, "oom": False, "time": 2.0}
        )
    )
    if not rank1_left_through_python:
        paths.rank_running(1).touch()
    status, error = outcome_status(tmp_path, returncode=1, timed_out=False)
    assert status == "failed"
    assert (error["rank"], error["type"]) == ((0, "RuntimeError") if rank1_left_through_python else (1, "ProcessExit"))


# A launcher that starts its "rank" in a session of its own (as torchrun does) and leaves
# on SIGTERM at once; the rank ignores SIGTERM, as a rank inside a long kernel defers it.
LAUNCHER = """
import signal, subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                         "print('up', flush=True); time.sleep(600)"], start_new_session=True, stdout=sys.stdout)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print(rank.pid, flush=True)
time.sleep(600)
"""


def test_ending_a_launcher_ends_the_ranks_it_started_in_sessions_of_their_own():
    from orchestrator.core.process import end_group

    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    lines = [launcher.stdout.readline().strip() for _ in range(2)]
    rank = int(next(line for line in lines if line != "up"))
    assert os.getpgid(rank) != os.getpgid(launcher.pid)  # out of the launcher's group: killpg misses it
    end_group(launcher)
    assert launcher.returncode == 0  # it left on SIGTERM, before any SIGKILL
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not _dead(rank):
        time.sleep(0.1)
    assert _dead(rank), "the rank outlived its launcher"


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie: ended, not yet reaped by init
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("missing", ["exit_code", "error", "metrics", "plan", "config"])
def test_wait_status_and_report_read_a_result_with_any_field_missing(cli, default_trial, tmp_path, missing):
    """`wait` over a result.json without exit_code ended in KeyError: every reader of a result
    takes any field as absent, and the exit code follows the status where the code is gone."""
    point = tmp_path / "0_run.seed=1"
    shutil.copytree(default_trial, point)
    result = json.loads((point / "result.json").read_text())
    result.pop(missing)
    (point / "result.json").write_text(json.dumps(result))
    for command in (["wait", "--timeout", "20"], ["status"], ["report"]):
        proc = cli(*command, str(tmp_path))
        assert "Traceback" not in proc.stdout + proc.stderr and proc.returncode == 0, (command, proc.stderr)


def test_a_signal_that_lands_in_a_finalizer_still_ends_the_command_as_interrupted(monkeypatch, capsys):
    """A SIGTERM handled while a `__del__` ran raised Interrupted there, where Python reports
    and drops it: the handler had already ignored the next signals, and the command finished
    its work and exited 0. Now it ends as interrupted (143), as any other SIGTERM."""
    import gc
    import signal

    from orchestrator import cli, commands

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)  # delivered, and handled, inside this finalizer
            for _ in range(1000):  # the handler runs between bytecodes, here
                pass

    def plan_that_collects(command, argv):
        Finalized()
        gc.collect()
        return 0

    monkeypatch.setattr(commands, "main", plan_that_collects)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert cli.main(["plan"]) == 128 + signal.SIGTERM
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    assert "interrupted by SIGTERM" in capsys.readouterr().err
