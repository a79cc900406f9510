"""measured_file.cached_or_measured: the one policy of the CPU's peak and this host's links' caches."""

import json

import pytest

from orchestrator.measure.measured_file import cached_or_measured


def usable(value) -> bool:
    return isinstance(value, float) and 0 < value < 10


def test_a_usable_entry_is_read_and_nothing_is_measured(tmp_path):
    path = tmp_path / "cache.json"
    path.write_text(json.dumps({"k": 2.5}))
    assert cached_or_measured(path, "k", usable, lambda: pytest.fail("measured again")) == 2.5


@pytest.mark.parametrize("held", ['{"k": 99.0}', '{"k": "fast"}', "[1, 2]", '"text"', "not json"])
def test_an_entry_that_cannot_be_is_said_and_measured_again(tmp_path, capsys, held):
    path = tmp_path / "cache.json"
    path.write_text(held)
    assert cached_or_measured(path, "k", usable, lambda: 1.5) == 1.5
    assert json.loads(path.read_text())["k"] == 1.5
    warned = capsys.readouterr().err
    assert (str(path) in warned and "measured again" in warned) == held.startswith('{"k"'), warned


def test_a_cache_that_cannot_be_written_costs_only_the_measurement(tmp_path):
    blocked = tmp_path / "a file, not a folder"
    blocked.write_text("x")
    calls = []
    assert cached_or_measured(blocked / "cache.json", "k", usable, lambda: calls.append(1) or 3.0) == 3.0
    assert cached_or_measured(blocked / "cache.json", "k", usable, lambda: calls.append(1) or 3.0) == 3.0
    assert len(calls) == 2  # nothing was kept, and nothing failed
