"""Gradient accumulation for the engines whose optimizer step is ours to call (accelerate's
DDP, FSDP2): which micro batch synchronises gradients and steps. DeepSpeed counts its
micro batches itself (gradient_accumulation_steps in ds_config.json)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from orchestrator.plan.batch import grad_accum_steps


class MicroBatches:
    """Micro batches toward the next optimizer step, at the global batch of the moment (the
    batch warm-up changes it between steps)."""

    def __init__(self, global_batch: int, micro_batch_size: int, dp: int):
        self.global_batch, self.micro_batch_size, self.dp = global_batch, micro_batch_size, dp
        self.done = 0

    @property
    def grad_accum(self) -> int:
        return grad_accum_steps(self.global_batch, self.micro_batch_size, self.dp)

    def backward_and_step(
        self,
        loss: torch.Tensor,
        backward: Callable[[torch.Tensor, bool], None],
        optimizer: torch.optim.Optimizer,
        clip: Callable[[], object] | None = None,
    ) -> None:
        """backward(scaled_loss, sync): sync is False on all but the last micro batch, whose
        gradients the engine then reduces; after the last one, clip and step."""
        self.done += 1
        last = self.done == self.grad_accum
        backward(loss / self.grad_accum, last)
        if last:
            if clip:
                clip()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            self.done = 0
