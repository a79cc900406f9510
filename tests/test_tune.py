"""orchestrator tune: the space (axes from Hydra's sweep syntax, what a stage reads), the
search's policy (what it runs next, what an OOM teaches), bad input before anything runs,
and one real search on this CPU that is interrupted by its budget and resumed."""

import json
import math
from pathlib import Path

import pytest

from orchestrator.analysis.tune.search import CandidateRun, Search
from orchestrator.analysis.tune.space import DEFAULT_AXES, axes_of, plan_space, points
from orchestrator.core.errors import ConfigError
from tests.conftest import FP32, run_cli

GPU = ["model=gpt2-1.3b", "hardware=h100-sxm", "parallel.dp=8", "zero.reduce_bucket_size=2e8"]


def test_sweep_syntax_replaces_an_axis_a_plain_override_fixes_it_and_a_new_key_adds_one():
    fixed, axes = axes_of(
        [
            "model=gpt2-350m",
            "zero=stage3",
            "batch.micro_batch_size=1,2",
            "zero.overlap_comm=true,false",
        ]
    )
    assert fixed == ["model=gpt2-350m", "zero=stage3"]
    assert "zero" not in axes and axes["batch.micro_batch_size"] == ["1", "2"]
    assert [v.lower() for v in axes["zero.overlap_comm"]] == ["true", "false"]
    assert axes["recompute"] == DEFAULT_AXES["recompute"]
    with pytest.raises(ConfigError, match="a list of values"):
        axes_of(["batch.micro_batch_size=interval(1,4)"])


def test_a_candidate_leaves_out_the_axes_its_stage_does_not_read():
    keys = points(
        {
            "zero": ["stage0", "stage3"],
            "zero.prefetch_bucket_size": ["1e6", "2e6"],
            "zero.allgather_bucket_size": ["1e6", "2e6"],
        },
        None,
    )
    assert ("zero=stage0",) in keys  # neither bucket is read at stage 0: one candidate, not four
    assert len(keys) == 1 + 2 and len(set(keys)) == len(keys)
    assert all("allgather" not in o for k in keys for o in k)  # stage 3 has no allgather bucket


def test_candidates_the_same_in_effect_are_planned_and_run_once():
    """On the tiny model every default bucket (5e7 and up) holds the whole model, and on a
    CPU device offload moves nothing: of 3 x 3 buckets x 2 offloads one candidate runs, the
    others say which it is. On a GPU model with buckets below its size they all differ."""
    space = plan_space(["hardware=cpu", "model=tiny", "zero=stage2", "batch.micro_batch_size=1", "recompute=none"])
    (kept,) = space.fitting
    same = [c for c in space.candidates if c.status == "same in effect"]
    assert len(same) == 3 * 3 * 2 - 1 - len([c for c in space.candidates if c.status == "invalid"])
    assert all(f"runs as {kept.label()} does" in c.reason and "one bucket" in c.reason for c in same)
    gpu = plan_space([*GPU, "zero=stage2", "batch.micro_batch_size=1", "recompute=none", "zero.offload_optimizer=none"])
    assert not [c for c in gpu.candidates if c.status == "same in effect"] and len(gpu.candidates) == 3


def test_the_space_is_planned_and_the_search_runs_the_fastest_by_the_plan_first():
    space = plan_space([*GPU, "recompute=none,full", "zero.offload_optimizer=none"])
    assert space.fitting and all(c.predicted_tokens_per_sec_per_gpu for c in space.fitting)
    dropped = [c for c in space.candidates if c.status != "fits"]
    assert all("GiB" in c.reason for c in dropped if c.status == "does not fit")
    search = Search(space)
    first = search.next_batch(2)
    assert [search.predicted(c) for c in first] == sorted((search.predicted(c) for c in space.fitting), reverse=True)[
        :2
    ]


def test_an_oom_drops_every_candidate_planned_at_or_above_its_memory_and_says_why():
    search = Search(plan_space([*GPU, "zero=stage2", "zero.offload_optimizer=none"]))
    by_memory = sorted(search.space.fitting, key=lambda c: c.predicted_memory)
    middle = by_memory[len(by_memory) // 2]
    search.record(middle, CandidateRun("oom", "t", 1, error="CUDA out of memory"))
    assert all(c.predicted_memory < middle.predicted_memory for c in search.runnable())
    assert search.runnable() and search.dropped_by_oom()
    rows = {r["candidate"]: r for r in search.table()}
    dropped = rows[search.dropped_by_oom()[0].label()]
    assert dropped["status"].startswith("dropped") and "under-estimates" in dropped["reason"]
    assert middle not in search.next_batch(100)


def test_calibration_on_measured_candidates_moves_the_predictions_toward_them():
    """Measurements made up as 0.6x the plan's speed: after calibrating, the predictions of
    the candidates not measured follow, and nothing predicted far below the best is run."""
    search = Search(plan_space([*GPU, "zero=stage1", "zero.offload_optimizer=none", "recompute=full,none"]))
    for c in search.next_batch(2):
        search.record(c, CandidateRun("ok", "t", 1, 0.6 * c.predicted_tokens_per_sec_per_gpu, c.predicted_step_s / 0.6))
    search.calibrate()
    assert search.uncertainty is not None and search.uncertainty < 0.1
    others = [c for c in search.runnable() if c.key not in search.outcomes]
    ratios = [search.predicted(c) / c.predicted_tokens_per_sec_per_gpu for c in others]
    assert all(0.5 < r < 0.8 for r in ratios), ratios  # 1.0 before; communication does not scale with compute
    best = search.best()[1].tokens_per_sec_per_gpu
    assert all(search.bound(c) > math.log(best) for c in search.next_batch(100))


def test_the_search_compares_the_calibrated_model_with_the_rate_at_the_median_step():
    """Two candidates the plan cannot tell apart (only the seed differs). The first is measured
    as a CI run on a busy machine measured it: timed steps of 0.52 and 0.12 s, whose median
    step gives 400 tokens/s/GPU while the median of the steps' own rates reads 662. The model
    calibrated on it predicts the second at the median step's rate: compared with 662 the
    search would stop there; compared like with like, the second still runs."""
    search = Search(
        plan_space(
            [
                *GPU,
                "zero=stage2",
                "batch.micro_batch_size=1",
                "recompute=none",
                "zero.offload_optimizer=none",
                "zero.allgather_bucket_size=2e8",
                "run.seed=1,2",
            ]
        )
    )
    first, second = search.space.fitting
    step_s = 2 * first.predicted_step_s
    at_median_step = first.spec.tokens_per_step / step_s / first.spec.world_size
    search.record(first, CandidateRun("ok", "t", 1, 1.65 * at_median_step, step_s))
    search.calibrate()
    assert search.rate_at_median_step(first, search.outcomes[first.key]) == pytest.approx(at_median_step)
    assert search.predicted(second) == pytest.approx(at_median_step, rel=0.02)
    assert search.next_batch(1) == [second]


def test_a_space_where_nothing_fits_says_so_before_anything_runs(cli, tmp_path):
    out = tmp_path / "t"
    proc = cli(
        "tune",
        "--out",
        str(out),
        "model=llama3-70b",
        "hardware=h100-sxm",
        "parallel.dp=1",
        "zero=stage0,stage1",
        "zero.offload_optimizer=none",
        "cluster=slurm",
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr  # the plan refuses, as `plan` says of one trial
    assert "none does" in proc.stderr and "GiB" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()
    proc = cli("tune", "--out", str(out), "batch.micro_batch_size=range(1,1)")
    assert proc.returncode == 2 and "empty" in proc.stderr
    # a GPU space on a machine without one (this one): said before its candidates are planned
    proc = cli("tune", "--out", str(out), "model=llama3-70b", "hardware=h100-sxm", "zero=stage0,stage1")
    assert proc.returncode == 2 and "no GPU" in proc.stderr and "candidates" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_real_search_runs_its_budget_records_a_winner_and_resumes_without_rerunning(cli, tmp_path):
    out = tmp_path / "tune"
    # W&B offline and a secret in a setup line: it reaches no file of the search and no output.
    space = [
        "logger.mode=offline",
        FP32,
        "run.steps=3",
        "run.warmup_steps=1",
        "parallel.dp=1",
        "zero=stage0,stage1",
        "batch.micro_batch_size=1,2",
        "recompute=none",
        "zero.reduce_bucket_size=1e6",
        "zero.allgather_bucket_size=1e6",
        "zero.offload_optimizer=none",
        "cluster.setup=['export WANDB_API_KEY=s3crettune']",
    ]
    proc = run_cli("tune", "--out", str(out), "--trials", "2", *space, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "s3crettune" not in proc.stdout + proc.stderr
    assert not [p for p in out.rglob("*") if p.is_file() and b"s3crettune" in p.read_bytes()]
    state = json.loads((out / "tune.json").read_text())
    assert state["ran"] == 2 and state["winner"] and (out / "tune.png").is_file()
    first = {r["trial_dir"] for r in state["rows"] if r["trial_dir"]}
    assert state["winner"]["measured_tokens_per_sec_per_gpu"] > 0 and state["winner"]["engine_configs"]
    proc = run_cli("tune", "--out", str(out), "--trials", "3", *space, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = json.loads((out / "tune.json").read_text())
    again = {r["trial_dir"] for r in state["rows"] if r["trial_dir"]}
    # The first two kept, not re-run; a third only if the calibrated bound still says it may win.
    assert first <= again and state["ran"] == len(again) in (2, 3) and state["stopped"]
    assert "resuming" in proc.stdout
    # one search, one W&B group: a round after the resume runs in the first rounds' group
    sweeps = [json.loads((Path(d) / "trial.json").read_text())["sweep"] for d in again]
    assert len({s["group"] for s in sweeps}) == 1, sweeps
    # each run named by what it tried (the stage and micro batch), the resumed round's alone too
    assert all("zero=stage" in s["name"] and "batch.micro_batch_size=" in s["name"] for s in sweeps), sweeps
    # `report` on the tune's directory reports its trials and renders the tune's own files again
    (out / "tune.md").unlink()
    (out / "tune.png").unlink()
    proc = cli("report", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "report.md").is_file() and (out / "tune.png").is_file()
    assert f"{state['ran']} of" in (out / "tune.md").read_text().splitlines()[0]


def test_a_winner_from_candidates_that_all_ran_on_a_busy_host_is_said_to_be_so(tmp_path):
    """tune named a winner from trials that all started on a fully busy host without a word:
    now the winner record says so (each trial's result.json host_load, as the launcher wrote it)."""
    from orchestrator.analysis.tune.record import winner

    search = Search(plan_space([*GPU, "zero=stage2", "zero.offload_optimizer=none"]))
    for i, (c, busy) in enumerate(zip(search.space.fitting[:2], (0.97, 0.91))):
        trial = tmp_path / f"{i}_t"
        trial.mkdir()
        (trial / "result.json").write_text(json.dumps({"status": "ok", "host_load": {"busy_share": busy}}))
        search.record(c, CandidateRun("ok", str(trial), 1, tokens_per_sec_per_gpu=1000.0 + i, step_s=1.0))
    said = winner(search)["busy_hosts"]
    assert "every candidate that ran started on a busy host (91%-97%" in said
    (tmp_path / "0_t" / "result.json").write_text(json.dumps({"status": "ok", "host_load": {"busy_share": 0.02}}))
    assert winner(search)["busy_hosts"] == ""  # one quiet start: the comparison had a quiet trial


def test_a_tune_rounds_runs_are_named_by_what_they_tried(tmp_path):
    """A round's runs were named by what differed within the round: a round of one had every
    override in its name, a round of two only the axis they differed on. Now a run's name is
    what it tried: every override the command line did not fix."""
    from orchestrator.run.sweep_batch import SweepBatch

    fixed = frozenset({"parallel.dp=1", "zero=stage0,stage1", "batch.micro_batch_size=1,2"})
    point = ("parallel.dp=1", "zero=stage1", "batch.micro_batch_size=2", "recompute=none")
    alone = SweepBatch([point], 4, tmp_path, fixed=fixed)
    assert alone.info(0)["name"] == "zero=stage1,batch.micro_batch_size=2,recompute=none"
    pair = SweepBatch([point, (*point[:2], "batch.micro_batch_size=1", point[3])], 5, tmp_path, fixed=fixed)
    assert [pair.info(i)["name"] for i in range(2)] == [
        "zero=stage1,batch.micro_batch_size=2,recompute=none",
        "zero=stage1,batch.micro_batch_size=1,recompute=none",
    ]


def test_a_resumed_tune_keeps_the_group_its_trials_ran_in(tmp_path):
    from orchestrator.commands import resumed_group

    assert resumed_group(tmp_path) is None
    for i in range(2):
        trial = tmp_path / f"{i}_x"
        trial.mkdir()
        (trial / "result.json").write_text("{}")
        (trial / "trial.json").write_text(json.dumps({"sweep": {"group": "tune-2026-12-02_07-00-00"}}))
    assert resumed_group(tmp_path) == "tune-2026-12-02_07-00-00"
