"""Calibrate the CPU preset on a few trials of the memory matrix and check it on the rest.

    .venv/bin/python bench/memory_matrix.py bench-runs/matrix     # the 48 trials, ~8 min
    .venv/bin/python bench/calibration_check.py bench-runs/matrix [--fit-on NAME,NAME,...]

Fits the step-time parameters (orchestrator/calibrate.py, what `orchestrator calibrate`
does) on the named trials of the matrix (by default four: each shape with ZeRO 0 and 3,
no recompute and full, dp 1 and 2), then prints predicted / measured step time, before and
after, for every trial of the matrix and for the default trial (`orchestrator run` with no
overrides, run into DIR/default if it is not there yet). Target (the performance-model
issue): every trial not fitted on within +-25 % after. Writes no preset.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from orchestrator.calibrate import current_params, fit, log_error, measured_trials, predicted_step_s

FIT_ON = "gpt2-z0-none-dp1,gpt2-z3-full-dp2,llama-z0-full-dp2,llama-z3-none-dp1"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("matrix", type=Path)
    parser.add_argument("--fit-on", default=FIT_ON)
    args = parser.parse_args()
    default = args.matrix / "default"
    if not (default / "result.json").is_file():
        subprocess.run([sys.executable, "-m", "orchestrator", "run", "--out", str(default), "logger.mode=disabled"],
                       check=False, capture_output=True)
    names = set(args.fit_on.split(","))
    (trials,) = measured_trials([args.matrix]).values()  # one hardware kind: cpu
    label = {id(t): t.trial_dir.name for t in trials}
    fitted_on = [t for t in trials if label[id(t)] in names]
    start = current_params(trials[0].spec.cfg.hardware)
    params = fit(lambda p: log_error(fitted_on, p), start)
    print("fitted on " + ", ".join(sorted(names)) + ":")
    print("  " + ", ".join(f"{k}={v:.3g}" for k, v in params.items()))
    print(f"{'trial':28} {'measured s':>10} {'before':>7} {'after':>7}")
    held_out = []
    for t in sorted(trials, key=lambda t: label[id(t)]):
        before, after = (predicted_step_s(t.spec, p) / t.step_s for p in (start, params))
        fitted = label[id(t)] in names
        if not fitted:
            held_out.append(after)
        print(f"{label[id(t)]:28} {t.step_s:>10.4f} {before:>7.2f} {after:>7.2f}" + ("  (fitted on)" if fitted else
                                                                                   "" if abs(after - 1) <= 0.25 else "  miss"))
    inside = sum(abs(r - 1) <= 0.25 for r in held_out)
    print(f"not fitted on: {inside} of {len(held_out)} within +-25 % after ({min(held_out):.2f}-{max(held_out):.2f})")


if __name__ == "__main__":
    main()
