"""Every reliance on DeepSpeed's internals, in one place (tests/test_deepspeed_compat.py checks each).

- `import_muon_uncompiled`: DeepSpeed's ZeRO imports its Muon optimizer's module
  (`deepspeed.runtime.zero.muon.muon_optimizer`) when it builds the engine and again in
  its gradient reduction, whatever the optimizer, to ask whether the optimizer is Muon.
  That module decorates its kernels with `torch.compile` at import, and torch.compile
  with the inductor backend imports torch's inductor then and there: 2.6 s of CPU per
  rank on a 2-core AMD EPYC, a quarter of what a small trial's rank costs (py-spy), paid
  by every rank of every ZeRO trial and by the plan's engine timing. Our ranks run AdamW
  (deepspeed_sections.py), so Muon's kernels never run: the module is imported first with
  torch.compile switched off by torch's documented `TORCHDYNAMO_DISABLE=1`, which leaves
  them plain functions and imports nothing of the inductor. A trial whose optimizer is
  Muon imports it as DeepSpeed does.
- `leave_shm_comm_unbuilt`: on a CPU, DeepSpeed's communication backend compiles its
  shared-memory all-reduce op (`deepspeed_shm_comm`, two C++ files against torch's headers)
  the first time any process of a virtualenv starts it: 135 s of CPU and 73 s of wall on a
  2-core AMD EPYC before a new user's first CPU trial takes its first step. The op serves only
  `inference_all_reduce` (tensor-parallel inference); training reduces through
  torch.distributed. DeepSpeed keeps which ops this machine can build in
  `deepspeed.ops.__compatible_ops__`, one dict per process whose edits persist by design;
  marking the op there as not buildable makes the backend skip it, and an inference
  all-reduce falls back to torch.distributed, as it does where the op is missing.
  The dict is filled on its first look (setuptools imported, a compiler run): a CPU
  launcher server looks once (`probe_ops`), and every rank forked from it marks its copy.
- `rebind_collectives`: DeepSpeed's torch backend (`deepspeed.comm.comm.cdb`) binds
  `torch.distributed.all_gather_into_tensor` and `reduce_scatter_tensor` when it starts
  (`all_gather_function`, `reduce_scatter_function`), and ZeRO's all-gathers and
  reduce-scatters call those: a function put on torch.distributed later
  (torch_compat.wrap_collectives) is not seen there until they are bound again.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"
SHM_COMM_OP = "deepspeed_shm_comm"
NO_COMPILE = "TORCHDYNAMO_DISABLE"  # torch.compile returns the function unchanged while it is "1"


def import_muon_uncompiled(ds_config: dict | None) -> bool:
    """Before DeepSpeed builds an engine from `ds_config` (None: its optimizer is not Muon):
    import its Muon module without compiling it. Whether this call imported it."""
    optimizer = str(((ds_config or {}).get("optimizer") or {}).get("type", ""))
    if MUON_MODULE in sys.modules or "muon" in optimizer.lower():
        return False
    saved = os.environ.get(NO_COMPILE)
    os.environ[NO_COMPILE] = "1"
    try:
        importlib.import_module(MUON_MODULE)
    except ImportError:  # a DeepSpeed without Muon: nothing to import
        return False
    finally:
        if saved is None:
            del os.environ[NO_COMPILE]
        else:
            os.environ[NO_COMPILE] = saved
    return True


def leave_shm_comm_unbuilt() -> bool:
    """Before DeepSpeed starts its communication backend on a CPU: mark its shared-memory
    op as not buildable. Whether it was buildable (and so would have been built or loaded).
    Not on a GPU: the first look at the dict probes every op, CUDA's included."""
    import deepspeed.ops

    compatible = deepspeed.ops.__compatible_ops__
    was = bool(compatible.get(SHM_COMM_OP, False))
    compatible[SHM_COMM_OP] = False
    return was


def probe_ops() -> None:
    """On a CPU, in a process whose forks will start DeepSpeed (launchers/forked.py): fill
    `__compatible_ops__` here, once, where each fork would fill its own (0.1-0.2 CPU-s a
    rank on the 2-core AMD EPYC)."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__  # noqa: B018 - the first look probes


BOUND_COLLECTIVES = ("all_gather_function", "reduce_scatter_function")


def rebind_collectives() -> Callable[[], None]:
    """Bind DeepSpeed's backend's collectives again to what torch.distributed holds now, by
    their names. Returns the function that puts the earlier ones back. Nothing to do
    where DeepSpeed's backend has not started in this process."""
    comm = sys.modules.get("deepspeed.comm.comm")
    backend = getattr(comm, "cdb", None)
    if backend is None:
        return lambda: None
    import torch.distributed as dist

    before = {name: getattr(backend, name, None) for name in BOUND_COLLECTIVES}
    for name, bound in before.items():
        if bound is not None:
            setattr(backend, name, getattr(dist, getattr(bound, "__name__", ""), bound))

    def restore() -> None:
        for name, bound in before.items():
            setattr(backend, name, bound)

    return restore
