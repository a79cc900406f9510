"""orchestrator/workload/deepspeed_compat.py against the DeepSpeed installed here.

In a fresh interpreter: whether Muon's module was imported before decides what is
measured, and a pytest worker may have built a DeepSpeed engine already. Every DeepSpeed
trial of the suite runs with it too (tests/test_run.py, tests/test_plan_drift.py).
"""

import json
import subprocess
import sys

CHECK = """
import json, os, sys
import deepspeed
from orchestrator.workload.deepspeed_compat import MUON_MODULE, NO_COMPILE, import_muon_uncompiled

asked_for = import_muon_uncompiled({"optimizer": {"type": "Muon"}})  # a Muon trial: left to DeepSpeed
muon_asked = MUON_MODULE in sys.modules
imported = import_muon_uncompiled({"optimizer": {"type": "AdamW", "params": {}}})
# what DeepSpeed's ZeRO reduction does at every backward, whatever the optimizer
from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam
from deepspeed.runtime.zero.muon import original_muon
print(json.dumps({"asked_for": asked_for, "muon_asked": muon_asked, "imported": imported,
                  "again": import_muon_uncompiled(None), "inductor": "torch._inductor.compile_fx" in sys.modules,
                  "compiled": hasattr(original_muon.muon_update, "_torchdynamo_orig_callable"),
                  "left_set": NO_COMPILE in os.environ, "optimizer": MuonWithAuxAdam.__name__}))
"""


def test_muon_is_imported_uncompiled_without_torchs_inductor_and_only_for_another_optimizer():
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["asked_for"] is False and seen["muon_asked"] is False  # a Muon trial compiles it as DeepSpeed does
    assert seen["imported"] is True and seen["again"] is False  # once, before the engine
    assert seen["inductor"] is False and seen["compiled"] is False  # what the 2.6 s per rank was
    assert seen["left_set"] is False  # torch.compile works again for the model (run.compile)
    assert seen["optimizer"] == "MuonWithAuxAdam"  # DeepSpeed's own import finds it
