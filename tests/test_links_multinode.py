"""`orchestrator calibrate --links` on a real 4-node SLURM cluster whose links are shaped by
tc tbf (tests/slurm/cluster.sh start --link-mbit): the measurement runs as srun steps on the
real nodes, over gloo, and the fit is written as the preset's inter-node level. Mocked:
nothing. Part of the multinode group (`pytest -m multinode`)."""

import json

import pytest
import yaml

from orchestrator import network_table
from tests.conftest import LINK_MBIT, NODES, run_cli

pytestmark = pytest.mark.multinode


def test_calibrate_links_recovers_the_shaped_rate_between_nodes(slurm_cluster, tmp_path):
    env = {"ORCHESTRATOR_USER_CONF": str(tmp_path / "conf")}
    proc = run_cli(
        "calibrate",
        "--links",
        "--hardware",
        "cpu",
        "--nodes",
        "2,4",
        "--ranks-per-node",
        "1",
        "--max-mb",
        "8",
        "--reps",
        "3",
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "busbw GB/s" in proc.stdout and "all_gather" in proc.stdout  # the rows, as nccl-tests prints them
    preset = yaml.safe_load((tmp_path / "conf" / "hardware" / "cpu-calibrated.yaml").read_text())
    # Never above the link (load can only slow a measurement); how close it comes to the
    # shaped rate is an accuracy target, which the other tests' load moves here:
    # bench/comm_check.py calibrate prints it, run alone.
    assert 0 < preset["inter_node"]["busbw_gbps"] <= LINK_MBIT / 8000 * 1.15
    assert preset["inter_node"]["name"].startswith("measured: gloo")
    # the same measurements, as the network table the plan reads: every op on 2 and 4 nodes, 1-8 MB
    table = network_table.load(preset["network"])
    assert set(table.curves) == {(op, n, 1) for op in ("all_reduce", "all_gather", "reduce_scatter") for n in (2, 4)}
    assert all([s for s, _ in c] == [2**20 * k for k in (1, 2, 4, 8)] for c in table.curves.values())
    # the plan of a trial on this cluster now times its calls from that table
    plan = run_cli(
        "plan",
        "--json",
        "hardware=cpu-calibrated",
        "cluster=slurm",
        "cluster.gpus_per_node=1",
        "parallel.dp=2",
        env=env,
    )
    assert plan.returncode == 0 and "measured: gloo" in plan.stdout
    collectives = json.loads(plan.stdout)["comm"]["collectives"]
    assert collectives and all(c["algorithm"] == "measured" for c in collectives)


def test_calibrate_links_knows_the_clusters_nodes_first_and_says_an_srun_failure(slurm_cluster, cli, tmp_path):
    """Node counts past what SLURM has, or a partition it lacks, are refused before the one-node
    measurement (exit 2); ranks that fail under srun (a GPU preset on these CPU nodes) end
    the command with srun's own words in one paragraph (exit 1), no traceback, nothing written."""
    env = {"ORCHESTRATOR_USER_CONF": str(tmp_path / "conf")}
    proc = cli("calibrate", "--links", "--nodes", f"1,{NODES + 1}", "--max-mb", "1", env=env)
    assert proc.returncode == 2 and f"at most the {NODES} node(s) SLURM has" in proc.stderr, proc.stderr
    proc = cli("calibrate", "--links", "--nodes", "2", "--partition", "nosuch", env=env)
    assert proc.returncode == 2 and "--partition=nosuch" in proc.stderr, proc.stderr
    proc = cli(
        "calibrate",
        "--links",
        "--hardware",
        "h100-sxm",
        "--nodes",
        "2",
        "--ranks-per-node",
        "1",
        "--max-mb",
        "1",
        env=env,
    )
    assert proc.returncode == 1 and "failed (srun)" in proc.stderr and "Exited with exit code" in proc.stderr
    assert "Traceback (most recent call last)" not in proc.stderr and not (tmp_path / "conf").exists()
