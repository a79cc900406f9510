"""The data-parallel layout (plan/dp_layout.py): which ranks shard together, which hold replicas,
and on how many nodes each group lies, as torch's 2D device mesh numbers the ranks."""

import pytest

from orchestrator.plan.dp_layout import DpLayout


def test_shard_groups_are_consecutive_ranks_and_replica_groups_stride_across_them():
    hsdp = DpLayout(dp=8, replicate=4, ranks_per_node=2)
    assert hsdp.shard == 2 and hsdp.mesh_shape == (4, 2)
    assert hsdp.shard_group(5) == [4, 5] and hsdp.replica_group(5) == [1, 3, 5, 7]
    assert hsdp.shard_nodes == 1 and hsdp.replica_nodes == 4  # shard on a node, replicate across
    flat = DpLayout(dp=8, replicate=1, ranks_per_node=2)
    assert not flat.hybrid and flat.mesh_shape == (8,) and flat.shard_nodes == 4 and flat.replica_nodes == 1


def test_a_shard_group_that_straddles_two_nodes_is_seen():
    straddles = DpLayout(dp=12, replicate=3, ranks_per_node=3)  # groups of 4 on nodes of 3
    assert straddles.shard == 4 and straddles.shard_nodes == 2


@pytest.mark.parametrize("replicate", [1, 2, 4, 8])
def test_the_groups_cover_every_rank_once(replicate):
    layout = DpLayout(dp=8, replicate=replicate, ranks_per_node=4)
    shards = {tuple(layout.shard_group(r)) for r in range(8)}
    replicas = {tuple(layout.replica_group(r)) for r in range(8)}
    assert sorted(r for g in shards for r in g) == list(range(8)) and len(shards) == replicate
    assert sorted(r for g in replicas for r in g) == list(range(8)) and len(replicas) == layout.shard
