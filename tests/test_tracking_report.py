"""W&B offline runs read back with wandb's own reader, and the report of a real sweep."""

import csv
import json
import shutil

import pytest

from tests.conftest import FP32, PRESET_KERNELS, run_cli, wandb_summary

pytestmark = pytest.mark.slow
SECRET = "sentinel-api-key-0123456789abcdef0123456789"
CONFIG_GROUPS = {
    "model",
    "batch",
    "recompute",
    "zero",
    "numa",
    "engine",
    "cluster",
    "hardware",
    "logger",
    "parallel",
    "run",
    "choices",
    "derived",
}


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    """The local dp_bucket sweep, run once as a user would, with a W&B key in the environment."""
    out = tmp_path_factory.mktemp("sweep") / "dp_bucket_local"
    proc = run_cli(
        "run",
        "-m",
        "+sweep=dp_bucket_local",
        "run.steps=4",
        "run.warmup_steps=1",
        PRESET_KERNELS,
        FP32,
        "--out",
        str(out),
        env={"WANDB_API_KEY": SECRET},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "wandb sync" in proc.stdout
    return out


def test_every_point_has_a_wandb_run_that_matches_its_result(local_sweep):
    trials = sorted(p.parent for p in local_sweep.rglob("result.json"))
    assert len(trials) == 4
    groups = set()
    for trial in trials:
        result = json.loads((trial / "result.json").read_text())
        w = wandb_summary(trial)
        assert w["exit_code"] == 0 and w["state"] == "finished"
        # The resolved config once, nested as the groups are (W&B filters on zero.stage, ...).
        assert set(w["config"]) - {"_wandb"} == CONFIG_GROUPS
        assert w["config"]["parallel"]["dp"] == result["config"]["parallel"]["dp"]
        assert w["config"]["zero"]["reduce_bucket_size"] == result["config"]["zero"]["reduce_bucket_size"]
        assert (
            w["config"]["choices"]["model"] == "tiny"
            and w["config"]["derived"]["world_size"] == result["config"]["parallel"]["dp"]
        )
        assert w["history_records"] == result["metrics"]["steps"] == 4
        for key in ("tokens_per_sec_per_gpu", "mfu", "hfu", "step_time_s", "loss_last", "tokens"):
            assert w["summary"][f"perf/{key}"] == pytest.approx(result["metrics"][key]), key
            assert key not in w["summary"]  # measured figures only under perf/
        assert w["summary"]["plan/mfu"] == pytest.approx(result["plan"]["time"]["mfu"])
        # The step history is plotted against tokens seen.
        assert any(
            m.get("glob_name") == "train/*" and m.get("step_metric") == "train/tokens_seen" for m in w["metric_records"]
        ), w["metric_records"]
        every_step = sum(h["global_batch_size"] for h in result["metrics"]["history"])  # untimed steps too
        assert w["summary"]["train/tokens_seen"] == every_step * result["config"]["model"]["seq_len"]
        assert w["summary"]["status"] == result["status"] == "ok"
        assert w["run_record"]["job_type"] == "trial"
        assert "parallel.dp=" in w["run_record"]["display_name"]  # named by the swept values
        groups.add(w["run_record"]["run_group"])
        assert (
            "cluster:local" in w["run_record"]["tags"]
            and f"sweep:{w['run_record']['run_group']}" in w["run_record"]["tags"]
        )
        # the median's interval beside it, and the noise verdict always (True or False)
        assert (
            w["summary"]["perf/step_time_ci_low"]
            <= result["metrics"]["step_time_s"]
            <= w["summary"]["perf/step_time_ci_high"]
        )
        assert w["summary"]["perf/noisy"] is bool(result["metrics"]["noisy"])
        # every rank's figures in the one run, and whether a straggler was named (always there)
        ranks = result["metrics"]["ranks"]
        assert len([k for k in w["summary"] if k.startswith("perf/rank/") and k.endswith("/compute_s")]) == len(
            result["env"]["ranks"]
        )
        for r in ranks["ranks"]:
            for key in ("compute_s", "wait_s"):
                assert w["summary"][f"perf/rank/{r['rank']}/{key}"] == pytest.approx(r[key]["median"])
            assert w["summary"][f"perf/rank/{r['rank']}/host"] == r["host"]
        assert w["summary"]["perf/straggler/named"] is (ranks["straggler"] is not None)
        # each node's load over the steps, read by its own ranks (here one host, every rank)
        (host,) = {r["host"] for r in result["env"]["ranks"]}
        node, every = result["metrics"]["nodes"][host], sorted(r["rank"] for r in result["env"]["ranks"])
        assert node["ranks"] == every and w["summary"][f"perf/node/{host}/ranks"] == ",".join(map(str, every))
        busy = w["summary"][f"perf/node/{host}/cpu_busy_share"]
        assert busy == pytest.approx(node["cpu_busy_share"]) and 0 < busy <= 1  # a share of the node's cores
        assert 0 < w["summary"][f"perf/node/{host}/memory_used_bytes"] == node["memory_used_bytes"]
        # the last step's own throughput is not a summary figure beside perf/'s median
        assert "train/tokens_per_sec_per_gpu" not in w["summary"] and "train/step_time_s" not in w["summary"]
    (group,) = groups  # one group: the sweep, by its name and when it started
    assert group.startswith("dp_bucket_local-") and len(group) == len("dp_bucket_local-2026-11-25_17-30-00")
    # a point's directory and W&B name: what was swept, nothing fixed (run.steps=4 is not in them)
    assert all("run.steps" not in t.name and "sweep=" not in t.name for t in trials)


def test_the_sweeps_launchers_are_forks_of_one_server_each_with_its_trials_threads(local_sweep):
    """launchers/forked.py: the command imported the ranks' libraries once, in a server that
    forked every CPU trial's launcher; the dp 2 points share the server the dp 1 point
    started, with their own threads; the server ended with the command."""
    import os
    import re

    from orchestrator import machine

    servers = set()
    for trial in sorted(p.parent for p in local_sweep.rglob("result.json")):
        log = (trial / "logs" / "launcher.log").read_text()
        servers |= {int(pid) for pid in re.findall(r"forked from the launcher server (\d+)", log)}
        result = json.loads((trial / "result.json").read_text())
        dp = result["config"]["parallel"]["dp"]
        assert result["env"]["threads_per_rank"] == machine.threads_per_rank(dp), trial
        assert all(rank["forked"] for rank in result["env"]["ranks"])
    assert len(servers) == 1, servers
    with pytest.raises(ProcessLookupError):
        os.kill(servers.pop(), 0)


def test_the_api_key_reaches_no_file(local_sweep):
    leaked = [p for p in local_sweep.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaked == []


def test_report_of_the_sweep(cli, local_sweep):
    proc = cli("report", str(local_sweep))
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader((local_sweep / "report.csv").open()))
    assert len(rows) == 4 and {
        "parallel.dp",
        "zero.reduce_bucket_size",
        "tokens_per_sec_per_gpu",
        "mfu",
        "predicted_step_s",
        "peak_bytes",
        "predicted_peak_bytes",
    } <= set(rows[0])
    speeds = [float(r["tokens_per_sec_per_gpu"]) for r in rows]
    assert speeds == sorted(speeds, reverse=True)
    assert rows[0]["vs_best"] == "best" and {r["vs_best"] for r in rows[1:]} <= {
        "slower",
        "within noise",
        "too few steps to tell",
    }
    assert all(r["trial"] for r in rows)  # always a column that tells the rows apart
    assert "tokens/s/GPU" in proc.stdout and (local_sweep / "report.md").read_text().count("\n| ") >= 5
    import matplotlib.image as mpimg

    for name in ("scaling.png", "predicted_vs_measured.png", "warmup.png", "buckets.png"):  # the sweep varies buckets
        png = local_sweep / name
        assert png.stat().st_size > 10_000, name
        pixels = mpimg.imread(png)
        assert pixels.std() > 0.05, f"{name} is blank"  # axes, labels, lines drawn
    as_json = json.loads(cli("report", "--json", str(local_sweep)).stdout)
    assert len(as_json) == 4 and all(r["status"] == "ok" for r in as_json)


def test_report_of_a_directory_without_results_says_so(cli, tmp_path):
    proc = cli("report", str(tmp_path))
    assert proc.returncode == 2 and "no result.json" in proc.stderr


def test_repeats_of_a_point_are_one_row_with_their_timed_steps_pooled(cli, default_trial, tmp_path):
    """run.repeat=range(N) measures a point N times: the report shows it once, its step the
    median of every repeat's timed steps, `repeats` counting them; W&B's job type is the
    point's, so its runs group by it. (Two copies of one real trial stand for the repeats,
    the second with its steps slowed: the pooling, not the engine, is what is tested.)"""
    import statistics

    from orchestrator.workload.tracking import point_type

    sweep = tmp_path / "sweep"
    steps = []
    for repeat, slower in ((0, 1.0), (1, 1.5)):
        trial = sweep / f"{repeat}_run.repeat={repeat}"
        shutil.copytree(default_trial, trial)
        result = json.loads((trial / "result.json").read_text())
        result["overrides"] = [*result["overrides"], f"run.repeat={repeat}"]
        for h in result["metrics"]["history"]:
            h["step_time_s"] *= slower
            h["tokens_per_sec_per_gpu"] /= slower
            steps += [h["step_time_s"]] if h["timed"] else []
        (trial / "result.json").write_text(json.dumps(result))
    (row,) = json.loads(cli("report", str(sweep), "--json").stdout)
    assert row["repeats"] == 2 and row["trial"].endswith("(+1 repeats)") and "run.repeat" not in row
    assert row["step_time_s"] == pytest.approx(statistics.median(steps))
    assert (
        point_type({"swept": {"parallel.dp": 2, "run.repeat": 1}})
        == "parallel.dp=2"
        == point_type({"swept": {"parallel.dp": 2, "run.repeat": 0}})
        and point_type({"swept": {"parallel.dp": 2}}) == "trial"
    )
    assert len(point_type({"swept": {"x": "y" * 100, "run.repeat": 0}})) <= 64  # W&B's limit on a job type
    # and a sweep over it is three points of one trial each
    assert "3 plans" in cli("plan", "-m", "run.repeat=range(3)").stdout


def test_repeats_of_two_sweeps_that_differ_by_a_key_only_one_set_are_two_points(cli, default_trial, tmp_path):
    """Sweep A repeats the default; sweep B repeats it with zero.stage=1 set: the swept columns
    alone look alike, and pooling them made one point that neither configuration measured."""
    for sweep, extra in (("a", []), ("b", ["zero.stage=1"])):
        for repeat in (0, 1):
            trial = tmp_path / sweep / f"{repeat}_run.repeat={repeat}"
            shutil.copytree(default_trial, trial)
            result = json.loads((trial / "result.json").read_text())
            result["overrides"] = [*result["overrides"], *extra, f"run.repeat={repeat}"]
            (trial / "result.json").write_text(json.dumps(result))
    rows = json.loads(cli("report", str(tmp_path), "--json").stdout)
    assert len(rows) == 2 and all(r["repeats"] == 2 for r in rows)


def test_points_that_differ_only_in_a_swept_secret_stay_two_points_masked(cli, default_trial, tmp_path):
    """A swept secret is masked in every name: the two points looked alike, one W&B job type
    and one report row pooled as repeats. Each is numbered instead (sweep_batch.masked_point),
    in its name, its job type and trial.json, with nothing of the secret in any of them."""
    from orchestrator.core.redact import redact
    from orchestrator.run.sweep_batch import SweepBatch
    from orchestrator.workload.tracking import point_type

    sweep = tmp_path / "sweep"
    overrides = [
        (f"+data.api_key={key}", f"run.repeat={repeat}") for key in ("s3cret-one", "s3cret-two") for repeat in (0, 1)
    ]
    batch = SweepBatch(overrides=overrides, first=0, base=sweep, group="g")
    infos = [batch.info(i) for i in range(4)]
    assert "s3cret" not in json.dumps(infos)
    types, names = [point_type(i) for i in infos], [i["name"] for i in infos]
    assert types[0] == types[1] != types[2] == types[3] and len(set(names)) == 4, (types, names)
    assert (
        point_type(
            SweepBatch(
                overrides=[("parallel.dp=1", "run.repeat=0"), ("parallel.dp=2", "run.repeat=1")], first=0, base=sweep
            ).info(0)
        )
        == "parallel.dp=1"
    )  # no secret: no number
    for i, (info, these) in enumerate(zip(infos, overrides)):
        trial = sweep / f"{i}_{i}"
        shutil.copytree(default_trial, trial)
        result = json.loads((trial / "result.json").read_text())
        result["overrides"] = redact([*result["overrides"], *these])
        (trial / "result.json").write_text(json.dumps(result))
        meta = json.loads((trial / "trial.json").read_text())
        (trial / "trial.json").write_text(json.dumps({**meta, "sweep": redact(info)}))
    rows = json.loads(cli("report", str(sweep), "--json").stdout)
    assert len(rows) == 2 and all(r["repeats"] == 2 for r in rows), [(r["trial"], r["repeats"]) for r in rows]


def test_the_scaling_plot_labels_its_error_bars_with_what_they_cover(tmp_path, monkeypatch):
    """Four timed steps give an 88 % interval; the legend said 95 %. The label now says what
    the steps give (the figure read back from the plot itself)."""
    from orchestrator.analysis import plots
    from orchestrator.core.timing_stats import spread

    drawn = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.setdefault("fig", fig) and path)
    results = []
    for dp, tps in ((1, 1000.0), (2, 900.0)):
        s = spread([tps * f for f in (0.99, 1.0, 1.01, 1.0)]).as_dict()  # four timed steps
        results.append(
            (
                {
                    "metrics": {"tokens_per_sec_per_gpu": tps, "mfu": 0.3, "tokens_per_sec_per_gpu_spread": s},
                    "config": {"zero": {"reduce_bucket_size": 5e8}, "parallel": {"dp": dp}},
                },
                f"parallel.dp={dp}",
            )
        )
    plots.scaling_plot(results, tmp_path / "scaling.png")
    labels = [t.get_text() for ax in drawn["fig"].axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert any("interval of the median, 88%" in label for label in labels), labels
    assert not any("95 %" in label for label in labels)


def _scaling_results(engines=("deepspeed", "fsdp"), dps=(1, 2, 4)) -> list[tuple[dict, str]]:
    """Results of an engine x dp sweep as the report hands them to the plots (with labels)."""
    from orchestrator.core.timing_stats import spread

    out = []
    for engine in engines:
        for dp in dps:
            tps = (20_000.0 if engine == "fsdp" else 24_000.0) / dp**0.2
            s = spread([tps * f for f in (0.97, 1.0, 1.03, 0.99, 1.01, 1.0)]).as_dict()
            out.append(
                (
                    {
                        "status": "ok",
                        "plan": {
                            "parallel": {"nodes": 1},
                            "time": {"step_s": 0.1 * dp, "tokens_per_sec_per_gpu": tps * 1.1, "mfu": tps / 1e5},
                        },
                        "config": {
                            "zero": {"reduce_bucket_size": 5e8, "stage": 1},
                            "engine": {"name": engine},
                            "parallel": {"dp": dp},
                        },
                        "metrics": {
                            "tokens_per_sec_per_gpu": tps,
                            "mfu": tps / 1e5,
                            "step_time_s": 0.1 * dp,
                            "tokens_per_sec_per_gpu_spread": s,
                        },
                    },
                    f"engine={engine}, parallel.dp={dp}",
                )
            )
    return out


def test_the_scaling_plot_draws_a_line_per_configuration_mfu_with_its_interval_and_nothing_over_data(
    tmp_path, monkeypatch
):
    """An engine comparison was one line per bucket size (both engines on one line), the MFU
    panel had no error bars, the legend sat over the data and a point's label ran past its
    panel. Rendered and read back: the lines, the MFU bars, where each legend and label is."""
    from orchestrator.analysis import plots

    drawn = {}
    real_save = plots.save_figure
    monkeypatch.setattr(
        plots, "save_figure", lambda fig, path: drawn.setdefault(path.name, fig) and real_save(fig, path)
    )
    plots.scaling_plot(_scaling_results(engines=("deepspeed", "fsdp", "accelerate", "ddp")), tmp_path / "scaling.png")
    fig = drawn["scaling.png"]
    throughput, mfu, efficiency = fig.axes
    measured = {c.get_label(): list(c.lines[0].get_xdata()) for c in throughput.containers}
    assert sorted(k.split(",")[0] for k in measured) == [
        "engine=accelerate",
        "engine=ddp",
        "engine=deepspeed",
        "engine=fsdp",
    ], measured
    assert all(x == [1, 2, 4] for x in measured.values())
    assert len(mfu.containers) == 4 and all(c.has_yerr for c in mfu.containers)  # MFU with its interval
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # the figure as saved (closed once written: it had lost its canvas)
    canvas.draw()
    renderer = canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend().get_window_extent(renderer)
        points = [ax.transData.transform(xy) for line in ax.get_lines() for xy in line.get_xydata()]
        assert not any(legend.contains(*xy) for xy in points), f"{ax.get_title()}: the legend covers a point"
        box = ax.get_window_extent(renderer)
        for text in ax.texts:
            extent = text.get_window_extent(renderer)
            assert box.x0 <= extent.x0 and extent.x1 <= box.x1, f"{ax.get_title()}: {text.get_text()} past the panel"


def test_a_bucket_plot_is_drawn_only_for_configurations_that_ran_at_several_bucket_sizes(tmp_path, monkeypatch):
    """Two engines, each at its own bucket size, were drawn as one bucket-size line."""
    from orchestrator.analysis import plots
    from orchestrator.records.trial_dir import SweepPaths

    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(path.name) or path)
    for other in ("scaling_plot", "predicted_vs_measured_plot", "warmup_plot"):
        monkeypatch.setattr(plots, other, lambda *a: None)
    results = _scaling_results(engines=("deepspeed", "accelerate"), dps=(2,))
    results[1][0]["config"]["zero"]["reduce_bucket_size"] = 2e8
    plots.report_plots(*zip(*results), SweepPaths(tmp_path))
    assert drawn == []
    results += [
        (
            {**results[0][0], "config": {**results[0][0]["config"], "zero": {"reduce_bucket_size": 1e6, "stage": 1}}},
            results[0][1],
        )
    ]
    plots.report_plots(*zip(*results), SweepPaths(tmp_path))  # deepspeed at two sizes: its line alone
    assert drawn == ["buckets.png"]


def test_a_plain_runs_wandb_run_has_a_name_and_a_noise_verdict(default_trial):
    """`orchestrator run` with no sweep: its W&B run was unnamed; now its overrides, or
    (none here) its directory's name."""
    w = wandb_summary(default_trial)
    assert w["run_record"]["display_name"] == default_trial.name
    assert w["summary"]["perf/noisy"] in (True, False)
    # how busy the host was as the ranks started, as result.json has it
    result = json.loads((default_trial / "result.json").read_text())
    assert w["summary"]["perf/host_busy_share"] == pytest.approx(result["host_load"]["busy_share"])


def test_the_bucket_plot_draws_one_line_per_configuration_and_no_fsdp2_point(tmp_path, monkeypatch):
    """buckets.png drew dp 1 and dp 2 of one node as one line, and FSDP2 trials (which
    reduce-scatter per block, whatever the bucket size) at 5e8: read back from the plot.
    Its second panel draws exposed communication, the plan's and the measured, per point."""
    from orchestrator.analysis import plots

    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append((path.name, fig)) or path)
    results, labels = [], []
    for engine, dp, bucket in (
        ("deepspeed", 1, 1e6),
        ("deepspeed", 1, 5e8),
        ("deepspeed", 2, 1e6),
        ("deepspeed", 2, 5e8),
        ("fsdp", 2, 5e8),
    ):
        results.append(
            {
                "status": "ok",
                "plan": {
                    "parallel": {"nodes": 1},
                    "time": {"step_s": 0.1 * dp},
                    "comm": {"exposed_s": 0.01 * dp, "collectives": []},
                },
                "config": {
                    "zero": {"reduce_bucket_size": bucket, "stage": 2},
                    "engine": {"name": engine},
                    "parallel": {"dp": dp},
                },
                "metrics": {
                    "step_time_s": 0.1 * dp,
                    "ranks": {"exposed_comm": {"exposed_s": 0.02 * dp * (2 if bucket > 1e6 else 1)}},
                },
            }
        )
        labels.append(f"engine={engine}, parallel.dp={dp}, zero.reduce_bucket_size={bucket:g}")
    monkeypatch.setattr(plots, "scaling_plot", lambda *a: None)
    monkeypatch.setattr(plots, "predicted_vs_measured_plot", lambda *a: None)
    monkeypatch.setattr(plots, "warmup_plot", lambda *a: None)
    from orchestrator.records.trial_dir import SweepPaths

    plots.report_plots(results, labels, SweepPaths(tmp_path))
    (fig,) = [f for name, f in drawn if name == "buckets.png"]
    step, exposed = fig.axes
    lines = {line.get_label(): list(line.get_xdata()) for line in step.get_lines()}
    assert set(lines) == {
        f"engine=deepspeed, parallel.dp={dp}, 1 node(s), {kind}" for dp in (1, 2) for kind in ("predicted", "measured")
    }
    assert all(x == [1e6, 5e8] for x in lines.values())
    drawn_ms = {line.get_label(): list(line.get_ydata()) for line in exposed.get_lines()}
    assert drawn_ms["engine=deepspeed, parallel.dp=2, 1 node(s), measured"] == pytest.approx([40, 80])
    assert drawn_ms["engine=deepspeed, parallel.dp=2, 1 node(s), predicted"] == pytest.approx([20, 20])


def test_a_report_across_two_sweeps_keeps_the_column_that_tells_them_apart(cli, default_trial, tmp_path):
    """Sweep a over parallel.dp, sweep b the same with zero.stage=1 set: one value of
    zero.stage among all the rows, so it was dropped, and a's rows and b's looked alike."""
    for sweep, extra in (("a", []), ("b", ["zero.stage=1"])):
        for dp in (1, 2):
            trial = tmp_path / sweep / f"{dp - 1}_parallel.dp={dp}"
            shutil.copytree(default_trial, trial)
            result = json.loads((trial / "result.json").read_text())
            result["overrides"] = [*extra, f"parallel.dp={dp}"]
            (trial / "result.json").write_text(json.dumps(result))
    rows = json.loads(cli("report", str(tmp_path), "--json").stdout)
    by_trial = {r["trial"]: r for r in rows}
    assert all(by_trial[f"b/{d}_parallel.dp={d + 1}"].get("zero.stage") == "1" for d in (0, 1))
    assert all(not by_trial[f"a/{d}_parallel.dp={d + 1}"].get("zero.stage") for d in (0, 1))
