"""HSDP (parallel.replicate): FSDP2 on torch's 2D device mesh, shard within a group of ranks
and replicate across groups; planned level by level, translated, and run here for real on
four CPU ranks with gloo. The SLURM layouts (4 nodes x 2 ranks) are tests/test_multinode.py's."""

import json

import pytest

from orchestrator.run.planning import plan_trial
from orchestrator.spec import build_spec
from tests.conftest import run_in_process

GPUS = ["hardware=h100-sxm", "cluster=slurm", "cluster.gpus_per_node=8", "model=gpt2-1.3b", "engine=fsdp"]


def _plan(*overrides):
    return plan_trial(build_spec([*GPUS, "parallel.dp=32", *overrides])).as_dict()


def test_hsdp_gathers_within_a_node_and_all_reduces_each_gradient_shard_between_nodes():
    flat, hsdp = _plan(), _plan("parallel.replicate=4", "parallel.shard_within_node=true")
    by_op = {op: [c for c in hsdp["comm"]["collectives"] if c["op"] == op] for op in ("all_gather", "reduce_scatter")}
    assert all(c["level"] == "intra" for cs in by_op.values() for c in cs)  # the shard group is one node
    (across,) = [c for c in hsdp["comm"]["collectives"] if c["op"] == "all_reduce"]
    (scatter,) = by_op["reduce_scatter"]
    assert across["level"] == "inter" and across["calls"] == scatter["calls"]  # one per block and the root
    # what crosses the nodes is a shard of each block's gradients, 1/8 of what the group scatters
    assert across["bytes_per_call"] == pytest.approx(scatter["bytes_per_call"] / 8, rel=0.01)
    assert {c["level"] for c in flat["comm"]["collectives"]} == {"inter"}  # full shard: every call across nodes
    assert "all_reduce" not in {c["op"] for c in flat["comm"]["collectives"]}
    # each rank keeps 1/8 of the model's sharded state, not 1/32
    assert hsdp["memory"]["static"] == pytest.approx(4 * flat["memory"]["static"], rel=0.01)


def test_the_translated_explanation_names_the_2d_mesh():
    from orchestrator.translate.fsdp import explain, fsdp_settings

    spec = build_spec([*GPUS, "parallel.dp=32", "parallel.replicate=4"])
    assert fsdp_settings(spec)["mesh"] == {"replicate": 4, "shard": 8}
    assert "2D device mesh (replicate 4 x shard 8" in explain(spec)[0]
    from orchestrator.run.display import trial_label

    assert "dp=32 replicate=4 (shard 8)" in trial_label(spec)


@pytest.fixture(scope="module")
def hsdp_trial(tmp_path_factory):
    out = tmp_path_factory.mktemp("hsdp")
    proc = run_in_process(
        "run", "engine=fsdp", "model=tiny", "parallel.dp=4", "parallel.replicate=2", "run.steps=6",
        "logger.mode=disabled", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((out / "result.json").read_text())


@pytest.mark.slow
def test_hsdp_runs_on_a_2d_mesh_that_torch_built(hsdp_trial):
    engine = hsdp_trial["metrics"]["engine"]
    assert engine["mesh_shape"] == [2, 2]
    assert engine["placements"] == ["R", "S(0)"]  # replicated across the outer dimension, sharded on the inner
    assert engine["parameters_sharded"]


@pytest.mark.slow
def test_hsdp_measures_every_collective_the_plan_has_and_the_state_it_shards(hsdp_trial):
    measured = hsdp_trial["metrics"]["ranks"]["exposed_comm"]["by_kind_s"]
    planned = {c["op"] for c in hsdp_trial["plan"]["comm"]["collectives"]}
    assert set(measured) == planned == {"all_gather", "reduce_scatter", "all_reduce"}
    assert measured["all_reduce"] > 0  # the replicas' all-reduce of the gradient shards ran
    # the state between steps is each rank's 1/2 of the model (shard groups of 2), as planned
    static = hsdp_trial["metrics"]["memory"]["static_bytes"]
    assert static == pytest.approx(hsdp_trial["plan"]["memory"]["static"], rel=0.05)
