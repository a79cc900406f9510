"""orchestrator/workload/wandb_compat.py against the W&B installed here, in fresh interpreters
(a pytest worker has imported W&B and torch already). Every trial that logs runs through it
too (tests/test_tracking_report.py reads their offline runs)."""

import json
import subprocess
import sys

CHECK = """
import json, sys
from orchestrator.workload.wandb_compat import import_wandb

disabled = import_wandb("disabled")
wandb_before = "wandb" in sys.modules
wandb = import_wandb("offline")
before = set(sys.modules)
run = wandb.init(dir=sys.argv[1], project="compat", settings=wandb.Settings(console="off"))
run.finish()
print(json.dumps({"disabled": disabled, "wandb_before": wandb_before, "mode": run.settings.mode,
                  "init_imported": sorted(m for m in set(sys.modules) - before if m.startswith("wandb.sdk.launch"))}))
"""


def test_what_wandb_init_imports_is_imported_with_wandb(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NETRC": str(tmp_path / "netrc")},
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["disabled"] is None and seen["wandb_before"] is False  # disabled imports nothing
    assert seen["mode"] == "offline" and list(tmp_path.glob("wandb/offline-run-*"))
    # Empty while INIT_IMPORTS names what init imports: a W&B that moved it lists it here.
    assert seen["init_imported"] == []
