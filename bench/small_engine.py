"""The small DeepSpeed engine the rank probes build (collective_wait_probe.py,
profiled_step_probe.py, per_rank_overhead.py): an MLP of 8 square layers, a global batch of
8 in micro batches of 4 over two ranks, AdamW, and ZeRO's gradient buckets overlapped from
stage 1. DeepSpeed is imported inside: a probe may wrap torch.distributed before it is."""

import torch

LAYERS = 8


def deepspeed_mlp(stage: int, width: int = 512, reduce_bucket: int = 200_000):
    """(model, engine) at ZeRO `stage`: the model before DeepSpeed wraps it, and its engine."""
    import deepspeed

    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(LAYERS)])
    config = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": stage, "overlap_comm": stage > 0, "reduce_bucket_size": reduce_bucket},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return model, engine
