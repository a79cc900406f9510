"""orchestrator/workload/transformers_compat.py against the transformers installed here.

In fresh interpreters: a pytest worker may have imported a model module already. scipy is
installed in the tests' virtualenv (Optuna, a test extra, needs it), so transformers would
import scipy.optimize unless told otherwise.
"""

import importlib.util
import json
import subprocess
import sys

BUILD = """
import json, sys, torch
from orchestrator.config import ModelConfig
from orchestrator.workload.model import build_model, import_libraries
import_libraries("llama")
shape = ModelConfig(arch="llama", n_layers=1, hidden=32, heads=2, vocab=64, seq_len=8, max_positions=8)
model = build_model(shape, seed=0)
tokens = torch.randint(0, 64, (2, 8))
loss = model(input_ids=tokens, labels=tokens).loss
print(json.dumps({"scipy": "scipy.optimize" in sys.modules, "loss": float(loss)}))
"""

TOO_LATE = """
import json, sys
import transformers.loss.loss_utils
from orchestrator.workload.transformers_compat import leave_scipy_unimported
print(json.dumps({"took_effect": leave_scipy_unimported(), "scipy": "scipy.optimize" in sys.modules}))
"""


def fresh(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True).stdout
    return json.loads(out.splitlines()[-1])


def test_a_model_is_imported_built_and_trained_without_scipy_and_a_late_call_says_so():
    assert importlib.util.find_spec("scipy") is not None  # else there would be nothing to leave out
    built = fresh(BUILD)
    assert built["scipy"] is False and 0 < built["loss"] < 20  # the causal LM's loss needs no scipy
    late = fresh(TOO_LATE)
    assert late == {"took_effect": False, "scipy": True}  # imported before: said, not hidden
