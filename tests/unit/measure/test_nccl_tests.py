"""`orchestrator calibrate --nccl-tests FILE...`: nccl-tests' standard output, in exactly the
format all_reduce_perf, all_gather_perf and reduce_scatter_perf print (older versions with
a root column, newer ones with a version header and a blank root), multi-node logs
included, read into the NAME-calibrated preset's network table; garbage, a truncated run
and an in-place-only table. The logs are written here (no GPU to run nccl-tests on); the
command, the preset and the plan that reads it are the real ones."""

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from orchestrator import network_table
from orchestrator.core.errors import ConfigError
from orchestrator.measure.nccl_tests import parse_run, parse_runs, read_runs, table_of

SIZES = [2**k for k in range(20, 31, 2)]  # 1 MiB to 1 GiB
TYPE_BYTES = {"float": 4, "bfloat16": 2}


def rank_lines(nodes: int, per_node: int) -> str:
    return "".join(
        f"#  Rank {n * per_node + g:2d} Group  0 Pid {1000 + g:6d} on p5-node-{n:03d} device {g:2d} "
        f"[0000:{g:02x}:00] NVIDIA H100 80GB HBM3\n"
        for n in range(nodes)
        for g in range(per_node)
    )


def log(
    op: str,
    nodes: int,
    per_node: int,
    busbw: dict[int, float],
    *,
    new: bool = False,
    dtype: str = "float",
    footer: bool = True,
    in_place_only: bool = False,
) -> str:
    """A run as nccl-tests prints it: busbw (GB/s) by size gives each row's time."""
    ranks = nodes * per_node
    factor = 2 * (ranks - 1) / ranks if op == "all_reduce" else (ranks - 1) / ranks
    head = (
        f"# nccl-tests version 2.17.6 nccl-headers=22501 nccl-library=22501\n# Collective test starting: {op}_perf\n"
        if new
        else ""
    )
    head += (
        "# nThread 1 nGpus 1 minBytes 1048576 maxBytes 1073741824 step: 4(factor) warmup iters: 5 iters: 20 "
        "agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n" + rank_lines(nodes, per_node) + "#\n"
        "#                                                              out-of-place                       in-place\n"
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw  "
        " busbw #wrong\n"
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  "
        "(GB/s)\n"
    )
    rows = ""
    for size, bw in busbw.items():
        count = size // TYPE_BYTES[dtype] // (1 if op == "all_reduce" else ranks)
        us = size * factor / (bw * 1e9) * 1e6
        redop = "none" if op == "all_gather" else "sum"
        root = "" if new else "-1"
        timing = f"{us:8.1f} {size / us / 1e3:7.2f} {bw:7.2f}      0"
        rows += (
            f"{size:12d}  {count:12d}  {dtype:>8s}  {redop:>6s}  {root:>6s}  "
            + (" " * 32 if in_place_only else timing)
            + f" {timing}\n"
        )
    tail = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 70.742\n#\n" if footer else ""
    return head + rows + tail


def curve(*values: float) -> dict[int, float]:
    return dict(zip(SIZES, values))


def test_every_format_reads_its_collective_ranks_nodes_and_bus_bandwidth():
    ar = parse_run(log("all_reduce", 2, 8, curve(20, 60, 150, 300, 400, 450)), "all_reduce_perf-2n.log")
    assert (ar.collective, ar.ranks, ar.nodes, ar.ranks_per_node, ar.complete) == ("all_reduce", 16, 2, 8, True)
    ag = parse_run(log("all_gather", 4, 8, curve(10, 30, 80, 150, 200, 220), new=True, dtype="bfloat16"), "ag.log")
    assert (ag.collective, ag.nodes) == ("all_gather", 4)
    # no 'Collective test starting' line (older versions): the file's name says which program ran
    rs = parse_run(log("reduce_scatter", 2, 8, curve(10, 30, 80, 150, 200, 220)), "logs/reduce_scatter_perf.16.out")
    assert rs.collective == "reduce_scatter"
    ag_old = parse_run(log("all_gather", 2, 8, curve(10, 30, 80, 150, 200, 220)), "allgather-2n.txt")
    assert ag_old.collective == "all_gather"
    # and where neither does, the table cannot tell an all-gather from an alltoall: refused, not guessed
    with pytest.raises(ConfigError, match="says which program ran"):
        parse_run(log("all_gather", 2, 8, curve(10, 30)), "nccl-16n.log")


def test_an_in_place_only_table_is_read_from_its_in_place_columns():
    text = log("all_reduce", 2, 8, curve(20, 60, 150, 300, 400, 450), in_place_only=True)
    run = parse_run(text, "all_reduce_perf-replay.log")
    assert len(run.rows) == 6 and run.rows[0].time_us > 0


def test_a_truncated_run_keeps_its_complete_rows_and_knows_it_was_cut():
    text = log("all_reduce", 2, 8, curve(20, 60, 150, 300, 400, 450), footer=False)
    cut = text[: text.rindex("\n", 0, len(text) - 1) + 30]  # the last row cut mid-line
    run = parse_run(cut, "all_reduce_perf-cut.log")
    assert not run.complete and len(run.rows) == 5


@pytest.mark.parametrize(
    "garbage,line",
    [
        ("Segmentation fault (core dumped)\n", 1),
        ("   1048576  262144  float  sum  -1  12.0  x  y  0\n", 1),
    ],
)
def test_a_line_that_is_not_nccl_tests_output_names_the_file_and_line(garbage, line):
    text = garbage + log("all_reduce", 2, 8, curve(20, 60, 150, 300, 400, 450))
    with pytest.raises(ConfigError, match=f"mixed.log line {line}"):
        parse_run(text, "all_reduce_perf-mixed.log")


def test_nccl_debug_lines_are_nccls_own_output_and_skipped():
    text = log("all_reduce", 2, 8, curve(20, 60, 150, 300, 400, 450))
    noisy = text.replace("# Using devices\n", "# Using devices\np5-node-000:123:123 [0] NCCL INFO Bootstrap\n")
    assert len(parse_run(noisy, "all_reduce_perf-noisy.log").rows) == 6


def test_other_collectives_and_logs_without_rank_lines_are_refused():
    alltoall = log("all_reduce", 2, 8, curve(20, 60)).replace(
        "# nThread", "# Collective test starting: alltoall_perf\n# nThread"
    )
    with pytest.raises(ConfigError, match="alltoall_perf"):
        parse_run(alltoall, "a2a.log")
    no_ranks = "".join(
        line + "\n" for line in log("all_reduce", 2, 8, curve(20, 60)).splitlines() if "Rank" not in line
    )
    with pytest.raises(ConfigError, match="node count is read"):
        parse_run(no_ranks, "all_reduce_perf-no-ranks.log")


def test_calibrate_nccl_tests_writes_the_table_into_the_calibrated_preset_and_the_plan_reads_it(cli, tmp_path):
    files = []
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        for nodes, scale in ((2, 1.0), (4, 0.6)):
            path = tmp_path / f"{op}_perf-{nodes}.log"
            path.write_text(
                log(op, nodes, 8, curve(*(scale * b for b in (20, 60, 150, 300, 400, 450))), new=op != "reduce_scatter")
            )
            files.append(str(path))
    env = {"ORCHESTRATOR_USER_CONF": str(tmp_path / "conf")}
    proc = cli("calibrate", "--nccl-tests", *files, "--hardware", "h100-sxm", env=env)
    assert proc.returncode == 0, proc.stderr
    preset = yaml.safe_load((tmp_path / "conf" / "hardware" / "h100-sxm-calibrated.yaml").read_text())
    table = network_table.load(preset["network"])
    assert set(table.curves) == {(op, n, 8) for op in ("all_reduce", "all_gather", "reduce_scatter") for n in (2, 4)}
    assert table.busbw("all_reduce", 2, 8, 2**24).busbw == pytest.approx(150e9, rel=0.01)  # from the time column
    plan = cli(
        "plan",
        "--json",
        "hardware=h100-sxm-calibrated",
        "cluster=slurm",
        "cluster.gpus_per_node=8",
        "model=gpt2-1.3b",
        "parallel.dp=32",
        env=env,
    )
    assert plan.returncode == 0, plan.stderr
    assert all(c["algorithm"] == "measured" for c in json.loads(plan.stdout)["comm"]["collectives"])


def test_a_bad_log_exits_2_naming_the_file_and_line(cli, tmp_path):
    path = tmp_path / "all_reduce_perf-mixed.log"
    path.write_text(log("all_reduce", 2, 8, curve(20, 60, 150)) + "srun: error: node-3: task 7: Exited\n")
    proc = cli(
        "calibrate",
        "--nccl-tests",
        str(path),
        "--hardware",
        "h100-sxm",
        env={"ORCHESTRATOR_USER_CONF": str(tmp_path / "conf")},
    )
    assert proc.returncode == 2 and f"{path} line" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "conf").exists()  # nothing written


REAL = Path(__file__).resolve().parents[2] / "fixtures" / "nccl-tests" / "all_reduce_perf-2n-h100-a3mega.log"


def test_a_real_two_node_log_reads_as_it_was_published():
    """tests/fixtures/nccl-tests/SOURCES.md: 16 H100 ranks on two hosts, 8 B to 8 GiB."""
    run = read_runs(REAL)[0]
    assert (run.collective, run.ranks, run.nodes, run.complete, len(run.rows)) == ("all_reduce", 16, 2, True, 31)
    table = table_of([run])
    # the log's own busbw at 8 GiB is 338.82 GB/s: read back from its time column
    assert table.busbw("all_reduce", 2, 8, 8589934592).busbw == pytest.approx(338.82e9, rel=1e-3)
    assert table.busbw("all_reduce", 2, 8, 8).busbw > 0  # 8 B in 135.8 us: the latency the plan reads


def _wrapped(how: str) -> str:
    lines = REAL.read_text().splitlines()
    if how == "tag-output":  # mpirun --tag-output: every line prefixed with [job,rank]<stream>:
        return "".join(f"[1,0]<stdout>:{line}\n" for line in lines)
    if how == "srun -l":
        return "".join(f"0: {line}\n" for line in lines)
    if how == "timestamps":
        return "".join(f"[2026-12-02 06:00:{i % 60:02d}] {line}\n" for i, line in enumerate(lines))
    if how == "NCCL_DEBUG=INFO":  # NCCL's banner, unprefixed, and its INFO lines between the ranks and the table
        at = next(i for i, line in enumerate(lines) if line.startswith("#                "))
        noise = [
            "NCCL version 2.21.5+cuda12.4",
            "ztan-mig-235z:6899:6899 [0] NCCL INFO Bootstrap : Using enp0s12",
            "ztan-mig-235z:6899:6950 [0] NCCL INFO comm 0x55 rank 0 nranks 16 - Init COMPLETE",
            "Authorization required, but no authorization protocol specified",
            "",
        ]
        return "\n".join(lines[:at] + noise + lines[at:]) + "\n"
    raise ValueError(how)


@pytest.mark.parametrize("how", ["tag-output", "srun -l", "timestamps", "NCCL_DEBUG=INFO"])
def test_the_real_log_as_launchers_write_it_reads_the_same(how):
    assert parse_run(_wrapped(how), REAL.name) == dataclasses.replace(read_runs(REAL)[0], path=REAL.name)


def test_several_runs_in_one_file_are_read_one_by_one():
    body = REAL.read_text()
    two = (
        f"# Collective test starting: all_reduce_perf\n{body}# Collective test concluded: all_reduce_perf\n"
        + f"# Collective test starting: all_gather_perf\n{body.replace(' sum ', 'none')}"
        + "# Collective test concluded: all_gather_perf\n"
    )
    runs = parse_runs(two, "job-1234.out")
    assert [r.collective for r in runs] == ["all_reduce", "all_gather"] and all(r.nodes == 2 for r in runs)
    with pytest.raises(ConfigError, match="one run, but it holds 2"):
        parse_run(two, "job-1234.out")


@pytest.mark.parametrize(
    "change,says",
    [
        (lambda t: t.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 248 FAILED"), "FAILED"),
        (lambda t: t.replace("338.82      0", "338.82      3"), "#wrong"),
        (lambda t: t.replace("on ztan-mig-gq73 device  7", "on ztan-mig-235z device  7"), "the same number of ranks"),
        (lambda t: t.replace("ztan-mig-gq73", "ztan-mig-235z"), None),  # all on one host: one node of 16, even
        (
            lambda t: "".join(line + "\n" for line in t.splitlines() if "Rank" not in line or "Rank  0 " in line),
            "at least 2 ranks",
        ),
        (lambda t: t.replace("        8192          2048", "        ٨١٩٢          2048"), "line"),  # not ASCII digits
        (lambda t: re.sub(r"(float     sum      -1)\s+\S+", r"\1    0.0", t), "timed above 0"),  # every time 0
        (lambda t: t.replace("47535  180.71", "0.0001  180.71"), "bus bandwidth from"),  # 8 GiB in 0.1 ns
    ],
)
def test_what_a_real_log_cannot_be_planned_from_is_refused(change, says):
    text = change(REAL.read_text())
    if says is None:
        assert parse_run(text, REAL.name).nodes == 1
        return
    with pytest.raises(ConfigError, match=says):
        parse_run(text, REAL.name)


def test_rank_lines_of_older_versions_without_a_group_are_read():
    old = re.sub(r"Group\s+0 ", "", REAL.read_text())
    assert parse_run(old, REAL.name).ranks == 16


def test_calibrate_nccl_tests_needs_a_gpu_preset_named(cli, tmp_path):
    env = {"ORCHESTRATOR_USER_CONF": str(tmp_path / "conf")}
    none = cli("calibrate", "--nccl-tests", str(REAL), env=env)
    assert none.returncode == 2 and "--hardware" in none.stderr and "GPU preset" in none.stderr
    cpu = cli("calibrate", "--nccl-tests", str(REAL), "--hardware", "cpu", env=env)
    assert cpu.returncode == 2 and "a GPU preset" in cpu.stderr
    assert not (tmp_path / "conf").exists()
    ok = cli("calibrate", "--nccl-tests", str(REAL), "--hardware", "h100-sxm", env=env)
    assert ok.returncode == 0, ok.stderr
