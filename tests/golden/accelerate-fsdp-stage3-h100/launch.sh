#!/usr/bin/env bash
# Written by orchestrator translate: runs this trial's ranks on this machine.
set -e
export OMP_NUM_THREADS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
exec python -m accelerate.commands.launch --config_file $TRIAL_DIR/accelerate_config.yaml --enable_cpu_affinity --module orchestrator.workload.train $TRIAL_DIR
