"""A trial's directory before launch: exactly what the engines and launchers consume.

`write_trial_files(spec, trial_dir)` writes, without running anything:
  config.yaml, trial.json    the resolved trial (what every rank loads back), its sweep
  plan.json                  the plan (predicted figures) the run is compared against
  ds_config.json             DeepSpeed's config (engine=deepspeed, or accelerate + deepspeed)
  accelerate_config.yaml     Accelerate's config (engine=accelerate; engine=fsdp needs none: EXPLAIN.md
                             says what fully_shard is given)
  launch.json                the launch as argument lists and environment
  launch.sh                  the same for a person: torchrun / accelerate launch, or an sbatch script
  EXPLAIN.md                 how each value follows from the trial
`orchestrator translate` calls it on --out DIR; `orchestrator run` on the trial directory.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from orchestrator.core.files import atomic_write_json, atomic_write_text
from orchestrator.core.redact import redact, secret_exports
from orchestrator.launchers import slurm
from orchestrator.launchers.binding import trial_binding
from orchestrator.launchers.local import Command, local_command, rank_environment
from orchestrator.records.trial_dir import TrialPaths
from orchestrator.records.trial_meta import TrialMeta
from orchestrator.spec import TrialSpec
from orchestrator.token_file import few_windows_warning
from orchestrator.translate import accelerate, deepspeed, fsdp


@dataclass(frozen=True)
class TrialFiles:
    directory: Path
    written: list[Path]
    warnings: list[str]
    command: Command | None  # local launches
    slurm: dict | None  # submitit parameters and the per-task command


def write_trial_files(
    spec: TrialSpec, trial_dir: Path, plan: dict | None = None, sweep: dict | None = None
) -> TrialFiles:
    """sweep: {"group", "name", "index", "swept"} for W&B; plan: the plan's dict (plan.json)."""
    trial_dir = trial_dir.resolve()
    paths = TrialPaths(trial_dir)
    bind = trial_binding(spec)
    files: dict[Path, str | dict] = {
        paths.config: OmegaConf.to_yaml(spec.resolved()),
        paths.meta: TrialMeta(spec.overrides, spec.choices, redact(sweep or {})).as_dict(),
    }
    if plan is not None:  # its text holds what users named (a link, a table's path and comment): masked
        files[paths.plan] = redact(plan)
    explain = [
        "# How this trial's configs follow from it",
        "",
        f"Overrides: `{' '.join(spec.overrides) or '(defaults)'}`",
        "",
        *_engine_files(spec, paths, files),
    ]
    warnings = [*bind.warnings, *_data_warnings(spec)]
    command, slurm_launch = None, None
    if spec.cfg.cluster.name == "local":
        if spec.cfg.engine.name == "accelerate" and bind.accelerate_args and spec.cfg.numa.mode != "node":
            warnings.append(f"numa.mode={spec.cfg.numa.mode}: accelerate launch binds to the GPU's NUMA node only")
        command = local_command(spec, trial_dir, bind)
        files[paths.launch_json] = {"cluster": "local", "argv": command.argv, "env": command.env}
        files[paths.launch_sh] = _local_script(command)
        explain += [
            "## launch",
            "",
            f"- {spec.world_size} processes on this machine: "
            + ("accelerate launch" if spec.cfg.engine.name == "accelerate" else "torchrun --standalone")
            + (f", NUMA binding {bind.torchrun_args or bind.accelerate_args}" if bind.torchrun_args else ""),
        ]
    else:
        slurm_launch = _slurm_launch(spec, trial_dir, bind)
        files[paths.launch_json] = {"cluster": "slurm", **slurm_launch}
        files[paths.launch_sh] = _sbatch_script(spec, slurm_launch)
        paths.logs.mkdir(parents=True, exist_ok=True)  # sbatch --output's folder: SLURM makes none
        explain += _slurm_explain(spec, bind)
    explain += [f"- warning: {w}" for w in warnings]
    files[paths.explain] = "\n".join(explain) + "\n"
    for path, content in files.items():
        if isinstance(content, dict):
            atomic_write_json(path, content)
        else:
            atomic_write_text(path, content)
    paths.launch_sh.chmod(0o755)
    return TrialFiles(directory=trial_dir, written=list(files), warnings=warnings, command=command, slurm=slurm_launch)


def _engine_files(spec: TrialSpec, paths: TrialPaths, files: dict[Path, str | dict]) -> list[str]:
    """The engine's own config files, added to `files`, and EXPLAIN.md's section on each."""
    explain: list[str] = []
    if spec.cfg.engine.backend == "deepspeed":
        files[paths.ds_config] = deepspeed.ds_config(spec)
        explain += [
            f"## {paths.ds_config.name} (DeepSpeed)",
            "",
            *(f"- {line}" for line in deepspeed.explain(spec)),
            "",
        ]
    if spec.cfg.engine.name == "fsdp":
        explain += ["## FSDP2 (engine=fsdp, under torchrun)", "", *(f"- {line}" for line in fsdp.explain(spec)), ""]
    if spec.cfg.engine.name == "accelerate":
        config = accelerate.accelerate_config(spec, paths.ds_config)
        files[paths.accelerate_config] = yaml.safe_dump(config, sort_keys=False)
        explain += [f"## {paths.accelerate_config.name}", "", *(f"- {line}" for line in accelerate.explain(spec)), ""]
    return explain


def _data_warnings(spec: TrialSpec) -> list[str]:
    run = spec.cfg.run
    if run.data and os.path.isfile(run.data):
        few = few_windows_warning(run.data, run.data_dtype, spec.cfg.model.seq_len, spec.global_batch_size)
        return [few] if few else []
    return []


def _slurm_launch(spec: TrialSpec, trial_dir: Path, bind) -> dict:
    """launch.json's SLURM half: submitit's parameters, sbatch's and srun's options, each task's
    command and environment, and the command that writes result.json after the job."""
    return {
        "submitit": slurm.submitit_parameters(spec, bind),
        "sbatch": slurm.sbatch_options(spec, bind, trial_dir),
        "srun": slurm.srun_options(spec, bind),
        "task": slurm.task_command(spec, trial_dir),
        "env": rank_environment(spec, spec.threads_per_rank),
        "result": slurm.result_command(spec, trial_dir),
    }


def _slurm_explain(spec: TrialSpec, bind) -> list[str]:
    c = spec.cfg.cluster
    tasks, cpus = slurm.node_tasks(spec)
    shape = (
        f"{tasks} task a node, which starts its {spec.gpus_per_node} ranks through accelerate launch "
        f"(--machine_rank: SLURM's node index), {cpus} CPUs"
        if spec.cfg.engine.name == "accelerate"
        else f"{tasks} tasks, one per GPU (ntasks-per-node = ranks per node)"
    )
    return [
        "## launch (SLURM)",
        "",
        f"- {spec.nodes} node(s) x {shape}; time {c.time}"
        + ("; the nodes to itself (--exclusive: cluster.exclusive)" if c.exclusive else ""),
        f"- `sbatch launch.sh` starts the job `orchestrator run cluster=slurm` submits through submitit: "
        f"each task runs {slurm.TASK_MODULE} (rendezvous from SLURM's variables, {spec.threads_per_rank} "
        f"threads a rank: cluster.cpus_per_task), a rank that dies ends the others (srun --kill-on-bad-exit), "
        f"SLURM's warning checkpoints and requeues (at most cluster.max_requeues={c.max_requeues} times); "
        "its last line writes result.json",
        f"- interpreter: `{shlex.join(slurm.task_python(spec))}` (cluster.python"
        + (")" if c.python else "; null: the one that wrote this file, which must be at that path on the nodes)"),
        f"- binding: srun {bind.srun_args or 'none'}, sbatch {bind.sbatch_options or 'none'}",
    ]


def _local_script(command: Command) -> str:
    lines = [
        "#!/usr/bin/env bash",
        "# Written by orchestrator translate: runs this trial's ranks on this machine.",
        "set -e",
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in command.env.items()]
    return "\n".join(lines + ["exec " + shlex.join(command.argv)]) + "\n"


def _sbatch_script(spec: TrialSpec, launch: dict) -> str:
    lines = ["#!/usr/bin/env bash", "#SBATCH --job-name=orchestrator"]
    lines += [f"#SBATCH {opt}" for opt in launch["sbatch"]]
    lines += [
        "# Written by orchestrator translate: `sbatch launch.sh` runs one task per GPU, the job that",
        "# `orchestrator run cluster=slurm` submits (EXPLAIN.md), then writes result.json.",
        "set -u  # not -e: the last line records a failed step too",
    ]
    lines += secret_exports(spec.cfg.cluster.setup)[0]  # the user's setup lines (module load ...), no secret
    lines += [f"export {k}={shlex.quote(v)}" for k, v in launch["env"].items()]  # what every rank's environment needs
    lines += ["started=$(date +%s)", "srun " + shlex.join([*launch["srun"], *launch["task"]])]
    return "\n".join(lines + [shlex.join(launch["result"]) + ' "$?" --started "$started"']) + "\n"
