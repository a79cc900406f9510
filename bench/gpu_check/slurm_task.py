"""One SLURM task as srun would start it, without SLURM: submitit's environment from fake
SLURM_* variables (set by the caller), launchers.slurm_task.SlurmTask called as submitit calls
it. With hardware.kernels=measured rank 0 re-plans on the node (GPU) before starting its rank."""

import json
import os
import sys
import time
from pathlib import Path

from orchestrator.launchers.slurm_task import SlurmTask
from orchestrator.spec import load_spec

d = Path(sys.argv[1])
rank = os.environ.get("SLURM_PROCID", "0")
t0 = time.time()
spec = load_spec(d)
why = ""
try:
    SlurmTask.for_trial(spec, d)()  # what submitit's path and launch.sh's both run
    ok = True
except Exception as exc:  # noqa: BLE001
    ok, why = False, f"{type(exc).__name__}: {exc}"
wall = time.time() - t0
sub = d / "plan-at-submit.json"
if rank != "0":  # only rank 0 writes metrics.json; another rank says how it ended
    err = d / "errors" / f"rank{rank}.json"
    said = json.loads(err.read_text())["message"][:200] if err.is_file() else why
    print(f"{'PASS' if ok else 'FAIL'} rank {rank} ({wall:.0f} s) {' '.join(said.split())}")
    sys.exit()
if not ok or not (d / "metrics.json").is_file():
    errs = sorted((d / "errors").glob("rank*.json")) if (d / "errors").is_dir() else []
    msg = json.loads(errs[0].read_text())["message"][:200] if errs else (why if not ok else "no metrics.json")
    print(f"FAIL ({wall:.0f} s) {' '.join(msg.split())}")
    sys.exit()
b = json.loads((d / "plan.json").read_text())
a = json.loads(sub.read_text()) if sub.is_file() else b  # no plan-at-submit: kernels=preset, nothing re-planned
m = json.loads((d / "metrics.json").read_text())["metrics"]
replan = f"{sub.stat().st_mtime - t0:.0f} s" if sub.is_file() else "no"
print(
    f"PASS ({wall:.0f} s, of which {replan} re-planning on the node before the rank started; world "
    f"{json.loads((d / 'metrics.json').read_text())['env']['world_size']}) "
    f"step: submitted plan {a['time']['step_s'] * 1e3:.1f} ms -> node plan {b['time']['step_s'] * 1e3:.1f} ms -> "
    f"measured {m['step_time_s'] * 1e3:.1f} ms; compute: {b['sources']['compute'][-70:]}"
)
