"""run, plan and translate as Hydra apps: Hydra's flags, its output layout, its sweep
grammar, its sweeper plugins (a real Optuna study), and errors that exit 2 with a
did-you-mean. Real Hydra throughout; the trials are real (CPU, gloo)."""

import json

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.hydra_glue.compose import expand_sweep
from tests.conftest import FP32, PRESET_KERNELS, run_cli, run_in_process

FAST = ["run.steps=1", "run.warmup_steps=0", "logger.mode=disabled", "parallel.dp=1", PRESET_KERNELS, FP32]


# --- Hydra's flags: each flag and the output it must give ----------------------------------

FLAGS = [
    (["plan", "--cfg", "job"], ["zero:", "reduce_bucket_size:", "parallel:"], ["hydra:"]),
    (["plan", "--cfg", "hydra"], ["hydra:", "OrchestratorLauncher", "sweep:"], ["reduce_bucket_size:"]),
    (["plan", "--cfg", "all", "model=gpt2-350m"], ["hydra:", "hidden: 1024"], []),
    (["plan", "--cfg", "job", "--package", "zero"], ["stage: 0", "reduce_bucket_size:"], ["parallel:"]),
    (["run", "--cfg", "job", "--resolve", "model=llama3-8b"], ["arch: llama", "hidden: 4096"], []),
    (["plan", "--info"], ["Config search path", "orchestrator"], []),
    (["plan", "--info", "defaults"], ["model/tiny", "hydra/launcher/orchestrator"], []),
    (
        ["run", "--help"],
        ["--out", "--overwrite", "--multirun", "OVERRIDE", "model: ", "gpt2-350m", "Exit codes"],
        ["--json", "--trials"],
    ),
    # each command's help shows its own flags, not another's
    (["plan", "--help"], ["plan's own flags", "--json", "--max-points"], ["--trials", "--overwrite", "--out DIR"]),
    (["tune", "--help"], ["tune's own flags", "--trials N", "--minutes M", "--out DIR"], ["--json"]),
    (["translate", "--help"], ["--out DIR", "(required)"], ["--json", "--trials"]),
    (["plan", "--hydra-help"], ["--shell-completion", "--config-dir"], []),
    (["run", "--shell-completion", "install=bash"], ["complete", "hydra_bash_completion"], []),
]


@pytest.mark.parametrize("argv,present,absent", FLAGS, ids=[" ".join(f[0]) for f in FLAGS])
def test_a_hydra_flag_gives_hydras_output(argv, present, absent, capsys):
    assert main(argv) == 0
    out = capsys.readouterr().out
    for text in present:
        assert text in out, text
    for text in absent:
        assert text not in out, text


def test_config_name_and_config_dir_choose_the_tree(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.yaml").write_text(
        "arch: gpt2\nn_layers: 3\nhidden: 96\nheads: 4\nkv_heads: 4\n"
        "ffn_hidden: 384\nvocab: 512\nseq_len: 64\nmax_positions: 64\n"
        "tie_embeddings: true\n"
    )
    assert main(["plan", "--json", "-cd", str(tmp_path), "model=mine", PRESET_KERNELS]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["parameters"] == 512 * 96 + 64 * 96 + 3 * (12 * 96 * 96 + 13 * 96) + 2 * 96
    assert main(["plan", "--cfg", "job", "-cd", str(tmp_path), "model=mine"]) == 0
    assert "hidden: 96" in capsys.readouterr().out
    assert main(["plan", "-cn", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_glob_range_and_choice_expand_as_in_hydra():
    assert [p for p in expand_sweep(["zero=glob(*)"])] == [[f"zero=stage{s}"] for s in range(4)]
    assert expand_sweep(["zero=glob(include=[stage1,stage2])"]) == [["zero=stage1"], ["zero=stage2"]]
    assert expand_sweep(["zero=glob(*,exclude=stage0)"]) == [[f"zero=stage{s}"] for s in (1, 2, 3)]
    assert expand_sweep(["parallel.dp=range(1,4)"]) == [["parallel.dp=1"], ["parallel.dp=2"], ["parallel.dp=3"]]
    assert expand_sweep(["parallel.dp=choice(1,2)", "zero=stage1,stage2"]) == [
        ["parallel.dp=1", "zero=stage1"],
        ["parallel.dp=1", "zero=stage2"],
        ["parallel.dp=2", "zero=stage1"],
        ["parallel.dp=2", "zero=stage2"],
    ]


def test_plan_sweeps_a_glob(capsys):
    assert main(["plan", "-m", "--json", "zero=glob(*)", PRESET_KERNELS]) == 0
    points = json.loads(capsys.readouterr().out)
    assert sorted(p["overrides"][0] for p in points) == [f"zero=stage{s}" for s in range(4)]


ERRORS = [
    (["plan", "-m", "zero.reduce_bucket_size=interval(1e5,1e6)"], "hydra/sweeper=optuna"),
    (["plan", "logger=null"], "logger.mode=disabled"),
    (["plan", "~run.lr"], "nothing can be deleted"),
    (["run", "hydra/launcher=submitit_slurm"], "cluster=slurm"),
    (["run", "-m", "hydra/launcher=basic", "parallel.dp=1,2"], "cluster=local"),
    (["plan", "model=gpt2-1.3B"], "did you mean gpt2-1.3b?"),
    (["plan", "zero.reduce_bucket=1"], "did you mean reduce_bucket_size?"),
    (["plan", "numa.mode=sockte"], "did you mean socket?"),
    (["plan", "hardware=h100"], "did you mean h100-p5, h100-pcie or h100-sxm?"),  # not h200, one letter off
    (["plna"], "did you mean plan?"),
    (["plan", "--cfg", "job", "model=gpt2-1.3B"], "did you mean gpt2-1.3b?"),
    (["run", "-m", "parallel.dp=1,0", *FAST[:3], PRESET_KERNELS], "sweep point 2 of 2"),
]


@pytest.mark.parametrize("argv,says", ERRORS, ids=[" ".join(e[0]) for e in ERRORS])
def test_bad_input_exits_2_with_one_paragraph(argv, says, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())  # nothing written


# --- output layout --------------------------------------------------------------------------


@pytest.mark.slow
def test_run_dir_and_sweep_dir_follow_hydra_with_hydra_subdirs(tmp_path):
    one = tmp_path / "single"
    proc = run_in_process("run", *FAST, f"hydra.run.dir={one}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (one / "result.json").is_file() and (one / ".hydra" / "config.yaml").is_file()
    assert yaml.safe_load((one / ".hydra" / "overrides.yaml").read_text()) == FAST
    assert json.loads((one / "result.json").read_text())["overrides"] == FAST

    sweep = tmp_path / "sweep"
    # Two one-rank points (the sweep's layout is the point, not the ranks).
    proc = run_in_process(
        "run", "-m", *FAST, "run.seed=1,2", f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=seed${run.seed}"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["seed1", "seed2"]
    for seed in (1, 2):
        point = sweep / f"seed{seed}"
        assert json.loads((point / "result.json").read_text())["config"]["run"]["seed"] == seed
        assert yaml.safe_load((point / ".hydra" / "config.yaml").read_text())["run"]["seed"] == seed
    assert (sweep / "multirun.yaml").is_file()


SECRET = "s3cr3t-hydra"


@pytest.fixture(scope="module")
def default_layout_sweep(tmp_path_factory):
    """`run -m` with no --out, from a fresh directory, with a secret in a setup line."""
    cwd = tmp_path_factory.mktemp("cwd")
    proc = run_cli(
        "run", "-m", *FAST, "run.seed=1,2", f"cluster.setup=['export HF_TOKEN={SECRET}']", cwd=cwd, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return cwd, proc


@pytest.mark.slow
def test_default_layout_is_outputs_date_time_and_multirun_date_time_n(default_layout_sweep):
    tmp_path, _ = default_layout_sweep
    (day,) = (tmp_path / "multirun").iterdir()
    (time_dir,) = day.iterdir()
    points = sorted(p.name for p in time_dir.iterdir() if p.is_dir())
    assert points == ["0_run.seed=1", "1_run.seed=2"]  # what was swept; the fixed overrides left out
    assert all((time_dir / p / ".hydra" / "hydra.yaml").is_file() for p in points)


# --- a sweeper plugin: a real Optuna study --------------------------------------------------


@pytest.mark.slow
def test_an_optuna_study_maximises_measured_tokens_per_second(tmp_path):
    """Four trials sampled by Hydra's Optuna sweeper. Micro batch 8 with dp 2 cannot make
    the global batch of 8: such a point is refused, recorded, and a failed Optuna trial."""
    sweep = tmp_path / "study"
    proc = run_in_process(
        "run",
        "-m",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=4",
        "hydra.sweeper.n_jobs=1",
        "hydra.sweeper.sampler.seed=3",
        "batch.micro_batch_size=choice(1,2,4,8)",
        "zero.reduce_bucket_size=choice(100000,1000000)",
        "batch.global_batch_size=8",
        "run.steps=2",
        "run.warmup_steps=1",
        "logger.mode=disabled",
        "--out",
        str(sweep),
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    results = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/result.json"))]
    assert len(results) == 4
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    ok = [r for r in results if r["status"] == "ok"]
    assert best["best_value"] == pytest.approx(max(r["metrics"]["tokens_per_sec_per_gpu"] for r in ok))
    hydra_cfg = yaml.safe_load(next(sweep.glob("*/.hydra/hydra.yaml")).read_text())["hydra"]
    assert hydra_cfg["sweeper"]["direction"] == "maximize"  # the objective's own direction, by default
    refused = [r for r in results if r["status"] != "ok"]
    sampled_8 = [p for p in sweep.glob("*/.hydra/overrides.yaml") if "batch.micro_batch_size=8" in p.read_text()]
    assert len(refused) == len(sampled_8) >= 1  # seed 3 samples micro batch 8
    for r in refused:
        assert r["status"] == "refused" and r["exit_code"] == 2 and "batch" in r["error"]["message"]
    assert (proc.stdout + proc.stderr).count("Failed experiment") == len(refused)  # Optuna: failed, not a number


@pytest.mark.slow
def test_a_secret_in_a_sweep_reaches_no_file_and_no_directory_name(default_layout_sweep):
    tmp_path, proc = default_layout_sweep
    assert SECRET not in proc.stdout + proc.stderr
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len([p for p in files if p.name == "multirun.yaml"]) == 1
    assert len([p for p in files if p.name == "overrides.yaml"]) == 2
    assert [p for p in files if SECRET.encode() in p.read_bytes()] == []
    assert not any(SECRET in str(p) or "HF_TOKEN" in str(p) for p in tmp_path.rglob("*"))


@pytest.mark.slow
def test_a_swept_value_that_is_a_path_names_one_point_inside_its_sweep(tmp_path):
    """A swept value is any string: `a/b` and `../../../x` name two points directly inside the
    sweep (one path component each), and a subdir interpolated from a value that leaves the
    sweep is refused before anything is written there: a user's directory is never claimed."""
    root = tmp_path / "deep" / "er"
    sweep = root / "sweep"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "config.yaml").write_text("mine: true\n")
    proc = run_in_process("run", "-m", *FAST, "logger.group=a/b,../../../x", "--out", str(sweep))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    points = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(points) == 2 and all((p / "result.json").is_file() for p in points)
    assert all("/" not in p.name.partition("_")[2] for p in points)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep", "victim"]  # nothing outside the sweep
    assert sorted(p.name for p in root.iterdir()) == ["sweep"]

    out = tmp_path / "sweep2"
    proc = run_in_process(
        "run", "-m", *FAST, "logger.group=../victim", "hydra.sweep.subdir=${logger.group}", "--out", str(out)
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "hydra.sweep.subdir" in proc.stderr and "Traceback" not in proc.stderr
    assert (victim / "config.yaml").read_text() == "mine: true\n" and sorted(p.name for p in victim.iterdir()) == [
        "config.yaml"
    ]


def test_a_point_name_cut_to_fit_keeps_two_points_apart():
    from orchestrator.hydra_glue.hydra_registry import dirname, fit_name

    long = "logger.group=" + "x" * 200
    assert dirname(long + "1") != dirname(long + "2") and len(dirname(long + "1").encode()) <= 120
    assert fit_name("a" * 130 + "1") != fit_name("a" * 130 + "2") and len(fit_name("a" * 130 + "1")) == 120
