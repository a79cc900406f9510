"""The data-parallel layout: which ranks shard the model together and which hold replicas.

With parallel.replicate = R the dp ranks form R shard groups of S = dp / R consecutive
ranks (torch's 2D device mesh (replicate, shard), rank = r * S + s, as init_device_mesh
lays it out and torchtitan's dp_replicate x dp_shard uses it). Inside a shard group the
parameters are all-gathered and the gradients reduce-scattered; across the groups each
gradient shard is all-reduced among the R ranks that hold the same shard (HSDP: Zhao et
al., "PyTorch FSDP", VLDB 2023, hybrid sharding). R = 1 is plain FSDP.

Pure: validation, the plan and the engine read the same groups from here.
"""

from __future__ import annotations

from dataclasses import dataclass

MESH_DIMS = ("replicate", "shard")  # the device mesh's dimension names, outer first


@dataclass(frozen=True)
class DpLayout:
    dp: int
    replicate: int  # shard groups, each holding a whole replica of the model
    ranks_per_node: int

    @property
    def shard(self) -> int:
        """Ranks of one shard group: each holds 1/shard of every parameter."""
        return self.dp // self.replicate

    @property
    def hybrid(self) -> bool:
        return self.replicate > 1

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return (self.replicate, self.shard) if self.hybrid else (self.dp,)

    def shard_group(self, rank: int) -> list[int]:
        first = rank - rank % self.shard
        return list(range(first, first + self.shard))

    def replica_group(self, rank: int) -> list[int]:
        return list(range(rank % self.shard, self.dp, self.shard))

    def nodes_of(self, ranks: list[int]) -> int:
        """How many nodes the ranks lie on (SLURM fills each node with ranks_per_node)."""
        return len({r // self.ranks_per_node for r in ranks})

    @property
    def shard_nodes(self) -> int:
        """Nodes the widest shard group spans: 1 where every group lies within a node."""
        return max(self.nodes_of(self.shard_group(r)) for r in range(0, self.dp, self.shard))

    @property
    def replica_nodes(self) -> int:
        return max(self.nodes_of(self.replica_group(r)) for r in range(self.shard))


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
