"""This host's links, measured by the plan (orchestrator/measure/local_links.py): a CPU trial with
several ranks on this host is planned over what gloo between them measured, not over the
preset's assumed inside-node level."""

from __future__ import annotations

import json

import pytest

from orchestrator.measure import links, trial_measurements
from orchestrator.measure import local_links as local
from orchestrator.measure.links import OPS, Measurement
from orchestrator.measure.local_links import cache_path, key, local_links
from orchestrator.plan import assumptions, planner
from orchestrator.plan.collectives import ring_time
from orchestrator.spec import build_spec

DP2 = ["hardware=cpu", "parallel.dp=2", "zero=stage3"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def rows_of_a_level(latency_s: float, busbw: float) -> list[Measurement]:
    """What two ranks would measure over a level of `latency_s` a hop and `busbw` B/s."""
    from orchestrator.plan.collectives import Level, Network

    net = Network(ranks=2, nodes=1, intra=Level(busbw, latency_s), inter=Level(busbw, latency_s), backend="gloo")
    return [Measurement(op, 2, 1, size, ring_time(op, size, net)) for op in OPS for size in (1 << 20, 1 << 22)]


def cached(rows: list[Measurement], ranks: int = 2) -> None:
    cache_path().parent.mkdir(parents=True, exist_ok=True)
    cache_path().write_text(
        json.dumps(
            {
                key(ranks): {
                    "when": "2026-11-28T09:00:00Z",
                    "rows": [[m.op, m.ranks, m.nodes, m.bytes, m.seconds] for m in rows],
                }
            }
        )
    )


def test_the_links_are_measured_once_then_read_from_the_cache(cache, monkeypatch):
    measured = local_links(2)  # real: two ranks under torchrun, gloo on this host
    rows = json.loads(cache_path().read_text())[key(2)]["rows"]
    assert {r[0] for r in rows} == set(OPS) and all(r[1] == 2 and r[4] > 0 for r in rows)
    # The small calls too (a bias, a norm): from MIN_BYTES, though on a busy machine a call as
    # short as the barriers around it is timed at nothing and left out (a CI run lost 16-32 KB).
    assert local.MIN_BYTES <= min(r[3] for r in rows) < 1 << 20
    assert measured.level.busbw > 0 and measured.level.latency >= 0 and "2 ranks of this host" in measured.source
    monkeypatch.setattr(local, "measure", lambda *a, **k: pytest.fail("measured again"))
    assert local_links(2).level == measured.level


@pytest.mark.parametrize(
    "damage",
    [
        lambda rows: rows[:-2],  # a collective missing
        lambda rows: [[*r[:4], -1.0] for r in rows],  # a time no call takes
        lambda rows: [[*r[:4], "fast"] for r in rows],
        lambda rows: "rows",
    ],
)
def test_a_damaged_cache_entry_is_measured_again(cache, monkeypatch, damage):
    cached(rows_of_a_level(1e-3, 5e8))
    data = json.loads(cache_path().read_text())
    data[key(2)]["rows"] = damage(data[key(2)]["rows"])
    cache_path().write_text(json.dumps(data))
    again = rows_of_a_level(2e-3, 5e8)
    monkeypatch.setattr(local, "measure", lambda *a, **k: again)
    assert local_links(2).level.latency == pytest.approx(2e-3, rel=1e-6)


def test_a_cpu_trial_with_ranks_on_this_host_is_planned_over_its_measured_links(cache):
    cached(rows_of_a_level(1e-3, 5e8))
    spec = build_spec(DP2)
    measured, note = trial_measurements.measured_links(spec, here=True, refused=False)
    assert note == "" and measured.level.latency == pytest.approx(1e-3, rel=1e-6)
    facts = trial_measurements.machine_facts(spec)
    net = planner.network_of(spec, facts, measured)
    assert net.intra.latency == pytest.approx(1e-3, rel=1e-6) and net.intra.busbw == pytest.approx(5e8, rel=1e-6)
    assert net.table is measured.table
    preset = planner.network_of(spec, facts)  # the preset's assumed level: 50 us, 5 GB/s
    assert ring_time("all_gather", 1 << 20, net) > ring_time("all_gather", 1 << 20, preset) + 1e-3
    assert "intra-node measured on this host" in assumptions.network_note(spec.cfg.hardware, facts, measured)


@pytest.mark.parametrize(
    "overrides, here",
    [
        (["hardware=cpu", "parallel.dp=1"], True),  # one rank: nothing between ranks
        (DP2, False),  # planned away from where it runs (a SLURM login node)
        (["hardware=h100-sxm", "parallel.dp=2"], True),  # a GPU's links are NCCL's, from the preset or calibrate
        ([*DP2, "hardware.kernels=preset"], True),  # nothing of this host is measured
        ([*DP2, "hardware.intra_node.name=measured: by calibrate --links"], True),  # already measured
    ],
)
def test_the_links_are_measured_only_where_the_trial_runs_here_on_a_cpu_with_several_ranks(
    cache, monkeypatch, overrides, here
):
    monkeypatch.setattr(local, "measure", lambda *a, **k: pytest.fail("measured"))
    assert trial_measurements.measured_links(build_spec(overrides), here=here, refused=False) == (None, "")


def test_links_that_cannot_be_measured_leave_the_preset_and_say_why(cache, monkeypatch):
    def fail(*a, **k):
        raise links.MeasurementFailed("2 ranks on 1 node(s) failed: no port")

    monkeypatch.setattr(local, "measure", fail)
    measured, note = trial_measurements.measured_links(build_spec(DP2), here=True, refused=False)
    assert measured is None and "could not be measured" in note and "no port" in note


def test_a_cached_call_no_link_can_make_is_measured_again():
    """A tampered local_links.json (a 16 MB call in 1e-12 s planned gloo at 2.8e8 GB/s) is
    not this host's links: refused as a cache, so they are measured again."""
    from orchestrator.measure.local_links import rows_of

    good = {"when": "2026-12-02T00:00:00Z", "rows": [[op, 2, 1, 1 << 20, 2e-3] for op in OPS]}
    assert rows_of(good) is not None
    bad = {"when": good["when"], "rows": [*good["rows"], ["all_reduce", 2, 1, 16 << 20, 1e-12]]}
    assert rows_of(bad) is None
