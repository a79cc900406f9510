"""Batch arithmetic: gradient accumulation and the global-batch warm-up schedule.

Pure functions of integers, shared by the spec (which validates and derives), the plan
and the workload (which applies the schedule step by step).

The warm-up follows Megatron-LM's --rampup-batch-size: the global batch starts at
`start` sequences and grows by `increment` every ramp_tokens / n_increments tokens until
it reaches `end`. A schedule is a list of (from_token, global_batch_size): the batch size
in force once that many tokens have been consumed.
"""

from __future__ import annotations

BatchSchedule = list[tuple[int, int]]


def grad_accum_steps(global_batch_size: int, micro_batch_size: int, dp: int) -> int:
    """gbs = mbs x ga x dp (DeepSpeed's train_batch_size); the caller checks divisibility."""
    return global_batch_size // (micro_batch_size * dp)


def warmup_schedule(start: int, end: int, increment: int, ramp_tokens: int) -> BatchSchedule:
    """[(0, start), (t1, start + inc), ..., (ramp_tokens, end)] with equal token intervals."""
    if start == end:
        return [(0, end)]
    n_increments = (end - start) // increment
    return [(round(i * ramp_tokens / n_increments), start + i * increment) for i in range(n_increments + 1)]


def global_batch_at(schedule: BatchSchedule, consumed_tokens: int) -> int:
    """The global batch size in force after `consumed_tokens` tokens."""
    size = schedule[0][1]
    for from_token, gbs in schedule:
        if consumed_tokens >= from_token:
            size = gbs
    return size


def batch_sizes_per_step(schedule: BatchSchedule, steps: int, seq_len: int) -> list[int]:
    """The global batch (sequences) of each of `steps` optimizer steps."""
    sizes, consumed = [], 0
    for _ in range(steps):
        size = global_batch_at(schedule, consumed)
        sizes.append(size)
        consumed += size * seq_len
    return sizes
