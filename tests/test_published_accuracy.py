"""The plan against every published measurement the project holds, on every change.

Each set of bench/data is planned with the shipped presets (bench/published.py: nothing
timed, so the figures are the same on every machine and no load moves them), and held to
its floor in bench/data/floors.json. The docs' accuracy tables are the ones
bench/doc_figures.py renders from the same plans: a stale one fails here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import doc_figures  # noqa: E402 (bench/ is not a package: on the path first)
import published  # noqa: E402


@pytest.mark.parametrize("name", list(published.SETS))
def test_each_published_set_stays_at_or_above_its_floor(name):
    within, rows = published.share_within(list(doc_figures.planned(name)))
    floor = published.floors()[name]
    assert within >= floor, (
        f"{name}: {within} of {rows} rows within 20 % of what ran, below its floor of {floor} "
        "(bench/data/floors.json); `python bench/published.py --rows` shows each row"
    )
    assert rows == len(published.SETS[name].rows()) and rows > 0


def test_calibration_holds_on_the_rows_it_did_not_see():
    held_out, params = doc_figures.held_out()
    within, rows = published.share_within(list(held_out))
    assert rows == 9 and within >= published.floors()["ultrascale-1b-calibrated"], (within, rows, params)


@pytest.mark.parametrize("stage", [0, 1])
def test_exposed_communication_scales_as_it_ran_on_the_runs_own_network(stage):
    """dp 256 / dp 8 at one micro batch a step: where the gradient reduction has nothing to
    hide behind. Planned on the network those runs measured, it must stay within 10 %."""
    measured, predicted = published.scaling_ratio(list(doc_figures.planned("ultrascale-1b")), stage)
    tolerance = json.loads(published.FLOORS.read_text())["scaling_ratio_tolerance"]
    assert abs(predicted / measured - 1) <= tolerance, (stage, measured, predicted)


def test_a_floor_exists_for_every_set_and_no_floor_for_a_set_that_is_gone():
    assert set(published.floors()) == {*published.SETS, "ultrascale-1b-calibrated"}


def test_every_figure_block_in_the_docs_is_what_the_code_plans_now():
    stale, seen = [], set()
    for path in doc_figures.docs():
        for name, body in doc_figures.blocks_in(path.read_text()):
            assert name in doc_figures.BLOCKS, f"{path.name}: a block named {name!r} that no renderer writes"
            seen.add(name)
            if body != doc_figures.BLOCKS[name]():
                stale.append(f"{path.name}: {name}")
    assert not stale, f"stale figures, rewrite them with `python bench/doc_figures.py`: {stale}"
    assert seen == set(doc_figures.BLOCKS), f"renderers whose table no document shows: {set(doc_figures.BLOCKS) - seen}"


def test_a_block_that_differs_from_its_renderer_is_rewritten_and_nothing_else_is():
    body = doc_figures.BLOCKS["ultrascale-scaling"]()
    fence = ("<!-- figures: ultrascale-scaling -->\n", "<!-- /figures: ultrascale-scaling -->")
    text = f"before\n{fence[0]}| an old figure |\n{fence[1]}\nafter\n"
    new = doc_figures.rewrite(text)
    assert new == f"before\n{fence[0]}{body}{fence[1]}\nafter\n"
    assert doc_figures.rewrite(new) == new


def test_the_error_the_plan_states_is_no_smaller_than_its_misses_on_rows_it_was_not_fitted_on():
    """HELD_OUT_ERROR, below which `plan -m` does not rank two points, is the median miss on
    the published rows no preset was fitted on; it may not claim more accuracy than that."""
    import statistics

    from orchestrator.plan.prediction import HELD_OUT_ERROR

    misses = [abs(p.ratio - 1) for name in ("ultrascale-1b", "fms-fsdp-eager") for p in doc_figures.planned(name)]
    assert statistics.median(misses) <= HELD_OUT_ERROR <= statistics.median(misses) + 0.02, statistics.median(misses)
