"""`orchestrator run` on real engines: DeepSpeed / Accelerate, torchrun, gloo, 2 CPU ranks.

Nothing is mocked: each test launches real processes that train the tiny GPT for a few
steps (seconds each once DeepSpeed's CPU communication op is built, which the first
run on a fresh machine does once).
"""

import json
import time
from pathlib import Path

import numpy as np
import pytest

from orchestrator.plan.batch import batch_sizes_per_step
from orchestrator.spec import build_spec
from tests.conftest import run_cli

pytestmark = pytest.mark.slow
QUICK = ["run.steps=4", "run.warmup_steps=1"]
METRIC_KEYS = {"tokens_per_sec", "tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu", "hfu", "step_time_s",
               "step_times_s", "steps", "tokens", "loss_first", "loss_last", "global_batch_sizes", "memory"}


def run(out: Path, *overrides: str, multirun: bool = False):
    start = time.monotonic()
    result = run_cli("run", *(["-m"] if multirun else []), "--out", str(out), *overrides, timeout=600)
    return result, time.monotonic() - start


def results_below(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.rglob("result.json"))]


def test_the_default_trial_succeeds_and_is_measured(tmp_path):
    proc, seconds = run(tmp_path)
    print(f"default trial: {seconds:.1f} s")  # README: under 60 s on the 2-core machine
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["status"] == "ok" and r["exit_code"] == 0 and r["error"] is None
    m = r["metrics"]
    assert METRIC_KEYS <= set(m)
    assert m["tokens_per_sec_per_gpu"] > 0 and 0 < m["mfu"] < 1 and m["hfu"] == pytest.approx(m["mfu"])
    assert m["tokens"] == 8 * 8 * 128  # 8 timed steps x global batch 8 x 128 tokens
    assert len(m["step_times_s"]) == 10 and m["steps"] == 10
    assert "measured" in m["peak_source"]  # a CPU: MFU against a measured matmul peak, never a guess
    mem = m["memory"]
    assert mem["static_bytes"] > 0 and mem["activation_bytes"] > 0 and mem["peak_bytes"] > mem["static_bytes"]
    env = r["env"]
    assert env["world_size"] == 2 and len(env["ranks"]) == 2 and set(env["affinity"]) == {"0", "1"}
    assert env["versions"]["deepspeed"] and env["versions"]["torch"]
    for name in ("ds_config.json", "config.yaml", "launch.json", "logs/rank0.log", "logs/rank1.log"):
        assert (tmp_path / name).is_file(), name
    assert r["config"]["model"]["hidden"] == 64 and r["plan"]["parameters"] == 141056
    assert "step 10/10" in proc.stdout and "tokens/s/GPU" in proc.stdout  # progress and final table
    # The plan timed this CPU's kernels (nothing fitted elsewhere). Within 2x is a guard on
    # any machine of this kind; the 20 % target is bench/kernel_check.py's, run alone.
    plan = r["plan"]
    assert plan["sources"]["compute"].startswith("compute: measured kernels: timed on ")
    assert plan["time"]["micro_batch"]["timed"] is True
    assert 0.5 < plan["time"]["step_s"] / m["step_time_s"] < 2.0


@pytest.fixture
def counting_tokens(tmp_path) -> Path:
    """A token file with something to learn (each id is followed by the next): run.data's real-data path."""
    path = tmp_path / "tokens.bin"
    (np.arange(200_000) % 512).astype(np.uint16).tofile(path)
    return path


def test_every_zero_stage_and_engine_trains_the_same_loss_curve(tmp_path, counting_tokens):
    # fp32: the engines must agree to rounding, and bf16 matmuls crawl on a CPU without AVX512-BF16.
    proc, _ = run(tmp_path / "runs", "zero=stage0,stage1,stage2,stage3", "run.lr=1e-2", f"run.data={counting_tokens}",
                  "run.steps=6", "run.warmup_steps=1", "run.bf16=false", multirun=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = results_below(tmp_path / "runs")
    assert [r["config"]["zero"]["stage"] for r in results] == [0, 1, 2, 3]
    assert all(r["status"] == "ok" for r in results)
    # Accelerate's DeepSpeed ZeRO-3 as well: the model is built partitioned there too
    # (zero3_init_flag), from the same weights.
    accel, _ = run(tmp_path / "accelerate", "engine=accelerate", "engine.backend=deepspeed", "zero=stage3",
                   "run.lr=1e-2", f"run.data={counting_tokens}", "run.steps=6", "run.warmup_steps=1", "run.bf16=false")
    assert accel.returncode == 0, accel.stdout + accel.stderr
    (accelerated,) = results_below(tmp_path / "accelerate")
    assert accelerated["metrics"]["engine"]["distributed_type"].endswith("DEEPSPEED")
    assert [r["metrics"]["engine"]["built_partitioned"] for r in results + [accelerated]] == [False] * 3 + [True] * 2
    curves = [r["metrics"]["losses"] for r in results + [accelerated]]
    assert curves[0][-1] < curves[0][0] - 0.05  # it learns something, so the curves can differ
    for curve in curves[1:]:
        assert curve == pytest.approx(curves[0], rel=5e-3)  # fp32: only the order of reductions differs


def test_recompute_orders_measured_activations(tmp_path):
    proc, _ = run(tmp_path, "recompute=none,selective,full", "run.steps=2", "run.warmup_steps=1", multirun=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    measured = {r["config"]["recompute"]["mode"]: r["metrics"]["memory"]["activation_bytes"]
                for r in results_below(tmp_path)}
    assert measured["none"] > measured["selective"] > measured["full"] > 0


def test_warmup_grows_the_global_batch_as_planned(tmp_path):
    overrides = ["batch=warmup", "batch.global_batch_size=32", "batch.warmup.ramp_tokens=4096", "run.steps=6",
                 "run.warmup_steps=1"]
    proc, _ = run(tmp_path, *overrides)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads((tmp_path / "result.json").read_text())
    spec = build_spec(overrides)
    planned = batch_sizes_per_step(spec.schedule, 6, 128)
    assert planned[0] == 8 and planned[-1] == 32 and planned == sorted(planned)
    assert r["metrics"]["global_batch_sizes"] == planned
    assert [h["engine_global_batch_size"] for h in r["metrics"]["history"]] == planned  # DeepSpeed's own view
    assert json.loads((tmp_path / "ds_config.json").read_text())["train_batch_size"] == 8


def test_a_rank_failure_is_recorded_with_rank_and_message(tmp_path):
    proc, seconds = run(tmp_path, "run.fail_at_step=2", "run.fail_rank=1", *QUICK)
    assert proc.returncode == 1
    assert seconds < 60  # rank 0, blocked in a collective, is ended rather than left hanging
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["status"] == "failed" and r["exit_code"] == 1
    assert r["error"]["rank"] == 1 and "injected failure" in r["error"]["message"]
    assert "RuntimeError" in r["error"]["log_tail"]


def test_a_rank_that_exits_without_a_python_error_is_named(tmp_path):
    proc, _ = run(tmp_path, "run.fail_at_step=1", "run.fail_rank=1", "run.fail_mode=exit", *QUICK)
    assert proc.returncode == 1
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["status"] == "failed" and r["error"]["rank"] == 1 and r["error"]["type"] == "ProcessExit"


def test_a_sweep_records_an_oom_point_and_runs_the_others(tmp_path):
    proc, _ = run(tmp_path, "run.fail_at_step=1,null", "run.fail_mode=oom", *QUICK, multirun=True)
    assert proc.returncode == 1
    results = results_below(tmp_path)
    assert [r["status"] for r in results] == ["oom", "ok"]
    assert results[0]["error"]["rank"] == 0 and results[1]["metrics"]["tokens"] > 0


def test_accelerate_runs_deepspeed_and_ddp_on_cpu_with_the_plans_buckets(tmp_path):
    proc, _ = run(tmp_path, "engine=accelerate", "engine.backend=deepspeed,fsdp", "zero=stage0",
                  "zero.reduce_bucket_size=1000000", *QUICK, multirun=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    engines = [r["metrics"]["engine"] for r in results_below(tmp_path)]
    assert engines[0]["distributed_type"].endswith("DEEPSPEED") and engines[0]["model_wrapper"] == "DeepSpeedEngine"
    assert engines[1]["distributed_type"].endswith("MULTI_CPU") and engines[1]["model_wrapper"] == "DistributedDataParallel"
    # DDP reduces in the buckets the plan counts: a million bf16 elements
    assert engines[1]["ddp_bucket_bytes"] == 1_000_000 * 2


def test_accelerate_fsdp_says_clearly_that_the_cpu_cannot_run_it(tmp_path):
    proc, _ = run(tmp_path, "engine=accelerate", "engine.backend=fsdp", "zero=stage3")
    assert proc.returncode == 2 and "FSDP only on GPUs" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "logs").exists()


def test_the_deepspeed_engine_is_the_one_asked_for(tmp_path):
    proc, _ = run(tmp_path, "zero=stage3", *QUICK)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    engine = json.loads((tmp_path / "result.json").read_text())["metrics"]["engine"]
    assert engine == {"engine": "deepspeed", "zero_stage": 3, "optimizer": "DeepSpeedZeroOptimizer_Stage3",
                      "built_partitioned": True}


def test_tuning_knobs_are_applied_and_recorded_and_profile_writes_a_trace(tmp_path):
    proc, _ = run(tmp_path, "run.profile=true", "run.gc_collect_every=2", "run.dataloader_workers=1",
                  "run.pin_memory=true", "run.steps=6", "run.warmup_steps=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tuning = json.loads((tmp_path / "result.json").read_text())["metrics"]["tuning"]
    assert tuning["gc_collect_every"] == 2 and tuning["gc_enabled"] is False  # gc really was off in the rank
    assert tuning["dataloader_workers"] == 1 and tuning["pin_memory"] is True
    traces = list((tmp_path / "profile").glob("*.json"))
    assert traces and json.loads(traces[0].read_text())["traceEvents"]  # Perfetto / TensorBoard format


def test_expandable_segments_reach_the_ranks_environment_on_gpus(tmp_path):
    from orchestrator.launchers.binding import binding
    from orchestrator.launchers.local import local_command

    gpu = build_spec(["hardware=h100-sxm"])
    assert local_command(gpu, tmp_path, binding("none", "cuda", 2)).env["PYTORCH_CUDA_ALLOC_CONF"] == \
        "expandable_segments:True"
    off = build_spec(["hardware=h100-sxm", "run.expandable_segments=false"])
    assert "PYTORCH_CUDA_ALLOC_CONF" not in local_command(off, tmp_path, binding("none", "cuda", 2)).env


def test_a_trial_past_its_time_limit_is_ended_and_recorded_as_timeout(tmp_path):
    proc, seconds = run(tmp_path, "run.timeout_min=0.1", "run.steps=100000", "run.warmup_steps=1")
    assert proc.returncode == 1 and seconds < 60
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["status"] == "timeout" and r["error"]["type"] == "Timeout" and r["metrics"] is None
