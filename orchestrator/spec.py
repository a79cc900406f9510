"""TrialSpec: a composed config, validated, with the numbers every later stage needs.

`build_spec(overrides)` is the one entry point: Hydra composes (compose.py), this module
resolves hardware=auto, runs every check of a value and every cross-field rule
(validation/: trial_checks.py one concern at a time, cluster_checks.py the cluster group's),
and derives world size, nodes, grad-accum steps, tokens per step and the global-batch
schedule. Anything wrong raises ConfigError naming the
field, the value and what is allowed, before any process is started.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from orchestrator import hardware_presets, machine
from orchestrator.config import TrialConfig
from orchestrator.core.errors import ConfigError, one_of
from orchestrator.core.files import read_yaml
from orchestrator.core.redact import redact, redact_text
from orchestrator.hydra_glue.compose import Composed, compose_trial, composing
from orchestrator.hydra_glue.conf_tree import presets, user_conf_dir
from orchestrator.hydra_glue.hydra_registry import override_key
from orchestrator.plan.batch import BatchSchedule, grad_accum_steps, warmup_schedule
from orchestrator.plan.dp_layout import DpLayout
from orchestrator.records.trial_dir import TrialPaths
from orchestrator.records.trial_meta import TrialMeta
from orchestrator.validation.checks import at_most, positive, typed_config
from orchestrator.validation.cluster_checks import check_cluster, check_dp_layout, placement
from orchestrator.validation.trial_checks import (
    MAX_DP,
    check_batch,
    check_engine,
    check_grad_accum,
    check_hardware,
    check_logger,
    check_model,
    check_run,
    check_zero,
    check_zero_only_knobs,
    with_network_table,
)

REPEAT = "run.repeat"  # the override that numbers one point's measurements (a sweep over it repeats the point)


@dataclass(frozen=True)
class TrialSpec:
    cfg: TrialConfig  # validated; bucket sizes are ints here
    choices: dict[str, str]  # preset chosen per config group, e.g. {"model": "gpt2-350m"}
    overrides: tuple[str, ...]
    precision: str  # bf16 | fp16 | fp32
    world_size: int
    dp: int
    nodes: int
    gpus_per_node: int  # ranks per node actually used
    micro_batch_size: int
    grad_accum_steps: int  # at the final (post warm-up) global batch
    global_batch_size: int  # sequences, after the warm-up
    tokens_per_step: int  # at the final global batch
    schedule: BatchSchedule  # [(from_token, global_batch_size)]

    @property
    def layout(self) -> DpLayout:
        """Which ranks shard together and which hold replicas (parallel.replicate)."""
        return DpLayout(self.dp, self.cfg.parallel.replicate, self.gpus_per_node)

    @property
    def threads_per_rank(self) -> int:
        """The threads each rank computes with, the same for the plan's timed kernels and the
        ranks: a SLURM task has cluster.cpus_per_task CPUs (srun --cpus-per-task); here the
        ranks share this host's usable CPUs."""
        if self.cfg.cluster.name == "slurm":
            return self.cfg.cluster.cpus_per_task
        return machine.threads_per_rank(self.gpus_per_node)

    @property
    def collective_timeout(self) -> dict[str, timedelta]:
        """The process group's timeout as init_process_group's keyword (empty: torch's default)."""
        seconds = self.cfg.run.collective_timeout_s
        return {} if seconds is None else {"timeout": timedelta(seconds=seconds)}

    def resolved(self) -> dict[str, Any]:
        """The whole config as plain data, secrets masked (redact.py): what result.json,
        config.yaml and W&B get. The SLURM submission reads the real values from cfg."""
        return redact(OmegaConf.to_container(OmegaConf.structured(self.cfg), resolve=True, enum_to_str=True))


def build_spec(overrides: list[str] | tuple[str, ...] = ()) -> TrialSpec:
    """Compose, resolve hardware=auto, validate and derive; ConfigError on bad input."""
    for o in overrides:  # a calibrated preset is checked before Hydra reads it: its error names the file
        value = o.partition("=")[2]
        if override_key(o) == "hardware" and value.endswith(hardware_presets.CALIBRATED):
            hardware_presets.calibrated_preset(value, user_conf_dir())
    with composing(list(overrides)) as composed:
        if composed.cfg.hardware.name != "auto":
            return spec_from(composed)
        auto = _resolve_auto_hardware(composed)
    return spec_from(auto)


def load_spec(trial_dir: Path) -> TrialSpec:
    """The TrialSpec written into a trial directory (config.yaml + trial.json), validated again.

    Built from the resolved config, not re-composed, so a rank on another host gets the
    very trial that was planned (hardware=auto already resolved on the submitting host).
    """
    paths = TrialPaths(trial_dir)
    try:
        meta = TrialMeta.read(trial_dir)
        choices, overrides = meta.choices, meta.overrides
        cfg = OmegaConf.merge(OmegaConf.structured(TrialConfig), OmegaConf.create(read_yaml(paths.config)))
        assert isinstance(cfg, DictConfig)  # merged onto the schema's dict
    except (OSError, ValueError, KeyError, TypeError, RecursionError, OmegaConfBaseException, yaml.YAMLError) as exc:
        raise ConfigError(
            "trial",
            str(trial_dir),
            f"a trial directory whose {paths.config.name} and {paths.meta.name} "
            f"can be read ({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''})",
        ) from None
    return spec_from(Composed(cfg=cfg, choices=choices, overrides=overrides, sweep_params={}))


def spec_from(composed: Composed) -> TrialSpec:
    cfg: TrialConfig = typed_config(composed.cfg, composed.typed_groups, composed.changed)
    check_model(cfg)
    check_zero(cfg)
    check_engine(cfg)
    check_cluster(cfg)
    check_zero_only_knobs(cfg, composed.overrides)
    precision = check_run(cfg)
    check_grad_accum(cfg, precision)
    check_hardware(cfg, precision, composed.choices.get("hardware", ""))
    cfg = with_network_table(cfg)
    check_logger(cfg)
    dp = at_most(positive(cfg.parallel.dp, "parallel.dp"), "parallel.dp", MAX_DP)
    gpus_per_node, nodes = placement(cfg, dp)
    check_dp_layout(cfg, dp, gpus_per_node)
    mbs, gbs = check_batch(cfg, dp)
    return TrialSpec(
        cfg=cfg,
        choices=composed.choices,
        overrides=tuple(redact_text(o) for o in composed.overrides),
        precision=precision,
        world_size=dp,
        dp=dp,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        micro_batch_size=mbs,
        grad_accum_steps=grad_accum_steps(gbs, mbs, dp),
        global_batch_size=gbs,
        tokens_per_step=gbs * cfg.model.seq_len,
        schedule=_schedule(cfg, mbs * dp),
    )


def _schedule(cfg: TrialConfig, unit: int) -> BatchSchedule:
    b, w = cfg.batch, cfg.batch.warmup
    if w is None:
        assert b.global_batch_size is not None  # set by trial_checks.check_batch
        return [(0, b.global_batch_size)]
    assert (
        w.start is not None and w.increment is not None and w.ramp_tokens is not None
    )  # set by trial_checks.check_batch
    return warmup_schedule(w.start, w.end, w.increment, w.ramp_tokens)


def _resolve_auto_hardware(composed: Composed) -> Composed:
    """hardware=auto: the local GPU's preset, or cpu; never a guess for a remote cluster."""
    presets_known = [p for p in presets("hardware") if p != "auto"]
    if composed.cfg.cluster.name != "local":
        raise ConfigError(
            "hardware",
            "auto",
            f"on cluster={composed.cfg.cluster.name} the compute nodes cannot be "
            f"seen from here; choose one of {one_of(presets_known)} (with hardware.kernels=measured "
            "its kernels are timed on the allocated node before the ranks start)",
        )
    gpu = machine.local_gpu_name()
    preset = "cpu" if gpu is None else machine.preset_for_gpu(gpu)
    # A GPU without a preset is planned from its timed kernels and its own memory size;
    # with no published peak its MFU is unknown (conf/hardware/gpu.yaml).
    given = {override_key(o) for o in composed.overrides}
    unknown = (
        []
        if preset or "hardware.memory_gib" in given
        else [f"hardware.memory_gib={machine.local_gpu_memory_gib():.2f}"]
    )
    preset = preset or "gpu"
    if hardware_presets.calibrated_preset(preset, user_conf_dir()) is not None:  # written by `orchestrator calibrate`
        preset = hardware_presets.calibrated_name(preset)
    kept = [o for o in composed.overrides if override_key(o) != "hardware"]
    # On the machine the trial runs on, its kernels are timed here (kernel_timing.py);
    # a calibrated preset is the user's choice of fitted values, and keeps them.
    timed = (
        []
        if preset.endswith(hardware_presets.CALIBRATED) or "hardware.kernels" in given
        else ["hardware.kernels=measured"]
    )
    resolved = compose_trial(kept + [f"hardware={preset}", *timed, *unknown])
    return dataclasses.replace(resolved, overrides=composed.overrides)  # what the user typed
