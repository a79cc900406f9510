"""`orchestrator run` on real engines: DeepSpeed / Accelerate, torchrun, gloo, 2 CPU ranks.

Nothing is mocked: each test launches real processes that train the tiny GPT for a few
steps (seconds each once DeepSpeed's CPU communication op is built, which the first
run on a fresh machine does once).
"""

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orchestrator.plan.batch import batch_sizes_per_step
from orchestrator.spec import build_spec
from tests.conftest import FP32, PRESET_KERNELS, default_trial_stdout, results_below, run_in_process, wandb_summary

pytestmark = pytest.mark.slow
QUICK = ["run.steps=4", "run.warmup_steps=1"]
NO_WANDB = "logger.mode=disabled"  # where W&B is not the point: its offline run costs rank 0 ~3 s of CPU
METRIC_KEYS = {
    "tokens_per_sec",
    "tokens_per_sec_per_gpu",
    "tflops_per_gpu",
    "mfu",
    "hfu",
    "step_time_s",
    "step_times_s",
    "steps",
    "tokens",
    "loss_first",
    "loss_last",
    "global_batch_sizes",
    "memory",
}


def run(out: Path, *overrides: str, multirun: bool = False):
    """The trial in-process (run_in_process); pytest's timeout (600 s) is the guard against a hang."""
    return run_in_process("run", *(["-m"] if multirun else []), "--out", str(out), *overrides)


def test_the_default_trial_succeeds_and_is_measured(default_trial):
    tmp_path = default_trial
    stdout = default_trial_stdout(default_trial).read_text()
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["status"] == "ok" and r["exit_code"] == 0 and r["error"] is None
    m = r["metrics"]
    assert METRIC_KEYS <= set(m)
    assert m["tokens_per_sec_per_gpu"] > 0 and 0 < m["mfu"] < 1 and m["hfu"] == pytest.approx(m["mfu"])
    assert m["tokens"] == 8 * 8 * 128  # 8 timed steps x global batch 8 x 128 tokens
    assert len(m["step_times_s"]) == 10 and m["steps"] == 10
    # the median of the timed steps (not their mean), with its quartiles and interval
    timed = sorted(m["step_times_s"][2:])
    assert m["step_time_s"] == pytest.approx((timed[3] + timed[4]) / 2)
    spread = m["step_time_spread"]
    assert spread["n"] == 8 and spread["q1"] <= m["step_time_s"] <= spread["q3"]
    assert (spread["ci_low"], spread["ci_high"]) == (timed[0], timed[-1])  # 8 steps: the whole range, 99 %
    assert m["noisy"] is None or "scatter" in m["noisy"]
    assert "the median of 8 timed steps of 10" in " ".join(stdout.split())
    # every rank's own step: its compute and its time in collectives, all 8 timed steps
    ranks = m["ranks"]
    assert [r["rank"] for r in ranks["ranks"]] == list(range(r["env"]["world_size"]))
    assert all(x["steps"] == 8 and x["compute_s"]["median"] > 0 for x in ranks["ranks"])
    assert "per rank, median ms of compute / in collectives: 0: " in " ".join(stdout.split())
    # said before it started: the plan's step, its time for run.steps, its peak
    assert "planned:" in stdout and "for 10 steps" in stdout and "GiB free" in " ".join(stdout.split())
    load = r["host_load"]
    assert 0 <= load["busy_share"] <= 1 and load["cores"] >= 1 and "warning" in load
    assert "measured" in m["peak_source"]  # a CPU: MFU against a measured matmul peak, never a guess
    # and the plan's own peak: the run's MFU and the plan's divide by one figure
    assert m["peak_tflops"] == r["plan"]["time"]["peak_tflops"] and m["peak_source"] == r["plan"]["sources"]["peak"]
    assert m["tuning"]["gc_enabled"] is True  # off while the rank imported and built its engine, on for the steps
    assert m["tuning"]["gc_frozen_objects"] > 0  # what the imports made, frozen before the first tensor (train.py)
    mem = m["memory"]
    assert mem["static_bytes"] > 0 and mem["activation_bytes"] > 0 and mem["peak_bytes"] > mem["static_bytes"]
    env = r["env"]
    assert env["world_size"] == 2 and len(env["ranks"]) == 2 and set(env["affinity"]) == {"0", "1"}
    # a CPU trial's ranks are forks of one launcher that imported their libraries (launchers/forked.py)
    assert all(rank["forked"] for rank in env["ranks"])
    assert env["versions"]["deepspeed"] and env["versions"]["torch"]
    for name in ("ds_config.json", "config.yaml", "launch.json", "logs/rank0.log", "logs/rank1.log"):
        assert (tmp_path / name).is_file(), name
    assert r["config"]["model"]["hidden"] == 64 and r["plan"]["parameters"] == 141056
    assert "step 10/10" in stdout and "tokens/s/GPU" in stdout  # progress and final table
    # The plan timed this CPU's kernels (nothing fitted elsewhere) and says so. How close it
    # comes to the measured step is an accuracy target, which load moves (0.33 with another
    # test beside it): bench/calibration_check.py prints it, median of 3 runs, run alone.
    plan = r["plan"]
    assert plan["sources"]["compute"].startswith("compute: measured kernels: timed on ")
    assert plan["time"]["micro_batch"]["timed"] is True
    assert math.isfinite(plan["time"]["step_s"]) and plan["time"]["step_s"] > 0


@pytest.fixture
def counting_tokens(tmp_path) -> Path:
    """A token file with something to learn (each id is followed by the next): run.data's real-data path."""
    path = tmp_path / "tokens.bin"
    (np.arange(200_000) % 512).astype(np.uint16).tofile(path)
    return path


def test_every_zero_stage_and_engine_trains_the_same_loss_curve(tmp_path, counting_tokens):
    # fp32: the engines must agree to rounding, and bf16 matmuls crawl on a CPU without AVX512-BF16.
    proc = run(
        tmp_path / "runs",
        "zero=stage0,stage1,stage2,stage3",
        "run.lr=1e-2",
        f"run.data={counting_tokens}",
        "run.steps=6",
        "run.warmup_steps=1",
        FP32,
        NO_WANDB,
        PRESET_KERNELS,
        multirun=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = results_below(tmp_path / "runs")
    assert [r["config"]["zero"]["stage"] for r in results] == [0, 1, 2, 3]
    assert all(r["status"] == "ok" for r in results)
    # the DeepSpeed engine is the one asked for
    assert results[3]["metrics"]["engine"] == {
        "engine": "deepspeed",
        "zero_stage": 3,
        "optimizer": "DeepSpeedZeroOptimizer_Stage3",
        "built_partitioned": True,
    }
    # Accelerate's DeepSpeed ZeRO-3 as well: the model is built partitioned there too
    # (zero3_init_flag), from the same weights.
    accel = run(
        tmp_path / "accelerate",
        "engine=accelerate",
        "engine.backend=deepspeed",
        "zero=stage3",
        "run.lr=1e-2",
        f"run.data={counting_tokens}",
        "run.steps=6",
        "run.warmup_steps=1",
        FP32,
        NO_WANDB,
        PRESET_KERNELS,
    )
    assert accel.returncode == 0, accel.stdout + accel.stderr
    (accelerated,) = results_below(tmp_path / "accelerate")
    engine = accelerated["metrics"]["engine"]
    assert engine["distributed_type"].endswith("DEEPSPEED") and engine["model_wrapper"] == "DeepSpeedEngine"
    assert [r["metrics"]["engine"]["built_partitioned"] for r in results + [accelerated]] == [False] * 3 + [True] * 2
    curves = [r["metrics"]["losses"] for r in results + [accelerated]]
    assert curves[0][-1] < curves[0][0] - 0.05  # it learns something, so the curves can differ
    for curve in curves[1:]:
        assert curve == pytest.approx(curves[0], rel=5e-3)  # fp32: only the order of reductions differs


WARMUP = [
    "batch=warmup",
    "batch.global_batch_size=32",
    "batch.warmup.ramp_tokens=4096",
    "run.steps=6",
    "run.warmup_steps=1",
]
KNOBS = [
    "run.profile=true",
    "run.gc_collect_every=2",
    "run.dataloader_workers=1",
    "run.pin_memory=true",
    "logger.mode=disabled",
]


@pytest.fixture(scope="module")
def knobs_trial(tmp_path_factory) -> Path:
    """One trial with a batch warm-up and every tuning knob on: neither touches what the other checks."""
    out = tmp_path_factory.mktemp("knobs") / "trial"
    proc = run(out, *WARMUP, *KNOBS, PRESET_KERNELS, FP32)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (out.parent / "stdout.txt").write_text(proc.stdout)
    return out


def test_logger_disabled_writes_no_wandb_run(knobs_trial):
    assert not (knobs_trial / "wandb").exists()
    assert "wandb sync" not in (knobs_trial.parent / "stdout.txt").read_text()


def test_warmup_grows_the_global_batch_as_planned(knobs_trial):
    tmp_path = knobs_trial
    r = json.loads((tmp_path / "result.json").read_text())
    spec = build_spec(WARMUP)
    planned = batch_sizes_per_step(spec.schedule, 6, 128)
    assert planned[0] == 8 and planned[-1] == 32 and planned == sorted(planned)
    assert r["metrics"]["global_batch_sizes"] == planned
    assert [h["engine_global_batch_size"] for h in r["metrics"]["history"]] == planned  # DeepSpeed's own view
    assert json.loads((tmp_path / "ds_config.json").read_text())["train_batch_size"] == 8


@pytest.fixture(scope="module")
def failing_sweep(tmp_path_factory) -> list[Path]:
    """One sweep whose every point fails on rank 1 at step 2, each in its own way: out of
    memory first, then a Python error, then an exit without one."""
    out = tmp_path_factory.mktemp("failing") / "sweep"
    # Rank 0, blocked in a collective, is ended rather than left hanging: gloo would wait 30
    # minutes, so a hang fails pytest's timeout (a guard far above any trial's time, not a speed).
    proc = run(
        out,
        "run.fail_mode=oom,raise,exit",
        "run.fail_at_step=2",
        "run.fail_rank=1",
        *QUICK,
        PRESET_KERNELS,
        FP32,
        multirun=True,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return sorted(p.parent for p in out.rglob("result.json"))


def result(trial: Path) -> dict:
    return json.loads((trial / "result.json").read_text())


def test_a_sweep_records_an_oom_point_and_runs_the_others(failing_sweep):
    oom, *others = map(result, failing_sweep)
    assert oom["status"] == "oom" and oom["error"]["rank"] == 1
    assert len(others) == 2 and all(r["status"] == "failed" for r in others)  # the sweep went on past the OOM


def test_a_rank_failure_is_recorded_with_rank_and_message(failing_sweep):
    r = result(failing_sweep[1])
    assert r["status"] == "failed" and r["exit_code"] == 1
    assert r["error"]["rank"] == 1 and "injected failure" in r["error"]["message"]
    assert "RuntimeError" in r["error"]["log_tail"]


def test_a_failed_trial_ends_its_wandb_run_with_a_nonzero_exit_code(failing_sweep):
    w = wandb_summary(failing_sweep[1])  # rank 1 raised; rank 0 holds the run
    assert w["exit_code"] == 1 and w["summary"]["status"] == "failed"


def test_a_rank_that_exits_without_a_python_error_is_named(failing_sweep):
    r = result(failing_sweep[2])
    assert r["status"] == "failed" and r["error"]["rank"] == 1 and r["error"]["type"] == "ProcessExit"


def test_accelerate_runs_ddp_on_cpu_with_the_plans_buckets(tmp_path):
    # (Accelerate's DeepSpeed engine on CPU: test_every_zero_stage_and_engine_trains_the_same_loss_curve.)
    proc = run(
        tmp_path,
        "engine=accelerate",
        "engine.backend=fsdp",
        "zero=stage0",
        "zero.reduce_bucket_size=1000000",
        *QUICK,
        NO_WANDB,
        PRESET_KERNELS,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (r,) = results_below(tmp_path)
    engine = r["metrics"]["engine"]
    assert engine["distributed_type"].endswith("MULTI_CPU") and engine["model_wrapper"] == "DistributedDataParallel"
    # DDP reduces in the buckets the plan counts: a million bf16 elements
    assert engine["ddp_bucket_bytes"] == 1_000_000 * 2


def test_accelerate_fsdp_says_clearly_that_the_cpu_cannot_run_it(cli, tmp_path):
    proc = run(tmp_path, "engine=accelerate", "engine.backend=fsdp", "zero=stage3")
    assert proc.returncode == 2 and "FSDP only on GPUs" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "logs").exists()
    # plan agrees with run: refused on a CPU device, planned on a GPU one
    plan = cli("plan", "engine=accelerate", "engine.backend=fsdp", "zero=stage3")
    assert plan.returncode == 2 and "FSDP only on GPUs" in plan.stderr
    assert (
        cli(
            "plan",
            "engine=accelerate",
            "engine.backend=fsdp",
            "zero=stage3",
            "hardware=h100-sxm",
            "hardware.memory_gib=80",
        ).returncode
        == 0
    )


def test_tuning_knobs_are_applied_and_recorded_and_profile_writes_a_trace(knobs_trial):
    tmp_path = knobs_trial
    tuning = json.loads((tmp_path / "result.json").read_text())["metrics"]["tuning"]
    assert tuning["gc_collect_every"] == 2 and tuning["gc_enabled"] is False  # gc really was off in the rank
    assert tuning["dataloader_workers"] == 1 and tuning["pin_memory"] is True
    traces = list((tmp_path / "profile").glob("*.json"))
    assert traces and json.loads(traces[0].read_text())["traceEvents"]  # Perfetto / TensorBoard format


def test_expandable_segments_reach_the_ranks_environment_on_gpus(tmp_path):
    from orchestrator.launchers.binding import binding
    from orchestrator.launchers.local import local_command

    gpu = build_spec(["hardware=h100-sxm"])
    assert (
        local_command(gpu, tmp_path, binding("none", "cuda", 2)).env["PYTORCH_CUDA_ALLOC_CONF"]
        == "expandable_segments:True"
    )
    off = build_spec(["hardware=h100-sxm", "run.expandable_segments=false"])
    assert "PYTORCH_CUDA_ALLOC_CONF" not in local_command(off, tmp_path, binding("none", "cuda", 2)).env


def test_only_a_cpu_trials_ranks_are_forked_from_a_launcher_that_imported_their_libraries(tmp_path):
    from orchestrator.launchers.binding import binding
    from orchestrator.launchers.forked import torchrun_argv
    from orchestrator.launchers.local import FORKED_LAUNCHER, WORKLOAD_MODULE, local_command

    # CUDA is not fork-safe once the parent touched it: a GPU trial's ranks are new interpreters
    gpu = local_command(build_spec(["hardware=h100-sxm", "numa.mode=node"]), tmp_path, binding("node", "cuda", 8)).argv
    assert gpu[1:3] == ["-m", "torch.distributed.run"] and gpu[-3:] == ["--module", WORKLOAD_MODULE, str(tmp_path)]
    assert "--numa-binding=node" in gpu and not any(a.startswith("--start-method") for a in gpu)
    cpu = local_command(build_spec([]), tmp_path, binding("none", "cpu", 2)).argv
    assert cpu[1:3] == ["-m", FORKED_LAUNCHER] and "--nproc-per-node=2" in cpu and cpu[-1] == str(tmp_path)
    torchrun = torchrun_argv(cpu[3:])  # what the launcher hands torchrun once it has imported
    assert torchrun[:-3] == [*cpu[3:-1], "--start-method=fork"] and torchrun[-1] == str(tmp_path)
    script = Path(torchrun[torchrun.index("--run-path") + 1])
    assert script.is_file() and script.stem == "train"


def test_the_result_names_the_rank_the_others_wait_for(tmp_path):
    # rank 1 sleeps 0.2 s a step: its compute, the others' wait (the quiet case: test_multinode.py)
    proc = run(
        tmp_path,
        "run.steps=8",
        "run.warmup_steps=1",
        "run.slow_rank=1",
        "run.step_sleep_s=0.2",
        NO_WANDB,
        FP32,
        PRESET_KERNELS,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = json.loads((tmp_path / "result.json").read_text())["metrics"]["ranks"]["straggler"]
    assert s["rank"] == 1 and s["host"] == socket.gethostname() and 0.17 < s["by_s"] < 0.4
    said = " ".join(proc.stdout.split())
    assert f"straggler: rank 1 on {s['host']}; the others wait {s['by_s'] * 1e3:.3g} ms a step for it" in said


def test_a_trial_past_its_time_limit_is_ended_and_recorded_as_timeout(tmp_path):
    # 100,000 steps would take hours: ending within pytest's timeout is the limit at work. The
    # steps sleep, so the 6 s the limit allows leave the cores to the other tests.
    proc = run(
        tmp_path,
        "run.timeout_min=0.1",
        "run.steps=100000",
        "run.warmup_steps=1",
        "run.step_sleep_s=0.5",
        "parallel.dp=1",
        NO_WANDB,
        PRESET_KERNELS,
    )
    assert proc.returncode == 1
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["status"] == "timeout" and r["error"]["type"] == "Timeout" and r["metrics"] is None


def test_a_timing_target_stops_the_ranks_together_where_rank_0s_steps_pin_the_median(tmp_path):
    """run.timing_ci: two ranks step on until the median of rank 0's timed steps is known to
    within 30 %, at least 6 of them, at most 40 steps. When that happens depends on the
    machine's load, so the test replays the rule on the steps the trial recorded."""
    from orchestrator.core.timing_stats import precise_enough

    proc = run(
        tmp_path / "t",
        "run.steps=40",
        "run.warmup_steps=1",
        "run.min_timed_steps=6",
        "run.timing_ci=0.3",
        "logger.mode=disabled",
        PRESET_KERNELS,
        FP32,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = json.loads((tmp_path / "t" / "result.json").read_text())["metrics"]
    times = [h["step_time_s"] for h in m["history"] if h["timed"]]
    first = next((k for k in range(1, len(times) + 1) if precise_enough(times[:k], 0.3, 6)), None)
    assert len(m["history"]) == (1 + first if first else 40) and m["steps"] == len(m["history"])
    assert m["timing_ci_met"] == (first is not None and 1 + first < 40)
    assert "for up to 40 steps" in proc.stdout


AFFINITY_THREADS = """
import os, sys
from orchestrator.launchers.binding import binding
from orchestrator.launchers.local import local_command
from orchestrator.spec import build_spec
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # as `taskset -c N` or a SLURM task's binding would
print(local_command(build_spec(["parallel.dp=1"]), sys.argv[1], binding("none", "cpu", 1)).env["OMP_NUM_THREADS"])
"""


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs at least two usable CPUs to restrict to one",
)
def test_a_ranks_threads_are_its_share_of_the_cpus_it_may_run_on_not_of_the_machine(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", AFFINITY_THREADS, str(tmp_path)], capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    assert out == ["1"]  # bound to one CPU: one thread, however many the machine has (os.cpu_count)
    from orchestrator.launchers.binding import binding
    from orchestrator.launchers.local import local_command

    free = local_command(build_spec(["parallel.dp=1"]), tmp_path, binding("none", "cpu", 1)).env["OMP_NUM_THREADS"]
    assert free == str(len(os.sched_getaffinity(0)))
