"""TrialSpec: composition of the presets and the numbers derived from them."""

import math

import pytest

from orchestrator import machine
from orchestrator.core.errors import ConfigError
from orchestrator.hydra_glue.compose import expand_sweep
from orchestrator.hydra_glue.conf_tree import conf_dir, presets
from orchestrator.measure import hardware
from orchestrator.spec import build_spec

GPU = ["hardware=h100-sxm"]


def test_default_trial_is_tiny_on_two_local_cpu_ranks_with_wandb_offline():
    spec = build_spec([])
    assert spec.choices["model"] == "tiny" and spec.cfg.cluster.name == "local"
    assert spec.dp == spec.world_size == 2 and spec.nodes == 1
    assert spec.cfg.logger.mode == "offline"
    assert spec.cfg.hardware.device == "cpu"  # this machine has no GPU; auto found the CPU


def test_derived_batch_numbers():
    spec = build_spec(["parallel.dp=4", "batch.micro_batch_size=2", "batch.global_batch_size=64"])
    assert spec.grad_accum_steps == 8 and spec.global_batch_size == 64
    assert spec.tokens_per_step == 64 * spec.cfg.model.seq_len
    assert spec.schedule == [(0, 64)]


def test_null_global_batch_means_one_micro_batch_per_rank():
    spec = build_spec(["parallel.dp=4", "batch.micro_batch_size=3"])
    assert spec.global_batch_size == 12 and spec.grad_accum_steps == 1


@pytest.mark.parametrize("dp,gpn,nodes,per_node", [(8, 8, 1, 8), (64, 8, 8, 8), (4, 8, 1, 4), (16, 4, 4, 4)])
def test_slurm_nodes_are_ceil_dp_over_gpus_per_node(dp, gpn, nodes, per_node):
    spec = build_spec(["cluster=slurm", *GPU, f"parallel.dp={dp}", f"cluster.gpus_per_node={gpn}"])
    assert spec.nodes == nodes == math.ceil(dp / gpn) and spec.gpus_per_node == per_node


def test_slurm_rejects_a_dp_that_leaves_a_node_partly_used():
    with pytest.raises(ConfigError, match="parallel.dp=12"):
        build_spec(["cluster=slurm", *GPU, "parallel.dp=12", "cluster.gpus_per_node=8"])


def test_warmup_schedule_sizes_are_multiples_of_micro_times_dp():
    spec = build_spec(
        [
            "batch=warmup",
            "parallel.dp=2",
            "batch.micro_batch_size=2",
            "batch.warmup.start=4",
            "batch.global_batch_size=20",
            "batch.warmup.ramp_tokens=1000",
        ]
    )
    sizes = [s for _, s in spec.schedule]
    assert sizes == [4, 8, 12, 16, 20] and all(s % 4 == 0 for s in sizes)
    assert spec.schedule[-1][0] == 1000 and spec.global_batch_size == 20
    assert spec.cfg.batch.warmup.increment == 4  # null became micro x dp


def test_bucket_sizes_accept_scientific_notation_and_become_ints():
    spec = build_spec(["zero=stage2", "zero.reduce_bucket_size=2e8", "zero.allgather_bucket_size=300000000"])
    assert spec.cfg.zero.reduce_bucket_size == 200_000_000 and isinstance(spec.cfg.zero.reduce_bucket_size, int)
    assert spec.cfg.zero.allgather_bucket_size == 300_000_000


# GPT-3 paper, Table 2.1 (n_layers, d_model, n_heads), with the two shapes the paper
# misprints corrected as trained (1.3B: 16 heads of 128; 13B: d_model 5120).
GPT3_TABLE = {
    "gpt2-125m": (12, 768, 12),
    "gpt2-350m": (24, 1024, 16),
    "gpt2-1.3b": (24, 2048, 16),
    "gpt2-2.7b": (32, 2560, 32),
    "gpt2-6.7b": (32, 4096, 32),
    "gpt2-13b": (40, 5120, 40),
    "gpt3-175b": (96, 12288, 96),
}


def test_the_warmup_preset_ramps_over_whole_batches_for_every_model():
    """batch=warmup ramps over 256 sequences (Megatron's samples), 8 of its final batches,
    whatever the model's sequence length; ramp_tokens given instead is taken as it is."""
    for preset in presets("model"):
        spec = build_spec([f"model={preset}", "batch=warmup", *GPU])
        ramp_tokens, end = spec.schedule[-1]
        assert end == 32 and ramp_tokens == 256 * spec.cfg.model.seq_len, preset
        assert len(spec.schedule) > 2, preset  # a ramp, not one step at the full batch
    spec = build_spec(["batch=warmup", "batch.warmup.ramp_tokens=4096", *GPU])
    assert spec.schedule[-1][0] == 4096


@pytest.mark.parametrize("preset", presets("model"))
def test_every_model_preset_composes_and_validates(preset):
    spec = build_spec([f"model={preset}", *GPU])
    m = spec.cfg.model
    if preset in GPT3_TABLE:
        assert (m.n_layers, m.hidden, m.heads) == GPT3_TABLE[preset]
        assert m.seq_len == 2048 and m.vocab == 50257 and m.ffn_hidden == 4 * m.hidden
    if preset.startswith("llama3"):
        assert m.arch == "llama" and m.vocab == 128256 and m.kv_heads == 8 and m.seq_len == 8192
        assert (m.n_layers, m.hidden, m.heads, m.ffn_hidden) == {
            "llama3-8b": (32, 4096, 32, 14336),
            "llama3-70b": (80, 8192, 64, 28672),
        }[preset]


@pytest.mark.parametrize(
    "preset,bf16,memory",
    [("a100-80gb", 312, 80.0), ("h100-sxm", 989, 79.6), ("h100-pcie", 756, 79.6), ("h200", 989, 140.4)],
)
def test_hardware_presets_carry_published_dense_bf16_peaks(preset, bf16, memory):
    hw = build_spec([f"hardware={preset}"]).cfg.hardware
    assert hw.peak_tflops.bf16 == bf16 and hw.memory_gib == memory and hw.device == "cuda"


def test_every_preset_of_every_group_composes():
    for group in ("batch", "recompute", "zero", "numa", "engine", "cluster", "logger"):
        for preset in presets(group):
            build_spec([f"{group}={preset}", *GPU] + (["zero=stage2"] if group == "engine" else []))


@pytest.mark.parametrize(
    "name,preset",
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA L40S", None),
    ],
)
def test_gpu_names_map_to_presets(name, preset):
    assert machine.preset_for_gpu(name) == preset


def test_auto_hardware_on_a_known_gpu_picks_its_preset_and_keeps_overrides(monkeypatch):
    # No GPU here: the CUDA device name is the one thing mocked.
    monkeypatch.setattr(machine, "local_gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    spec = build_spec(["hardware.compute_efficiency=0.4"])
    assert spec.cfg.hardware.name == "h100-sxm" and spec.cfg.hardware.compute_efficiency == 0.4


@pytest.mark.parametrize(
    "files,present",
    [
        ([], False),
        (["null", "tty0"], False),
        (["nvidia0", "nvidiactl"], True),
        (["nvidia-caps"], True),
        (["kfd"], True),
        (["dxg"], True),
    ],
)
def test_a_gpu_is_looked_for_only_where_a_driver_made_its_device_files(tmp_path, files, present):
    # torch is asked for a GPU only where NVIDIA's, ROCm's or WSL2's device files exist:
    # elsewhere it cannot see one, and its import would cost every `plan` 1.5 s.
    for name in files:
        (tmp_path / name).touch()
    assert machine.gpu_driver_present(tmp_path) is present


def test_the_cpu_peak_is_keyed_by_torchs_version_without_importing_torch():
    import torch

    assert hardware.torch_version() == torch.__version__  # the key a cached peak was written under


def test_sweep_expands_the_product_in_hydra_order():
    points = expand_sweep(["parallel.dp=1,2", "zero=stage0,stage2", "run.steps=3"])
    assert len(points) == 4 and all("run.steps=3" in p for p in points)
    assert {(p[0], p[1]) for p in points} == {
        (f"parallel.dp={d}", f"zero={z}") for d in (1, 2) for z in ("stage0", "stage2")
    }


def test_sweep_file_axes_and_a_command_line_axis_replaces_the_files():
    from_file = expand_sweep(["+sweep=dp_bucket_local"])
    assert len(from_file) == 4
    specs = [build_spec(p) for p in from_file]
    assert {(s.dp, s.cfg.zero.reduce_bucket_size) for s in specs} == {(1, 10**4), (1, 10**5), (2, 10**4), (2, 10**5)}
    assert all(s.cfg.zero.stage == 2 for s in specs)
    narrowed = expand_sweep(["+sweep=dp_bucket_local", "parallel.dp=2"])
    assert {build_spec(p).dp for p in narrowed} == {2} and len(narrowed) == 2


def test_conf_tree_has_every_group_of_the_design():
    expected = {
        "model": {
            "tiny",
            "gpt2-125m",
            "gpt2-350m",
            "gpt2-1.3b",
            "gpt2-2.7b",
            "gpt2-6.7b",
            "gpt2-13b",
            "gpt3-175b",
            "llama3-8b",
            "llama3-70b",
        },
        "batch": {"constant", "warmup"},
        "recompute": {"none", "selective", "full"},
        "zero": {"stage0", "stage1", "stage2", "stage3"},
        "numa": {"none", "node", "socket", "exclusive", "core-complex"},
        "engine": {"deepspeed", "accelerate"},
        "cluster": {"local", "slurm"},
        "hardware": {"auto", "cpu", "a100-80gb", "h100-sxm", "h100-pcie", "h200"},
        "logger": {"wandb"},
    }
    for group, names in expected.items():
        assert names <= set(presets(group)), group
    assert (conf_dir() / "config.yaml").is_file()


def test_a_users_own_preset_directory_joins_the_search_path(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.yaml").write_text(
        "arch: gpt2\nn_layers: 3\nhidden: 128\nheads: 2\nkv_heads: 2\nffn_hidden: 512\nvocab: 1024\n"
        "seq_len: 64\nmax_positions: 64\ntie_embeddings: true\n"
    )
    spec = build_spec([f"hydra.searchpath=[file://{tmp_path}]", "model=mine"])
    assert spec.choices["model"] == "mine" and spec.cfg.model.n_layers == 3


def test_sweep_points_on_one_base_keep_their_own_values_and_interpolations(tmp_path):
    """Points that differ only in values reuse the unchanged groups' typed values
    (checks.typed_config); a group that interpolates another is converted at each point,
    and no point sees what another point's caller changed in its spec."""
    (tmp_path / "logger").mkdir()
    (tmp_path / "logger" / "per-dp.yaml").write_text("mode: disabled\nproject: dp-${parallel.dp}\n")
    base = [f"hydra.searchpath=[file://{tmp_path}]", "logger=per-dp", "model=gpt2-125m", *GPU]
    specs = []
    for dp in (1, 2, 2):
        specs.append(build_spec([*base, f"parallel.dp={dp}"]))
        assert specs[-1].cfg.model.hidden == 768 and specs[-1].cfg.run.lr == 3e-4
        specs[-1].cfg.model.hidden, specs[-1].cfg.run.lr = 1, 1.0  # a caller's own change, seen by no other point
    assert [s.cfg.logger.project for s in specs] == ["dp-1", "dp-2", "dp-2"]
    assert build_spec([*base, "parallel.dp=2", "run.lr=0.5"]).cfg.run.lr == 0.5
    assert build_spec([*base, "parallel.dp=2"]).cfg.run.lr == 3e-4


CHOICE_FIELDS = [
    "model.arch",
    "model.attention",
    "recompute.mode",
    "zero.offload_optimizer",
    "zero.offload_param",
    "numa.mode",
    "engine.name",
    "engine.backend",
    "cluster.name",
    "hardware.device",
    "logger.mode",
    "run.objective",
    "run.data_dtype",
    "run.fail_mode",
]


@pytest.mark.parametrize("key", CHOICE_FIELDS)
def test_choice_fields_are_typed_and_refuse_a_value_outside_their_enum(key):
    """Each choice field is a StrEnum next to its dataclass: its members are the allowed
    values, every member is accepted as a value, and anything else is refused naming them all."""
    import enum
    import typing

    from orchestrator import config

    group, name = key.split(".")
    kind = typing.get_type_hints(typing.get_type_hints(config.TrialConfig)[group])[name]
    assert isinstance(kind, type) and issubclass(kind, enum.StrEnum), f"{key} is typed {kind}"
    members = [m.value for m in kind]
    for value in members:
        try:
            spec = build_spec([f"{key}={value}"])
            assert getattr(getattr(spec.cfg, group), name) == value
        except ConfigError as exc:  # a cross-field rule (engine.backend=fsdp needs accelerate), not the choice
            assert "is not allowed: one of" not in str(exc), str(exc)
    with pytest.raises(ConfigError) as err:
        build_spec([f"{key}={members[-1].upper()}X"])
    assert err.value.field == key and all(m in str(err.value) for m in members)
    assert f"did you mean {members[-1]}?" in str(err.value)


def test_a_negative_host_time_per_kernel_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"hardware.host_op_us=-1.*from 0 to 2000; the nearest valid value is 0"):
        build_spec(["hardware=h100-sxm", "hardware.host_op_us=-1"])


def test_the_timed_steps_and_the_timing_target_are_checked_naming_the_field():
    with pytest.raises(ConfigError, match=r"run.steps=4 .*at least run.warmup_steps \+ run.min_timed_steps = 8"):
        build_spec(["run.steps=4", "run.warmup_steps=2", "run.min_timed_steps=6"])
    with pytest.raises(ConfigError, match=r"run.timing_ci=1.5 .*in \(0, 1\)"):
        build_spec(["run.timing_ci=1.5"])
    assert build_spec(["run.steps=40", "run.timing_ci=0.05", "run.min_timed_steps=6"]).cfg.run.timing_ci == 0.05


def test_the_generic_gpu_preset_named_directly_asks_for_its_memory_and_says_where_auto_finds_it():
    with pytest.raises(ConfigError, match=r"hardware.memory_gib=null .*hardware=auto reads it from the device"):
        build_spec(["hardware=gpu"])
    assert build_spec(["hardware=gpu", "hardware.memory_gib=80"]).cfg.hardware.memory_gib == 80
