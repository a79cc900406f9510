"""`orchestrator plan` and the refusal of `orchestrator run`, as a user types them."""

import json

import pytest

from orchestrator.cli import main
from orchestrator.run.planning import plan_trial
from orchestrator.spec import build_spec

H100 = ["hardware=h100-sxm"]
DESIGN_KEYS = {
    "parallel": {"world_size", "dp", "nodes", "gpus_per_node"},
    "batch": {"micro_batch_size", "grad_accum_steps", "global_batch_size", "tokens_per_step", "schedule"},
    "memory": {"params", "grads", "optimizer", "activations", "buffers", "runtime", "total", "capacity", "fits"},
    "flops": {"model_per_token", "hardware_per_token", "per_step"},
    "comm": {"bytes_per_rank_per_step", "collectives", "time_s", "exposed_s"},
    "time": {"compute_s", "comm_s", "step_s", "tokens_per_sec_per_gpu", "mfu"},
}


def test_plan_json_has_the_keys_of_the_design(capsys):
    assert main(["plan", "--json", "model=gpt2-350m", "zero=stage2", "parallel.dp=8", *H100]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["parameters"] > 3e8 and isinstance(plan["warnings"], list)
    for section, keys in DESIGN_KEYS.items():
        assert keys <= set(plan[section]), section
    m = plan["memory"]
    held = m["params"] + m["grads"] + m["optimizer"]
    phases = {
        "loss backward": m["static"] + m["gathered"] + m["activations"] + m["loss_backward"],
        "backward": held + m["buffers"] + m["activations"] + m["recompute"],
        "optimizer step": m["params"]
        + m["grads_at_step"]
        + m["optimizer"]
        + m["optimizer_step"]
        + m["optimizer_temporaries"],
    }
    assert m["total"] == m["runtime"] + max(phases.values()) and m["fits"] is True
    assert m["peak_phase"] == max(phases, key=phases.get)
    hw = build_spec(["model=gpt2-350m", *H100]).cfg.hardware
    ceiling = max(hw.compute_efficiency, hw.attention_efficiency)  # no kernel runs faster than these
    assert 0 < plan["time"]["mfu"] <= ceiling
    parts = plan["time"]["micro_batch"]
    assert parts["total_s"] == pytest.approx(
        parts["gemm_s"] + parts["attention_s"] + parts["memory_bound_s"] + parts["overhead_s"]
    )


def test_plan_table_labels_figures_predicted_and_lists_assumptions(cli):
    result = cli("plan", "model=gpt2-350m", "zero=stage2", "parallel.dp=8", *H100)
    assert result.returncode == 0
    out = result.stdout
    assert "predicted" in out and "assumptions:" in out and "989" in out and "published" in out
    for word in (
        "parameters",
        "gradients",
        "optimizer states",
        "activations",
        "buffers",
        "runtime",
        "total",
        "tokens/s/GPU",
        "MFU",
    ):
        assert word in out, word


def test_plan_on_cpu_uses_a_measured_peak():
    plan = plan_trial(build_spec(["hardware=cpu"]))
    assert plan.time.peak_tflops > 0
    assert any("measured" in a for a in plan.assumptions)


def test_the_optimizer_step_costs_its_memory_traffic_at_the_device_bandwidth():
    def plan(*more):
        return plan_trial(build_spec(["model=gpt2-1.3b", "parallel.dp=8", *H100, *more]))

    z0, z2 = plan("zero=stage0"), plan("zero=stage2")
    n = z0.parameters
    assert z0.time.optimizer_s == (80 + 4 + 12) * n / 3350e9  # AdamW passes, clip norm, bf16 <-> fp32
    assert z2.time.optimizer_s == (80 + 4 + 12) * -(-n // 8) / 3350e9  # each rank updates its partition
    # Offloaded: CPU Adam on the host's memory bandwidth, shared by the node's 8 ranks,
    # after the gradient comes down and before the parameter goes up the host link.
    offloaded = plan("zero=stage2", "zero.offload_optimizer=cpu")
    shard = -(-n // 8)
    assert offloaded.time.optimizer_s == pytest.approx(shard * 28 * 8 / 100e9 + shard * 4 / 25e9)
    assert any("host link (assumed)" in a for a in offloaded.assumptions)
    own = plan_trial(
        build_spec(
            [
                "model=gpt2-1.3b",
                "hardware.name=mygpu",
                "hardware.device=cuda",
                "hardware.peak_tflops.bf16=500",
                "hardware.memory_gib=80",
            ]
        )
    )
    assert own.time.optimizer_s == 0 and any("not counted" in a for a in own.assumptions)


def test_a_trial_that_does_not_fit_exits_3_with_the_breakdown(cli):
    result = cli("plan", "model=gpt2-13b", "parallel.dp=1", *H100)
    assert result.returncode == 3
    assert "DOES NOT FIT" in result.stdout and "activations" in result.stdout
    assert "would be refused by run: does not fit" in result.stderr and "Traceback" not in result.stderr


def test_run_refuses_what_does_not_fit_and_records_it(tmp_path, capsys):
    # 175B parameters on this machine's CPU: the plan says no before anything starts.
    assert main(["run", "model=gpt3-175b", "hardware=cpu", "--out", str(tmp_path)]) == 3
    out = capsys.readouterr().out
    assert "refused" in out and "run.force=true" in out and "optimizer states" in out
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "refused" and result["exit_code"] == 3
    assert result["plan"]["memory"]["fits"] is False and "does not fit" in result["error"]["message"]
    assert "not even ZeRO-3" in result["error"]["message"]  # and what would be needed instead
    assert not (tmp_path / "logs").exists()  # nothing was launched


def test_force_lifts_the_refusal():
    from orchestrator.run.trial import refusal

    spec = build_spec(["model=gpt3-175b", "hardware=cpu"])
    forced = build_spec(["model=gpt3-175b", "hardware=cpu", "run.force=true"])
    plan = plan_trial(spec)  # a forced plan is the same but for its timed kernels (most of a minute here)
    assert "does not fit" in refusal(spec, plan)
    assert refusal(forced, plan) is None
    # A plan that will be refused times nothing: the refusal is immediate, and says where
    # its time comes from instead.
    assert not plan.time.micro_batch.timed and "kernels not timed: the trial does not fit" in plan.sources["compute"]


def test_run_on_a_gpu_preset_without_a_gpu_is_refused_before_launch(tmp_path, capsys):
    assert main(["run", "hardware=h100-sxm", "--out", str(tmp_path)]) == 2
    assert "no GPU" in capsys.readouterr().err and not (tmp_path / "logs").exists()


def test_sweep_view_has_one_row_per_point_and_scaling_flattens(capsys):
    dps = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    argv = [
        "plan",
        "-m",
        "--json",
        "model=gpt2-1.3b",
        "zero=stage2",
        "cluster=slurm",
        *H100,
        "batch.global_batch_size=1024",
        "batch.micro_batch_size=1",
        f"parallel.dp={','.join(map(str, dps))}",
    ]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["plan"]["parallel"]["dp"] for r in rows] == dps
    step = [r["plan"]["time"]["step_s"] for r in rows]
    per_gpu = [r["plan"]["time"]["tokens_per_sec_per_gpu"] for r in rows]
    # More ranks: shorter steps within a node (NVLink) and across nodes (IB), 004's monotone
    # question; but each GPU does less as communication stops paying: ZeRO-2 all-reduces its
    # 2.6 GB of gradients at every micro batch, however few each rank runs.
    assert step == sorted(step, reverse=True)
    assert per_gpu[-1] < per_gpu[0]  # each GPU does less: communication stops paying
    assert main(argv[:2] + argv[3:]) == 0  # the table
    table = capsys.readouterr().out
    assert "parallel.dp" in table and all(f" {d} " in table for d in dps)


def test_shape_warnings():
    def warned(*ov):
        return " ".join(plan_trial(build_spec([*ov, *H100])).warnings)

    assert "multiple of 64" in warned("model=gpt2-125m")  # vocab 50257
    assert "head size" in warned("model=gpt2-2.7b")  # 2560 / 32 = 80
    assert "SwiGLU" in warned("model=llama3-8b", "model.ffn_hidden=11000", "batch.micro_batch_size=1")
    assert "SwiGLU" not in warned("model=llama3-8b", "batch.micro_batch_size=1")
    assert "leaves memory unused" in warned("model=gpt2-125m", "batch.micro_batch_size=1")


def test_max_micro_batch_is_the_edge_of_fitting():
    base = ["model=gpt2-1.3b", "zero=stage2", "parallel.dp=8", *H100]
    k = plan_trial(build_spec(base)).max_micro_batch
    assert k > 1
    assert plan_trial(build_spec([*base, f"batch.micro_batch_size={k}"])).fits
    assert not plan_trial(build_spec([*base, f"batch.micro_batch_size={k + 1}"])).fits


def test_a_trial_that_does_not_fit_is_told_what_would():
    base = ["model=llama3-8b", "zero=stage2", "parallel.dp=8", *H100]
    plan = plan_trial(build_spec(base))
    assert not plan.fits
    (advice,) = [w for w in plan.warnings if w.startswith("does not fit")]
    options = [o.split() for o in advice.split(": ", 1)[1].split("; ")]
    assert len(options) >= 2
    for overrides in options:  # every suggestion fits, with the trial's micro batch or the largest that does
        assert plan_trial(build_spec([*base, *overrides])).fits, overrides
        micro = int(overrides[-1].split("=")[1])
        bigger = [*overrides[:-1], f"batch.micro_batch_size={micro + 1}"]
        assert micro == 4 or not plan_trial(build_spec([*base, *bigger])).fits, bigger
    huge = plan_trial(build_spec(["model=gpt3-175b", "zero=stage3", "parallel.dp=8", *H100]))
    assert any(w.startswith("does not fit; not even ZeRO-3") and "parallel.dp" in w for w in huge.warnings)


def test_sweep_view_says_what_would_fit_for_each_point_that_does_not(cli):
    result = cli(
        "plan", "-m", "model=llama3-8b", "batch.micro_batch_size=1", "zero=stage2,stage3", "parallel.dp=8", *H100
    )
    assert result.returncode == 3
    text = " ".join(result.stdout.split())  # rich wraps long lines
    # Neither fits at micro batch 1 (ZeRO-3 misses by the loss's fp32 gradients at the start
    # of backward, 7.8 GiB at a 128k vocabulary); each point is told its own way out.
    assert "zero=stage2 does not fit; by this plan these would fit: recompute=selective" in text
    assert "zero=stage3 does not fit; by this plan these would fit: recompute=selective" in text


def test_a_sweep_says_which_points_lie_within_the_plans_own_error_of_the_best(capsys):
    """Where larger buckets stop paying on 32 nodes: the points within HELD_OUT_ERROR of the
    best are named as not ranked by the plan; the ones clearly slower are not."""
    from orchestrator.plan.prediction import HELD_OUT_ERROR

    argv = [
        "plan",
        "-m",
        "model=llama3-8b",
        "model.n_layers=16",
        "model.hidden=2048",
        "model.heads=32",
        "model.kv_heads=32",
        "model.ffn_hidden=8192",
        "model.vocab=131072",
        "model.seq_len=4096",
        "model.max_positions=4096",
        "hardware=h100-p5",
        "cluster=slurm",
        "engine=accelerate",
        "engine.backend=fsdp",
        "zero=stage0",
        "recompute=none",
        "zero.communication_dtype=fp32",
        "parallel.dp=256",
        "batch.micro_batch_size=1",
        "batch.global_batch_size=256",
        "zero.reduce_bucket_size=1e6,1e8,5e8",
    ]
    assert main([*argv[:2], "--json", *argv[2:]]) == 0
    rate = {
        r["overrides"][-1]: r["plan"]["time"]["tokens_per_sec_per_gpu"] for r in json.loads(capsys.readouterr().out)
    }
    best = max(rate.values())
    close = {k for k, v in rate.items() if v >= best * (1 - HELD_OUT_ERROR)}
    assert {k.split("=")[1] for k in close} == {"100000000.0", "500000000.0"}  # 1e6: too many calls
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"2 points are planned within {HELD_OUT_ERROR:.0%} of the best" in text
    assert "zero.reduce_bucket_size=100000000; zero.reduce_bucket_size=500000000" in text
    assert "does not rank them" in text
