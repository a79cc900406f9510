#!/usr/bin/env bash
# bench/gpu_check.sh - orchestrator on a GPU machine: the paths that start ranks on GPUs, one line per check.
#
# Run from the root of a fresh clone of the repository, on a machine with 1 GPU (an H200 or
# H100) or 8, in at most ~10 minutes (BUDGET_S, default 560 s, counts from the script's start,
# install included; a check that no longer fits prints SKIP):
#
#     bash bench/gpu_check.sh                      # PyPI reachable: pip installs torch (no pin) and the package
#     WHEELS=/path/to/wheels bash bench/gpu_check.sh   # no network: pip installs from those wheels only
#
# The helpers each check calls are bench/gpu_check/*.py. With one GPU the checks cover one rank of
# each engine, the refusals (dp above the visible GPUs), the planner's GPU residue, the SLURM task
# emulated (the node's plan, one GPU per task at local rank 1); with several, NCCL between ranks,
# FSDP2 and ZeRO 1-3, two SLURM tasks with all GPUs or one each, and NUMA binding.
#
# Install: a venv in $VENV (default .venv-gpu). Where `python3` already imports a CUDA torch (the
# a GPU machine image may keep one in a venv of its own), the new venv reads that site-packages through a
# .pth file and nothing of torch is downloaded; else `pip install torch` takes PyPI's default
# (CUDA) build, no pin. Then `pip install -e .`
# (DeepSpeed is an sdist on PyPI; DS_BUILD_OPS=0 keeps its build pure Python). For an offline
# machine, make the wheels on a connected one with the same Python (3.12 on the H200 image):
#     pip wheel -w wheels . && pip download -d wheels --no-deps <anything pip then says is missing>
# (`pip wheel` builds DeepSpeed's sdist into a wheel there).
#
# Every trial, log and helper stays under $WORK (default gpu-check-DATE in the clone); the
# kernel cache is fresh there ($XDG_CACHE_HOME), so the first plan is a cold one. The lines also
# go to $WORK/gpu_check.txt and, where $OUT is set, to $OUT/gpu_check.txt.
# EXTRA=1 adds two slower checks (accelerate FSDP2 with recompute=full against FSDP2 itself,
# and ZeRO-2 with the optimizer offloaded: DeepSpeed's CPU Adam is JIT-built on first use).
set -uo pipefail

BUDGET_S=${BUDGET_S:-560}
STAMP=$(date +%Y%m%d-%H%M%S)
WORK=${WORK:-$PWD/gpu-check-$STAMP}
VENV=${VENV:-$PWD/.venv-gpu}
WHEELS=${WHEELS:-}
EXTRA=${EXTRA:-0}
TOOLS=$(cd "$(dirname "$0")" && pwd)/gpu_check
LOG=$WORK/gpu_check.txt
mkdir -p "$WORK"
export XDG_CACHE_HOME=$WORK/cache ORCHESTRATOR_USER_CONF=$WORK/userconf
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DS_BUILD_OPS=0 PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$XDG_CACHE_HOME" "$ORCHESTRATOR_USER_CONF"

say() { printf '%s\n' "$*" | tee -a "$LOG"; [ -n "${OUT:-}" ] && printf '%s\n' "$*" >> "$OUT/gpu_check.txt"; return 0; }
left() { echo $(( BUDGET_S - SECONDS )); }

# ---------------------------------------------------------------- helpers (Python) --








# ------------------------------------------------------------------------ install --
say "== orchestrator GPU check $STAMP in $PWD (budget ${BUDGET_S} s; work dir $WORK)"
if ! grep -q 'name = "orchestrator"' pyproject.toml 2>/dev/null; then
  say "check 0 install: FAIL run this from the root of the orchestrator repository"; exit 1
fi
command -v nvidia-smi >/dev/null && say "check 0 driver: INFO $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader | head -1) ($(nvidia-smi -L | wc -l) GPU(s))"
# A CUDA torch that python3 already imports (a machine image may keep it in another venv, which
# --system-site-packages would not see): the new venv reads that site-packages through a .pth file.
HOST_SITE=$(python3 -c 'import os, torch; assert torch.cuda.is_available(); print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null || true)
PIPX=(-q)
[ -n "$WHEELS" ] && PIPX+=(--no-index --find-links "$WHEELS")
t=$SECONDS
{
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  PY=$VENV/bin/python
  if [ -n "$HOST_SITE" ]; then
    echo "$HOST_SITE" > "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_host_cuda_torch.pth"
  fi
  if ! "$PY" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    "$PY" -m pip install "${PIPX[@]}" torch              # PyPI's default build is CUDA's: no pin
  fi
  "$PY" -m pip install "${PIPX[@]}" setuptools wheel >/dev/null 2>&1 || true
  if [ -n "$WHEELS" ]; then "$PY" -m pip install "${PIPX[@]}" --no-build-isolation -e .; else "$PY" -m pip install "${PIPX[@]}" -e .; fi
} > "$WORK/install.log" 2>&1
PY=$VENV/bin/python ORCH=$VENV/bin/orchestrator
if ! "$PY" -c 'import torch, deepspeed, hydra, submitit, wandb, orchestrator; assert torch.cuda.is_available()' >> "$WORK/install.log" 2>&1; then
  say "check 0 install: FAIL after $((SECONDS - t)) s: $(tail -n 3 "$WORK/install.log" | tr '\n' ' ' | cut -c1-300)"; exit 1
fi
say "check 0 install: PASS $((SECONDS - t)) s (torch: ${HOST_SITE:-installed from PyPI into $VENV}${WHEELS:+; the rest offline from $WHEELS})"
envline=$("$PY" "$TOOLS/env.py" 2>&1)
say "check 0 env: $(printf '%s\n' "$envline" | grep -E '^INFO' | tail -n 1 || printf '%s\n' "$envline" | tail -n 2 | tr '\n' ' ')"
eval "$(printf '%s\n' "$envline" | grep -E '^NGPU=' || echo NGPU=0)"
PRESET=${PRESET:-}
(( NGPU >= 1 )) || { say "check 0 env: FAIL torch sees no GPU"; exit 1; }
NDP=$(( NGPU >= 8 ? 8 : NGPU ))

# ------------------------------------------------------------- the run machinery --
nvsample() {  # one sample: app,PID,MiB for each process on a GPU; gpu,INDEX,MiB for each GPU
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null | tr -d ' ' | sed 's/^/app,/'
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits 2>/dev/null | tr -d ' ' | sed 's/^/gpu,/'
}

watch_run() {  # CAP SAMPLES CMD...: CMD in the background (output to $WATCH_LOG), GPU sampled each second, ended at CAP
  local cap=$1 samples=$2 start=$SECONDS killed=0 kstart=0; shift 2
  "$@" > "$WATCH_LOG" 2>&1 &
  WATCH_PID=$!
  while kill -0 "$WATCH_PID" 2>/dev/null; do
    nvsample >> "$samples"
    if (( killed == 0 && SECONDS - start > cap )); then kill -TERM "$WATCH_PID" 2>/dev/null; killed=1; kstart=$SECONDS; fi
    if (( killed == 1 && SECONDS - kstart > 25 )); then kill -KILL "$WATCH_PID" 2>/dev/null; killed=2; fi
    sleep 1
  done
  wait "$WATCH_PID"; WATCH_RC=$?
  (( killed )) && WATCH_RC="$WATCH_RC, ended at the ${cap} s cap"
  return 0
}

fits() {  # NEED LABEL: whether NEED seconds are left; else a SKIP line
  if (( $(left) < $1 )); then say "check $2: SKIP (budget: $(left) s left, needs ~$1 s)"; return 1; fi
}

trial() {  # ID LABEL CAP NEED OVERRIDES...: one `orchestrator run`, summarised in one line
  local id=$1 label=$2 cap=$3 need=$4; shift 4
  fits "$need" "$id $label" || return 1
  local l=$(( $(left) - 5 )) dir="$WORK/t$id" t0=$SECONDS
  (( cap > l )) && cap=$l
  WATCH_LOG="$dir.log"
  watch_run "$cap" "$dir.gpumem" "$ORCH" run --out "$dir" "$@"
  say "$("$PY" "$TOOLS/summ.py" "$dir" "check $id $label" "$WATCH_PID" "$dir.gpumem" "$WATCH_RC" "$((SECONDS - t0))" 2>&1 | tail -n 1)"
}

STEPS=(run.steps=8 run.warmup_steps=3 logger.mode=disabled)   # 5 timed steps; W&B only where checked

# --------------------------------------------------------------------- the checks --
# 1. kernel_timing's clocks: CUPTI device time (kernels) vs CUDA events (blocks), quiet check.
if fits 25 "1 clocks"; then
  say "check 1 clocks: $(timeout 90 "$PY" "$TOOLS/clock.py" 2>&1 | tail -n 1)"
fi

# 2. The default trial on the GPU at one rank (tiny GPT, DeepSpeed ZeRO-0, hardware=auto, W&B offline).
trial 2 "default trial, parallel.dp=1 (tiny, DeepSpeed, hardware=auto)" 150 60 parallel.dp=1

# 3. A local GPU trial with more ranks than visible GPUs is refused before anything starts (exit 2).
if fits 20 "3 dp above the visible GPUs"; then
  "$ORCH" run parallel.dp=$(( NGPU + 1 )) logger.mode=disabled --out "$WORK/t3" > "$WORK/t3.log" 2>&1; rc=$?
  said=$(tr '\n' ' ' < "$WORK/t3.log" | grep -o "parallel.dp=$(( NGPU + 1 )) is not allowed[^;]*" | head -1)
  say "check 3 dp=$(( NGPU + 1 )) on $NGPU GPU(s): $([ $rc = 2 ] && [ -n "$said" ] && echo PASS || echo FAIL) exit $rc: ${said:-$(tail -n 2 "$WORK/t3.log" | tr '\n' ' ' | cut -c1-200)}"
fi
(( NGPU >= 2 )) && trial 3b "default trial as shipped (parallel.dp=2)" 100 40

# 4. Planning on the GPU: a new shape cold (kernels + engine stand-in timed here), then warm.
if fits 60 "4 plan gpt2-125m ZeRO-2 cold/warm"; then
  t0=$SECONDS; timeout $(( $(left) > 200 ? 200 : $(left) )) "$ORCH" plan model=gpt2-125m zero=stage2 parallel.dp=1 --json \
      > "$WORK/plan4.json" 2> "$WORK/plan4.err"; rc=$?; cold=$((SECONDS - t0))
  t0=$SECONDS; timeout 90 "$ORCH" plan model=gpt2-125m zero=stage2 parallel.dp=1 --json > "$WORK/plan4b.json" 2>/dev/null; warm=$((SECONDS - t0))
  say "check 4 plan gpt2-125m ZeRO-2 (hardware=auto): $([ $rc = 0 ] && echo INFO || echo FAIL) cold ${cold} s, warm ${warm} s; $(
    "$PY" "$TOOLS/plancheck.py" "$WORK/plan4.json" 2>&1 | tail -n 1)"
fi

# 5. gpt2-125m DeepSpeed ZeRO-2 at one rank, W&B offline; its W&B run read back.
trial 5 "gpt2-125m DeepSpeed ZeRO-2 dp=1" 150 45 model=gpt2-125m zero=stage2 parallel.dp=1 run.steps=8 run.warmup_steps=3 \
  && fits 10 "5w W&B offline summary" && say "check 5w W&B offline summary: $("$PY" "$TOOLS/wandb_check.py" "$WORK/t5" 2>&1 | tail -n 1)"

# 11. Several GPUs: NCCL across ranks (DeepSpeed binds device_id=cuda:LOCAL_RANK; FSDP2 does not), numa binding.
if (( NGPU >= 2 )); then
  trial 11a "gpt2-125m DeepSpeed ZeRO-2 dp=$NDP (NCCL)" 150 60 model=gpt2-125m zero=stage2 parallel.dp=$NDP "${STEPS[@]}"
  trial 11b "gpt2-125m FSDP2 (zero=stage3) dp=$NDP (NCCL)" 150 60 model=gpt2-125m engine=fsdp parallel.dp=$NDP "${STEPS[@]}"
  trial 11c "gpt2-125m ZeRO-3 dp=$NDP numa=node (torchrun --numa-binding=node)" 150 60 model=gpt2-125m zero=stage3 \
    numa=node parallel.dp=$NDP "${STEPS[@]}"
fi

# 11d/11e. Two SLURM tasks on one node without SLURM (submitit's environment from SLURM_* variables,
#   launchers.slurm_task.SlurmTask as srun runs it, NCCL between them): every GPU visible to each
#   task (what --gpus-per-node gives), then one GPU per task (what --gpus-per-task=1 or
#   --gpu-bind=single:1 gives; placement.py picks cuda:0, DeepSpeed binds cuda:LOCAL_RANK).
slurm_pair() {  # ID LABEL NARROW CAP ENGINE-OVERRIDES...
  local id=$1 label=$2 narrow=$3 cap=$4 d=$WORK/t$1 port=$(( 20000 + RANDOM % 20000 )) i vis
  local pids=()
  shift 4
  fits $(( cap / 2 + 20 )) "$id $label" || return 1
  "$ORCH" translate model=gpt2-125m cluster=slurm "hardware=$PRESET" cluster.gpus_per_node=2 parallel.dp=2 \
      "$@" "${STEPS[@]}" --out "$d" > "$d.translate.log" 2>&1
  for i in 0 1; do
    vis=0,1; [ "$narrow" = 1 ] && vis=$i
    env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u MASTER_ADDR SUBMITIT_EXECUTOR=slurm SLURM_JOB_ID=4343 \
        SLURM_JOB_NODELIST=localhost SLURM_JOB_NUM_NODES=1 SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=2 SLURM_NODEID=0 \
        SLURM_PROCID=$i SLURM_LOCALID=$i MASTER_PORT=$port CUDA_VISIBLE_DEVICES=$vis \
        timeout -k 20 "$cap" "$PY" "$TOOLS/slurm_task.py" "$d" > "$d.rank$i.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[0]}"; wait "${pids[1]}"
  say "check $id $label: $(grep -hE '^(PASS|FAIL)' "$d.rank0.log" | tail -n 1 | cut -c1-300) | rank 1: $(grep -hE '^(PASS|FAIL)' "$d.rank1.log" | tail -n 1 | cut -c1-200)"
}
if (( NGPU >= 2 )) && [ -n "$PRESET" ]; then
  slurm_pair 11d "2 SLURM tasks, all GPUs visible (--gpus-per-node), DeepSpeed ZeRO-2" 0 150 zero=stage2
  # one GPU a task: each task is local rank 0 of 1 (slurm_task.task_environment), so each engine's
  # own cuda:LOCAL_RANK is that GPU (DeepSpeed's device_id and zero.Init, FSDP2's mesh)
  slurm_pair 11e "2 SLURM tasks, one GPU each (--gpus-per-task=1), DeepSpeed ZeRO-2" 1 120 zero=stage2
  slurm_pair 11f "2 SLURM tasks, one GPU each, DeepSpeed ZeRO-3 (zero.Init's set_device)" 1 120 zero=stage3
  slurm_pair 11g "2 SLURM tasks, one GPU each, FSDP2" 1 120 engine=fsdp zero=stage3
fi
# 11h. One GPU: a task that is local rank 1 of its node's 2 and sees one GPU (what --gpu-bind=single:1
#   gives the second task), ZeRO-3 at world size 1: zero.Init's set_device(LOCAL_RANK) is the test.
if (( NGPU == 1 )) && [ -n "$PRESET" ] && fits 60 "11h one GPU per task at local rank 1"; then
  d=$WORK/t11h
  "$ORCH" translate model=gpt2-125m zero=stage3 cluster=slurm "hardware=$PRESET" cluster.gpus_per_node=1 parallel.dp=1 \
      "${STEPS[@]}" --out "$d" > "$d.translate.log" 2>&1
  env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u MASTER_ADDR SUBMITIT_EXECUTOR=slurm SLURM_JOB_ID=4444 \
      SLURM_JOB_NODELIST=localhost SLURM_JOB_NUM_NODES=1 SLURM_NTASKS=1 SLURM_NTASKS_PER_NODE=2 SLURM_NODEID=0 \
      SLURM_PROCID=0 SLURM_LOCALID=1 MASTER_PORT=$(( 20000 + RANDOM % 20000 )) CUDA_VISIBLE_DEVICES=0 \
      timeout -k 20 120 "$PY" "$TOOLS/slurm_task.py" "$d" > "$d.log" 2>&1
  say "check 11h one GPU per task at local rank 1 (ZeRO-3): $(grep -hE '^(PASS|FAIL)' "$d.log" | tail -n 1 | cut -c1-300)"
fi

# 6. gpt2-125m FSDP2, parameters kept between forward and backward (zero=stage2).
trial 6 "gpt2-125m FSDP2 zero=stage2 dp=1" 150 50 model=gpt2-125m engine=fsdp zero=stage2 parallel.dp=1 "${STEPS[@]}"

# 7. What the planning process keeps on the GPU after timing a new shape (it lives on during the
#    run): nothing, the kernels are timed in a process of their own (kernel_timing.measure_apart).
if fits 60 "7 planner residue (gpt2-350m ZeRO-2)"; then
  say "check 7 planner residue (gpt2-350m ZeRO-2 planned in-process): $(timeout $(( $(left) > 200 ? 200 : $(left) )) \
      "$PY" "$TOOLS/residue.py" model=gpt2-350m zero=stage2 parallel.dp=1 2>&1 | tail -n 1)"
fi

# 8, 9. gpt2-350m, both engines.
trial 8 "gpt2-350m DeepSpeed ZeRO-2 dp=1" 150 45 model=gpt2-350m zero=stage2 parallel.dp=1 "${STEPS[@]}"
trial 9 "gpt2-350m FSDP2 zero=stage3 dp=1" 150 50 model=gpt2-350m engine=fsdp parallel.dp=1 "${STEPS[@]}"

# 10. A SLURM task without SLURM: hardware.kernels=measured re-plans on the node before the rank starts.
if [ -n "$PRESET" ] && fits 50 "10 SLURM task emulation"; then
  d10=$WORK/t10
  "$ORCH" translate model=gpt2-125m zero=stage2 cluster=slurm "hardware=$PRESET" hardware.kernels=measured \
      cluster.gpus_per_node=1 parallel.dp=1 "${STEPS[@]}" --out "$d10" > "$d10.translate.log" 2>&1
  port=$(( 20000 + RANDOM % 20000 ))
  WATCH_LOG=$d10.log
  watch_run $(( $(left) > 150 ? 150 : $(left) - 5 )) "$d10.gpumem" env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE \
      -u MASTER_ADDR SUBMITIT_EXECUTOR=slurm SLURM_JOB_ID=4242 SLURM_JOB_NODELIST=localhost SLURM_JOB_NUM_NODES=1 \
      SLURM_NTASKS=1 SLURM_NTASKS_PER_NODE=1 SLURM_NODEID=0 SLURM_PROCID=0 SLURM_LOCALID=0 MASTER_PORT=$port \
      CUDA_VISIBLE_DEVICES=0 "$PY" "$TOOLS/slurm_task.py" "$d10"
  held=$("$PY" "$TOOLS/held.py" "$d10.gpumem" "$WATCH_PID" 2>/dev/null)
  say "check 10 SLURM task emulation (gpt2-125m ZeRO-2, hardware=$PRESET hardware.kernels=measured): $(grep -E '^(PASS|FAIL)' "$d10.log" | tail -n 1 | cut -c1-400) [exit $WATCH_RC]; the SlurmTask process itself held $held on GPU 0 while its rank ran (expect nothing: the node's plan runs in a process of its own)"
fi

# 12. NUMA binding at one rank (on several GPUs 11c did it): torchrun --numa-binding needs numactl.
(( NGPU == 1 )) && trial 12 "numa=node dp=1 (torchrun --numa-binding=node)" 90 30 numa=node parallel.dp=1 "${STEPS[@]}"

# 13. accelerate's FSDP2: never run anywhere before (refused on a CPU).
trial 13 "accelerate FSDP2 zero=stage3 dp=1 (gpt2-125m)" 150 60 model=gpt2-125m engine=accelerate engine.backend=fsdp \
  zero=stage3 parallel.dp=1 "${STEPS[@]}"

if [ "$EXTRA" = 1 ]; then
  # 14. recompute=full under accelerate FSDP2 against FSDP2 itself: near 1, the blocks are recomputed
  #     once (accelerate's fsdp_activation_checkpointing is off; the workload checkpoints them).
  trial 14a "FSDP2 recompute=full dp=1 (gpt2-125m)" 150 50 model=gpt2-125m engine=fsdp recompute=full parallel.dp=1 "${STEPS[@]}"
  trial 14b "accelerate FSDP2 recompute=full dp=1 (gpt2-125m)" 150 60 model=gpt2-125m engine=accelerate engine.backend=fsdp \
    zero=stage3 recompute=full parallel.dp=1 "${STEPS[@]}"
  if [ -f "$WORK/t14a/result.json" ] && [ -f "$WORK/t14b/result.json" ]; then
    say "check 14 accelerate FSDP2 / FSDP2 step at recompute=full: INFO $("$PY" "$TOOLS/ratio.py" "$WORK/t14a/result.json" "$WORK/t14b/result.json" 2>&1 | tail -n 1)"
  fi
  # 15. ZeRO-2 with the optimizer on the host: DeepSpeedCPUAdam is compiled on first use (g++, Python headers).
  trial 15 "gpt2-125m ZeRO-2 offload_optimizer=cpu dp=1" 240 120 model=gpt2-125m zero=stage2 zero.offload_optimizer=cpu \
    parallel.dp=1 "${STEPS[@]}"
fi

n_pass=$(grep -c ': PASS' "$LOG"); n_fail=$(grep -c ': FAIL' "$LOG"); n_skip=$(grep -c ': SKIP' "$LOG")
say "== done in ${SECONDS} s: ${n_pass} PASS, ${n_fail} FAIL, ${n_skip} SKIP; trials and logs in $WORK"
exit 0
