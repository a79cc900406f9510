#!/usr/bin/env bash
#SBATCH --job-name=orchestrator
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=01:00:00
#SBATCH --gpus-per-node=8
#SBATCH --partition=gpu
#SBATCH --exclusive
#SBATCH --signal=USR2@90
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=$TRIAL_DIR/logs/sbatch-%j.out
#SBATCH --gres-flags=enforce-binding
#SBATCH --ntasks-per-socket=4
# Written by orchestrator translate: `sbatch launch.sh` runs one task per GPU, the job that
# `orchestrator run cluster=slurm` submits (EXPLAIN.md), then writes result.json.
set -u  # not -e: the last line records a failed step too
export OMP_NUM_THREADS=8
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
started=$(date +%s)
srun --kill-on-bad-exit=1 --cpus-per-task=8 --cpu-bind=sockets python -m orchestrator.launchers.slurm_task $TRIAL_DIR
python -m orchestrator.launchers.slurm_task $TRIAL_DIR --result "$?" --started "$started"
