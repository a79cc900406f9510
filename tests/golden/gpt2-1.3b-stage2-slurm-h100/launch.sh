#!/usr/bin/env bash
#SBATCH --job-name=orchestrator
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=01:00:00
#SBATCH --gpus-per-node=8
#SBATCH --partition=gpu
#SBATCH --signal=USR2@90
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --gres-flags=enforce-binding
#SBATCH --ntasks-per-socket=4
# Written by orchestrator translate: `sbatch launch.sh` runs one task per GPU.
set -e
srun --cpu-bind=sockets python -m orchestrator.workload.train $TRIAL_DIR
