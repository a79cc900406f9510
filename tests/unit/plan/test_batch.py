"""The batch arithmetic: grad accumulation and the Megatron-style warm-up schedule."""

import pytest

from orchestrator.plan.batch import batch_sizes_per_step, global_batch_at, grad_accum_steps, warmup_schedule


def test_grad_accum_is_global_over_micro_times_dp():
    assert grad_accum_steps(512, 4, 16) == 8
    assert grad_accum_steps(8, 4, 2) == 1


@pytest.mark.parametrize("start,end,inc,ramp", [(8, 32, 8, 16384), (3072, 15360, 64, 469_000_000), (16, 16, 8, 100)])
def test_warmup_schedule_ramps_in_equal_token_steps(start, end, inc, ramp):
    schedule = warmup_schedule(start, end, inc, ramp)
    tokens = [t for t, _ in schedule]
    sizes = [s for _, s in schedule]
    assert schedule[0] == (0, start) and sizes[-1] == end
    assert all(b - a == inc for a, b in zip(sizes, sizes[1:]))
    assert tokens == sorted(tokens) and (len(schedule) == 1 or tokens[-1] == ramp)
    gaps = [b - a for a, b in zip(tokens, tokens[1:])]
    assert not gaps or max(gaps) - min(gaps) <= 1  # equal intervals up to rounding


def test_batch_in_force_follows_consumed_tokens():
    schedule = [(0, 8), (1000, 16), (2000, 24)]
    assert [global_batch_at(schedule, t) for t in (0, 999, 1000, 1999, 2000, 10**9)] == [8, 8, 16, 16, 24, 24]
    # 10 tokens per sequence: 80 tokens per step at 8, so the switch to 16 comes at step 13.
    sizes = batch_sizes_per_step(schedule, 20, seq_len=10)
    assert sizes[:13] == [8] * 13 and sizes[13] == 16 and sizes[-1] == 24


def test_micro_batches_sync_and_step_only_on_the_last_one_at_the_batch_of_the_moment():
    import torch

    from orchestrator.workload.accumulation import MicroBatches

    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    syncs, scaled = [], []

    def backward(loss, sync):
        syncs.append(sync)
        scaled.append(loss.item())
        loss.backward()

    micro = MicroBatches(global_batch=8, micro_batch_size=2, dp=2)  # 2 micro batches a step
    for _ in range(2):
        micro.backward_and_step((weight * 3).sum(), backward, optimizer)
    assert syncs == [False, True] and scaled == [3.0, 3.0]  # each loss divided by grad_accum
    assert weight.tolist() == [-2.0, -2.0] and weight.grad is None  # one step on the summed gradient, then freed
    micro.global_batch = 4  # warm-up: now one micro batch a step
    micro.backward_and_step((weight * 1).sum(), backward, optimizer)
    assert syncs[-1] is True and weight.tolist() == [-3.0, -3.0]
