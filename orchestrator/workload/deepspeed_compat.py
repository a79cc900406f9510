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
"""

from __future__ import annotations

import importlib
import os
import sys

MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"
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
