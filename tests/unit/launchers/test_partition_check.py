"""Will the partition ever run it: sinfo's node list against one node's share of a trial.

Pure logic (sinfo's text in, a refusal out); tests/test_slurm.py and test_multinode.py
check the same against real clusters.
"""

from orchestrator.launchers.slurm import NodeShape, parse_sinfo, partition_refusal
from orchestrator.spec import build_spec

GPU_NODES = "gpu01|64|gpu:h100:4(S:0-1)|gpu*\ngpu02|64|gpu:h100:4(S:0-1)|gpu*\ncpu01|128|(null)|cpu\n"


def test_sinfo_lines_give_the_default_partitions_nodes_with_their_gpus():
    assert parse_sinfo(GPU_NODES, None) == [NodeShape("gpu01", 64, 4), NodeShape("gpu02", 64, 4)]
    assert parse_sinfo("a|8|gpu:2,gpu:a100:2|p\n", "p") == [NodeShape("a", 8, 4)]


def test_too_many_cpus_per_node_names_the_field_and_what_fits():
    spec = build_spec(["cluster=slurm", "hardware=cpu", "cluster.gpus_per_node=2", "parallel.dp=2"])  # 8 CPUs each
    why = partition_refusal(spec, [NodeShape("n1", 2, 0)])
    assert "cluster.cpus_per_task=8" in why and "the most that fits is cluster.cpus_per_task=1" in why
    assert partition_refusal(spec, [NodeShape("n1", 16, 0)]) is None


def test_more_gpus_per_node_than_any_node_has():
    spec = build_spec(["cluster=slurm", "hardware=h100-sxm", "model=gpt2-125m", "parallel.dp=16"])  # 8 per node
    why = partition_refusal(spec, parse_sinfo(GPU_NODES, None))
    assert "cluster.gpus_per_node=8" in why and "cluster.gpus_per_node=4" in why


def test_more_nodes_than_the_partition_holds_names_the_largest_dp():
    spec = build_spec(
        ["cluster=slurm", "hardware=h100-sxm", "model=gpt2-125m", "cluster.gpus_per_node=4", "parallel.dp=16"]
    )
    why = partition_refusal(spec, parse_sinfo(GPU_NODES, None))
    assert "parallel.dp=16" in why and "the largest that fits is parallel.dp=8" in why
    assert partition_refusal(spec, []).startswith("cluster.partition=")
