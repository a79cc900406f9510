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
    proc = subprocess.run(
        [sys.executable, "-c", CHECK],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["asked_for"] is False and seen["muon_asked"] is False  # a Muon trial compiles it as DeepSpeed does
    assert seen["imported"] is True and seen["again"] is False  # once, before the engine
    assert seen["inductor"] is False and seen["compiled"] is False  # what the 2.6 s per rank was
    assert seen["left_set"] is False  # torch.compile works again for the model (run.compile)
    assert seen["optimizer"] == "MuonWithAuxAdam"  # DeepSpeed's own import finds it


SHM_CHECK = """
import json, os, sys
import deepspeed, deepspeed.comm, deepspeed.ops
from orchestrator.workload.deepspeed_compat import SHM_COMM_OP, leave_shm_comm_unbuilt, probe_ops

probe_ops()  # as the launcher server does; the rank below is its fork
if os.fork():
    _, status = os.wait()
    print(json.dumps({"parents": deepspeed.ops.__compatible_ops__[SHM_COMM_OP]}))  # the fork marked its own copy
    sys.exit(os.waitstatus_to_exitcode(status))
probed = "__compatible_ops__" in vars(deepspeed.ops)
was = leave_shm_comm_unbuilt()
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)  # what a CPU rank starts
backend = deepspeed.comm.comm.cdb
extensions = os.environ["TORCH_EXTENSIONS_DIR"]
built = sorted(os.listdir(extensions)) if os.path.isdir(extensions) else []
print(json.dumps({"was": was, "op": repr(backend.shm_comm_op), "built": built, "world": deepspeed.comm.get_world_size(),
                  "probed": probed}), flush=True)
os._exit(0)
"""


def test_a_cpu_ranks_deepspeed_backend_starts_without_compiling_its_shared_memory_op(tmp_path):
    """The launcher server probes the ops (probe_ops), each forked rank marks its copy. Without
    the mark DeepSpeed compiles deepspeed_shm_comm into TORCH_EXTENSIONS_DIR (an empty
    one here, so it would be built: ~110 s of CPU) and keeps it as the backend's shm_comm_op."""
    env = {**_one_rank(tmp_path), "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions")}
    proc = subprocess.run([sys.executable, "-c", SHM_CHECK], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    *_, child, parent = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert child["was"] is True  # this machine could build it: the mark is what left it unbuilt
    assert child["op"] == "None" and child["built"] == [] and child["world"] == 1
    assert child["probed"] is True and parent["parents"] is True  # probed once before the fork; marked in the fork only


def _one_rank(home) -> dict:
    """A one-rank world on loopback, in a bare environment (a fresh HOME), for DeepSpeed on a CPU."""
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "DS_ACCELERATOR": "cpu",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
    }


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


REBIND_CHECK = """
import json, os
import torch
import deepspeed
import deepspeed.comm as ds_comm
from orchestrator.workload.deepspeed_compat import leave_shm_comm_unbuilt
from orchestrator.workload.collective_wait import CollectiveWait
from orchestrator.workload.device import Device
leave_shm_comm_unbuilt()
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
backend = ds_comm.comm.cdb
bound = backend.all_gather_function
with CollectiveWait(Device.for_rank("cpu", {})) as clock:
    clock.start_step()
    ds_comm.all_gather_into_tensor(torch.zeros(4), torch.ones(4))  # as ZeRO gathers its partitions
    ds_comm.reduce_scatter_tensor(torch.zeros(4), torch.ones(4))
    _, kinds = clock.step_seconds()
print(json.dumps({"kinds": sorted(kinds), "restored": backend.all_gather_function is bound}), flush=True)
os._exit(0)
"""


def test_zeros_gathers_and_reduce_scatters_reach_the_collective_clock(tmp_path):
    """DeepSpeed's backend binds torch's all_gather_into_tensor and reduce_scatter_tensor when
    it starts, before the clock wraps them: rebound while the clock holds, put back after."""
    env = _one_rank(tmp_path)
    proc = subprocess.run([sys.executable, "-c", REBIND_CHECK], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
    assert out == {"kinds": ["all_gather", "reduce_scatter"], "restored": True}
