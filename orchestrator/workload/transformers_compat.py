"""Every reliance on transformers' internals, in one place (tests/test_transformers_compat.py checks it).

- `leave_scipy_unimported`: transformers' model modules import its loss functions, and those
  of object detection import `scipy.optimize` wherever scipy is installed (Optuna, which the
  `optuna` extra brings, installs it): 0.3-0.4 s of CPU in every process that imports a model,
  every rank among them (2-core AMD EPYC, 2026-11-28), for a matcher no causal LM ever
  calls. Those modules ask `transformers.utils.is_scipy_available` when they are imported;
  answering False there, before the first model module is imported, leaves scipy out, and
  the detection losses then say scipy is missing if anything ever called them.
"""

from __future__ import annotations

import sys

DETECTION_LOSS = "transformers.loss.loss_for_object_detection"  # the module that imports scipy.optimize


def leave_scipy_unimported() -> bool:
    """Before transformers' first model module is imported here: keep it from importing
    scipy. Whether it took effect (False once a model module was imported before)."""
    if DETECTION_LOSS in sys.modules:
        return False
    import transformers.utils

    transformers.utils.is_scipy_available = _scipy_unavailable
    return True


def _scipy_unavailable() -> bool:
    return False
