"""A node's load as its ranks read it (measure/host_load.py): from /proc, and grouped by node."""

import time

from orchestrator.measure.host_load import by_node, cpu_ticks, node_load


def test_a_busy_rank_reads_its_node_busy_and_its_memory_in_use():
    since = cpu_ticks()
    end = time.process_time() + 0.3
    while time.process_time() < end:  # this process keeps a core busy
        pass
    load = node_load(since)
    assert 1 / load["cores"] * 0.5 < load["cpu_busy_share"] <= 1
    assert load["memory_used_bytes"] > 0


def test_the_ranks_of_a_node_are_one_node_and_its_figure_the_median_of_their_readings():
    def rank(r, host, busy):
        return {"rank": r, "host": host, "node_load": {"cpu_busy_share": busy, "cores": 2, "memory_used_bytes": 10}}

    nodes = by_node([rank(0, "a", 0.5), rank(1, "a", 0.7), rank(2, "b", 0.1), {"rank": 3, "host": "b"}])
    assert nodes["a"] == {"ranks": [0, 1], "cpu_busy_share": 0.6, "cores": 2, "memory_used_bytes": 10}
    assert nodes["b"]["ranks"] == [2]  # a rank that read nothing (another version) is left out
