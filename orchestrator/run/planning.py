"""The one place that decides when a trial's plan is measured: the plan of the machine's facts
first (its memory needs nothing timed), then, where the trial's kernels are to be measured
(hardware.kernels=measured), it runs here and it fits, its kernels, engine and links timed,
and the plan of those.

Every command that plans a trial to run it (`plan`, `translate`, `run`, tune's space, the
SLURM node's plan before its ranks start) comes here; what plans a trial that ran already
(calibrate, the report) calls plan/planner.make_plan with the machine's facts alone.
"""

from __future__ import annotations

from orchestrator.launchers.binding import trial_binding
from orchestrator.measure.trial_measurements import machine_facts, measure_for_trial
from orchestrator.plan.planner import make_plan, memory_of
from orchestrator.plan.prediction import Plan
from orchestrator.spec import TrialSpec


def plan_trial(spec: TrialSpec, on_the_node: bool = False) -> Plan:
    """The plan of one trial, measured where it runs here (cluster=local) or where
    `on_the_node` says this is the SLURM allocation it was submitted to (launchers/slurm_task.py
    re-plans there before the ranks start)."""
    facts = machine_facts(spec)
    # A trial the plan refuses for its memory is not worth timing: the refusal comes at once.
    refused = not memory_of(spec, facts).fits and not spec.cfg.run.force and facts.peak_tflops is not None
    here = on_the_node or spec.cfg.cluster.name == "local"
    plan = make_plan(spec, facts, measure_for_trial(spec, facts, here=here, refused=refused))
    plan.warnings.extend(trial_binding(spec).warnings)  # NUMA binding follows the GPU: said once, by binding.py
    return plan
