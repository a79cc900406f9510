"""A trial's timed steps as a median with its spread and interval (orchestrator/core/timing_stats.py),
and the report's verdict against the best trial. Pure arithmetic, then the report on
crafted result files."""

import json
import statistics

import pytest

from orchestrator.analysis.report import collect
from orchestrator.core.timing_stats import NOISY_RELATIVE_IQR, beyond_noise, coverage, median_interval, spread

# The trial, timed while another job ran on the machine.
BUSY = [1.089, 0.136, 0.458, 0.12, 0.536, 0.855, 0.892, 0.763]
# A quiet run's steps (the default trial on an H100, 8 timed steps).
QUIET = [0.1058, 0.1055, 0.1046, 0.1047, 0.1047, 0.1065, 0.1058, 0.1060]


def test_the_median_and_its_interval_of_planted_steps():
    s = spread(BUSY)
    assert s.median == pytest.approx(statistics.median(BUSY)) and s.n == 8
    assert s.q1 == pytest.approx(0.3775) and s.q3 == pytest.approx(0.86425)
    # 8 values: only the whole range reaches 95 % (it covers 1 - 2/256)
    assert (s.ci_low, s.ci_high, s.confidence) == (min(BUSY), max(BUSY), pytest.approx(1 - 2 / 256))
    assert "75% of the median" in s.noisy()
    assert spread(QUIET).noisy() is None and spread(QUIET).relative_iqr < NOISY_RELATIVE_IQR


def test_the_interval_takes_the_binomial_ranks():
    # n = 20: x_(6) .. x_(15), the sign-test interval of the tables (95.9 %)
    low, high, cover = median_interval([float(i) for i in range(1, 21)])
    assert (low, high) == (6.0, 15.0) and cover == pytest.approx(0.9586, abs=1e-4)
    assert coverage(20, 7) < 0.95 <= coverage(20, 6)
    # one value: an interval of no confidence; five: the range, at 94 %
    assert median_interval([3.0]) == (3.0, 3.0, 0.0)
    assert median_interval([5.0, 1.0, 4.0, 2.0, 3.0]) == (1.0, 5.0, pytest.approx(1 - 2 / 32))
    with pytest.raises(ValueError):
        spread([])


def test_differences_beyond_both_intervals_only_are_real():
    fast, close, slow = (
        spread([1.0, 1.01, 0.99, 1.02, 0.98, 1.0]),
        spread([1.01, 1.03, 1.0, 1.02, 0.99, 1.01]),
        spread([1.2, 1.22, 1.19, 1.21, 1.18, 1.2]),
    )  # six steps each: the fewest a 95 % interval takes
    assert not beyond_noise(fast, close) and beyond_noise(fast, slow) and beyond_noise(slow, fast)


def _trial(directory, name, steps):
    tps = [1000 / s for s in steps]
    metrics = {
        "tokens_per_sec_per_gpu": statistics.median(tps),
        "step_time_s": statistics.median(steps),
        "tokens_per_sec_per_gpu_spread": spread(tps).as_dict(),
        "step_time_spread": spread(steps).as_dict(),
        "noisy": spread(steps).noisy(),
    }
    trial = directory / name
    trial.mkdir()
    (trial / "result.json").write_text(
        json.dumps({"status": "ok", "overrides": [f"zero.stage={name[-1]}"], "metrics": metrics})
    )


def test_the_report_says_which_trials_differ_from_the_best_beyond_noise(tmp_path):
    _trial(tmp_path, "stage0", [1.0, 1.01, 0.99, 1.02, 0.98, 1.0])
    _trial(tmp_path, "stage1", [1.01, 1.03, 1.0, 1.02, 0.99, 1.01])  # as fast, within the noise
    _trial(tmp_path, "stage2", [1.3, 1.32, 1.29, 1.31, 1.28, 1.3])  # slower beyond both intervals
    _trial(tmp_path, "stage3", [0.9, 2.9, 0.95, 3.1, 1.0, 2.8])  # scattered: noisy
    rows, _ = collect(tmp_path)
    verdicts = {r["trial"]: (r["vs_best"], bool(r["noisy"])) for r in rows}
    assert rows[0]["trial"] == "stage0" and verdicts["stage0"] == ("best", False)
    assert verdicts["stage1"] == ("within noise", False) and verdicts["stage2"] == ("slower", False)
    assert verdicts["stage3"][1] is True


def test_timing_stops_once_the_median_is_pinned_and_not_before_the_fewest_steps():
    from orchestrator.core.timing_stats import precise_enough

    steady = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98]
    assert precise_enough(steady, 0.05, 6) and not precise_enough(steady[:5], 0.05, 5)  # 5 steps: 94 % at best
    assert not precise_enough(steady, 0.05, 7)  # fewer than asked for
    assert not precise_enough(BUSY, 0.05, 6) and precise_enough(BUSY, 5.0, 6)


def test_a_verdict_needs_intervals_of_their_stated_confidence(tmp_path):
    """One or four timed steps give no 95 % interval: two identical one-step trials 0.6 %
    apart are not "slower", and the report says it cannot tell."""
    one, other = spread([1.0]), spread([1.006])
    assert one.confidence == 0 and not beyond_noise(one, other)
    four = spread([1.0, 1.01, 0.99, 1.0])
    assert four.confidence < 0.95 and not beyond_noise(four, spread([2.0, 2.01, 1.99, 2.0]))
    _trial(tmp_path, "stage0", [1.0])
    _trial(tmp_path, "stage1", [1.006])
    rows, _ = collect(tmp_path)
    assert [r["vs_best"] for r in rows] == ["best", "too few steps to tell"]


def test_the_medians_interval_costs_one_pass_over_the_binomial(monkeypatch):
    """A 4,000-step trial's interval summed its tail again for every j in n-bit integers (268 s
    after its last step, again at every step under run.timing_ci): now each term once."""
    from orchestrator.core import timing_stats

    calls = []
    real = timing_stats._half_binomial
    monkeypatch.setattr(timing_stats, "_half_binomial", lambda n, i: calls.append(i) or real(n, i))
    low, high, covered = timing_stats.median_interval([float(i) for i in range(4000)])
    assert len(calls) <= 2001 and covered >= 0.95 and low < 2000 < high
    assert abs(covered - timing_stats.coverage(4000, int(low) + 1)) < 1e-9  # the same figure as the direct sum


def test_crafted_step_times_rank_no_trial_and_crash_no_report(tmp_path):
    """A hand-edited result's zero, negative or string figures are shown empty and rank last;
    a spread beside a figure that is not one is no verdict."""
    _trial(tmp_path, "stage0", [1.0, 1.01, 0.99, 1.02, 0.98, 1.0])
    for name, value in (("stage1", -0.1), ("stage2", 0), ("stage3", "fast")):
        _trial(tmp_path, name, [1.0, 1.01, 0.99, 1.02, 0.98, 1.0])
        path = tmp_path / name / "result.json"
        result = json.loads(path.read_text())
        result["metrics"].update(step_time_s=value, tokens_per_sec_per_gpu=value)
        result["metrics"]["history"] = [{"timed": True, "step_time_s": value, "tokens_per_sec_per_gpu": value}]
        path.write_text(json.dumps(result))
    rows, _ = collect(tmp_path)
    assert rows[0]["trial"] == "stage0" and rows[0]["vs_best"] == "best"
    assert all(
        r["tokens_per_sec_per_gpu"] is None and r["step_time_s"] is None and r["vs_best"] == "" for r in rows[1:]
    )


def test_the_report_tables_carry_each_trials_interval_and_how_busy_its_host_was(tmp_path):
    """A steady load slows every step alike (no scatter, no noisy mark): the host's share busy
    at the start says so beside the interval, in report.csv, report.md and the terminal's table."""
    from orchestrator.analysis.report import write_report

    _trial(tmp_path, "stage0", [1.0, 1.01, 0.99, 1.02, 0.98, 1.0])
    _trial(tmp_path, "stage1", [7.5, 7.51, 7.49, 7.52, 7.48, 7.5])
    path = tmp_path / "stage1" / "result.json"
    result = json.loads(path.read_text())
    result["host_load"] = {"busy_share": 0.93, "cores": 2}
    path.write_text(json.dumps(result))
    rows, results = collect(tmp_path)
    slow = next(r for r in rows if r["trial"] == "stage1")
    assert slow["host_busy"] == "93%" and slow["vs_best"] == "slower" and not slow["noisy"]
    assert slow["step_time_interval"].startswith("7.48-7.52 s (97%, 6 steps)")
    write_report(tmp_path, rows, results)
    assert (
        "93%" in (tmp_path / "report.md").read_text() and "step_time_interval" in (tmp_path / "report.csv").read_text()
    )
