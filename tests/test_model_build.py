"""Building the trial's model: the same weights from the same seed, whole or partitioned.

ZeRO-3 builds the model partitioned (deepspeed.zero.Init through transformers), so no
rank holds it whole. Two real ranks under torchrun with gloo, real transformers models.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from orchestrator.config import ModelConfig
from orchestrator.workload.model import build_model

SHAPES = {
    "gpt2": dict(arch="gpt2", n_layers=2, hidden=64, heads=4, vocab=512, seq_len=32, max_positions=64),
    "llama": dict(
        arch="llama",
        n_layers=2,
        hidden=64,
        heads=4,
        kv_heads=2,
        ffn_hidden=128,
        vocab=512,
        seq_len=32,
        max_positions=64,
        tie_embeddings=False,
    ),
}

RANK = r"""
import json, math, os, sys
import deepspeed, torch
from orchestrator.config import ModelConfig
from orchestrator.workload.deepspeed_compat import leave_shm_comm_unbuilt
from orchestrator.workload.model import build_model

leave_shm_comm_unbuilt()  # as a CPU rank does
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
rank = int(os.environ["RANK"])
shapes, out = json.loads(sys.argv[1]), sys.argv[2]
ds = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
      "zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
for arch, shape in shapes.items():  # one launch builds every architecture (a rank's start-up is most of its CPU)
    m = ModelConfig(**shape)
    whole = dict(build_model(m, seed=11).named_parameters())
    parted = build_model(m, seed=11, zero3_config=ds)
    held, full, equal = 0, 0, True
    for name, p in parted.named_parameters():
        held += p.ds_tensor.numel()  # this rank's partition, before anything gathers it
        full += p.ds_numel
        with deepspeed.zero.GatheredParameters([p]):
            # zero.Init keeps the bf16 of the config; DeepSpeed casts a whole-built model the same way.
            equal &= torch.equal(p.detach(), whole[name].detach().to(p.dtype))
    with open(f"{out}/{arch}-rank{rank}.json", "w") as f:
        json.dump({"held": held, "full": full, "equal": bool(equal), "ranks": int(os.environ["WORLD_SIZE"])}, f)
torch.distributed.barrier()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # as the workload leaves: gloo's threads can abort a process in C++ static destructors
"""


@pytest.fixture(scope="module")
def zero3_built(tmp_path_factory):
    """Both architectures built partitioned by two real ranks, in one torchrun launch."""
    out = tmp_path_factory.mktemp("zero3-build")
    script = out / "rank.py"
    script.write_text(RANK)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(script),
            json.dumps(SHAPES),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_zero3_builds_partitioned_with_the_weights_of_the_whole_model(zero3_built, arch):
    ranks = [json.loads((zero3_built / f"{arch}-rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert r["equal"]  # gathered, every parameter is the whole-built one
        assert r["full"] / 2 <= r["held"] <= r["full"] / 2 + 64  # half of every tensor (rounded up), never the whole
        assert r["ranks"] == 2
    assert ranks[0]["full"] == sum(p.numel() for p in build_model(ModelConfig(**SHAPES[arch])).parameters())


def test_the_seed_alone_decides_the_weights():
    m = ModelConfig(**SHAPES["gpt2"])
    torch.manual_seed(123)  # whatever was drawn before does not matter
    a = dict(build_model(m, seed=5).named_parameters())
    b = dict(build_model(m, seed=5).named_parameters())
    c = dict(build_model(m, seed=6).named_parameters())
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not torch.equal(a["transformer.h.0.attn.c_attn.weight"], c["transformer.h.0.attn.c_attn.weight"])
    # transformers' initialisation, not torch's defaults: N(0, 0.02), the residual projections
    # scaled by 1 / sqrt(2 x layers)
    assert a["transformer.h.0.attn.c_attn.weight"].std().item() == pytest.approx(0.02, rel=0.1)
    assert a["transformer.h.0.attn.c_proj.weight"].std().item() == pytest.approx(0.02 / 2, rel=0.15)
