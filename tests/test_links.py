"""The link measurement's arithmetic (orchestrator/measure/links.py): nccl-tests' bandwidths, and the
fit recovering a level from calls timed by the model itself. The measuring is the
multinode group's (tests/test_links_multinode.py)."""

import pytest

from orchestrator.measure.links import Measurement, fit_level, fit_network, sizes
from orchestrator.plan.collectives import Level, Network, ring_time


def test_busbw_is_nccl_tests_definition():
    ar = Measurement("all_reduce", ranks=8, nodes=1, bytes=8 * 2**20, seconds=0.01)
    ag = Measurement("all_gather", ranks=8, nodes=1, bytes=8 * 2**20, seconds=0.01)
    assert ar.algbw == pytest.approx(8 * 2**20 / 0.01)
    assert ar.busbw == pytest.approx(ar.algbw * 2 * 7 / 8) and ag.busbw == pytest.approx(ag.algbw * 7 / 8)


def test_sizes_double_from_one_megabyte():
    assert sizes(8) == [2**20, 2**21, 2**22, 2**23] and sizes(0.5) == [2**20]


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_the_fit_recovers_a_level_from_calls_the_model_timed(backend):
    true = Level(busbw=0.05e9, latency=300e-6)
    rows = []
    for ranks in (2, 4):
        net = Network(ranks=ranks, nodes=ranks, intra=Level(5e9, 50e-6), inter=true, backend=backend)
        for op in ("all_reduce", "reduce_scatter", "all_gather"):
            for nbytes in sizes(16):
                rows.append(Measurement(op, ranks, ranks, nbytes, ring_time(op, nbytes, net)))
    fitted = fit_level(rows, backend)
    if backend == "gloo":  # lock step: exactly the model's terms
        assert fitted.busbw == pytest.approx(true.busbw, rel=1e-6) and fitted.latency == pytest.approx(true.latency)
    else:  # NCCL's base latency and mixed hops make it approximate
        assert fitted.busbw == pytest.approx(true.busbw, rel=0.05)


def test_one_node_rows_fit_inside_and_several_nodes_between():
    inside, between = Level(5e9, 20e-6), Level(0.1e9, 200e-6)
    rows = []
    for ranks, nodes in ((2, 1), (4, 1), (2, 2), (4, 4)):
        net = Network(ranks=ranks, nodes=nodes, intra=inside, inter=between, backend="gloo")
        rows += [Measurement("all_reduce", ranks, nodes, b, ring_time("all_reduce", b, net)) for b in sizes(8)]
    got_inside, got_between = fit_network(rows, "gloo")
    assert got_inside.busbw == pytest.approx(inside.busbw, rel=1e-3)
    assert got_between.busbw == pytest.approx(between.busbw, rel=1e-3)


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--hardware", "h100-sxmm"], "--hardware=h100-sxmm"),
        (["--nodes", "1", "--ranks-per-node", "1"], "at least 2 ranks"),
        (["--nodes", "one"], "--nodes=one"),
    ],
)
def test_bad_link_measurement_arguments_exit_2_before_measuring(cli, argv, says):
    proc = cli("calibrate", "--links", *argv)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr
