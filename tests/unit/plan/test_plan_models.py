"""The planner's pure models against the theory's worked numbers and against themselves."""

import dataclasses

import pytest

from orchestrator.config import ModelConfig
from orchestrator.plan.activations import activation_bytes, activations_per_layer, recompute_bytes
from orchestrator.plan.flops import attention_forward_per_token, flops_per_token, layer_matmul_forward_per_token
from orchestrator.plan.memory import ZeroLayout, model_states, sub_groups
from orchestrator.plan.params import count_parameters, matmul_parameters, parameter_tensors
from orchestrator.spec import build_spec

GPU = ["hardware=h100-sxm"]


def model(preset: str, *more: str) -> ModelConfig:
    return build_spec([f"model={preset}", *GPU, *more]).cfg.model


def layout(stage: int, dp: int = 8, precision: str = "bf16", **kw) -> ZeroLayout:
    base = dict(
        stage=stage,
        dp=dp,
        precision=precision,
        reduce_bucket_size=5 * 10**8,
        overlap_comm=True,
        contiguous_gradients=True,
        prefetch_bucket_size=5 * 10**7,
        max_live_parameters=10**9,
        param_persistence_threshold=0,
        sub_group_size=10**9,
        offload_optimizer=False,
        offload_param=False,
    )
    return ZeroLayout(**{**base, **kw})


def states_bytes(s: dict) -> int:
    return s["params"] + s["grads"] + s["optimizer"]


# --- parameters -------------------------------------------------------------------


def test_gpt_count_is_the_theory_formula_plus_position_embeddings():
    m = model("gpt2-1.3b")
    h, v, L = m.hidden, m.vocab, m.n_layers
    assert count_parameters(m) == h * v + L * (12 * h * h + 13 * h) + 2 * h + m.max_positions * h


# --- model states: 16N, 20N, the ZeRO paper's ratios -------------------------------------


@pytest.mark.parametrize("preset", ["gpt2-1.3b", "llama3-8b", "llama3-70b"])
def test_stage0_mixed_precision_is_16n_and_20n_inside_the_optimizer_step(preset):
    m = model(preset)
    n = count_parameters(m)
    s = model_states(m, layout(0, dp=1))
    assert states_bytes(s) == 16 * n  # 2 (bf16 params) + 2 (grads) + 4 (fp32 master) + 8 (Adam)
    assert states_bytes(s) + s["optimizer_step"] == 20 * n  # + the fp32 gradient copy in step()
    fp32 = model_states(m, layout(0, dp=1, precision="fp32"))
    assert states_bytes(fp32) == 16 * n and fp32["optimizer_step"] == 0  # 4 + 4 + 8, no master copy


@pytest.mark.parametrize("billions,gb16,gb20", [(1, 16, 20), (7, 112, 140), (70, 1120, 1400), (405, 6480, 8100)])
def test_theory_memory_table(billions, gb16, gb20):
    # 16 bytes per parameter with bf16 mixed precision and Adam, 20 with fp32 gradient
    # accumulation (ZeRO, Rajbhandari et al., 2020, section 3.1), from the plan's stage-0 states.
    m = model("llama3-8b")
    s = model_states(m, layout(0, dp=1))
    per_param_16 = states_bytes(s) / count_parameters(m)
    per_param_20 = (states_bytes(s) + s["optimizer_step"]) / count_parameters(m)
    assert per_param_16 * billions == gb16 and per_param_20 * billions == gb20


@pytest.mark.parametrize("dp", [2, 8, 64])
def test_zero_stages_partition_as_the_zero_paper_says(dp):
    m = model("llama3-8b")
    n = count_parameters(m)
    expected = {1: 2 * n + 2 * n + 12 * n / dp, 2: 2 * n + 14 * n / dp, 3: 16 * n / dp}
    for stage, bytes_ in expected.items():
        assert states_bytes(model_states(m, layout(stage, dp))) == pytest.approx(bytes_, rel=1e-9, abs=16)


def test_zero_paper_7_5b_on_64_gpus():
    # ZeRO paper, Figure 1: 7.5B parameters, 64 GPUs: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
    m = dataclasses.replace(model("llama3-8b"), n_layers=33, vocab=32000)  # ~7.5B
    n = count_parameters(m)
    assert 7.0e9 < n < 8.0e9
    got = [states_bytes(model_states(m, layout(st, 64))) / n * 7.5e9 / 1e9 for st in (0, 1, 2, 3)]
    assert got == pytest.approx([120, 31.4, 16.6, 1.9], abs=0.1)


@pytest.mark.parametrize("dp", [2, 16, 1024])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_model_states_shrink_with_each_stage(dp, precision):
    m = model("gpt2-1.3b")
    totals = [states_bytes(model_states(m, layout(st, dp, precision))) for st in (0, 1, 2, 3)]
    assert totals[3] <= totals[2] <= totals[1] <= totals[0]


def test_offload_moves_optimizer_and_parameters_to_the_host():
    m = model("llama3-8b")
    plain = model_states(m, layout(3, 8))
    off = model_states(m, layout(3, 8, offload_optimizer=True, offload_param=True))
    assert off["optimizer"] == 0 and off["params"] == 0 and off["optimizer_step"] == 0
    assert off["offloaded"] == plain["optimizer"] + plain["optimizer_step"] + plain["params"]


def test_stage3_keeps_small_parameters_whole_on_every_rank():
    m = model("gpt2-125m")
    none_persist = model_states(m, layout(3, 8, param_persistence_threshold=0))["params"]
    persist = model_states(m, layout(3, 8, param_persistence_threshold=10**5))["params"]
    assert persist > none_persist


def test_zero3_cuts_its_partition_into_sub_groups_as_deepspeed_does():
    # A sub-group closes at the parameter that takes it to sub_group_size elements or more
    # (tests/test_plan_drift.py holds the rule against a real engine's groups).
    assert sub_groups([5, 5, 5, 5, 5], 12) == [15, 10]
    assert sub_groups([5, 5, 5, 5, 5], 100) == [25]
    assert sub_groups([20, 1, 1], 10) == [20, 2]
    assert sub_groups([5, 5], 10) == [10]


def test_zero3_steps_with_the_fp32_gradients_of_one_sub_group_at_a_time():
    # gpt2-1.3b at ZeRO-3 on one H200 peaked 2.2 GiB under a plan that counted the whole
    # partition's fp32 gradients and AdamW temporaries (bench/RESULTS.md): its 1.3e9
    # elements step in two sub-groups, the first closing just past 1e9.
    m = model("gpt2-1.3b")
    n = count_parameters(m)
    whole = model_states(m, layout(3, 1, sub_group_size=n))
    cut = model_states(m, layout(3, 1, sub_group_size=10**9))
    assert whole["optimizer_step"] == whole["optimizer_temporaries"] == 4 * n
    # past 1e9 by less than the tensor that closes it (at most a layer's largest, an MLP matrix)
    assert 4 * 10**9 <= cut["optimizer_step"] == cut["optimizer_temporaries"] < 4 * (10**9 + m.hidden * m.ffn)
    assert cut["static"] == whole["static"] and cut["optimizer"] == whole["optimizer"]  # kept between steps: unchanged


def test_reduce_buckets_cost_their_configured_size_even_for_a_tiny_model():
    m = model("tiny")
    two = model_states(m, layout(2, 2, reduce_bucket_size=5 * 10**8))["buffers"]
    assert two == 2 * 2 * 5 * 10**8  # two bf16 buckets with overlap_comm, as DeepSpeed allocates
    assert model_states(m, layout(2, 2, reduce_bucket_size=5 * 10**8, overlap_comm=False))["buffers"] == two // 2


# --- activations ------------------------------------------------------------------


def test_eager_gpt_with_dropout_is_korthikanti():
    m = dataclasses.replace(model("gpt2-1.3b"), attention="eager", dropout=0.1)
    s, b, h, a = m.seq_len, 2, m.hidden, m.heads
    # Korthikanti leaves out the norms' fp32 mean and rstd (4 values of s*b per layer).
    assert activations_per_layer(m, b, "none", "bf16") - 2 * 2 * 4 * s * b == s * b * h * (34 + 5 * a * s / h)
    # selective keeps the block input and the linear layers' outputs: 2 + 6 + 2 + 8 + 2
    assert activations_per_layer(m, b, "selective", "bf16") == 20 * s * b * h


def test_selective_recompute_saves_at_least_the_theorys_70_percent_at_gpt3_scale():
    # Korthikanti et al. recompute only the attention core and keep 34sbh: -70 % at GPT-3
    # 175B. The workload's policy also recomputes norms and activations: it saves more.
    m = dataclasses.replace(model("gpt3-175b"), attention="eager", dropout=0.1)
    none = activations_per_layer(m, 1, "none", "bf16")
    s, h, a = m.seq_len, m.hidden, m.heads
    korthikanti = 1 - 34 / (34 + 5 * a * s / h)
    assert korthikanti == pytest.approx(0.70, abs=0.01)
    assert 1 - activations_per_layer(m, 1, "selective", "bf16") / none >= korthikanti


def test_full_recompute_keeps_one_hidden_state_per_layer():
    m = model("gpt2-1.3b")
    full = activation_bytes(m, 4, "full", "bf16")
    none = activation_bytes(m, 4, "none", "bf16")
    one_block = activations_per_layer(m, 4, "none", "bf16")
    sbh = m.seq_len * 4 * m.hidden
    layers_full = m.n_layers * 2 * sbh  # 2 bytes x s x b x h per layer (000, section 8.2.1)
    assert full - layers_full == none - m.n_layers * one_block  # the head (norm, logits) is the same
    assert full < activation_bytes(m, 4, "selective", "bf16") <= none
    # Backward rebuilds one whole block at a time under full recompute, the dropped parts under selective.
    assert recompute_bytes(m, 4, "full", "bf16") == one_block
    assert recompute_bytes(m, 4, "selective", "bf16") == one_block - activations_per_layer(m, 4, "selective", "bf16")
    assert recompute_bytes(m, 4, "none", "bf16") == 0


def test_static_is_what_deepspeed_keeps_between_steps():
    # As a census after step() finds it (bench/memory_matrix.py): stages 0-2 free the
    # gradients; ZeRO-3 keeps its flat gradient partition and its reduce bucket.
    m = model("gpt2-125m")
    n = count_parameters(m)
    assert model_states(m, layout(0, 1))["static"] == 14 * n
    assert model_states(m, layout(0, 1, precision="fp32"))["static"] == 12 * n
    padded = -(-n // 16) * 16  # stages 1-2 pad the flat buffer to a multiple of 2 x dp
    for stage in (1, 2):
        assert model_states(m, layout(stage, 8))["static"] == 2 * padded + 12 * padded // 8
    s3 = model_states(m, layout(3, 8, reduce_bucket_size=10**6))
    shard = sum(-(-p.numel // 8) for p in parameter_tensors(m))
    assert s3["static"] == 16 * shard + 2 * 10**6


@pytest.mark.parametrize("preset", ["gpt2-350m", "llama3-8b"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_activations_grow_with_batch_and_sequence(preset, recompute):
    m = model(preset)
    by_batch = [activation_bytes(m, b, recompute, "bf16") for b in (1, 2, 4, 8)]
    assert by_batch == sorted(by_batch) and by_batch[0] < by_batch[-1]
    by_seq = [activation_bytes(dataclasses.replace(m, seq_len=s), 2, recompute, "bf16") for s in (256, 512, 1024, 2048)]
    assert by_seq == sorted(by_seq) and by_seq[0] < by_seq[-1]


# --- FLOPs ------------------------------------------------------------------------


def test_model_flops_are_6n_plus_causal_attention():
    m = model("gpt2-1.3b")
    model_f, hardware_f, forward = flops_per_token(m, "none")
    assert model_f == 6 * matmul_parameters(m) + 6 * m.n_layers * m.seq_len * m.hidden  # half of PaLM's 12Lsh
    assert hardware_f == model_f and forward == model_f / 3


def test_recompute_adds_forward_work_to_hardware_flops_only():
    m = model("gpt2-1.3b")
    model_none, _, _ = flops_per_token(m, "none")
    model_full, hw_full, _ = flops_per_token(m, "full")
    _, hw_sel, _ = flops_per_token(m, "selective")
    assert model_full == model_none
    assert hw_full - model_full == layer_matmul_forward_per_token(m) + attention_forward_per_token(m)
    assert model_none < hw_sel < hw_full
    assert 1.25 < hw_full / model_full < 4 / 3 + 1e-9  # "8N instead of 6N", less the lm_head


@pytest.mark.parametrize("stage, buckets", [(1, 2), (2, 2), (3, 1)])
def test_a_cpu_holds_only_the_written_part_of_its_reduce_buckets(stage, buckets):
    """DeepSpeed allocates its reduce buckets whole (5e8 elements by default) and the
    gradients write at most the model's size into each: a CPU commits only written pages,
    so its plan's total leaves the rest out (the allocator's count keeps it, `allocated`);
    a GPU's caching allocator holds all of it."""
    from orchestrator.run.planning import plan_trial

    cpu = plan_trial(build_spec(["hardware=cpu", f"zero=stage{stage}"])).memory
    n = count_parameters(build_spec(["hardware=cpu"]).cfg.model)
    assert cpu.untouched == 2 * (500_000_000 - n) * buckets  # bf16 elements past the model's n
    assert cpu.total < cpu.allocated <= cpu.total + cpu.untouched
    assert cpu.untouched_static == (cpu.untouched if stage == 3 else 0)  # ZeRO-3 keeps its bucket between steps
    gpu = plan_trial(build_spec([*GPU, "hardware.memory_gib=80", f"zero=stage{stage}"])).memory
    assert gpu.untouched == 0 and gpu.total == gpu.allocated
    # a bucket smaller than the model is written whole: nothing is left out
    small = plan_trial(build_spec(["hardware=cpu", f"zero=stage{stage}", "zero.reduce_bucket_size=1e4"])).memory
    assert small.untouched == 0 and small.total == small.allocated


@pytest.mark.parametrize(
    "overrides",
    [
        ["zero=stage2"],
        ["zero=stage3", "parallel.dp=8"],
        ["recompute=full"],
        ["model.vocab=8", "zero=stage1"],
        ["hardware=cpu", "hardware.kernels=preset", "zero=stage2", "parallel.dp=2"],
    ],
)
def test_what_the_peak_is_made_of_adds_up_to_the_total(overrides):
    """The memory table's rows are each component's own figure, not all alive at once: the
    line under its total names what the peak holds, and that adds up to it."""
    from orchestrator.run.planning import plan_trial

    plan = plan_trial(build_spec(["model=gpt2-1.3b", "hardware=h100-sxm", *overrides]))
    assert sum(v for _, v in plan.memory.at_peak()) == plan.memory.total
