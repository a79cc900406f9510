"""Shared test helpers. Tests run against the checkout's conf/ and the installed package."""

import contextlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from unittest import mock

import pytest
from filelock import FileLock

CLUSTER = Path(__file__).parent / "slurm" / "cluster.sh"


@pytest.fixture(scope="session", autouse=True)
def _no_wandb_credentials(tmp_path_factory):
    """No test may see the developer's W&B key or ~/.netrc, nor touch the network. Set once
    for the session, before any module's fixture: the environment stays the same from one
    trial to the next, so the trials run in-process share their launcher server
    (launchers/forked.py starts another for another environment)."""
    netrc = tmp_path_factory.mktemp("home") / ".netrc"  # never written: no test logs in
    with mock.patch.dict(os.environ, {"NETRC": str(netrc), "WANDB_MODE": "offline"}):
        os.environ.pop("WANDB_API_KEY", None)
        yield


@contextlib.contextmanager
def logging_kept():
    """A command run in-process lets Hydra configure logging (process-wide, as it must for a
    real command); the handlers it leaves write to a captured stream that is gone once the
    test ends. Logging is put back as it was found."""

    def loggers():
        return [logging.getLogger()] + [
            lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
        ]

    saved = {lg: (lg.level, list(lg.handlers), lg.propagate, lg.disabled) for lg in loggers()}
    try:
        yield
    finally:
        for lg in loggers():
            level, handlers, propagate, disabled = saved.get(lg, (logging.NOTSET, [], True, False))
            lg.setLevel(level)
            lg.handlers[:] = handlers
            lg.propagate, lg.disabled = propagate, disabled


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    with logging_kept():
        yield


def run_cli(*args: str, env: dict | None = None, timeout: float = 120, cwd=None) -> subprocess.CompletedProcess:
    """`python -m orchestrator ARGS` in a fresh process, as a user would type it."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def run_in_process(*args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """`orchestrator ARGS` in this process (`cli.main`): what run_cli returns, without a new
    interpreter (2-3 s of CPU for its imports, most of a query command's cost). A trial it
    runs is as real as run_cli's (its launcher forked from a launcher server, which this
    process keeps while the environment stays, so the next trial imports nothing). For the
    commands that read directories and configs, and trials whose test is about the trial; a
    test about the process itself (signals, two at once, exit and output of the program,
    a user's shell) keeps run_cli."""
    from orchestrator.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(logging_kept())
        stack.enter_context(mock.patch.dict(os.environ, env or {}))
        os.environ.pop("PYTEST_CURRENT_TEST", None)  # pytest's, changed each test: not a user's environment
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        code = main(list(args))
    return subprocess.CompletedProcess(["orchestrator", *args], code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli():
    """run_in_process, for a test to take as its argument."""
    return run_in_process


# Every SLURM test shares one cluster: four nodes in network namespaces, two CPUs each, links
# shaped to 400 Mbit/s (50 MB/s each way). A single-node test runs on any one node; the
# multi-node ones span them; calibrate --links finds the shaped rate; and four two-rank
# jobs run at once, so tests that wait on SLURM overlap.
NODES, LINK_MBIT = 4, 400
CLUSTER_SHAPE = ("--nodes", str(NODES), "--cpus-per-node", "2", "--link-mbit", str(LINK_MBIT))
# The plan from the preset's step-time parameters, not this CPU's timed kernels, for a trial
# or plan whose test is about something else (SLURM's mechanics, faults, Hydra's layout). On a
# cache that has not timed a configuration yet, its plan times the kernels and the engine's
# step (the default trial's: 12 s and 16 CPU-s on the AVX-512 EPYC, two to three times that on
# one without bf16 instructions), and a newcomer's first run of the suite pays it for every
# configuration its trials use. The timed plan keeps tests of its own: test_kernel_timing, the
# default trial and test_run's trials like it, test_fsdp, tune's search, and on SLURM nodes
# test_multinode's dp sweep.
PRESET_KERNELS = "hardware.kernels=preset"
# fp32 for a trial whose test is not about its precision. A CPU without bf16 instructions
# (the AVX2 EPYC of docs/measurements.md) multiplies bf16 at 0.84-8.5 GFLOPS a thread and fp32
# at 60: the default trial's step took 0.18 s there, 0.027 s on a CPU with them, where bf16 and
# fp32 cost the same (a two-rank six-step trial 1.3-1.6 CPU-s either way). The default trial,
# the drift points' bf16 memory and FSDP2's mixed precision keep bf16: there it is the point.
FP32 = "run.bf16=false"
# A two-rank trial on one node of it, a few steps.
SLURM_SMALL = [
    "cluster=slurm",
    "hardware=cpu",
    PRESET_KERNELS,
    FP32,
    "cluster.gpus_per_node=2",
    "cluster.cpus_per_task=1",
    "run.steps=3",
    "run.warmup_steps=1",
    "logger.mode=disabled",
]
# The same with one rank, where the number of ranks is not the point (a rank costs ~7 s of CPU).
ONE_RANK = ["parallel.dp=1", "cluster.gpus_per_node=1"]
_STATE = Path(os.environ.get("ORCH_SLURM_STATE", "/var/lib/orchestrator-slurm"))
_OWNER = "ORCH_TEST_RUN"  # set by the controller; the worker that starts the cluster records it
_OWNS_CLUSTER = pytest.StashKey[bool]()


def pytest_configure(config):
    """The controller (or a run without xdist) names this run before any worker starts. A
    pytest run inside a test (tests/test_hydra_compat.py) inherits the name and owns nothing."""
    if not hasattr(config, "workerinput") and _OWNER not in os.environ:
        os.environ[_OWNER] = uuid.uuid4().hex
        config.stash[_OWNS_CLUSTER] = True


def pytest_sessionstart(session):
    """The controller byte-compiles the package once. Where PYTHONDONTWRITEBYTECODE is set (as
    on the CI machine) nothing else would, and every process a test starts (the CLI, each
    rank) would compile the checkout's modules again: 0.25 s of CPU each, a few seconds a trial."""
    if not hasattr(session.config, "workerinput"):
        import compileall

        for folder in ("orchestrator", "hydra_plugins"):
            compileall.compile_dir(Path(__file__).resolve().parent.parent / folder, quiet=1)
        _compile_what_ranks_import()


# What a rank or a test imports first, of the libraries (torch alone is over a thousand modules).
RANK_LIBRARIES = (
    "torch",
    "torch.distributed.run",
    "deepspeed",
    "accelerate",
    "transformers.models.gpt2.modeling_gpt2",
    "transformers.models.llama.modeling_llama",
    "hydra",
    "wandb",
)


def _compile_what_ranks_import() -> None:
    """Where the libraries were installed without bytecode (`.ci/run`: PIP_COMPILE=0),
    one process imports them, and so compiles each module once, before the workers start: else
    the first workers and ranks would each compile the same modules at once."""
    import importlib.util

    torch_bytecode = importlib.util.find_spec("torch").cached
    if sys.dont_write_bytecode or (torch_bytecode and Path(torch_bytecode).is_file()):
        return
    subprocess.run([sys.executable, "-c", "import " + ", ".join(RANK_LIBRARIES)], capture_output=True, timeout=600)


@pytest.hookimpl(tryfirst=True)  # before pytest's own `-m` reads the markers
def pytest_collection_modifyitems(items):
    """A test that takes the cluster is marked `slurm`: the README's `pytest` leaves those
    out (pyproject.toml) and `pytest -m slurm` runs them. Then files whose tests wait on
    SLURM first, then those that run real engines, then the rest: xdist hands files out in
    this order, so the long waits start at once and the quick tests fill the gaps at the
    end. Within a file the order is kept."""
    for item in items:
        if "slurm_cluster" in item.fixturenames:
            item.add_marker(pytest.mark.slurm)

    def weight(item) -> int:
        if item.get_closest_marker("slurm"):
            return 0
        return 1 if item.get_closest_marker("slow") else 2

    first = {}
    for item in items:
        first[item.path] = min(first.get(item.path, 2), weight(item))
    items.sort(key=lambda item: first[item.path])


def pytest_sessionfinish(session):
    """The controller stops the cluster once every worker is done, if this run started it."""
    if not session.config.stash.get(_OWNS_CLUSTER, False):
        return
    marker = _STATE / "started-by"
    if marker.is_file() and marker.read_text().strip() == os.environ.get(_OWNER):
        subprocess.run(["bash", str(CLUSTER), "stop"], capture_output=True, timeout=120)
        marker.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def default_trial(tmp_path_factory, worker_id) -> Path:
    """`orchestrator run` with nothing changed (the tiny model, 2 ranks, DeepSpeed, W&B
    offline), run once for the whole test run and shared by every worker (a file lock, as
    pytest-xdist's docs do it): tests read it, or copy it before changing anything. What
    it printed is kept beside it (default_trial_stdout)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if worker_id != "master" else base  # the workers' temp dirs share a parent
    out = root / "default-trial"
    with FileLock(str(root / "default-trial.lock")):
        if not (out / "result.json").is_file():
            proc = run_cli("run", "--out", str(out), timeout=600)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            default_trial_stdout(out).write_text(proc.stdout)
    return out


def default_trial_stdout(trial: Path) -> Path:
    return trial.with_name(trial.name + ".stdout.txt")


@pytest.fixture(scope="session")
def slurm_cluster():
    """The test cluster (CLUSTER_SHAPE), started by the first worker that needs it (cluster.sh
    takes a lock) and left up for the others; a cluster already up is used as it is."""
    if not (os.geteuid() == 0 and shutil.which("apt-get")):
        if os.environ.get("CI") == "true":
            pytest.fail("CI must run the SLURM tests, but this machine cannot host the cluster (root + apt needed)")
        pytest.skip("a local SLURM cluster needs root and apt-get (Debian); run tests/slurm/cluster.sh start")
    proc = subprocess.run(["bash", str(CLUSTER), "start", *CLUSTER_SHAPE], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if "already up" not in proc.stdout and os.environ.get(_OWNER):
        (_STATE / "started-by").write_text(os.environ[_OWNER])


def results_below(base: Path) -> list[dict]:
    """Every result.json below BASE, in path order."""
    return [json.loads(p.read_text()) for p in sorted(base.rglob("result.json"))]


def history_is_whole(r: dict, steps: int, ranks: int) -> None:
    """A requeued trial's figures are an uninterrupted run's: no step lost, none repeated, 1
    warm-up step, then a micro batch of 4 x 128 tokens a rank each step."""
    m = r["metrics"]
    assert [h["step"] for h in m["history"]] == list(range(steps))
    assert m["steps"] == steps and m["tokens"] == (steps - 1) * ranks * 4 * 128


def wait_cli(base: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """`orchestrator wait BASE`: until every trial below BASE has its result.json (in-process:
    waiting is the test's point, not the program)."""
    return run_in_process("wait", str(base), "--timeout", str(timeout))


def submit(out: Path, *overrides: str, multirun: bool = False) -> subprocess.CompletedProcess:
    """`orchestrator run [-m] --out OUT OVERRIDES` on SLURM (in-process): returns once
    submitted; asserts it was."""
    proc = run_in_process("run", *(["-m"] if multirun else []), "--out", str(out), *overrides)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def wandb_summary(trial_dir: Path) -> dict:
    """The trial's offline W&B run as wandb's own reader sees it: summary, history, run and metric records."""
    (run_dir,) = (trial_dir / "wandb").glob("offline-run-*")
    wandb_cli = Path(sys.executable).parent / "wandb"
    out = subprocess.run(
        [str(wandb_cli), "leet", "inspect", "--summary", "--json", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    records = subprocess.run(
        [str(wandb_cli), "leet", "inspect", "--json", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    summary = json.loads(out)
    summary["history_records"] = sum('"type":"history"' in r for r in records)
    summary["run_record"] = next(json.loads(r)["run"] for r in records if '"type":"run"' in r)
    summary["metric_records"] = [json.loads(r)["metric"] for r in records if '"type":"metric"' in r]
    return summary


def squeue(job: str, fmt: str) -> str:
    """What squeue says of a job in FORMAT (%T: its state, %r: why it waits)."""
    return subprocess.run(
        ["squeue", "-h", "-j", job, "-o", fmt], capture_output=True, text=True, timeout=30
    ).stdout.strip()


def sacct(job_id: str, *fields: str) -> list[list[str]]:
    out = subprocess.run(
        ["sacct", "-j", job_id, "-n", "-P", "-o", ",".join(fields)], capture_output=True, text=True, timeout=60
    ).stdout
    return [line.split("|") for line in out.splitlines()]
