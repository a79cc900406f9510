"""The network as it measured itself (orchestrator/plan/bus_table.py): a table of bus
bandwidth by collective, node count and size, how the plan reads a call from it (between,
below, above and beyond what was measured), its file checked before launch, and the h100-p5
preset built from published nccl-tests. Pure arithmetic and the real CLI; nothing mocked."""

import json
import math

import pytest

from orchestrator import network_table
from orchestrator.measure.trial_measurements import machine_facts
from orchestrator.plan.bus_table import BusRow, BusTable, alpha_beta, curve_busbw
from orchestrator.plan.collectives import Level, Network, bus_factor, call_time
from orchestrator.plan.planner import network_of
from orchestrator.run.planning import plan_trial
from orchestrator.spec import build_spec

MiB = 2**20
P5 = ["hardware=h100-p5", "cluster=slurm", "cluster.gpus_per_node=8", "model=gpt2-1.3b"]


def net_with(table: BusTable, nodes: int, rpn: int = 8) -> Network:
    return Network(ranks=nodes * rpn, nodes=nodes, intra=Level(370e9, 3.4e-6), inter=Level(368e9, 9.6e-6), table=table)


def two_node_table() -> BusTable:
    rows = [
        BusRow("all_reduce", n, 8, s, b)
        for n, curve in ((2, ((32 * MiB, 100.0), (128 * MiB, 300.0))), (8, ((32 * MiB, 50.0), (128 * MiB, 150.0))))
        for s, b in curve
    ]
    return BusTable(rows, "test")


def test_a_measured_point_is_its_call_time_exactly():
    t = call_time("all_reduce", 32.0 * MiB, net_with(two_node_table(), 2))
    assert t.algorithm == "measured" and t.note == ""
    assert t.seconds == pytest.approx(32 * MiB * bus_factor("all_reduce", 16) / 100e9)


def test_between_sizes_and_node_counts_the_table_is_interpolated_in_log_space():
    table = two_node_table()
    mid = curve_busbw(table.curves[("all_reduce", 2, 8)], 64 * MiB)[0]
    assert mid == pytest.approx(math.sqrt(100e9 * 300e9))  # the geometric mean halfway in log size
    r = table.busbw("all_reduce", 4, 8, 32 * MiB)  # 4 nodes: halfway between 2 and 8 in log nodes
    assert r.busbw == pytest.approx(math.sqrt(100e9 * 50e9)) and "between the 2- and 8-node curves" in r.note


def test_below_the_smallest_size_latency_shows_and_above_the_largest_bandwidth_saturates():
    edge, inner = (32 * MiB, 100e9), (128 * MiB, 300e9)
    small = alpha_beta(edge, inner, 1 * MiB, below=True)
    large = alpha_beta((128 * MiB, 300e9), (32 * MiB, 100e9), 8192 * MiB, below=False)
    assert small < 100e9 / 4  # a 32x smaller call pays the same latency: far lower busbw
    assert 300e9 < large < 1 / ((128 * MiB / 300e9 - 32 * MiB / 100e9) / (96 * MiB)) * 1.0001  # toward 1/beta
    r = two_node_table().busbw("all_reduce", 2, 8, 1 * MiB)
    assert r.busbw == pytest.approx(small) and "below the smallest size measured (32 MiB)" in r.note


def test_beyond_the_measured_node_counts_the_model_carries_the_edge_and_says_so():
    table = two_node_table()
    at_edge = call_time("all_reduce", 64.0 * MiB, net_with(table, 8))
    beyond = call_time("all_reduce", 64.0 * MiB, net_with(table, 64))
    assert "extrapolated beyond the largest node count measured (8)" in beyond.note
    assert beyond.busbw < at_edge.busbw  # more nodes, more hops: a lower bus bandwidth at the same size
    assert call_time("all_reduce", 64.0 * MiB, net_with(table, 1)).algorithm in ("ring", "tree")  # NVLink: the level


def test_a_collective_the_table_lacks_is_read_from_its_all_reduce_and_says_so():
    t = call_time("all_gather", 32.0 * MiB, net_with(two_node_table(), 2))
    assert t.busbw == pytest.approx(100e9) and "all_gather read from all_reduce's curve" in t.note
    assert t.seconds == pytest.approx(32 * MiB * bus_factor("all_gather", 16) / 100e9)


def test_the_h100_p5_preset_plans_dp_buckets_where_the_measured_curve_is_lowest():
    """1,024 ranks' all-reduce of 50 MB buckets on p5 moves at the table's 32-node figure
    for that size (nccl-tests: 66 GB/s at 32 MiB, 84 at 64 MiB), not at its 8 GiB rate."""
    spec = build_spec([*P5, "parallel.dp=256"])
    t = call_time("all_reduce", 50e6, network_of(spec, machine_facts(spec)))
    assert t.algorithm == "measured" and 66e9 < t.busbw < 84e9
    p5 = build_spec([*P5[:1], "model=gpt2-1.3b", "parallel.dp=8"])
    assert network_of(p5, machine_facts(p5)).table is not None
    plan = plan_trial(spec)
    assert all(c.algorithm == "measured" for c in plan.comm.collectives)
    assert any("h100-p5.network.csv" in a for a in plan.assumptions)


def test_a_preset_without_a_table_keeps_its_parametric_levels():
    plan = plan_trial(
        build_spec(
            ["hardware=h100-sxm", "cluster=slurm", "cluster.gpus_per_node=8", "model=gpt2-1.3b", "parallel.dp=256"]
        )
    )
    assert {c.algorithm for c in plan.comm.collectives} <= {"ring", "tree"}


def test_the_plan_says_when_it_extrapolates_past_the_tables_node_counts(cli):
    proc = cli("plan", *P5, "parallel.dp=512")
    assert proc.returncode == 0, proc.stderr
    assert "extrapolated beyond the largest node count measured (32)" in " ".join(proc.stdout.split())


def test_a_users_table_replaces_the_presets(cli, tmp_path):
    path = tmp_path / "net.csv"
    path.write_text(
        "# my cluster\ncollective,nodes,ranks_per_node,bytes,busbw_gbps\n"
        "all_reduce,4,8,1048576,1\nall_reduce,4,8,1073741824,2\n"
    )
    proc = cli("plan", "--json", *P5, "parallel.dp=32", f"hardware.network={path}")
    assert proc.returncode == 0, proc.stderr
    reduce = json.loads(proc.stdout)["comm"]["collectives"][0]
    assert reduce["algorithm"] == "measured" and 1 <= reduce["busbw_gbps"] <= 2


@pytest.mark.parametrize(
    "body,says",
    [
        ("all_reduce,2,8,1048576,\n", "busbw_gbps=(empty)"),  # a gap
        ("all_reduce,2,8,1048576,-3\n", "busbw_gbps=-3"),
        ("all_reduce,2,8,1048576,0\n", "busbw_gbps=0"),
        ("all_reduce,0,8,1048576,10\n", "nodes=0"),
        ("all_reduce,2,8,2097152,10\nall_reduce,2,8,1048576,20\n", "line 4: bytes=1048576"),
        ("alltoall,2,8,1048576,10\n", "collective=alltoall"),
    ],
)
def test_a_bad_table_exits_2_naming_the_file_the_row_and_the_field(cli, tmp_path, body, says):
    path = tmp_path / "net.csv"
    path.write_text("# test\ncollective,nodes,ranks_per_node,bytes,busbw_gbps\n" + body)
    proc = cli("plan", *P5, f"hardware.network={path}")
    assert proc.returncode == 2 and str(path) in proc.stderr and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("text", ["size,busbw\n1,2\n", "", "\x00\x01 not a table"])
def test_a_file_that_is_not_a_table_exits_2(cli, tmp_path, text):
    path = tmp_path / "net.csv"
    path.write_text(text)
    proc = cli("plan", *P5, f"hardware.network={path}")
    assert proc.returncode == 2 and "hardware.network" in proc.stderr and "Traceback" not in proc.stderr


def test_a_missing_table_exits_2(cli):
    proc = cli("plan", *P5, "hardware.network=no-such-table.csv")
    assert proc.returncode == 2 and "hardware.network=no-such-table.csv" in proc.stderr


def test_a_table_written_reads_back_the_same(tmp_path):
    table = two_node_table()
    network_table.write(tmp_path / "t.csv", table)
    again = network_table.load(tmp_path / "t.csv")
    assert again.curves == table.curves and again.source == "test"


def test_a_call_below_a_curves_smallest_size_is_no_faster_than_fewer_nodes_measured_it():
    """p5's 32-node curve starts at 32 MiB, its 8- and 16-node curves at 8 B: a small call at
    32 nodes costs at least the 16-node latency, not what a line through 32 and 64 MiB says."""
    rows = [
        BusRow("all_reduce", n, 8, s, b)
        for n, curve in (
            (8, ((8, 8 * bus_factor("all_reduce", 64) / 200e-6 / 1e9), (32 * MiB, 80.0))),  # 8 B in 200 us
            (16, ((8, 8 * bus_factor("all_reduce", 128) / 260e-6 / 1e9), (32 * MiB, 70.0))),  # in 260 us
            (32, ((32 * MiB, 60.0), (64 * MiB, 120.0))),
        )
        for s, b in curve
    ]
    table = BusTable(rows, "test")
    small = call_time("all_reduce", 8.0, net_with(table, 32))
    assert "no faster than the 16-node curve at this size" in small.note
    at = {n: call_time("all_reduce", 8.0, net_with(table, n)).seconds for n in (8, 16)}
    assert at[16] > at[8] and small.seconds >= 0.99 * at[16] * bus_factor("all_reduce", 256) / bus_factor(
        "all_reduce", 128
    )
    line = alpha_beta((32 * MiB, 60e9), (64 * MiB, 120e9), 8.0, below=True)
    assert small.seconds > 8.0 * bus_factor("all_reduce", 256) / line  # the line alone: far too fast
    # where the curve itself reaches the size, it is read as measured
    assert call_time("all_reduce", 32.0 * MiB, net_with(table, 32)).note == ""


def test_the_plan_says_what_a_small_call_costs_its_ranks_and_on_what_that_rests():
    p5 = plan_trial(build_spec([*P5, "parallel.dp=256", "zero=stage3"]))
    sxm = plan_trial(
        build_spec(["hardware=h100-sxm", "cluster=slurm", "model=gpt2-1.3b", "parallel.dp=256", "zero=stage3"])
    )
    line = lambda plan: next(a for a in plan.assumptions if "8-byte all-reduce" in a)  # noqa: E731
    # p5's 32-node curve starts at 32 MiB; the line through its two smallest sizes is slower at
    # 8 B than the 16-node curve measured, so the line stands, and the plan says so
    assert "below the smallest size measured (32 MiB)" in line(p5)
    assert "LL protocol" in line(sxm) and "not measured" in line(sxm)


@pytest.mark.parametrize(
    "body,says",
    [
        ("all_reduce,2,8,1" + "0" * 30 + ",10\n", "a whole number from 1 to"),  # 1e30 bytes
        ("all_reduce,2,8,1" + "0" * 400 + ",10\n", "a whole number from 1 to"),  # past any float: no OverflowError
        ("all_reduce,200000,8,1048576,10\n", "nodes=200000"),
        ("all_reduce,2,8,1e6,10\n", "bytes=1e6"),
        ("all_reduce,2,8,١٠٢٤,10\n", "bytes="),  # Arabic-Indic digits: int() takes them, a table may not
    ],
)
def test_a_table_field_no_measurement_can_hold_exits_2(cli, tmp_path, body, says):
    path = tmp_path / "net.csv"
    path.write_text("collective,nodes,ranks_per_node,bytes,busbw_gbps\n" + body)
    proc = cli("plan", "hardware=h100-p5", f"hardware.network={path}", "cluster=slurm", "parallel.dp=16")
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_reading_never_passes_the_fastest_busbw_the_table_measured():
    """Two points a few bytes apart at nearly one time make a line of almost no slope: read
    above them it would plan millions of GB/s. No reading passes what the table measured."""
    rows = [BusRow("all_reduce", 2, 8, 1 * MiB, 10.0), BusRow("all_reduce", 2, 8, 1 * MiB + 8, 10.0001)]
    table = BusTable(rows, "test")
    for nodes in (2, 64):  # on a measured node count, and carried beyond it
        t = call_time("all_reduce", 1e12, net_with(table, nodes))
        assert t.busbw <= 10.0001e9 * (1 + 1e-9), (nodes, t)


def test_carrying_a_long_curve_beyond_its_node_counts_fits_a_bounded_number_of_its_sizes(monkeypatch):
    """The edge level is fitted to a thinned curve: its cost does not grow with the table (a
    100k-row table took over 300 s a plan)."""
    from orchestrator.plan import collectives

    sizes = {}
    real = collectives.modelled_time

    def counting(op, nbytes, net):
        sizes[nbytes] = True
        return real(op, nbytes, net)

    monkeypatch.setattr(collectives, "modelled_time", counting)
    table = BusTable(
        [BusRow("all_reduce", n, 8, 2**10 + i * 997, 10.0 + i * 1e-4 + n) for n in (2, 4) for i in range(20_000)],
        "a long table",
    )
    call_time("all_reduce", 5e6, net_with(table, 32))
    assert 0 < len(sizes) <= 2 * collectives.FIT_POINTS + 2
