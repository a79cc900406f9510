"""The files translate writes: golden copies, overrides flowing through, binding, quoting."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.run.trial_files import write_trial_files
from orchestrator.spec import build_spec, load_spec
from orchestrator.translate.deepspeed import ds_config
from tests.conftest import PRESET_KERNELS

GOLDEN = Path(__file__).parent / "golden"
CASES = {
    "tiny-default": [],
    "gpt2-1.3b-stage2-slurm-h100": [
        "model=gpt2-1.3b",
        "zero=stage2",
        "cluster=slurm",
        "hardware=h100-sxm",
        "parallel.dp=16",
        "numa=socket",
        "cluster.partition=gpu",
        "batch=warmup",
        "batch.micro_batch_size=2",
        "batch.warmup.start=64",
        "batch.global_batch_size=512",
        "batch.warmup.ramp_tokens=100000000",
        "batch.warmup.increment=64",
    ],
    "llama3-8b-stage3-offload-fp16": [
        "model=llama3-8b",
        "zero=stage3",
        "zero.offload_optimizer=cpu",
        "zero.offload_param=cpu",
        "run.bf16=false",
        "run.fp16=true",
        "recompute=full",
        "hardware=a100-80gb",
        "parallel.dp=8",
        "batch.micro_batch_size=1",
    ],
    "accelerate-fsdp-stage3-h100": [
        "engine=accelerate",
        "engine.backend=fsdp",
        "zero=stage3",
        "recompute=full",
        "hardware=h100-sxm",
        "numa=node",
        "parallel.dp=4",
    ],
}
COMPARED = ("ds_config.json", "accelerate_config.yaml", "launch.json", "launch.sh", "EXPLAIN.md", "trial.json")


def normalised(text: str, trial_dir: Path) -> str:
    return text.replace(str(trial_dir), "$TRIAL_DIR").replace(sys.executable, "python")


@pytest.mark.parametrize("case", CASES)
def test_golden_files(tmp_path, case):
    """UPDATE_GOLDEN=1 rewrites tests/golden/ after a deliberate change (review the diff)."""
    files = write_trial_files(build_spec(CASES[case]), tmp_path)
    for name in COMPARED:
        path = tmp_path / name
        if not path.exists():
            assert not (GOLDEN / case / name).exists(), f"{name} is no longer written"
            continue
        got = normalised(path.read_text(), files.directory)
        golden = GOLDEN / case / name
        if os.environ.get("UPDATE_GOLDEN"):
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(got)
        assert got == golden.read_text(), f"{case}/{name} differs from the golden copy"


def _leaves(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


@pytest.mark.parametrize(
    "override,key",
    [
        ("zero.reduce_bucket_size=123456", "zero_optimization.reduce_bucket_size"),
        ("zero.allgather_bucket_size=7e7", "zero_optimization.allgather_bucket_size"),
        ("zero.prefetch_bucket_size=2.5e7", "zero_optimization.stage3_prefetch_bucket_size"),
        ("zero.max_live_parameters=3e8", "zero_optimization.stage3_max_live_parameters"),
        ("zero.overlap_comm=false", "zero_optimization.overlap_comm"),
        ("run.grad_clip=0.5", "gradient_clipping"),
    ],
)
def test_an_override_changes_exactly_its_key(override, key):
    base = _leaves(ds_config(build_spec(["zero=stage3", "hardware=h100-sxm"])))
    changed = _leaves(ds_config(build_spec(["zero=stage3", "hardware=h100-sxm", override])))
    assert {k for k in base if base[k] != changed[k]} == {key}
    assert changed[key] != base[key]


def test_numa_without_gpus_warns_and_binds_nothing(tmp_path, capsys):
    assert main(["translate", "numa=socket", "--out", str(tmp_path)]) == 0
    assert "no GPU" in capsys.readouterr().err
    argv = json.loads((tmp_path / "launch.json").read_text())["argv"]
    assert not any(a.startswith("--numa") for a in argv)


def test_numa_with_gpus_binds_through_torchrun_and_slurm(tmp_path):
    local = write_trial_files(build_spec(["numa=socket", "hardware=h100-sxm", "parallel.dp=8"]), tmp_path / "l")
    assert "--numa-binding=socket" in local.command.argv
    slurm = write_trial_files(
        build_spec(["numa=socket", "hardware=h100-sxm", "parallel.dp=16", "cluster=slurm"]), tmp_path / "s"
    )
    assert "--cpu-bind=sockets" in slurm.slurm["srun"]
    assert {
        "--gres-flags=enforce-binding",
        "--ntasks-per-socket=4",
        "--nodes=2",
        "--ntasks-per-node=8",
        "--gpus-per-node=8",
    } <= set(slurm.slurm["sbatch"])
    assert slurm.slurm["submitit"]["slurm_additional_parameters"]["ntasks-per-socket"] == "4"


def _argv_the_script_runs(script: Path, launcher: str) -> list[str]:
    """Run the generated script with its launcher swapped for printf: what argv would it get?"""
    text = script.read_text().replace(f"\n{launcher} ", "\nexec printf '%s\\0' ", 1)
    result = subprocess.run(["bash", "-c", text], capture_output=True, cwd=script.parent, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.decode().split("\0")[:-1]


def test_shell_metacharacters_in_config_values_never_reach_a_shell(tmp_path):
    evil = "x; touch PWNED $(touch PWNED2) `touch PWNED3` 'q\" & | > out"
    trial_dir = tmp_path / f"trial {evil}"
    local = write_trial_files(build_spec([]), trial_dir)
    assert _argv_the_script_runs(trial_dir / "launch.sh", "exec") == local.command.argv
    assert local.command.argv[-1] == str(trial_dir.resolve())  # one argument, intact
    slurm_dir = tmp_path / f"slurm {evil}"
    srun_arg = "--comment=x; touch PWNED4 $(touch PWNED5) `touch PWNED6` & | > out"
    slurm = write_trial_files(
        build_spec(["cluster=slurm", "hardware=cpu", f'cluster.srun_args=["{srun_arg}"]']), slurm_dir
    )
    assert _argv_the_script_runs(slurm_dir / "launch.sh", "srun") == [*slurm.slurm["srun"], *slurm.slurm["task"]]
    assert srun_arg in slurm.slurm["srun"]
    assert not list(tmp_path.rglob("PWNED*")) and not list(tmp_path.rglob("out"))


def test_a_slurm_name_with_shell_characters_is_refused():
    from orchestrator.core.errors import ConfigError

    with pytest.raises(ConfigError, match="cluster.partition"):
        build_spec(["cluster=slurm", "hardware=h100-sxm", "cluster.partition='gpu;reboot'"])


def test_the_trial_directory_loads_back_as_the_same_trial(tmp_path):
    spec = build_spec(["model=gpt2-125m", "zero=stage2", "hardware=h100-sxm", "batch=warmup", "parallel.dp=4"])
    write_trial_files(spec, tmp_path)
    again = load_spec(tmp_path)
    assert again.cfg == spec.cfg and again.schedule == spec.schedule and again.overrides == spec.overrides


def test_translate_sweep_writes_one_directory_per_point(tmp_path):
    points = ["zero=stage1,stage2", "parallel.dp=1,2", PRESET_KERNELS]
    assert main(["translate", "-m", *points, "--out", str(tmp_path)]) == 0
    dirs = sorted(p.name for p in tmp_path.iterdir())
    assert len(dirs) == 4 and all((tmp_path / d / "ds_config.json").is_file() for d in dirs)
    stages = {json.loads((tmp_path / d / "ds_config.json").read_text())["zero_optimization"]["stage"] for d in dirs}
    assert stages == {1, 2}


def test_slurm_resource_fields_and_submitit_names_reach_sbatch_and_submitit(tmp_path):
    spec = build_spec(
        [
            "cluster=slurm",
            "hardware=h100-sxm",
            "cluster.mem_gb=500",
            "cluster.exclude='node[1-2]'",
            "cluster.gres=gpu:8",
            "cluster.comment=sweep-a",
            "+cluster.additional_parameters.reservation=big",
            "cluster.timeout_min=30",
            "cluster.max_num_timeout=5",
            "cluster.signal_delay_s=60",
        ]
    )
    assert spec.cfg.cluster.time == "30" and spec.cfg.cluster.max_requeues == 5  # hydra-submitit-launcher's names
    write_trial_files(spec, tmp_path)
    launch = json.loads((tmp_path / "launch.json").read_text())
    assert {
        "--time=30",
        "--mem=512000M",
        "--exclude=node[1-2]",
        "--gres=gpu:8",
        "--comment=sweep-a",
        "--reservation=big",
        "--signal=USR2@60",
        "--requeue",
    } <= set(launch["sbatch"])
    submitit = launch["submitit"]
    assert submitit["mem_gb"] == 500 and submitit["timeout_min"] == 30 and submitit["slurm_exclude"] == "node[1-2]"
    assert submitit["slurm_additional_parameters"]["reservation"] == "big"
    assert "#SBATCH --signal=USR2@60" in (tmp_path / "launch.sh").read_text()


@pytest.mark.parametrize(
    "overrides,field",
    [
        (["cluster.mem_gb=10", "cluster.mem_per_gpu=40G"], "cluster.mem_per_gpu"),
        (["cluster.mem_per_gpu=lots"], "cluster.mem_per_gpu"),
        (["cluster.timeout_min=0"], "cluster.timeout_min"),
        (["+cluster.additional_parameters.Bad-Name=1"], "cluster.additional_parameters.Bad-Name"),
    ],
)
def test_bad_slurm_fields_are_refused(overrides, field, capsys):
    assert main(["plan", "cluster=slurm", "hardware=h100-sxm", *overrides]) == 2
    assert capsys.readouterr().err.split(": ", 1)[1].startswith(f"{field}=")
