"""The plan's parameter count equals the real transformers model's, for every preset and odd
shapes, and so does its number of parameter tensors (ZeRO-3 gathers each persistent one in a
call of its own after step(): plan/comm.py)."""

import dataclasses

import pytest

from orchestrator.hydra_glue.conf_tree import presets
from orchestrator.plan.params import count_parameters, parameter_tensors
from orchestrator.spec import build_spec
from orchestrator.workload.model import build_model


def real_count(m) -> tuple[int, int]:
    """(elements, tensors) of the real model."""
    model = build_model(m, device="meta")  # shapes only: 175B costs no memory
    return sum(p.numel() for p in model.parameters()), len(list(model.parameters()))


def planned(m) -> tuple[int, int]:
    return count_parameters(m), len(parameter_tensors(m))


@pytest.mark.parametrize("preset", presets("model"))
def test_every_preset(preset):
    m = build_spec([f"model={preset}", "hardware=h100-sxm"]).cfg.model
    assert planned(m) == real_count(m)


ODD = [
    dict(
        arch="gpt2",
        n_layers=3,
        hidden=96,
        heads=3,
        kv_heads=3,
        ffn_hidden=200,
        vocab=1001,
        seq_len=50,
        max_positions=77,
        tie_embeddings=False,
    ),
    dict(
        arch="gpt2",
        n_layers=1,
        hidden=8,
        heads=1,
        kv_heads=1,
        ffn_hidden=None,
        vocab=7,
        seq_len=4,
        max_positions=4,
        tie_embeddings=True,
    ),
    dict(
        arch="llama",
        n_layers=3,
        hidden=96,
        heads=6,
        kv_heads=2,
        ffn_hidden=250,
        vocab=999,
        seq_len=64,
        max_positions=64,
        tie_embeddings=True,
    ),
    dict(
        arch="llama",
        n_layers=2,
        hidden=64,
        heads=4,
        kv_heads=1,
        ffn_hidden=172,
        vocab=300,
        seq_len=16,
        max_positions=16,
        tie_embeddings=False,
    ),
]


@pytest.mark.parametrize("shape", ODD, ids=lambda s: f"{s['arch']}-L{s['n_layers']}-h{s['hidden']}-kv{s['kv_heads']}")
def test_odd_shapes(shape):
    m = dataclasses.replace(build_spec([]).cfg.model, **shape)
    assert planned(m) == real_count(m)
