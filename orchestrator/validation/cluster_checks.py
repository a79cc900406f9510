"""The cluster group's checks: SLURM's names, sizes and time limits, hydra-submitit-
launcher's aliases, no secret in the job script (written in clear), and how many nodes a
data-parallel size fills and how its layout sits on them. spec.py calls them with the other checks."""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

from orchestrator.config import EngineName, TrialConfig
from orchestrator.core.errors import ConfigError
from orchestrator.core.redact import redact, secret_export
from orchestrator.plan.dp_layout import DpLayout, divisors
from orchestrator.validation.checks import above_zero, positive, time_limit_s


def check_cluster(cfg: TrialConfig) -> None:
    _apply_submitit_aliases(cfg)
    positive(cfg.cluster.gpus_per_node, "cluster.gpus_per_node")
    positive(cfg.cluster.cpus_per_task, "cluster.cpus_per_task")
    positive(cfg.cluster.sockets_per_node, "cluster.sockets_per_node")
    if cfg.cluster.max_requeues < 0:
        raise ConfigError("cluster.max_requeues", cfg.cluster.max_requeues, "a whole number >= 0")
    if cfg.cluster.signal_delay_s < 0:
        raise ConfigError("cluster.signal_delay_s", cfg.cluster.signal_delay_s, "seconds >= 0")
    for name in ("partition", "account", "qos"):
        value = getattr(cfg.cluster, name)
        if value is not None and not re.fullmatch(r"[\w.\-,]+", value):
            raise ConfigError(f"cluster.{name}", value, "a SLURM name: letters, digits, _ . - and commas")
    if not re.fullmatch(r"(\d+-)?\d+(:\d\d){0,2}", cfg.cluster.time) or not time_limit_s(cfg.cluster.time):
        raise ConfigError("cluster.time", cfg.cluster.time, "a SLURM time limit above 0: MM, HH:MM:SS or D-HH:MM:SS")
    limit = time_limit_s(cfg.cluster.time)
    if cfg.cluster.python is not None:
        try:
            words = shlex.split(cfg.cluster.python)
        except ValueError as exc:
            words, why = [], f" ({exc})"
        else:
            why = ""
        if not words:
            raise ConfigError(
                "cluster.python",
                cfg.cluster.python,
                "a command that runs Python on the nodes (python3, "
                f"/shared/venv/bin/python, 'apptainer exec img.sif python'), or null for this one{why}",
            )
    if cfg.cluster.name == "slurm":  # only a SLURM job's files (its script, launch.json) hold these in clear
        _check_no_secret_in_job_script(cfg.cluster)
    if cfg.cluster.name == "slurm" and cfg.cluster.signal_delay_s > limit // 2:
        # SLURM warns this long before the end: past half the limit an allocation would
        # spend more time warned (checkpointing, waiting for the requeue) than training.
        raise ConfigError(
            "cluster.signal_delay_s",
            cfg.cluster.signal_delay_s,
            f"at most half of cluster.time={cfg.cluster.time} ({limit} s), so that every allocation "
            f"trains before SLURM warns of its end; the nearest valid value is {limit // 2}",
        )


def _apply_submitit_aliases(cfg: TrialConfig) -> None:
    """cluster.timeout_min and cluster.max_num_timeout (hydra-submitit-launcher's names)
    set cluster.time and cluster.max_requeues, which everything else reads."""
    c = cfg.cluster
    if c.timeout_min is not None:
        c.time = str(positive(c.timeout_min, "cluster.timeout_min"))  # SLURM's MM
    if c.max_num_timeout is not None:
        if c.max_num_timeout < 0:
            raise ConfigError("cluster.max_num_timeout", c.max_num_timeout, "a whole number >= 0")
        c.max_requeues = c.max_num_timeout
    if c.mem_gb is not None:
        above_zero(c.mem_gb, "cluster.mem_gb")
    if c.mem_gb is not None and c.mem_per_gpu is not None:
        raise ConfigError(
            "cluster.mem_per_gpu",
            c.mem_per_gpu,
            "unset (null) when cluster.mem_gb is set: SLURM takes one of --mem and --mem-per-gpu",
        )
    if c.mem_per_gpu is not None and not re.fullmatch(r"\d+[KMGT]?", str(c.mem_per_gpu)):
        raise ConfigError("cluster.mem_per_gpu", c.mem_per_gpu, "a SLURM size: a number with K, M, G or T (40G)")
    for key in c.additional_parameters:
        if not re.fullmatch(r"[a-z][a-z0-9_\-]*", str(key)):
            raise ConfigError(
                f"cluster.additional_parameters.{key}",
                c.additional_parameters[key],
                "an sbatch long option name (reservation, mail_type, ...)",
            )


def _check_no_secret_in_job_script(c: Any) -> None:
    """The sbatch script, launch.sh and launch.json are written in clear (and squeue shows
    --comment to every user): a secret may reach the job only as a setup line
    `export NAME=VALUE` (secret in its name or its value), which goes through sbatch's
    environment, never a file."""
    fix = "a secret reaches the job only as cluster.setup=['export NAME=VALUE'] (passed through sbatch's environment)"
    exports = {line for line in c.setup if secret_export(line)}
    fields = {
        "cluster.comment": [c.comment or ""],
        "cluster.srun_args": list(c.srun_args),
        "cluster.setup": [line for line in c.setup if line not in exports],
        **{f"cluster.additional_parameters.{k}": [f"{k}={v}"] for k, v in c.additional_parameters.items()},
    }
    for name, values in fields.items():
        if redact(values) != values:
            raise ConfigError(
                name,
                redact(values if len(values) > 1 else values[0]),
                f"a value free of secrets, as the job script is written in clear; {fix}",
            )


def placement(cfg: TrialConfig, dp: int) -> tuple[int, int]:
    """(ranks per node, nodes): local runs every rank here; SLURM fills whole nodes.

    A local GPU trial has one GPU a rank on this one host, so no more ranks than a node's
    GPUs (cluster.gpus_per_node): past that it is a trial of several nodes, which only
    cluster=slurm plans and runs (with its collectives between nodes, not all on NVLink)."""
    if cfg.cluster.name == "local":
        if cfg.hardware.device.is_gpu and dp > cfg.cluster.gpus_per_node:
            raise ConfigError(
                "parallel.dp",
                dp,
                f"at most cluster.gpus_per_node={cfg.cluster.gpus_per_node} with "
                "cluster=local, which runs every rank on this one host, one GPU each; plan it across "
                f"nodes with cluster=slurm, or the largest trial here is parallel.dp="
                f"{cfg.cluster.gpus_per_node}",
            )
        return dp, 1
    per_node = min(dp, cfg.cluster.gpus_per_node)
    if dp % per_node:
        raise ConfigError(
            "parallel.dp", dp, f"on SLURM, at most cluster.gpus_per_node={per_node} or a multiple of it (whole nodes)"
        )
    return per_node, math.ceil(dp / per_node)


def check_dp_layout(cfg: TrialConfig, dp: int, ranks_per_node: int) -> DpLayout:
    """parallel.replicate and parallel.shard_within_node against the degree and the nodes:
    the replicas must split the ranks evenly, HSDP is FSDP2's (engine=fsdp), and a shard group
    asked to lie within a node must fit in one and not straddle two."""
    p = cfg.parallel
    replicate = positive(p.replicate, "parallel.replicate")
    if dp % replicate:
        allowed = divisors(dp)
        nearest = min(allowed, key=lambda d: (abs(d - replicate), d))
        raise ConfigError(
            "parallel.replicate",
            replicate,
            f"a divisor of parallel.dp={dp} (each replica a shard group of dp / replicate ranks): "
            f"one of {', '.join(map(str, allowed))}; the nearest valid value is {nearest}",
        )
    layout = DpLayout(dp, replicate, ranks_per_node)
    if layout.hybrid and cfg.engine.name != EngineName.fsdp:
        raise ConfigError(
            "parallel.replicate",
            replicate,
            f"1 with engine={cfg.engine.name}: HSDP (shard within a group, replicate across) runs on "
            "FSDP2's 2D device mesh, engine=fsdp",
        )
    if p.shard_within_node and (layout.shard > ranks_per_node or layout.shard_nodes > 1):
        within = [r for r in divisors(dp) if dp // r <= ranks_per_node and ranks_per_node % (dp // r) == 0]
        raise ConfigError(
            "parallel.shard_within_node",
            True,
            f"a shard group within one node: parallel.dp={dp} / parallel.replicate={replicate} shards over "
            f"{layout.shard} ranks across {layout.shard_nodes} nodes of {ranks_per_node} ranks; "
            f"the nearest valid value is parallel.replicate={min(within, key=lambda r: abs(r - replicate))}",
        )
    return layout
