"""Bad input fails before launch: exit 2, one paragraph naming the field and what is
allowed, no traceback, nothing written (each row a case found by trying to break it)."""

import numpy as np
import pytest

from orchestrator.cli import main
from tests.conftest import run_cli

S = ["cluster=slurm", "cluster.cpus_per_task=1", "hardware=cpu", "model=tiny"]

CASES = [  # (overrides, the field the message must name)
    (["hardware.memory_gib=inf"], "hardware.memory_gib"),
    (["hardware.memory_gib=nan"], "hardware.memory_gib"),
    (["parallel.dp=10000000000000"], "parallel.dp"),
    (["logger.project=${oc.env:NOPE_XYZ}"], "logger.project"),
    (["model.hidden=${model.nope}"], "model.hidden"),
    (["run.lr=${run.lr}"], "run.lr"),
    (["model.n_layers=999999999999"], "model.n_layers"),
    (["run.steps=100000000000"], "run.steps"),
    (["run.seed=4611686018427387904"], "run.seed"),
    (["~model"], "~model"),
    (["~run"], "~run"),
    (["~run.lr"], "~run.lr"),
    (["~logger"], "~logger"),
    (['logger.tags=[""]'], "logger.tags"),
    (["logger.tags=[" + "a" * 65 + "]"], "logger.tags"),
    (["run.timeout_min=nan"], "run.timeout_min"),
    (["+sweep=dp_bucket_local"], "+sweep"),
    (["run.lr=nan"], "run.lr"),
    (["run.lr=inf"], "run.lr"),
    (["run.grad_clip=nan"], "run.grad_clip"),
    (["run.weight_decay=nan"], "run.weight_decay"),
    (["parallel.dp=2", "run.slow_rank=2"], "run.slow_rank"),
    # HSDP: replicas that do not split the ranks, on an engine without a 2D mesh, a shard
    # group asked to lie within a node that is larger than one or straddles two
    (["engine=fsdp", "parallel.dp=4", "parallel.replicate=3"], "parallel.replicate"),
    (["engine=fsdp", "parallel.dp=4", "parallel.replicate=0"], "parallel.replicate"),
    (["parallel.dp=4", "parallel.replicate=2"], "parallel.replicate"),
    (
        [*S, "engine=fsdp", "cluster.gpus_per_node=2", "parallel.dp=8", "parallel.shard_within_node=true"],
        "parallel.shard_within_node",
    ),
    (
        [
            *S,
            "engine=fsdp",
            "cluster.gpus_per_node=4",
            "parallel.dp=8",
            "parallel.replicate=2",
            "parallel.shard_within_node=true",
            "cluster.gpus_per_node=2",
        ],
        "parallel.shard_within_node",
    ),
    ([*S, "run.steps=100000", "cluster.time=00:01:00"], "cluster.signal_delay_s"),
    ([*S, "cluster.time=0"], "cluster.time"),
]


@pytest.mark.parametrize("overrides,field", CASES, ids=[" ".join(c[0])[-60:] for c in CASES])
def test_bad_input_exits_2_naming_the_field(overrides, field, capsys):
    code = main(["plan", *overrides])
    said = capsys.readouterr().err
    assert code == 2, said
    assert f"{field}=" in said and "is not allowed" in said and "Traceback" not in said
    assert len(said.strip().splitlines()) == 1  # one paragraph


def test_a_bad_dp_layout_names_the_nearest_valid_replicate(capsys):
    assert main(["plan", "engine=fsdp", "parallel.dp=8", "parallel.replicate=3"]) == 2
    said = capsys.readouterr().err
    assert "one of 1, 2, 4, 8; the nearest valid value is 2" in said
    within = [*S, "engine=fsdp", "cluster.gpus_per_node=2", "parallel.dp=8", "parallel.shard_within_node=true"]
    assert main(["plan", *within]) == 2
    assert (
        "8 ranks across 4 nodes of 2 ranks; the nearest valid value is parallel.replicate=4" in capsys.readouterr().err
    )
    assert main(["plan", *within, "parallel.replicate=4"]) == 0


def test_signal_delay_names_the_nearest_valid_value(capsys):
    assert main(["plan", *S, "cluster.time=00:01:00"]) == 2
    assert "the nearest valid value is 30" in capsys.readouterr().err


@pytest.fixture
def token_files(tmp_path):
    files = {"empty": b"", "odd": b"\x01\x00\x02"}
    for name, data in files.items():
        (tmp_path / f"{name}.bin").write_bytes(data)
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "short.bin")  # fewer than seq_len=128
    ids = np.random.default_rng(0).integers(0, 500, 100_000).astype(np.uint16)
    ids[50_000] = 60_000  # one id past model.vocab=512, far into the file
    ids.tofile(tmp_path / "oov.bin")
    return tmp_path


@pytest.mark.parametrize(
    "name,said",
    [
        ("empty", "it is empty"),
        ("odd", "holds 3 bytes"),
        ("short", "it holds 100"),
        ("oov", "id 60000 is at position 50,000"),
    ],
)
def test_a_token_file_that_cannot_feed_the_model_is_refused_before_launch(token_files, name, said, capsys):
    assert (
        main(["run", "model=tiny", f"run.data={token_files / f'{name}.bin'}", "--out", str(token_files / "never")]) == 2
    )
    err = capsys.readouterr().err
    assert "run.data=" in err and said in err
    assert not (token_files / "never").exists()  # nothing claimed, nothing written


def test_a_token_file_with_fewer_windows_than_a_batch_is_warned_about(tmp_path, capsys):
    np.arange(129, dtype=np.uint16).tofile(tmp_path / "tiny.bin")  # 2 windows of 128
    assert main(["translate", "model=tiny", f"run.data={tmp_path / 'tiny.bin'}", "--out", str(tmp_path / "t")]) == 0
    assert "holds 2 distinct window(s)" in capsys.readouterr().err


def test_a_preset_that_is_not_yaml_is_named(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "broken.yaml").write_text("arch: gpt2\nn_layers: [1,\n")
    assert main(["plan", f"hydra.searchpath=[file://{tmp_path}]", "model=broken"]) == 2
    err = capsys.readouterr().err
    assert "broken.yaml, line 3" in err and "not valid YAML" in err


def test_out_on_a_file_is_refused_for_run_and_translate(tmp_path):
    (tmp_path / "afile").write_text("x")
    for command in ("run", "translate"):
        proc = run_cli(command, "model=tiny", "--out", str(tmp_path / "afile"))
        assert proc.returncode == 2 and "it is a file" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert (tmp_path / "afile").read_text() == "x"
