"""The command line: help text, exit codes and the one-paragraph error for bad input."""

import shlex
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config import GROUPS
from orchestrator.hydra_glue.conf_tree import presets
from tests.conftest import run_cli

# (overrides, field the message must name, value it must show). Every bad input the
# skeleton issue lists, each rejected before anything runs.
BAD_INPUTS = [
    (["model=gpt5"], "model", "gpt5"),  # unknown config group option
    (["recompute=fast"], "recompute", "fast"),
    (["numa=nearby"], "numa", "nearby"),
    (["foo=1"], "foo", "1"),  # unknown key at the top
    (["model.foo=1"], "model.foo", "1"),  # unknown key in a group
    (["+model.foo=1"], "model.foo", "1"),  # ... also when appended with +
    (["zero.stage=4"], "zero.stage", "4"),
    (["zero.stage=-1"], "zero.stage", "-1"),
    (["zero.stage=two"], "zero.stage", "two"),
    (["recompute.mode=fast"], "recompute.mode", "fast"),
    (["model.heads=5"], "model.heads", "5"),  # 64 % 5
    (["model=llama3-8b", "hardware=h100-sxm", "model.kv_heads=5"], "model.kv_heads", "5"),  # 32 % 5
    (["batch.global_batch_size=10"], "batch.global_batch_size", "10"),  # not a multiple of 4 x 2
    (["batch=warmup", "batch.warmup.start=64"], "batch.warmup.start", "64"),  # start > end
    (["batch=warmup", "batch.warmup.ramp_tokens=0"], "batch.warmup.ramp_tokens", "0"),
    (["batch=warmup", "batch.warmup.ramp_tokens=-5"], "batch.warmup.ramp_tokens", "-5"),
    (["zero=stage2", "zero.reduce_bucket_size=0"], "zero.reduce_bucket_size", "0"),
    (["zero=stage2", "zero.reduce_bucket_size=-1e6"], "zero.reduce_bucket_size", "-1"),
    (["zero=stage2", "zero.reduce_bucket_size=big"], "zero.reduce_bucket_size", "big"),
    (["zero=stage3", "zero.prefetch_bucket_size=0"], "zero.prefetch_bucket_size", "0"),
    (["zero=stage2", "zero.allgather_bucket_size=true"], "zero.allgather_bucket_size", "true"),
    (["parallel.dp=0"], "parallel.dp", "0"),
    (["parallel.dp=-2"], "parallel.dp", "-2"),
    (["model.seq_len=0"], "model.seq_len", "0"),
    (["model=llama3-8b", "hardware=h100-sxm", "model.rope_theta=0"], "model.rope_theta", "0"),  # no wavelength
    (["model.norm_eps=-1e-5"], "model.norm_eps", "-1e-05"),
    (["model.norm_eps=inf"], "model.norm_eps", "inf"),
    (["model.seq_len=129"], "model.seq_len", "129"),  # tiny has 128 positions
    (["zero=stage0", "zero.offload_optimizer=cpu"], "zero.offload_optimizer", "cpu"),
    (["zero=stage2", "zero.offload_param=cpu"], "zero.offload_param", "cpu"),
    (["run.bf16=true", "run.fp16=true"], "run.fp16", "true"),
    (["numa.mode=nearby"], "numa.mode", "nearby"),
    (["hardware.name=mi300x", "hardware.device=cuda", "hardware.memory_gib=192"], "hardware.peak_tflops.bf16", "null"),
    (["hardware=h100-sxm", "hardware.peak_tflops.bf16=null"], "hardware.peak_tflops.bf16", "null"),
    (["hardware=h100-sxm", "hardware.memory_bandwidth_gbps=-1"], "hardware.memory_bandwidth_gbps", "-1"),
    (["logger.mode=online"], "logger.mode", "online"),  # no WANDB_API_KEY (conftest removes it)
    (["logger.mode=loud"], "logger.mode", "loud"),
    (["parallel.dp=1,2"], "parallel.dp", "1,2"),  # a sweep without -m
]


@pytest.mark.parametrize("overrides,field,value", BAD_INPUTS, ids=[" ".join(b[0]) for b in BAD_INPUTS])
@pytest.mark.parametrize("command", ["plan", "run"])
def test_bad_input_exits_2_with_one_paragraph_naming_field_and_value(capsys, command, overrides, field, value):
    assert main([command, *overrides]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing ran, nothing was summarised
    assert f"{field}={value}" in err
    assert "Traceback" not in err and "\n\n" not in err.strip() and len(err) < 600
    assert "allowed" in err  # ... and says what is allowed


def test_bad_input_from_a_real_process_has_no_traceback():
    result = run_cli("run", "zero.stage=7")
    assert result.returncode == 2
    assert "zero.stage=7" in result.stderr and "0, 1, 2 or 3" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_online_wandb_without_a_key_is_refused_before_anything_starts(capsys, tmp_path):
    # Refused by validation (exit 2, before launch), so no rank ever reaches wandb.init, which
    # would wait ~90 s for the network; nothing is written.
    assert main(["run", "logger.mode=online", "--out", str(tmp_path / "t")]) == 2
    assert "WANDB_API_KEY" in capsys.readouterr().err and not (tmp_path / "t").exists()


def test_online_wandb_with_a_key_passes_validation(capsys, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert main(["plan", "logger.mode=online"]) != 2


def test_a_sweep_with_one_bad_point_fails_before_any_point(capsys):
    # A global batch of 8 divides into micro 4 x dp for dp 1 and 2, not for 4 and 8.
    assert main(["run", "-m", "batch.global_batch_size=8", "parallel.dp=1,2,4,8"]) == 2
    out, err = capsys.readouterr()
    assert "sweep point 3 of 4" in err and "parallel.dp=4" in err and out == ""


def test_help_lists_every_group_and_its_presets():
    result = run_cli("--help")
    assert result.returncode == 0
    for group in GROUPS:
        line = next(x for x in result.stdout.splitlines() if x.strip().startswith(group + " "))
        assert all(p in line for p in presets(group)), group
    for command in ("run", "plan", "translate", "report"):
        assert command in result.stdout


def test_plan_help_describes_overrides_multirun_and_json():
    result = run_cli("plan", "--help")
    assert result.returncode == 0
    for word in ("--json", "--multirun", "OVERRIDE", "model=gpt2-350m", "hardware"):
        assert word in result.stdout


def test_console_script_is_installed():
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    exe = shutil.which("orchestrator", path=str(Path(sys.executable).parent)) or shutil.which("orchestrator")
    assert exe, "the orchestrator console script is not on PATH"
    result = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "config groups" in result.stdout


README = Path(__file__).resolve().parent.parent / "README.md"


def readme_commands(words: tuple[str, ...]) -> list[list[str]]:
    """The README's everyday commands whose command word (or flag) is one of `words`, as argv."""
    found = []
    for line in README.read_text().splitlines():
        if line.startswith("orchestrator "):
            argv = shlex.split(line.split("  #")[0])[1:]
            if argv and (argv[0] in words or argv[-1] in words):
                found.append(argv)
    return found


def test_the_readmes_planning_commands_run_here_as_it_says(cli, tmp_path):
    """Every README line that plans, translates or asks for help, run as written (the
    trials' own commands run in test_run, test_slurm and test_tune; those that need GPUs or
    a cluster's nodes are planned there, not run)."""
    commands = readme_commands(("plan", "translate", "--help"))
    assert len(commands) >= 5, commands
    for argv in commands:
        proc = cli(*argv, cwd=tmp_path)
        assert proc.returncode == 0, (argv, proc.stderr)
    assert (tmp_path / "cfgs" / "ds_config.json").is_file()  # translate ... --out cfgs/
