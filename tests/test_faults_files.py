"""Fault injection on the commands that read many trials (calibrate, report, status, wait,
tune's resume) and on inputs a careless or hostile user types: crafted files, links to
devices, claims no process holds, budgets and paths past their limits, two commands at
once. One row per case; each runs the real command in a fresh process and asserts the
promise: exit 2 with one paragraph naming the field or file, or a warning naming the file
and the rest done, never a traceback, nothing written earlier lost."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.core.errors import ConfigError
from tests.conftest import FP32, PRESET_KERNELS, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture
def ok_trial(default_trial) -> Path:
    """One real trial that ran (shared by the test run): the cases below copy and spoil it."""
    return default_trial


def sweep_of(ok_trial: Path, root: Path, n: int = 2) -> list[Path]:
    dirs = [root / f"{i}_trial" for i in range(n)]
    for d in dirs:
        shutil.copytree(ok_trial, d)
    return dirs


def said(proc: subprocess.CompletedProcess) -> str:
    return " ".join((proc.stdout + proc.stderr).split())  # rich wraps long lines


def edit_result(trial: Path, change) -> None:
    path = trial / "result.json"
    data = json.loads(path.read_text())
    data = change(data)
    path.write_text(data if isinstance(data, str) else json.dumps(data))


def set_step(value):
    def change(r):
        r["metrics"]["step_time_s"] = value
        return r

    return change


BAD_TRIALS = {  # what is done to the second of two ok trials
    "negative step": set_step(-0.5),
    "infinite step": lambda r: json.dumps(r).replace('"step_time_s": ', '"step_time_s": "Infinity", "x": '),
    "text step": set_step("fast"),
    "list step": set_step([1]),
    "dict step": set_step({"s": 1}),
    "huge step": set_step(1e30),
    "tiny step": set_step(1e-300),
    "true step": set_step(True),
    "NaN text step": set_step("NaN"),
    "metrics null": lambda r: {**r, "metrics": None},
    "metrics a list": lambda r: {**r, "metrics": [1, 2]},
    "result a list": lambda r: [r],
    "result a string": lambda r: json.dumps("ok"),
}


def test_calibrate_report_and_wait_skip_each_trial_with_bad_figures_or_files_and_use_the_rest(cli, ok_trial, tmp_path):
    # One sweep holding one good trial and a spoiled one per case: every command runs once.
    dirs = sweep_of(ok_trial, tmp_path / "sweep", n=1 + len(BAD_TRIALS) + 3)
    spoiled = dict(zip([*BAD_TRIALS, "config.yaml missing", "config.yaml corrupt", "trial.json corrupt"], dirs[1:]))
    for case, change in BAD_TRIALS.items():
        edit_result(spoiled[case], change)
    (spoiled["config.yaml missing"] / "config.yaml").unlink()
    (spoiled["config.yaml corrupt"] / "config.yaml").write_text(": : not [ yaml {")
    (spoiled["trial.json corrupt"] / "trial.json").write_text("{not json")
    env = {"ORCHESTRATOR_USER_CONF": str(tmp_path / "conf")}
    proc = cli("calibrate", str(tmp_path / "sweep"), env=env)
    assert proc.returncode == 0 and "Traceback" not in said(proc), said(proc)
    unnamed = [case for case, d in spoiled.items() if str(d) not in said(proc)]
    assert not unnamed, (unnamed, said(proc))  # each spoiled trial named in a warning
    preset = yaml.safe_load((tmp_path / "conf" / "hardware" / "cpu-calibrated.yaml").read_text())
    assert preset["calibrated_on"].startswith("1 trials")  # fitted on the good one alone
    for command in (["report"], ["wait", "--timeout", "5"], ["status"]):  # with the calibrated preset in use
        proc = cli(*command, str(tmp_path / "sweep"), env=env)
        assert proc.returncode in (0, 1) and "Traceback" not in said(proc), (command, said(proc))
        assert f"skipped {spoiled['result a list'] / 'result.json'}" in said(proc), (command, said(proc))


CORRUPT_PRESETS = {
    "empty": b"",
    "comment only": b"# only the comment header\n",
    "truncated": b"[1, 2",
    "a word": b"a word",
    "a list": b"- 1\n- 2\n",
    "binary": b"\x00\xff\xfe binary",
}


def test_a_calibrated_preset_that_is_not_one_is_refused_by_its_file_name(cli, ok_trial, tmp_path):
    sweep_of(ok_trial, tmp_path / "sweep")
    for case, content in CORRUPT_PRESETS.items():
        conf = tmp_path / case.replace(" ", "_") / "hardware"
        conf.mkdir(parents=True)
        path = conf / "cpu-calibrated.yaml"
        path.write_bytes(content)
        env = {"ORCHESTRATOR_USER_CONF": str(conf.parent)}
        proc = cli("plan", env=env)  # hardware=auto would choose it
        assert proc.returncode == 2 and str(path) in said(proc) and "Traceback" not in said(proc), (case, said(proc))
        if case not in ("empty", "binary"):
            continue
        proc = cli("report", str(tmp_path / "sweep"), env=env)  # still reports, saying why not calibrated
        assert proc.returncode == 0 and "Traceback" not in said(proc) and str(path) in said(proc), (case, said(proc))


def test_calibrate_checks_its_config_dir_before_fitting_and_writes_nowhere_else(cli, ok_trial, tmp_path):
    sweep_of(ok_trial, tmp_path / "sweep")
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("x")
    proc = cli("calibrate", str(tmp_path / "sweep"), env={"ORCHESTRATOR_USER_CONF": str(blocked)})
    assert proc.returncode == 2 and "ORCHESTRATOR_USER_CONF" in said(proc) and "within +-25" not in said(proc)
    proc = cli("plan", "hardware.name=../../../../tmp/x")
    assert proc.returncode == 2 and "hardware.name" in said(proc)


def test_two_calibrates_at_once_never_both_say_they_wrote(ok_trial, tmp_path):
    sweep_of(ok_trial, tmp_path / "sweep", n=4)
    env = {**os.environ, "ORCHESTRATOR_USER_CONF": str(tmp_path / "conf")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "calibrate", str(tmp_path / "sweep")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [(p.communicate(timeout=300)[0], p.returncode) for p in procs]
    wrote = [code for out, code in outs if code == 0 and "wrote" in out]
    refused = [code for out, code in outs if code == 2 and "one calibrate at a time" in " ".join(out.split())]
    assert len(wrote) + len(refused) == 2 and wrote, outs  # one fit wins; the other waits or is told so
    assert yaml.safe_load((tmp_path / "conf" / "hardware" / "cpu-calibrated.yaml").read_text())["calibrated_on"]


def test_the_links_writer_of_a_calibrated_preset_waits_for_calibrates_lock(tmp_path, monkeypatch):
    """calibrate --links wrote NAME-calibrated without the lock calibrate and --nccl-tests take:
    one writer now (hardware_presets.write_calibrated_preset), the lock held over its read,
    change and write. A lock another process holds refuses the write and leaves the file as it was."""
    import fcntl

    from orchestrator.hardware_presets import calibrated_preset_path, preset_lock
    from orchestrator.measure import links
    from orchestrator.plan.collectives import Level

    monkeypatch.setenv("ORCHESTRATOR_USER_CONF", str(tmp_path / "conf"))
    level = Level(busbw=5e9, latency=2e-5)
    path = Path(links.write_links("cpu", level, None, "a test"))
    assert path == calibrated_preset_path("cpu") and yaml.safe_load(path.read_text())["intra_node"]["busbw_gbps"] == 5
    before = path.read_text()
    with open(path.parent / ".cpu-calibrated.lock", "w") as held:  # as a second process holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match="one calibrate at a time"):
            links.write_links("cpu", Level(busbw=1e9, latency=2e-5), None, "another")
    assert path.read_text() == before
    with preset_lock("cpu"):  # held by this process (calibrate holds it from its fit on): a nested write goes on
        links.write_links("cpu", Level(busbw=1e9, latency=2e-5), None, "nested")
    assert yaml.safe_load(path.read_text())["intra_node"]["busbw_gbps"] == 1


def live_claim() -> dict:
    """A claim that this test's own (live) process holds, as claim_record writes one."""
    from orchestrator.core.process import start_ticks

    return {"pid": os.getpid(), "pid_start": start_ticks(os.getpid()), "host": socket.gethostname()}


@pytest.mark.parametrize(
    "claim",
    [
        [1, 2],
        {"pid": "x", "host": socket.gethostname()},
        {"pid": -4, "host": "another-host"},
        "not json",
        # a live process, but not the claimant: pid 1 (started long before), a pid reused since
        {"pid": 1, "host": socket.gethostname(), "started_at": "2026-01-01T00:00:00+00:00"},
        {"pid": os.getpid(), "pid_start": 1, "host": socket.gethostname()},
    ],
)
def test_a_claim_no_live_process_can_hold_is_resolved_not_waited_for(tmp_path, claim):
    trial = tmp_path / "sweep" / "0_x"
    trial.mkdir(parents=True)
    (trial / "claim.json").write_text(claim if isinstance(claim, str) else json.dumps(claim))
    proc = run_cli("wait", str(tmp_path / "sweep"), "--timeout", "30", timeout=60)
    assert proc.returncode == 1 and "interrupted" in said(proc) and "Traceback" not in said(proc), said(proc)
    result = json.loads((trial / "result.json").read_text())
    assert result["status"] == "interrupted" and "slurm.json" not in result["error"]["message"]


@pytest.mark.parametrize("timeout", ["nan", "-5", "inf", "soon"])
def test_wait_refuses_a_timeout_that_is_not_a_duration(cli, tmp_path, timeout):
    (tmp_path / "0_x").mkdir()
    (tmp_path / "0_x" / "claim.json").write_text(json.dumps(live_claim()))
    proc = cli("wait", str(tmp_path), "--timeout", timeout)
    assert proc.returncode == 2 and "--timeout" in said(proc) and "Traceback" not in said(proc)


def test_wait_timeout_zero_looks_once_and_returns(tmp_path):
    (tmp_path / "0_x").mkdir()
    (tmp_path / "0_x" / "claim.json").write_text(json.dumps(live_claim()))
    proc = run_cli("wait", str(tmp_path), "--timeout", "0", timeout=30)  # this test's process: a live claimant
    assert proc.returncode == 1 and "still not done" in said(proc)


@pytest.mark.parametrize("kind", ["link to a device", "link out of the tree", "too large", "a fifo"])
def test_report_reads_no_result_through_a_link_nor_past_its_size_limit(cli, ok_trial, tmp_path, kind):
    good, bad = sweep_of(ok_trial, tmp_path / "sweep")
    result = bad / "result.json"
    result.unlink()
    if kind == "link to a device":
        result.symlink_to("/dev/zero")
    elif kind == "link out of the tree":
        shutil.copy(good / "result.json", tmp_path / "outside.json")
        result.symlink_to(tmp_path / "outside.json")
    elif kind == "too large":
        result.write_text('{"status": "ok", "pad": "' + "x" * (65 * 2**20) + '"}')
    else:
        os.mkfifo(result)
    proc = cli("report", str(tmp_path / "sweep"))
    assert proc.returncode == 0 and "Traceback" not in said(proc), said(proc)
    assert f"skipped {result}" in said(proc)


def test_tune_budgets_are_checked_by_their_flag_before_a_directory_is_made(cli, tmp_path):
    for flag, value in (
        ("--trials", "0"),
        ("--trials", "-1"),
        ("--minutes", "0"),
        ("--minutes", "-1"),
        ("--minutes", "nan"),
    ):
        proc = cli("tune", flag, value, "--out", str(tmp_path / "t"))
        assert proc.returncode == 2 and f"{flag}={value}" in said(proc), said(proc)
        assert not (tmp_path / "t").exists()


def test_a_tune_interrupted_in_its_first_trial_resumes_and_another_space_is_refused(cli, tmp_path):
    out = tmp_path / "tune"
    space = [
        "logger.mode=disabled",
        PRESET_KERNELS,
        FP32,
        "run.steps=4",
        "run.warmup_steps=1",
        "run.step_sleep_s=2",
        "parallel.dp=1",
        "zero=stage0",
        "batch.micro_batch_size=1,2",
        "recompute=none",
        "zero.offload_optimizer=none",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "tune", "--trials", "1", "--out", str(out), *space],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "step 1/" in line:
            break
    os.killpg(proc.pid, 2)  # Ctrl-C in the first trial, before it has a result
    proc.communicate(timeout=120)
    assert (out / "tune.json").is_file(), "".join(lines)
    changed = [o.replace("1,2", "1,4") for o in space]
    # Ctrl-C needs a program of its own; what follows reads and resumes its files in this process.
    proc = cli("tune", "--trials", "1", "--out", str(out), *changed)
    assert proc.returncode == 2 and "batch.micro_batch_size" in said(proc) and "then" in said(proc), said(proc)
    proc = cli(
        "tune",
        "--trials",
        "1",
        "--out",
        str(out),
        *[o.replace("run.step_sleep_s=2", "run.step_sleep_s=0") for o in space],
    )
    assert proc.returncode == 2 and "run.step_sleep_s" in said(proc)  # a fixed override is part of the space too
    proc = cli("tune", "--trials", "1", "--out", str(out), *space)
    assert proc.returncode == 0 and "Traceback" not in said(proc), said(proc)
    assert json.loads((out / "tune.json").read_text())["winner"]


@pytest.mark.parametrize("record", [[1, 2], {"rows": "x", "rounds": "two", "elapsed_s": [1], "axes": {}}])
def test_a_tune_record_of_the_wrong_shape_is_refused_or_read_as_far_as_it_is_right(cli, tmp_path, record):
    out = tmp_path / "tune"
    out.mkdir()
    (out / "tune.json").write_text(json.dumps(record))
    proc = cli(
        "tune",
        "--trials",
        "1",
        "--out",
        str(out),
        "batch.micro_batch_size=1,2",
        "zero=stage0",
        "parallel.dp=1",
        PRESET_KERNELS,
        FP32,
    )
    assert proc.returncode == 2 and "tune.json" in said(proc) or "--out" in said(proc), said(proc)
    assert "Traceback" not in said(proc)


def test_directories_that_are_not_a_new_trial_are_never_claimed(ok_trial, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my own")
    run = ["run", "model=tiny", PRESET_KERNELS, "run.steps=3", "logger.mode=disabled"]
    proc = run_cli(*run, "--out", str(mine))
    assert proc.returncode == 2 and "notes.txt" in said(proc) and (mine / "notes.txt").read_text() == "my own"
    trial = tmp_path / "trial"
    shutil.copytree(ok_trial, trial)
    proc = run_cli(*run[:1], "-m", *run[1:], "run.seed=1,2", f"hydra.sweep.dir={trial}/inner")
    assert proc.returncode == 2 and "is a trial's" in said(proc) and not (trial / "inner").exists()
    (trial / "tune.json").write_text("{}")  # a trial with a tune.json is not a tune to take over
    proc = run_cli(
        "tune", "--out", str(trial), "batch.micro_batch_size=1,2", "zero=stage0", "parallel.dp=1", PRESET_KERNELS, FP32
    )
    assert proc.returncode == 2 and (trial / "result.json").is_file()


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--out", "L"],
        ["run", "hydra.run.dir=L"],
        ["translate", "--out", "L"],
        ["calibrate", "L"],
        ["report", "L"],
        ["status", "L"],
        ["plan", "model=L"],
        ["plan", "K=1"],
        ["plan", "model=../config"],
    ],
)
def test_names_past_the_file_systems_limits_or_out_of_the_tree_exit_2(cli, tmp_path, args):
    long = str(tmp_path / ("a" * 300))
    args = [a.replace("L", long) if a.endswith("L") else a.replace("K", "k" * 100_000) for a in args]
    proc = cli(*args)
    assert proc.returncode == 2 and "Traceback" not in said(proc), said(proc)[:2000]
    assert len(proc.stdout + proc.stderr) < 2000  # one paragraph, the long value cut


def test_a_sweep_says_its_size_and_a_huge_one_is_refused_unless_asked(cli, tmp_path):
    proc = cli("plan", "-m", "parallel.dp=range(1,100000)")
    assert proc.returncode == 2 and "99,999 points" in said(proc) and "--max-points" in said(proc)
    proc = cli("run", "-m", "parallel.dp=range(1,20001)", "--out", str(tmp_path / "s"))
    assert proc.returncode == 2 and not (tmp_path / "s").exists()
    proc = cli("plan", "-m", "parallel.dp=1,2,3", "--max-points", "2")
    assert proc.returncode == 2 and "3 points" in said(proc)
    proc = cli("plan", "-m", "run.seed=range(0,100)")
    assert proc.returncode == 0 and "sweep: 100 points" in proc.stderr


CACHE_POISONS = {  # what a damaged or hostile kernels.json may hold where a time should be
    "negative": -29.0,
    "zero": 0.0,
    "NaN": float("nan"),
    "infinite": float("inf"),
    "denormal": 1e-300,
    "a day": 86400.0,
    "text": "fast",
    "true": True,
}


def test_cached_kernel_times_no_device_could_take_are_timed_again_and_said(tmp_path, monkeypatch):
    """Every time read from kernels.json is checked before a plan uses it: one that no device
    can take is dropped, timed again (here a stand-in timing: what is tested is how the
    cache is trusted), said once as a warning, and the cache holds the new time."""
    from orchestrator.measure import kernel_cache
    from orchestrator.measure.engine_timing import plausible_line
    from orchestrator.measure.kernel_cache import Cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(Cache, "_known", None)
    path = kernel_cache.cache_path()
    path.parent.mkdir(parents=True)
    poisoned = {f"dev|sw|gemm {name}": [value, 1e-3, "2026-01-01T00:00:00Z"] for name, value in CACHE_POISONS.items()}
    good = {
        "dev|sw|gemm good": [2e-3, 4e-3, "2026-01-01T00:00:00Z"],
        "dev|sw|optimizer": [5e-3, 0.0, "2026-01-01"],
        "dev|sw|engine step_s": [-0.01, 2e-8, "2026-01-01"],
    }  # a fitted line may start below 0
    path.write_text(
        json.dumps({**poisoned, **good, "dev|sw|gemm short": [1e-3], "dev|sw|gemm bwd NaN": [1e-3, float("nan"), "x"]})
    )  # bare NaN, as a careless writer leaves it
    timed_again = []

    def measure():
        timed_again.append(1)
        return 1e-3, 2e-3

    for key in [*poisoned, "dev|sw|gemm short", "dev|sw|gemm bwd NaN"]:
        assert Cache.get(key, measure)[:2] == (1e-3, 2e-3), key
    assert Cache.get_whole("dev|sw|block", measure)[0] == (1e-3, 2e-3)  # absent: timed
    assert [Cache.get(k, measure, plausible_line if "engine" in k else None)[:2] for k in good] == [
        (2e-3, 4e-3),
        (5e-3, 0.0),
        (-0.01, 2e-8),
    ]  # plausible: used as cached, never timed
    assert len(timed_again) == len(poisoned) + 3
    said = Cache.take_discarded()
    assert f"{len(poisoned) + 2} cached time(s) in {path}" in said and "timed again" in said
    assert Cache.take_discarded() == ""  # said once
    Cache.save()
    rewritten = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c} in the cache"))
    assert all(kernel_cache.plausible_times(*rewritten[k][:2]) for k in poisoned)


def test_an_engines_line_no_engine_could_take_is_dropped_cached_or_just_timed(tmp_path, monkeypatch):
    """An engine's line (its hooks and step against the share's elements) was bounded only
    by an hour and a millisecond an element: a tampered 3,000 s intercept planned a step of
    hours. Against the memory's bandwidth: a cached one is dropped and timed again, a just
    timed one is not kept, and the plan says so and keeps torch's AdamW. (The engine's
    process is stood in for: what is tested is how its lines are trusted.)"""
    from orchestrator.measure import engine_timing
    from orchestrator.measure.engine_timing import EngineTiming, plausible_line
    from orchestrator.measure.kernel_cache import Cache
    from orchestrator.plan.compute import KernelTimes
    from orchestrator.plan.inputs import MeasuredKernels

    assert plausible_line(0.002, 2.5e-9, 10e9) and plausible_line(-0.01, 2e-8, 10e9)  # as this CPU's engines time
    assert plausible_line(-0.0446, 1.12e-6, 10e9)  # FSDP2's step on this 2-core CPU, per-tensor Python and all
    assert not plausible_line(3000.0, 2.5e-9, 10e9) and not plausible_line(0.002, 1e-4, 10e9)
    assert plausible_line(0.002, 1e-5)  # no bandwidth known: a millisecond an element
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(Cache, "_known", None)
    engine = EngineTiming.__new__(EngineTiming)  # its key and share, without its process
    engine.engine, engine.elements, engine.proc, engine.key = {"engine": "deepspeed"}, 10**6, None, "dev|sw|engine"
    Cache.known().update({f"dev|sw|engine {part}": [3000.0, 0.0, "2026-01-01"] for part in engine_timing.PARTS})
    timings = iter(
        [
            {part: (1e-3, 1e-9) for part in engine_timing.PARTS},  # what a quiet machine times
            {part: (1e-3, 1e-3) for part in engine_timing.PARTS},
        ]
    )  # 1,000 s for 1M elements: a busy one
    monkeypatch.setattr(EngineTiming, "timed", lambda self: next(timings))
    measured = MeasuredKernels(
        kernels=KernelTimes((0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0), 1e-5),
        optimizer_s=0.01,
        device="dev",
        software="sw",
        timed_at="2026-01-01",
        optimizer="torch's AdamW",
    )
    applied = engine.apply(measured, bandwidth=10e9)
    assert applied.optimizer_s == pytest.approx(1e-3 + 1e-3) and "own step" in applied.optimizer
    for part in engine_timing.PARTS:
        Cache.known().pop(f"dev|sw|engine {part}")
    applied = engine.apply(measured, bandwidth=10e9)
    assert applied.optimizer_s == 0.01 and "no engine's time" in applied.optimizer, applied.optimizer
    assert not any(k.startswith("dev|sw|engine") for k in Cache.known())  # not kept: timed again next plan


@pytest.mark.parametrize(
    "kind", ["fifo", "link to /dev/zero", "a list", "a string", "negative", "NaN", "text", "cache is a file"]
)
def test_a_cached_cpu_peak_is_read_bounded_and_checked_before_use(tmp_path, monkeypatch, kind):
    """cpu_peak.json as hostile as kernels.json: never a hang, an unbounded read or a
    traceback; a figure out of what a CPU can reach is measured again with a warning. (The
    measurement is a stand-in: what is tested is how the cache is read and trusted.)"""
    import threading

    from orchestrator.measure import hardware

    cache_home = tmp_path / "cache"
    path = cache_home / "orchestrator" / "cpu_peak.json"
    path.parent.mkdir(parents=True)
    key = "a CPU|torch x|bf16|1 threads"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "cache is a file":
        shutil.rmtree(cache_home)
        cache_home.write_text("not a directory")
    else:
        path.write_text(
            {
                "a list": "[1, 2]",
                "a string": '"fast"',
                "negative": json.dumps({key: -1.0}),
                "NaN": f'{{"{key}": NaN}}',
                "text": json.dumps({key: "fast"}),
            }[kind]
        )
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    got = []
    reader = threading.Thread(
        target=lambda: got.append(hardware._measured_once(key, 1, lambda: 0.25, hardware.PLAUSIBLE_TFLOPS)), daemon=True
    )
    reader.start()
    reader.join(timeout=30)
    assert got == [0.25], f"{kind}: no answer in 30 s" if not got else got
    if kind in ("negative", "NaN", "text"):  # a figure was there and was not trusted; the new one is kept
        assert json.loads(path.read_text())[key] == 0.25


@pytest.mark.parametrize(
    "args, field",
    [
        (["--max-mb", "inf"], "--max-mb"),
        (["--max-mb", "nan"], "--max-mb"),
        (["--max-mb", "1e9"], "--max-mb"),
        (["--max-mb", "0"], "--max-mb"),
        (["--nodes", "1,100000"], "--nodes"),
        (["--nodes", "0"], "--nodes"),
        (["--ranks-per-node", "100000"], "--ranks-per-node"),
        (["--reps", "0"], "--reps"),
        (["--reps", "10000000"], "--reps"),
        (["--nodes", "1,2,3000"], "--nodes"),
    ],
)
def test_calibrate_links_checks_every_argument_before_it_measures(cli, tmp_path, args, field):
    """Each bound of calibrate --links, before any rank starts: an infinite buffer would loop
    forever, NaN would write a 0 us latency; node counts are checked against the SLURM
    cluster that answers here (or refused where none does) before one node is measured."""
    proc = cli("calibrate", "--links", *args, env={"ORCHESTRATOR_USER_CONF": str(tmp_path / "conf")})
    assert proc.returncode == 2 and field in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "conf").exists()


def test_calibrate_links_buffers_past_the_hosts_free_memory_are_refused(cli, tmp_path):
    from orchestrator.measure.host_load import available_bytes

    too_many_mb = int(available_bytes() / 2**20)  # two ranks, two buffers each: four times what is free
    proc = cli(
        "calibrate",
        "--links",
        "--max-mb",
        str(min(too_many_mb, 16384)),
        env={"ORCHESTRATOR_USER_CONF": str(tmp_path / "conf")},
    )
    assert proc.returncode == 2 and "free memory" in proc.stderr and "nearest valid value" in proc.stderr


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_calibrate_links_stopped_by_sigterm_ends_its_ranks(tmp_path):
    """SIGTERM to calibrate --links mid-measurement: the command exits 143 with one line, and
    torchrun and both measuring ranks end with it (real processes, found through /proc)."""
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "calibrate", "--links", "--max-mb", "4", "--reps", "1000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ORCHESTRATOR_USER_CONF": str(tmp_path / "conf")},
    )
    deadline, below = time.monotonic() + 120, set()
    while time.monotonic() < deadline and proc.poll() is None:
        below |= (
            {p for p in descendants(proc.pid) if b"collective_timing" in Path(f"/proc/{p}/cmdline").read_bytes()}
            if alive(proc.pid)
            else set()
        )
        if len(below) >= 3:  # torchrun and its two ranks
            break
        time.sleep(0.5)
    assert len(below) >= 3, f"the ranks never started: {proc.poll()}"
    time.sleep(2)  # importing torch, joining the group: mid-measurement
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "interrupted by SIGTERM" in err and "Traceback" not in err, err
    deadline = time.monotonic() + 30
    while [p for p in below if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in below if alive(p)], "ranks left running"
    assert not (tmp_path / "conf").exists()  # nothing written from a measurement cut short


CSV_HEADER = "model,parallel.dp,step_time_s\n"


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "a directory"])
def test_calibrate_csv_reads_its_file_as_trial_files_are_read(cli, tmp_path, kind):
    """--csv FILE is a regular file read to a bound: a FIFO is not waited on, a link (to
    /dev/zero or anywhere) is not followed."""
    path = tmp_path / "runs.csv"
    {
        "fifo": lambda: os.mkfifo(path),
        "link to /dev/zero": lambda: path.symlink_to("/dev/zero"),
        "a directory": lambda: path.mkdir(),
    }[kind]()
    proc = cli("calibrate", "--csv", str(path), env={"ORCHESTRATOR_USER_CONF": str(tmp_path / "conf")})
    assert proc.returncode == 2 and "--csv" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_calibrate_csv_takes_a_byte_order_mark_limits_its_rows_and_says_its_progress(cli, tmp_path, monkeypatch):
    from orchestrator.analysis import fit_inputs

    env = {"ORCHESTRATOR_USER_CONF": str(tmp_path / "conf")}
    path = tmp_path / "runs.csv"
    # Excel's UTF-8 CSV: a byte-order mark before the header. The header is read as it is
    # meant: the bad value of row 3 is what stops it (the fit never starts), not 'model'.
    path.write_bytes(b"\xef\xbb\xbf" + (CSV_HEADER + "tiny,2,0.05\ntiny,2,slow\n").encode())
    monkeypatch.setattr(fit_inputs, "PROGRESS_EVERY_S", 0.0)  # say it at every row
    proc = cli("calibrate", "--csv", str(path), env=env)
    assert proc.returncode == 2 and "runs.csv row 3" in proc.stderr and "a positive number" in proc.stderr, proc.stderr
    assert "validated 1 of 2 rows of runs.csv" in proc.stderr
    # past --max-rows (a sweep's --max-points, 10,000 by default) refused before one row is validated
    path.write_text(CSV_HEADER + "tiny,2,0.05\n" * 11 + "tiny,0,0.05\n")
    proc = cli("calibrate", "--csv", str(path), "--max-rows", "10", env=env)
    assert proc.returncode == 2 and "--max-rows=10" in proc.stderr and "12 rows" in proc.stderr, proc.stderr
    assert "validated 1 of" not in proc.stderr and not (tmp_path / "conf").exists()


def test_trees_that_would_exhaust_a_reader_are_read_within_bounds(ok_trial, tmp_path, request):
    """A trial 1,500 folders down (deeper than Python's recursion) is found by every reading
    command; a config.yaml that is a YAML alias bomb is refused as unreadable (a warning
    naming it) instead of expanding without end; both with a bounded --timeout that holds."""
    deep = tmp_path / "deep"
    deep.mkdir()
    request.addfinalizer(lambda: subprocess.run(["rm", "-rf", str(deep)]))  # pytest's own cleanup recurses
    fd = os.open(deep, os.O_RDONLY)
    for _ in range(1500):  # os.makedirs recurses too: one level at a time
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    bottom = Path(f"/proc/self/fd/{fd}").resolve()
    os.close(fd)
    shutil.copytree(ok_trial, bottom / "t1")
    bomb = sweep_of(ok_trial, tmp_path / "bomb", 2)[1] / "config.yaml"
    bomb.write_text(
        "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
        + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))
    )
    env = {"ORCHESTRATOR_USER_CONF": str(tmp_path / "conf")}
    for command in (["status"], ["report"], ["wait", "--timeout", "5"], ["calibrate"]):
        proc = run_cli(*command, str(deep), env=env, timeout=120)
        assert proc.returncode == 0 and "RecursionError" not in said(proc), (command, said(proc))
        # the trial found: its status is "ok" ("ok, noisy" where the fixture's steps were timed on a busy machine)
        assert re.search(r"\sok[\s,]", said(proc)) or "calibrated" in said(proc), (command, said(proc))
    proc = run_cli("calibrate", str(tmp_path / "bomb"), env=env, timeout=120)
    assert proc.returncode == 0 and "1_trial" in said(proc) and "aliases expand it past" in said(proc), said(proc)
    # --overwrite deletes such a tree too (Python 3.11's shutil.rmtree recurses)
    from orchestrator.core.files import remove_tree

    remove_tree(deep)
    assert not deep.exists()


@pytest.mark.parametrize(
    "override, says",
    [
        ("hardware.inter_node.busbw_gbps=1e-320", "nearest valid value is 0.01"),  # planned an infinite step
        ("hardware.intra_node.busbw_gbps=1e300", "nearest valid value is 10000"),
        ("hardware.inter_node.latency_us=-3", "nearest valid value is 0"),
        ("hardware.compute_efficiency=1e-9", "nearest valid value is 0.02"),
        ("hardware.op_overhead_us=1e12", "nearest valid value is 2000"),
        ("hardware.memory_bandwidth_gbps=1e-30", "nearest valid value is 0.1"),
        ("hardware.collective_overhead_us=inf", "finite"),
        ("hardware.intra_node.latency_us=nan", "finite"),
        ("zero=stage1 zero.grad_accum_dtype=fp16", "or fp32 (DeepSpeed's BF16_Optimizer) at zero.stage=1"),
    ],
)
def test_a_figure_no_device_has_is_refused_before_planning(cli, override, says):
    """Every hardware figure within what a device can be (hardware_presets.PLAUSIBLE: the ranges
    calibrate fits within too), and DeepSpeed's dtype mixes as its own check says."""
    proc = cli("plan", *override.split())
    field = override.split()[-1].split("=")[0]
    assert proc.returncode == 2 and field in proc.stderr and says in proc.stderr, proc.stderr


def test_a_refused_sweep_says_why_once_per_point_and_its_directory_is_named_for_what_it_holds(tmp_path):
    """A sweep the plan refuses prints one line per point (why, and where its plan is), not
    every point's whole plan; the same --out again says it holds that sweep."""
    argv = ["run", "-m", "hardware.memory_gib=0.01", "parallel.dp=1,2", "--out", str(tmp_path / "sweep")]
    proc = run_cli(*argv, timeout=300)
    assert proc.returncode == 3, said(proc)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("refused:")]
    assert len(lines) == 2 and "Plan (predicted)" not in proc.stdout and "result.json in" in said(proc)
    again = run_cli(*argv, timeout=300)
    assert again.returncode == 2 and "it holds a sweep of 2 trial(s)" in said(again), said(again)


def test_a_long_trial_name_is_shown_whole_on_one_line_to_be_copied(cli, ok_trial, tmp_path):
    """A sweep point named by many overrides would wrap mid-name in a table: status and
    report show it as [n] in the table and whole, on one line, under it."""
    name = "3_parallel.dp=2,zero.reduce_bucket_size=100000000,zero.allgather_bucket_size=500000000"
    shutil.copytree(ok_trial, tmp_path / "sweep" / name)
    shutil.copytree(ok_trial, tmp_path / "sweep" / "0_short")
    for command in ("status", "report"):
        out = cli(command, str(tmp_path / "sweep")).stdout
        assert f"[1] {name}" in out.splitlines() and "0_short" in out, out


@pytest.mark.parametrize("value", ["", "relative/cache", "."])
def test_an_empty_or_relative_xdg_directory_is_ignored_as_the_spec_says(monkeypatch, tmp_path, value):
    """An empty XDG_CACHE_HOME put kernels.json into whatever directory the command ran in."""
    from orchestrator.hydra_glue.conf_tree import user_conf_dir
    from orchestrator.measure.hardware import cache_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("ORCHESTRATOR_USER_CONF", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", value)
    monkeypatch.setenv("XDG_CONFIG_HOME", value)
    assert cache_dir() == tmp_path / ".cache" / "orchestrator"
    assert user_conf_dir() == tmp_path / ".config" / "orchestrator" / "conf"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))
    assert cache_dir() == tmp_path / "elsewhere" / "orchestrator"


def test_a_nearly_full_file_system_is_refused_before_anything_is_written(cli, tmp_path, monkeypatch):
    """With 8 KB free (a 2 MB tmpfs filled, by hand), `run` wrote its claim, then failed mid-way
    with a traceback and no result.json. The free space is checked first (faked here: a full
    file system is not one to make in a test), and nothing is written."""
    import collections

    import orchestrator.records.trial_dir as trial_dir

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(trial_dir.shutil, "disk_usage", lambda path: usage(2 << 20, (2 << 20) - 8192, 8192))
    proc = cli("run", "--out", str(tmp_path / "t"), PRESET_KERNELS, "logger.mode=disabled")
    assert proc.returncode == 2 and "8 KB free" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "t").exists()
