#!/usr/bin/env bash
# Written by orchestrator translate: runs this trial's ranks on this machine.
set -e
export OMP_NUM_THREADS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
exec python -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=8 --module orchestrator.workload.train $TRIAL_DIR
