"""The trial's offline W&B run read back with wandb's own reader, against result.json."""

import json
import subprocess
import sys
from pathlib import Path

d = Path(sys.argv[1])
runs = sorted((d / "wandb").glob("offline-run-*"))
if not runs:
    print("FAIL no offline-run-* directory under wandb/")
    sys.exit()
wandb = Path(sys.executable).parent / "wandb"
try:
    out = subprocess.run(
        [str(wandb), "leet", "inspect", "--summary", "--json", str(runs[-1])],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    summary = json.loads(out)["summary"]
except Exception as exc:  # noqa: BLE001 - an older wandb has no `leet`
    size = sum(f.stat().st_size for f in runs[-1].glob("*.wandb"))
    print(f"INFO offline run written ({size} bytes) but not readable here ({type(exc).__name__}); `wandb sync` it")
    sys.exit()
r = json.loads((d / "result.json").read_text())
want = r["metrics"]["tokens_per_sec_per_gpu"]
got = summary.get("perf/tokens_per_sec_per_gpu")
same = got is not None and abs(got - want) <= 1e-6 * max(1.0, want)
keys = [k for k in summary if k.startswith(("perf/", "plan/", "train/"))]
print(
    f"{'PASS' if same and summary.get('status') == r['status'] else 'FAIL'} status={summary.get('status')} "
    f"perf/tokens_per_sec_per_gpu={got} (result.json {want:.1f}) perf/mfu={summary.get('perf/mfu')} "
    f"perf/memory/peak_bytes={summary.get('perf/memory/peak_bytes')} plan/step_s={summary.get('plan/step_s')}; "
    f"{len(keys)} perf/plan/train keys"
)
