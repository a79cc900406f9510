"""The communication model: one call as NCCL or gloo runs it (plan/collectives.py), and what
each engine puts on the wire per step and can hide (plan/comm.py). Pure arithmetic."""

import math

import pytest

from orchestrator.plan import comm
from orchestrator.plan.batch import batch_sizes_per_step
from orchestrator.plan.collectives import RING_BASE_US, TREE_HOP_US, call_time, network, ring_time, tree_time
from orchestrator.plan.comm import wire_dtype
from orchestrator.plan.prediction import planned_for_timed_steps, planned_steps_s, step_s_at
from orchestrator.run.planning import plan_trial
from orchestrator.run.trial import cost_line
from orchestrator.spec import build_spec

H100 = dict(intra_busbw_gbps=370, intra_latency_us=3.4, inter_busbw_gbps=368, inter_latency_us=9.6)


def _net(ranks, nodes, backend="nccl", call_us=0.0, **links):
    return network(ranks, nodes, **{**H100, **links}, backend=backend, call_us=call_us)


def _schedule(stage, n=10**9, bucket=5 * 10**8, overlap=True, wire=2, ddp=False, tensors=None, persistence=0):
    return comm.CommSchedule(
        stage=stage,
        tensors=tensors or [n // 2, n - n // 2],
        param_bytes=2,
        wire_bytes=wire,
        reduce_bucket=bucket,
        allgather_bucket=5 * 10**8,
        prefetch_bucket=5 * 10**7,
        overlap_comm=overlap,
        ddp=ddp,
        persistence_threshold=persistence,
    )


def _step(stage, dp, ga=1, nodes=1, **kw):
    return comm.step_time(_schedule(stage, **kw), grad_accum=ga, fwd_s=0.1, bwd_s=0.2, net=_net(dp, nodes))


# --- one call ---------------------------------------------------------------------------


def test_a_ring_inside_a_node_is_latency_per_step_plus_bytes_over_busbw():
    net = _net(8, 1)
    expected = RING_BASE_US * 1e-6 + 14 * 3.4e-6 + 8e9 * 14 / 8 / 370e9
    assert ring_time("all_reduce", 8e9, net) == pytest.approx(expected)
    assert call_time("all_reduce", 8e9, net).algorithm == "ring"  # NCCL's tree needs several nodes


def test_a_rings_latency_grows_with_the_ranks_and_a_trees_with_the_log_of_the_nodes():
    small = 1e3  # latency-bound
    ring = [ring_time("all_reduce", small, _net(8 * n, n)) for n in (2, 4, 8, 16, 32)]
    tree = [tree_time(small, _net(8 * n, n)) for n in (2, 4, 8, 16, 32)]
    ring_growth = [b - a for a, b in zip(ring, ring[1:])]
    tree_growth = [b - a for a, b in zip(tree, tree[1:])]
    assert all(b > 1.9 * a for a, b in zip(ring_growth, ring_growth[1:]))  # linear in the ranks: doubles per doubling
    assert tree_growth == pytest.approx([2 * TREE_HOP_US * 1e-6] * 4)  # one level more per doubling, up and down


def test_nccl_picks_the_tree_for_a_small_all_reduce_across_many_nodes_and_the_ring_for_a_large_one_on_few():
    many = _net(256, 32)
    assert call_time("all_reduce", 25e6, many).algorithm == "tree"
    assert call_time("all_reduce", 4e9, _net(16, 2)).algorithm == "ring"
    # reduce-scatter and all-gather have only rings; gloo has only rings
    assert call_time("all_gather", 25e6, many).algorithm == "ring"
    assert call_time("all_reduce", 25e6, _net(256, 32, backend="gloo")).algorithm == "ring"
    # the chosen one is the faster of the two
    t = call_time("all_reduce", 25e6, many)
    assert t.seconds == min(ring_time("all_reduce", 25e6, many), tree_time(25e6, many))


def test_a_ring_across_nodes_moves_at_the_slower_levels_busbw():
    slow_network = _net(16, 2, inter_busbw_gbps=50)
    data = ring_time("all_gather", 16e9, slow_network) - ring_time("all_gather", 0, slow_network)
    assert data == pytest.approx(16e9 * 15 / 16 / 50e9)


def test_gloo_runs_its_ring_in_lock_step_and_reduce_scatters_with_an_all_reduce():
    one_per_node = _net(2, 2, backend="gloo", inter_busbw_gbps=10, inter_latency_us=20)  # the CPU test cluster
    assert ring_time("all_gather", 2e9, one_per_node) == pytest.approx(20e-6 + 1e9 / 10e9)
    four = _net(4, 2, backend="gloo", inter_busbw_gbps=1, inter_latency_us=20)
    assert ring_time("reduce_scatter", 1e8, four) == ring_time("all_reduce", 1e8, four)
    assert call_time("all_reduce", 1e9, _net(1, 1)).seconds == 0


def test_a_fixed_cost_per_call_makes_many_small_buckets_slower_than_few_large_ones():
    tensors = [1000] * 200

    def step(bucket, call_us):
        net = _net(2, 2, backend="gloo", call_us=call_us, inter_busbw_gbps=1, inter_latency_us=20)
        return comm.step_time(
            _schedule(2, bucket=bucket, overlap=False, wire=4, tensors=tensors),
            grad_accum=1,
            fwd_s=0.01,
            bwd_s=0.02,
            net=net,
        ).step_s

    assert step(1000, 5000) - step(10**6, 5000) == pytest.approx(199 * 5e-3 + step(1000, 0) - step(10**6, 0))


# --- a step -----------------------------------------------------------------------------


@pytest.mark.parametrize("stage,factor", [(0, 2), (1, 3), (2, 3), (3, 3)])
def test_communication_volume_is_2x_3x_3x_3x_the_parameter_bytes(stage, factor):
    dp, n = 64, 10**9
    assert comm.bytes_per_rank_per_step(_step(stage, dp, n=n).collectives) == pytest.approx(
        factor * 2 * n * (dp - 1) / dp
    )


def test_fp32_gradients_on_the_wire_double_the_reduced_bytes_not_the_gathered_ones():
    bf16, fp32 = _step(1, 64, nodes=8).collectives, _step(1, 64, nodes=8, wire=4).collectives
    assert fp32[0].bytes_per_rank == pytest.approx(2 * bf16[0].bytes_per_rank) and fp32[0].dtype_bytes == 4
    assert fp32[1].bytes_per_rank == bf16[1].bytes_per_rank  # the parameters' all-gather stays bf16


def test_stage2_reduces_every_micro_batch_stage1_only_the_last():
    v1 = comm.bytes_per_rank_per_step(_step(1, 8, ga=4).collectives)
    v2 = comm.bytes_per_rank_per_step(_step(2, 8, ga=4).collectives)
    assert v2 > v1 and v1 == comm.bytes_per_rank_per_step(_step(1, 8, ga=1).collectives)


def test_only_the_last_backward_hides_a_reduction_and_the_gather_after_step_hides_behind_nothing():
    one, many = _step(1, 64, ga=1, nodes=8), _step(1, 64, ga=16, nodes=8)
    assert many.exposed_s == pytest.approx(one.exposed_s)  # more micro batches hide nothing more
    gather = one.collectives[1]
    assert gather.op == "all_gather" and gather.exposed_s == gather.time_s


def test_zero3_gathers_each_persistent_parameter_after_step_in_a_call_of_its_own():
    tensors = [4 * 10**6, 256, 4 * 10**6, 768, 256]  # weights, and the biases and norms kept whole
    net = _net(2, 1, backend="gloo", call_us=100.0)
    kept = comm.step_time(_schedule(3, tensors=tensors, persistence=1000), grad_accum=4, fwd_s=0.1, bwd_s=0.2, net=net)
    none = comm.step_time(_schedule(3, tensors=tensors), grad_accum=4, fwd_s=0.1, bwd_s=0.2, net=net)
    after = kept.collectives[-1]
    assert after.phase.startswith("after step()") and after.op == "all_gather" and after.calls == 3  # once a step
    assert after.exposed_s == after.time_s > 3 * 100e-6  # each call pays its own fixed cost, behind nothing
    assert kept.step_s == pytest.approx(none.step_s + after.time_s) and len(none.collectives) == 3
    one_rank = comm.step_time(
        _schedule(3, tensors=tensors, persistence=1000),
        grad_accum=4,
        fwd_s=0.1,
        bwd_s=0.2,
        net=_net(1, 1, backend="gloo"),
    )
    assert not any(c.phase.startswith("after step()") for c in one_rank.collectives)


def test_ddp_overlaps_its_buckets_and_deepspeed_stage0_does_not():
    tensors = [10**6] * 1000  # a billion parameters in a thousand tensors
    ds = _step(0, 64, nodes=8, bucket=10**7, tensors=tensors)
    ddp = _step(0, 64, nodes=8, bucket=10**7, tensors=tensors, ddp=True)
    assert ddp.exposed_s < ds.exposed_s
    assert ds.collectives[0].calls == 2  # DeepSpeed's fixed 5e8-element buckets: zero.reduce_bucket_size is unused
    assert ddp.collectives[0].calls == math.ceil(10**9 / 10**7)


def test_overlap_hides_communication_and_one_rank_has_none():
    assert _step(2, 8, overlap=True).exposed_s < _step(2, 8, overlap=False).exposed_s
    assert _step(0, 1).exposed_s == 0 and _step(0, 1).comm_s == 0


def test_gradient_buckets_hold_whole_tensors_as_deepspeed_fills_them():
    # backward order (3, 200, 5, 5, 100): 200 overflows the first bucket, 5 + 5 share one
    assert comm.packed_buckets([100, 5, 5, 200, 3], 50) == [3, 200, 10, 100]
    assert comm.packed_buckets([100, 5, 5, 200, 3], 10**6) == [313]
    assert len(comm.packed_buckets([100, 5, 5, 200, 3], 1)) == 5


def test_bucketed_overlap():
    assert comm.overlapped(10.0, [1.0, 1.0, 1.0, 1.0]) == pytest.approx(2.5 + 7.5 + 1.0)
    assert comm.overlapped(1.0, [2.0, 2.0]) == pytest.approx(0.5 + 2.0 + 2.0)
    assert comm.buckets(10, 4) == [4, 4, 2]


# --- the plan and the engine config agree on the wire dtype ----------------------------------


def test_the_wire_dtype_reaches_the_plan_as_deepspeed_decides_it():
    base = ["model=gpt2-125m", "hardware=h100-sxm", "cluster=slurm", "parallel.dp=16", "logger.mode=disabled"]
    plain = build_spec([*base, "zero=stage1"])
    comm32 = build_spec([*base, "zero=stage1", "zero.communication_dtype=fp32"])
    accum32 = build_spec([*base, "zero=stage1", "zero.grad_accum_dtype=fp32"])
    assert (wire_dtype(plain), wire_dtype(comm32), wire_dtype(accum32)) == ("bf16", "fp32", "fp32")
    reduced = [plan_trial(s).comm.collectives[0] for s in (plain, comm32, accum32)]
    assert [c.dtype_bytes for c in reduced] == [2, 4, 4]
    assert reduced[1].time_s > reduced[0].time_s


# --- a warm-up's steps ------------------------------------------------------------


@pytest.mark.parametrize(
    "engine",
    [
        ["zero=stage0"],
        ["zero=stage1"],
        ["zero=stage2"],
        ["zero=stage3"],
        ["engine=fsdp", "zero=stage3"],
        ["engine=fsdp", "zero=stage2"],
    ],
)
def test_a_warm_up_step_is_planned_as_the_same_trial_at_that_global_batch(engine):
    """A step of fewer micro batches (the warm-up's first) costs what the plan of a trial
    whose whole run had that batch says: the step models are lines in the micro batches."""
    base = ["model=gpt2-1.3b", "hardware=h100-sxm", "parallel.dp=8", "batch.micro_batch_size=2", *engine]
    warm = plan_trial(build_spec([*base, "batch=warmup", "batch.global_batch_size=128", "batch.warmup.start=32"]))
    assert warm.batch["grad_accum_steps"] == 8 and warm.time.added_micro_batch_s > 0
    for batch in (16, 32, 64, 128):
        alone = plan_trial(build_spec([*base, f"batch.global_batch_size={batch}"])).time.step_s
        assert step_s_at(warm.as_dict(), batch) == pytest.approx(alone, rel=1e-9)


def test_the_cost_before_launch_adds_up_the_warm_up_steps_at_their_own_batches():
    spec = build_spec(
        [
            "model=gpt2-1.3b",
            "hardware=h100-sxm",
            "parallel.dp=8",
            "batch.micro_batch_size=2",
            "zero=stage2",
            "batch=warmup",
            "batch.global_batch_size=128",
            "batch.warmup.start=32",
            "batch.warmup.ramp_samples=128",
            "run.steps=6",
            "run.warmup_steps=1",
        ]
    )
    plan = plan_trial(spec)
    sizes = batch_sizes_per_step(spec.schedule, 6, spec.cfg.model.seq_len)
    assert sizes[0] == 32 and sizes[-1] == 128  # the schedule warms up inside the run
    each = planned_steps_s(plan.as_dict(), sizes)
    assert each[0] < each[-1] == pytest.approx(plan.time.step_s)
    line = " ".join(cost_line(spec, plan, None).split())
    assert f"{min(each):.3g}-{max(each):.3g} s a step as the batch warms up" in line
    assert f"about {sum(each):.3g} s for 6 steps" in line or f"about {sum(each) / 60:.1f} min for 6 steps" in line


def test_the_plan_of_a_warm_up_trial_is_compared_at_the_steps_it_timed():
    spec = build_spec(
        [
            "model=gpt2-1.3b",
            "hardware=h100-sxm",
            "parallel.dp=8",
            "batch.micro_batch_size=2",
            "zero=stage2",
            "batch=warmup",
            "batch.global_batch_size=128",
            "batch.warmup.start=32",
        ]
    )
    plan = plan_trial(spec).as_dict()
    history = [
        {"timed": False, "global_batch_size": 32},
        {"timed": True, "global_batch_size": 32},
        {"timed": True, "global_batch_size": 64},
        {"timed": True, "global_batch_size": 64},
    ]
    got = planned_for_timed_steps(plan, history)
    assert got["step_s"] == pytest.approx(step_s_at(plan, 64)) and not got["at_full_batch"]
    # the rate is that of the timed steps' tokens over their planned time, not the full batch's
    tokens = 64 * spec.cfg.model.seq_len / step_s_at(plan, 64) / 8
    assert got["tokens_per_sec_per_gpu"] == pytest.approx(tokens, rel=1e-9)
    assert planned_for_timed_steps(plan, None)["step_s"] == plan["time"]["step_s"]


def test_calibrate_fits_a_warm_up_trial_at_the_batches_it_timed():
    from orchestrator.analysis.calibrate import current_params, log_error
    from orchestrator.analysis.fit_inputs import MeasuredTrial

    spec = build_spec(
        [
            "model=gpt2-1.3b",
            "hardware=h100-sxm",
            "parallel.dp=8",
            "batch.micro_batch_size=2",
            "zero=stage2",
            "batch=warmup",
            "batch.global_batch_size=128",
            "batch.warmup.start=32",
        ]
    )
    params = current_params(spec.cfg.hardware)
    # a measurement exactly as planned at the warm-up's batch, under the parameters that plan used
    at_32 = step_s_at(plan_trial(spec).as_dict(), 32)
    assert log_error([MeasuredTrial("t", spec, at_32, (32, 32))], params) < 1e-12
    assert log_error([MeasuredTrial("t", spec, at_32)], params) > 0.1  # against the full batch's step: a large miss


def test_a_small_call_runs_in_ncclS_ll_protocol_and_a_large_one_in_simple():
    """NCCL's LL protocol trades half the bandwidth for short hops: a ZeRO-3 persistent
    parameter's all-gather across 256 ranks costs LL's latency, not 255 Simple hops."""
    from orchestrator.plan.collectives import ll_ring_time

    many = _net(256, 32)
    small, large = call_time("all_gather", 8e3, many), call_time("all_gather", 1e9, many)
    assert (small.protocol, large.protocol) == ("LL", "Simple")
    assert small.seconds == pytest.approx(ll_ring_time("all_gather", 8e3, many))
    assert small.seconds < 0.5 * ring_time("all_gather", 8e3, many)  # the Simple ring: ~1 ms at 256 ranks
    # gloo has no LL
    assert call_time("all_gather", 8e3, _net(256, 32, backend="gloo")).protocol == "Simple"
