"""FLOPs per token: model FLOPs (for MFU) and hardware FLOPs (for HFU, with recompute).

Model FLOPs per token = 6 x (matmul parameters) + attention, the 6N of Kaplan et al.
counted on the parameters that really multiply (every layer weight and the lm_head;
not the embedding lookups, biases or norms) plus the attention matmuls QK^T and AV:
4sh per layer forward for the full s x s square, x3 for forward + backward.

Causal attention is counted at HALF that square (6Lsh instead of PaLM's 12Lsh): the
masked upper triangle is not useful work and flash kernels skip it. Calculators that
count the full square report a higher MFU for the same run; the plan says which it uses
(`attention_flops` in its JSON).

Hardware FLOPs add what recompute does again: full recompute one more forward of every
block (8N-style instead of 6N); selective recompute the attention core's forward.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from orchestrator.config import ModelConfig
from orchestrator.plan.params import matmul_parameters

ATTENTION_COUNTING = "causal, half of the s x s square"


@dataclass(frozen=True)
class Flops:
    model_per_token: float  # forward + backward, no recompute
    hardware_per_token: float  # plus recomputation
    forward_per_token: float  # the forward alone (a third of model FLOPs)
    per_step: float  # hardware FLOPs of one optimizer step, all ranks
    attention_flops: str = ATTENTION_COUNTING

    def as_dict(self) -> dict:
        return asdict(self)


def attention_forward_per_token(m: ModelConfig, causal_half: bool = True) -> float:
    """QK^T and AV of every layer for one token: half the square (causal) or all of it."""
    return (0.5 if causal_half else 1.0) * 4 * m.n_layers * m.seq_len * m.hidden


def layer_matmul_forward_per_token(m: ModelConfig) -> float:
    """2 FLOPs per matmul weight of the blocks (the lm_head is outside any checkpoint)."""
    head = m.vocab * m.hidden
    return 2 * (matmul_parameters(m) - head)


def flops_per_token(m: ModelConfig, recompute: str, causal_half: bool = True) -> tuple[float, float, float]:
    """(model, hardware, forward) FLOPs per token.

    causal_half=False counts the whole s x s square, as torch's FlopCounterMode and
    PaLM-style calculators do (tests/unit/plan/test_flop_counter.py checks against the former).
    """
    forward = 2 * matmul_parameters(m) + attention_forward_per_token(m, causal_half)
    model = 3 * forward
    if recompute == "full":
        extra = layer_matmul_forward_per_token(m) + attention_forward_per_token(m)
    elif recompute == "selective":
        extra = attention_forward_per_token(m)
    else:
        extra = 0.0
    return model, model + extra, forward


def flops(m: ModelConfig, recompute: str, tokens_per_step: int) -> Flops:
    model, hardware, forward = flops_per_token(m, recompute)
    return Flops(
        model_per_token=model,
        hardware_per_token=hardware,
        forward_per_token=forward,
        per_step=hardware * tokens_per_step,
    )
