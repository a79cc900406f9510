#!/usr/bin/env bash
# Written by orchestrator translate: runs this trial's ranks on this machine.
set -e
export OMP_NUM_THREADS=1
export DS_ACCELERATOR=cpu
export MALLOC_MMAP_THRESHOLD_=1048576
exec python -m orchestrator.launchers.forked --standalone --nnodes=1 --nproc-per-node=2 $TRIAL_DIR
