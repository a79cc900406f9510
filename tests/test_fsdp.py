"""FSDP2 (engine=fsdp): torch's fully_shard for real on CPU ranks with gloo, planned as FSDP2
(plan/fsdp.py, not as ZeRO-3), and what FSDP2 cannot do refused before launch."""

import json
from pathlib import Path

import pytest

from orchestrator.hydra_glue.compose import expand_sweep
from orchestrator.plan.collectives import network
from orchestrator.plan.fsdp import fsdp_states, fsdp_step_time, layout_of
from orchestrator.plan.params import parameter_tensors
from orchestrator.run.planning import plan_trial
from orchestrator.spec import build_spec
from tests.conftest import run_in_process

GPU = ["hardware=h100-sxm", "cluster=slurm", "model=gpt2-1.3b"]


def layout(dp=8, reshard=True, grad_accum=1, offload=False, wire=2, model="gpt2-1.3b"):
    tensors = parameter_tensors(build_spec([f"model={model}", "hardware=h100-sxm", "cluster=slurm"]).cfg.model)
    return layout_of(tensors, dp, 2, wire, reshard, grad_accum, offload, adam_foreach=True)


def test_each_block_is_one_unit_and_the_rest_is_the_roots():
    f = layout()
    spec = build_spec(["model=gpt2-1.3b", "hardware=h100-sxm", "cluster=slurm"])
    assert len(f.blocks) == spec.cfg.model.n_layers and len(set(f.blocks)) == 1
    assert f.elements == plan_trial(spec).parameters
    assert f.root == f.elements - sum(f.blocks) > 0  # embeddings and the final norm


def test_the_sharded_state_is_16_bytes_a_shard_element_and_the_working_set_follows_reshard():
    resharded, kept = fsdp_states(layout(reshard=True)), fsdp_states(layout(reshard=False))
    f = layout()
    assert resharded["params"] + resharded["grads_at_step"] + resharded["optimizer"] == 16 * f.shard
    assert resharded["grads"] == 2 * f.root  # inside backward: the root's, unsharded
    assert resharded["gathered"] == 2 * (f.root + 2 * max(f.blocks))  # root + the block computing + the prefetched
    assert kept["gathered"] == 2 * f.elements  # every block kept from forward to backward
    assert resharded["static"] == 12 * f.shard  # zero_grad(set_to_none) frees the gradient shards


def test_accumulating_micro_batches_keep_unsharded_gradients_and_offload_leaves_the_working_set():
    f = layout()
    assert fsdp_states(layout(grad_accum=4))["grads"] == 2 * f.elements
    off = fsdp_states(layout(offload=True))
    assert off["params"] == off["grads_at_step"] == off["optimizer"] == 0 and off["offloaded"] == 16 * f.shard
    assert off["gathered"] == fsdp_states(f)["gathered"]


NET = network(64, 8, 370, 3, 40, 10)


def test_gathers_every_micro_batch_and_reduce_scatters_once_a_step():
    f = layout(dp=64, grad_accum=4)
    t = fsdp_step_time(f, fwd_s=0.5, bwd_s=1.0, net=NET)
    gathers = [c for c in t.collectives if c.op == "all_gather"]
    (scatter,) = [c for c in t.collectives if c.op == "reduce_scatter"]
    assert sum(c.calls for c in gathers) == 4 * (2 * len(f.blocks) + 1)  # forward + backward + the root's
    assert scatter.calls == len(f.blocks) + 1 and scatter.dtype_bytes == 2
    kept = fsdp_step_time(layout(dp=64, grad_accum=4, reshard=False), fwd_s=0.5, bwd_s=1.0, net=NET)
    assert sum(c.calls for c in kept.collectives if c.op == "all_gather") == 4 * (len(f.blocks) + 1)
    assert kept.step_s < t.step_s


def test_only_the_first_gather_and_the_last_reduce_scatters_show_under_long_compute():
    f = layout(dp=64)
    long = fsdp_step_time(f, fwd_s=100.0, bwd_s=200.0, net=NET)
    first = [c for c in long.collectives if "root" in c.phase][0].time_s / 1 + [
        c for c in long.collectives if c.op == "all_gather"
    ][0].time_s / len(f.blocks)
    assert long.exposed_s < 3 * first  # the rest hides behind blocks' compute
    short = fsdp_step_time(f, fwd_s=1e-6, bwd_s=2e-6, net=NET)
    assert short.step_s == pytest.approx(short.comm_s, rel=0.01)  # nothing to hide behind
    fp32 = fsdp_step_time(layout(dp=64, wire=4), fwd_s=1e-6, bwd_s=2e-6, net=NET)
    assert fp32.comm_s > short.comm_s  # gradients reduced in fp32 move twice the bytes


def test_on_a_cpu_device_no_collective_hides_behind_compute():
    # FSDP2 overlaps through CUDA streams; on a CPU each collective blocks the rank.
    f = layout(dp=64, grad_accum=2)
    cpu = layout_of(
        parameter_tensors(build_spec(["model=gpt2-1.3b", "hardware=cpu"]).cfg.model),
        64,
        2,
        2,
        True,
        2,
        False,
        adam_foreach=False,
        overlap=False,
    )
    gpu, blocking = (fsdp_step_time(x, fwd_s=100.0, bwd_s=200.0, net=NET) for x in (f, cpu))
    assert blocking.step_s == pytest.approx(600.0 + blocking.comm_s) and blocking.exposed_s == pytest.approx(
        blocking.comm_s
    )
    assert gpu.exposed_s < 0.2 * gpu.comm_s
    spec = build_spec(["engine=fsdp", "zero=stage3", "hardware=cpu", "parallel.dp=2"])
    time = plan_trial(spec).as_dict()["time"]
    assert time["exposed_comm_s"] == pytest.approx(time["comm_s"])  # the planner tells the layout it is a CPU


def test_both_routes_to_fsdp2_describe_the_same_sharding():
    own = plan_trial(build_spec([*GPU, "engine=fsdp", "zero=stage3", "parallel.dp=16"]))
    via_accelerate = plan_trial(
        build_spec([*GPU, "engine=accelerate", "engine.backend=fsdp", "zero=stage3", "parallel.dp=16"])
    )
    zero3 = plan_trial(build_spec([*GPU, "engine=deepspeed", "zero=stage3", "parallel.dp=16"]))
    assert own.memory.total == via_accelerate.memory.total and own.time.step_s == via_accelerate.time.step_s
    assert own.memory.total != zero3.memory.total  # planned as FSDP2, not as ZeRO-3


@pytest.mark.parametrize(
    "overrides,field",
    [
        (["zero=stage1"], "zero.stage"),
        (["zero=stage0"], "zero.stage"),
        (["zero=stage3", "zero.reduce_bucket_size=1e6"], "zero.reduce_bucket_size"),
        (["zero=stage3", "zero.prefetch_bucket_size=1e6"], "zero.prefetch_bucket_size"),
        (["zero=stage3", "zero.offload_optimizer=cpu"], "zero.offload_optimizer"),
        (["zero=stage3", "run.bf16=false", "run.fp16=true", *GPU], "run.fp16"),
        (["zero=stage3", "engine.backend=deepspeed"], "engine.backend"),
        (["zero=stage3", "zero.offload_param=cpu", "hardware=cpu"], "zero.offload_param"),  # nothing to offload from
    ],
)
def test_what_fsdp2_cannot_do_exits_2_naming_the_field(cli, overrides, field):
    proc = cli("plan", "engine=fsdp", *overrides)
    assert proc.returncode == 2 and field in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_choosing_fsdp2_alone_shards_fully_and_a_stage_given_is_kept(cli):
    """engine=fsdp means sharding: FULL_SHARD (zero.stage 3) unless a stage is asked for,
    as torchtitan and Accelerate default; an explicit stage 0 or 1 is refused without
    offering stage 0 (which is DDP, another engine)."""
    for overrides, stage in ([[], 3], [["zero=stage2"], 2], [["zero.stage=2"], 2]):
        proc = cli("plan", "engine=fsdp", *overrides)
        assert proc.returncode == 0 and f"engine=fsdp zero.stage={stage}" in proc.stdout, (overrides, proc.stderr)
    # a sweep over engines: each keeps its own default
    specs = [build_spec(point) for point in expand_sweep(["engine=fsdp,deepspeed"])]
    assert [(s.cfg.engine.name, s.cfg.zero.stage) for s in specs] == [("fsdp", 3), ("deepspeed", 0)]
    for explicit in ("zero=stage0", "zero.stage=1"):
        proc = cli("plan", "engine=fsdp", explicit)
        assert proc.returncode == 2 and "2 or 3 with engine=fsdp" in proc.stderr and "DDP" not in proc.stderr


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory) -> Path:
    """DeepSpeed ZeRO-3 and FSDP2 in one sweep, two micro batches a step."""
    out = tmp_path_factory.mktemp("zero3-fsdp2") / "sweep"
    proc = run_in_process(
        "run",
        "-m",
        "engine=deepspeed,fsdp",
        "zero=stage3",
        "model=tiny",
        "run.steps=4",
        "run.warmup_steps=1",
        "batch.global_batch_size=8",
        "batch.micro_batch_size=2",
        "logger.mode=disabled",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.mark.slow
def test_one_sweep_puts_zero3_and_fsdp2_side_by_side(cli, side_by_side):
    proc = cli("report", str(side_by_side), "--json")
    rows = json.loads(proc.stdout)
    assert sorted(r["engine"] for r in rows) == ["deepspeed", "fsdp"] and all(r["status"] == "ok" for r in rows)


@pytest.fixture
def fsdp2_trial(request, side_by_side, tmp_path) -> tuple[int, Path]:
    """Stage 3 is the sweep's FSDP2 point; stage 2 (fp32 reduction) runs here."""
    stage = request.param
    if stage == 3:
        (point,) = [p.parent for p in side_by_side.rglob("result.json") if "engine=fsdp" in p.parent.name]
        return stage, point
    proc = run_in_process(
        "run",
        "engine=fsdp",
        "zero=stage2",
        "model=tiny",
        "run.steps=4",
        "run.warmup_steps=1",
        "logger.mode=disabled",
        "zero.communication_dtype=fp32",
        "--out",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return stage, tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("fsdp2_trial", [3, 2], indirect=True)
def test_fsdp2_trains_here_with_sharded_parameters(fsdp2_trial):
    stage, tmp_path = fsdp2_trial
    r = json.loads((tmp_path / "result.json").read_text())
    engine = r["metrics"]["engine"]
    assert r["status"] == "ok" and engine["engine"] == "fsdp2" and engine["parameters_sharded"]
    assert engine["reshard_after_forward"] is (stage == 3) and engine["sharded_blocks"] == 2
    # The root's parameters stay gathered into the backward, which needs them first (as the
    # plan's one gather of the root a micro batch has it); the blocks' only at stage 2.
    assert engine["gathered_after_forward"] == {"root": True, "blocks": stage == 2}
    assert engine["reduce_dtype"] == ("fp32" if stage == 2 else "bf16") and not engine["cpu_offload"]
    losses = r["metrics"]["losses"]
    assert all(isinstance(x, float) for x in losses) and losses[-1] < losses[0] + 0.5
    assert "FSDP2" in (tmp_path / "EXPLAIN.md").read_text() and not (tmp_path / "ds_config.json").exists()


def test_what_runs_the_model_is_decided_once_from_the_backend_and_stage():
    """engine.backend and zero.stage say what shards the model, whichever engine drives it;
    the plan, its tables and plots, the engine's timing ask config.runs_as."""
    from orchestrator.config import Sharding, runs_as

    assert [runs_as("deepspeed", s) for s in range(4)] == [Sharding.zero] * 4
    assert [runs_as("fsdp", s) for s in (0, 2, 3)] == [Sharding.ddp, Sharding.fsdp2, Sharding.fsdp2]
    for overrides, sharding in (
        (["engine=fsdp", "zero=stage2"], Sharding.fsdp2),
        (["engine=accelerate", "engine.backend=fsdp", "zero=stage0"], Sharding.ddp),
        (["engine=accelerate", "zero=stage3"], Sharding.zero),
    ):
        spec = build_spec([*GPU, *overrides])
        assert runs_as(spec.cfg.engine.backend, spec.cfg.zero.stage) == sharding, overrides
