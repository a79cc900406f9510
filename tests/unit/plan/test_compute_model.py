"""The step-time model's parts (plan/compute.py), each checked on its own: pure
arithmetic, no GPU needed (the published-GPU check is bench/perf_check.py)."""

import dataclasses

import pytest

from orchestrator.config import ModelConfig
from orchestrator.plan.compute import (
    ENDS_KERNELS,
    LAYER_KERNELS,
    KernelTimes,
    Rates,
    attention_time,
    estimated_kernels,
    gemm_time,
    kernel_counts,
    micro_batch_time,
)
from orchestrator.run.planning import plan_trial
from orchestrator.spec import build_spec

H100 = Rates(
    peak_flops=989e12,
    compute_efficiency=0.6,
    kn_efficiency=0.6,
    gemm_half_dim=128,
    cache_bytes=float("inf"),
    saturate_on_reduction=False,
    attention_efficiency=0.35,
    attention_backward_efficiency=0.25,
    memory_bytes_per_s=3350e9 * 0.7,
    op_overhead_s=5e-6,
)


def achieved(m, n, k, r=H100):
    return 2 * m * n * k / gemm_time(m, n, k, r, element_bytes=2) / r.peak_flops


def test_a_large_gemm_nears_the_ceiling_and_skinny_or_small_ones_fall_far_below():
    big = achieved(16384, 8192, 8192)
    assert 0.55 < big <= 0.6
    assert achieved(16384, 8192, 64) < big / 2  # a skinny inner dimension
    assert achieved(8, 8192, 8192) < 0.05  # a handful of rows: bound by reading the weight
    # The roofline: with k = 1 the product is the bytes of its output, not its FLOPs.
    m = n = 4096
    assert gemm_time(m, n, 1, H100, 2) == pytest.approx(2 * (m + n + m * n) / H100.memory_bytes_per_s)


def test_a_k_by_n_right_operand_runs_at_its_own_rate_where_each_model_has_one():
    def gemms(arch, kn):
        model = ModelConfig(arch=arch, hidden=1024, heads=16, n_layers=4, vocab=8192, seq_len=512, max_positions=512)
        t = micro_batch_time(
            model, 4, "none", estimated_kernels(model, 4, dataclasses.replace(H100, kn_efficiency=kn), 2)
        )
        return t.gemm_s, t.forward_s

    # A GPU runs every layout alike: the backward's two products are a forward's each.
    llama, llama_fwd = gemms("llama", 0.6)
    slow, slow_fwd = gemms("llama", 0.15)
    # nn.Linear (Llama): the forward reads its weight [n, k]; only dX = dY W is k x n.
    assert slow_fwd == pytest.approx(llama_fwd)
    assert slow == pytest.approx(llama / 3 * (2 + 4), rel=0.01)  # forward and dW as before, dX 4x as long
    # GPT-2's Conv1D stores [k, n]: its layers' forward is the slow one, and dX is not.
    gpt2, gpt2_fwd = gemms("gpt2", 0.6)
    assert gemms("gpt2", 0.15)[1] > 2 * gpt2_fwd


def test_one_cpu_thread_saturates_on_the_reduction_length_alone():
    cpu = dataclasses.replace(
        H100, peak_flops=10e9, gemm_half_dim=200, saturate_on_reduction=True, memory_bytes_per_s=20e9
    )
    # Measured on this CI machine, bf16, one thread: (512 x 64) @ (64 x 256) at 3 GFLOPS and
    # (512 x 256) @ (256 x 64) at 9: a short k, not a narrow output, is what is slow.
    assert achieved(512, 256, 64, cpu) < 0.5 * achieved(512, 64, 256, cpu)
    assert achieved(512, 64, 256, H100) == pytest.approx(achieved(512, 256, 64, H100))


def test_a_gemm_slows_only_where_both_operands_outgrow_the_cache():
    cpu = dataclasses.replace(H100, saturate_on_reduction=True, cache_bytes=4e6, memory_bytes_per_s=float("inf"))
    # The 128k-vocabulary lm_head at width 64: its dX, both operands over 16 MB, runs at
    # a fifth of the rate; its forward streams the weight against 16 KB of activations.
    no_cache = dataclasses.replace(cpu, cache_bytes=float("inf"))
    dx = achieved(128, 64, 128256, cpu)
    assert dx == pytest.approx(achieved(128, 64, 128256, no_cache) / (1 + 2 * 128256 * 64 / 4e6))
    assert dx < 0.25 * achieved(128, 64, 128256, no_cache)
    assert achieved(128, 128256, 64, cpu) == pytest.approx(achieved(128, 128256, 64, no_cache), rel=0.01)
    assert achieved(256, 256, 1024, cpu) > 0.85 * achieved(256, 256, 1024, no_cache)  # 0.5 MB operands: in cache


def test_fused_causal_attention_skips_half_the_square_and_its_backward_recomputes():
    model = ModelConfig(hidden=4096, heads=32, n_layers=1, seq_len=8192, max_positions=8192)
    fwd, bwd = attention_time(model, 1, H100, 2)
    square = 4 * 8192**2 * 4096
    assert fwd == pytest.approx(0.5 * square / (989e12 * 0.35))
    assert bwd / fwd == pytest.approx(2.5 * 0.35 / 0.25)
    eager_fwd, _ = attention_time(dataclasses.replace(model, attention="eager"), 1, H100, 2)
    assert eager_fwd > fwd  # the whole square, and the scores through memory


def test_micro_batch_size_changes_the_predicted_throughput():
    def tokens_per_s(micro):
        spec = build_spec(
            [
                "model=gpt2-125m",
                "hardware=h100-sxm",
                "parallel.dp=8",
                f"batch.micro_batch_size={micro}",
                "batch.global_batch_size=512",
            ]
        )
        return plan_trial(spec).time.tokens_per_sec_per_gpu

    rates = [tokens_per_s(m) for m in (1, 4, 16)]
    assert rates == sorted(rates) and rates[-1] > 1.2 * rates[0]


def test_long_sequences_spend_their_time_in_attention():
    def share(seq):
        model = ModelConfig(hidden=2048, heads=16, n_layers=24, vocab=50368, seq_len=seq, max_positions=seq)
        t = micro_batch_time(model, 65536 // seq, "none", estimated_kernels(model, 65536 // seq, H100, 2))
        return t.attention_s / t.total_s

    assert share(2048) < 0.2 < 0.5 < share(65536)


def test_full_recompute_runs_the_forward_again_and_selective_less():
    model = ModelConfig(hidden=4096, heads=32, n_layers=32, vocab=50368, seq_len=2048, max_positions=2048)
    none, sel, full = (
        micro_batch_time(model, 4, mode, estimated_kernels(model, 4, H100, 2)) for mode in ("none", "selective", "full")
    )
    assert none.forward_s == full.forward_s
    # full: the layers' forward once more (the lm_head and loss are outside the checkpoints)
    assert full.total_s - none.total_s == pytest.approx(none.forward_s, rel=0.1)
    assert none.total_s < sel.total_s < full.total_s


def test_a_tiny_model_is_its_fixed_cost_per_kernel():
    tiny = ModelConfig()  # 2 layers of width 64
    t = micro_batch_time(tiny, 1, "none", estimated_kernels(tiny, 1, dataclasses.replace(H100, op_overhead_s=10e-6), 2))
    assert t.overhead_s > 0.9 * t.total_s
    assert t.kernels == 2 * sum(LAYER_KERNELS["gpt2"]) + ENDS_KERNELS["gpt2"]  # each layer's, and the ends'


def test_full_recompute_launches_each_layers_forward_kernels_again():
    model = ModelConfig(arch="llama", n_layers=4)
    (fwd, bwd), (fwd_full, bwd_full) = kernel_counts(model, "none"), kernel_counts(model, "full")
    assert fwd_full == fwd and bwd_full - bwd == 4 * LAYER_KERNELS["llama"][0]
    assert kernel_counts(model, "none") < kernel_counts(model, "selective") < kernel_counts(model, "full")


def test_a_small_model_on_a_gpu_runs_at_its_hosts_pace_and_a_large_one_at_its_devices():
    host = dataclasses.replace(H100, host_op_s=40e-6)
    small = ModelConfig(hidden=256, heads=4, n_layers=4, vocab=50304, seq_len=256, max_positions=256)
    paced = micro_batch_time(small, 2, "none", estimated_kernels(small, 2, host, 2))
    free = micro_batch_time(small, 2, "none", estimated_kernels(small, 2, H100, 2))
    fwd, bwd = kernel_counts(small, "none")
    assert paced.host_s == pytest.approx((fwd + bwd) * 40e-6)
    # the device's own time is far shorter than the host's: each phase takes the host's
    assert free.total_s < paced.host_s / 2
    assert paced.forward_s == pytest.approx(fwd * 40e-6) and paced.total_s == pytest.approx(paced.host_s)
    assert paced.host_wait_s == pytest.approx(paced.total_s - free.total_s)
    large = ModelConfig(hidden=4096, heads=32, n_layers=8, vocab=50304, seq_len=2048, max_positions=2048)
    busy, alone = (micro_batch_time(large, 4, "none", estimated_kernels(large, 4, r, 2)) for r in (host, H100))
    assert busy.host_wait_s == 0 and busy.total_s == alone.total_s  # the host keeps ahead of long kernels
    # timed kernels hold the host's pace already: nothing is added to them
    timed = micro_batch_time(small, 2, "none", estimated_kernels(small, 2, host, 2), timed=True)
    assert timed.host_wait_s == 0


def test_the_host_paces_a_gpu_plan_only_and_says_so():
    gpu = plan_trial(build_spec(["hardware=h100-sxm", "model.hidden=256", "model.heads=4", "model.kv_heads=null"]))
    assert gpu.time.micro_batch.host_wait_s > 0 and "the host issues each kernel in 45 us" in " ".join(gpu.assumptions)
    cpu = plan_trial(build_spec(["hardware=cpu", "hardware.kernels=preset", "hardware.host_op_us=500"]))
    assert cpu.time.micro_batch.host_s == 0  # on a CPU the host is the device


def test_on_a_cpu_the_k_by_n_layout_runs_at_one_threads_rate_whatever_the_rank_has():
    # Measured on the CI machine: nn.Linear's layout runs 1.6-2.3x faster on two threads,
    # the k x n layout 0.9-1.35x (bench/RESULTS.md). Uses this host's measured peaks.
    from orchestrator import machine
    from orchestrator.measure import hardware
    from orchestrator.measure.trial_measurements import machine_facts
    from orchestrator.plan.rates import rates

    spec = build_spec(["hardware=cpu", "parallel.dp=1", "hardware.gemm_kn_efficiency=0.1"])  # as calibrate sets it
    hw = spec.cfg.hardware
    threads = machine.threads_per_rank(spec.gpus_per_node)
    rank_peak, _ = hardware.peak_tflops(hw, "bf16", threads)
    one_thread, _ = hardware.peak_tflops(hw, "bf16", 1)
    facts = machine_facts(spec)
    assert facts.peak_tflops == rank_peak and facts.peak_tflops_one_thread == one_thread
    r = rates(spec, facts)
    assert r.peak_flops * r.compute_efficiency == pytest.approx(rank_peak * 1e12 * hw.compute_efficiency)
    assert r.peak_flops * r.kn_efficiency == pytest.approx(one_thread * 1e12 * hw.gemm_kn_efficiency)
    gpu = build_spec(["hardware=h100-sxm", "parallel.dp=1"])
    assert rates(gpu, machine_facts(gpu)).kn_efficiency == gpu.cfg.hardware.compute_efficiency


def test_on_a_gpu_the_engines_hooks_run_on_the_host_beside_the_device():
    """Measured on a GPU: a block and the ends timed whole, and again on 8 tokens (the host's
    own time). The engine's hooks add to the host's side only: hidden behind a long device
    phase, paid where the host already sets the pace."""
    model = ModelConfig(n_layers=4)
    timed = dict(
        layer_gemms=(1e-3, 2e-3),
        head=(1e-3, 2e-3),
        attention=(1e-4, 2e-4),
        memory_bound=(1e-4, 2e-4),
        loss=(1e-4, 1e-4),
        launch_s=2e-6,
        block=(2e-3, 4e-3),
        ends=(2e-3, 3e-3),
    )
    fast_host = KernelTimes(**timed, host_block=(2e-4, 4e-4), host_ends=(1e-4, 2e-4))
    slow_host = KernelTimes(**timed, host_block=(4e-3, 8e-3), host_ends=(1e-3, 2e-3))
    device_bound = micro_batch_time(model, 2, "none", fast_host, timed=True, engine=(1e-3, 2e-3))
    assert device_bound.total_s == pytest.approx(4 * 6e-3 + 5e-3)  # layers x block + ends: the hooks hidden
    assert device_bound.engine_s == pytest.approx(3e-3) and device_bound.host_wait_s == pytest.approx(0, abs=1e-12)
    host_bound = micro_batch_time(model, 2, "none", slow_host, timed=True, engine=(1e-3, 2e-3))
    assert host_bound.forward_s == pytest.approx(4 * 4e-3 + 1e-3 + 1e-3)  # the host's, hooks included
    assert host_bound.total_s == pytest.approx(4 * 12e-3 + 3e-3 + 3e-3)
    assert host_bound.host_wait_s == pytest.approx(host_bound.total_s - (4 * 6e-3 + 5e-3))
    cpu = micro_batch_time(model, 2, "none", KernelTimes(**timed), timed=True, engine=(1e-3, 2e-3))
    assert cpu.total_s == pytest.approx(4 * 6e-3 + 5e-3 + 3e-3)  # on a CPU the hooks take the cores' time


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_eager_memory_traffic_is_what_the_workloads_own_block_moves(arch):
    """EAGER_LAYER_IO against a census of a real transformers block's forward and backward
    (bench/kernel_census.py: every aten op outside GEMMs and attention, its inputs and outputs)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    from kernel_census import SHAPES, block_census

    from orchestrator.plan.compute import EAGER_LAYER_IO

    hidden, ffn, kv_heads = SHAPES[2]  # the GQA shape: all three terms at work
    counted = block_census(arch, hidden, ffn, kv_heads)["bytes"]["memory"]
    a, b, c = EAGER_LAYER_IO[(arch, 2)]
    kv = hidden // 4 * kv_heads if arch == "llama" else 0
    assert a * hidden + b * ffn + c * kv == pytest.approx(counted, rel=0.02)


def test_torch_compile_is_planned_as_fused_kernels_and_fewer_launches():
    """run.compile=true: a Llama block's norms, rotary and SwiGLU fused (fewer bytes, a third
    of the kernels); GPT-2's LayerNorm and GELU are single kernels already, so less changes."""

    def micro(arch: str, compiled: bool):
        base = ["model=llama3-8b", "model.n_layers=8"] if arch == "llama" else ["model=gpt2-350m"]
        return plan_trial(
            build_spec([*base, "hardware=h100-sxm", f"run.compile={str(compiled).lower()}"])
        ).time.micro_batch

    eager, fused = micro("llama", False), micro("llama", True)
    # (the loss over a 128k vocabulary is the same kernels either way)
    assert fused.memory_bound_s < 0.6 * eager.memory_bound_s and fused.kernels < 0.45 * eager.kernels
    assert fused.gemm_s == eager.gemm_s and fused.attention_s == eager.attention_s  # library calls either way
    g_eager, g_fused = micro("gpt2", False), micro("gpt2", True)
    assert 0.5 * g_eager.memory_bound_s < g_fused.memory_bound_s < g_eager.memory_bound_s
    assert g_fused.kernels > 0.9 * g_eager.kernels
