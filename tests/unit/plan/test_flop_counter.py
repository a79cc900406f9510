"""The analytic FLOPs against torch's FlopCounterMode on the real transformers model.

FlopCounterMode counts every matmul the model really runs, forward and backward. It
counts attention's QK^T and AV over the full s x s square (it ignores the causal mask),
so the check uses the analytic model with causal_half=False; the plan itself counts
causal attention at half (orchestrator/plan/flops.py). Eager attention runs as plain
bmms; sdpa's backward also recomputes the scores, which FlopCounterMode counts as well
(14Lsh instead of 12Lsh), so eager is the like-for-like comparison.
"""

import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from orchestrator.plan.flops import flops_per_token
from orchestrator.spec import build_spec
from orchestrator.workload.model import build_model

SHAPES = {
    "gpt2": dict(arch="gpt2", n_layers=2, hidden=128, heads=4, kv_heads=4, ffn_hidden=512, vocab=1024),
    "llama": dict(
        arch="llama", n_layers=2, hidden=128, heads=4, kv_heads=2, ffn_hidden=352, vocab=1024, tie_embeddings=False
    ),
}


@pytest.mark.parametrize("seq_len", [64, 256, 512])
@pytest.mark.parametrize("arch", SHAPES)
def test_model_flops_within_3_percent_of_flop_counter(arch, seq_len):
    m = dataclasses.replace(
        build_spec([]).cfg.model, **SHAPES[arch], attention="eager", seq_len=seq_len, max_positions=max(seq_len, 512)
    )
    torch.manual_seed(0)
    model = build_model(m)
    batch = 2
    tokens = torch.randint(0, m.vocab, (batch, seq_len))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=tokens, labels=tokens).loss.backward()
    measured = counter.get_total_flops() / (batch * seq_len)
    predicted, _, _ = flops_per_token(m, "none", causal_half=False)
    assert predicted == pytest.approx(measured, rel=0.03)
