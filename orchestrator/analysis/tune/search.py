"""The search of `orchestrator tune`: which candidates to run next, and what was learnt.

Round one runs the candidates the plan ranks fastest. After every round the step-time
model is calibrated on the candidates measured so far (calibrate.fit, the fit behind
`orchestrator calibrate`) and every candidate that fits is predicted again. The next
round takes the highest upper confidence bound: log predicted tokens/s plus an
uncertainty that is the calibrated model's own error on what it was fitted to, grown with
how many axes separate a candidate from the nearest one measured (a model fitted on
ZeRO-1 runs knows less about ZeRO-3). The search stops when the budget is spent or when
no candidate's bound reaches the best measured throughput.

A candidate that runs out of memory teaches the memory plan: every candidate the plan
puts at or above that one's predicted peak is dropped, with the reason. Any other
failure is recorded and the search goes on.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from orchestrator.analysis.calibrate import (
    BOUNDS,
    FITTED,
    current_params,
    fit,
    log_error,
    predicted_step_s,
)
from orchestrator.analysis.fit_inputs import MeasuredTrial
from orchestrator.analysis.tune.space import Candidate, Space
from orchestrator.config import GIB

MIN_UNCERTAINTY = 0.05  # a model is never trusted closer than this (log scale, ~5 %)


@dataclass
class CandidateRun:
    """What running a candidate gave."""

    status: str  # result.json's status: ok, oom, failed, ...
    trial_dir: str
    round: int
    tokens_per_sec_per_gpu: float | None = None
    step_s: float | None = None
    error: str = ""
    timed_batches: tuple[int, ...] = ()  # the global batch of each timed step (a warm-up's are smaller)


@dataclass
class Search:
    space: Space
    outcomes: dict[tuple[str, ...], CandidateRun] = field(default_factory=dict)
    params: dict | None = None  # the calibrated step-time parameters, once anything ran
    calibrated: dict[tuple[str, ...], float] = field(default_factory=dict)  # key -> tokens/s/GPU
    uncertainty: float | None = None  # the calibrated model's log error on what it was fitted to
    oom_bound: int | None = None  # predicted bytes at which a candidate ran out of memory
    rounds: int = 0
    stopped: str = ""  # why the search ended
    elapsed_s: float = 0.0  # wall clock, over every run of this search (a resumed one adds)

    # --- what is known --------------------------------------------------------------------

    def runnable(self) -> list[Candidate]:
        """Candidates that fit by the plan and by what the OOMs taught."""
        return [c for c in self.space.fitting if self.oom_bound is None or (c.predicted_memory or 0) < self.oom_bound]

    def dropped_by_oom(self) -> list[Candidate]:
        runnable = {c.key for c in self.runnable()}
        return [c for c in self.space.fitting if c.key not in runnable and c.key not in self.outcomes]

    def measured_ok(self) -> list[tuple[Candidate, CandidateRun]]:
        by_key = {c.key: c for c in self.space.candidates}
        return [(by_key[k], o) for k, o in self.outcomes.items() if o.status == "ok" and o.tokens_per_sec_per_gpu]

    def best(self) -> tuple[Candidate, CandidateRun] | None:
        ok = self.measured_ok()
        return max(ok, key=lambda pair: pair[1].tokens_per_sec_per_gpu or 0.0) if ok else None

    def rate_at_median_step(self, c: Candidate, o: CandidateRun) -> float:
        """The measured tokens/s/GPU the calibrated model is comparable with: the tokens of a
        timed step over the median step, the time the model is fitted to. The result's own
        figure is the median of each timed step's rate; with few timed steps and one slow one
        the two part (steps of 0.52 and 0.12 s: 400 against 662 tokens/s/GPU), and a prediction
        of the one beside a measurement of the other ended searches that had candidates left."""
        if not (o.step_s and c.spec):
            return o.tokens_per_sec_per_gpu or 0.0
        tokens = (
            statistics.median(o.timed_batches) * c.spec.cfg.model.seq_len if o.timed_batches else c.spec.tokens_per_step
        )
        return tokens / o.step_s / c.spec.world_size

    def predicted(self, c: Candidate) -> float:
        """tokens/s/GPU by the calibrated model where there is one, else the plan's."""
        return self.calibrated.get(c.key, c.predicted_tokens_per_sec_per_gpu or 0.0)

    # --- learning ---------------------------------------------------------------------------

    def record(self, c: Candidate, outcome: CandidateRun) -> None:
        self.outcomes[c.key] = outcome
        if outcome.status == "oom" and c.predicted_memory:
            self.oom_bound = min(self.oom_bound or c.predicted_memory, c.predicted_memory)

    def calibrate(self) -> None:
        """Fit the step-time parameters to the measured candidates and predict every other."""
        ok = self.measured_ok()
        if not ok:
            return
        trials = [MeasuredTrial(o.trial_dir, c.spec, o.step_s, o.timed_batches) for c, o in ok if c.spec and o.step_s]
        start = current_params(trials[0].spec.cfg.hardware)
        # One or two runs cannot pin seven parameters: then only the overall rate moves.
        free = FITTED if len(trials) >= 4 else ("compute_efficiency",)
        self.params = fit(lambda p: log_error(trials, p), start, BOUNDS, free)
        errors = [math.log(predicted_step_s(t.spec, self.params, t.timed_batches) / t.step_s) for t in trials]
        self.uncertainty = max(MIN_UNCERTAINTY, math.sqrt(sum(e * e for e in errors) / len(errors)))
        self.calibrated = {}
        for c in self.runnable():
            assert c.spec is not None  # a runnable candidate was planned
            step_s = predicted_step_s(c.spec, self.params)
            self.calibrated[c.key] = c.spec.tokens_per_step / step_s / c.spec.world_size

    # --- choosing ---------------------------------------------------------------------------

    def bound(self, c: Candidate) -> float:
        """log tokens/s/GPU that the candidate could plausibly reach (upper confidence bound)."""
        if self.uncertainty is None:
            return math.log(max(self.predicted(c), 1e-12))
        distance = min((_distance(c.key, k) for k in self.outcomes), default=0)
        return math.log(max(self.predicted(c), 1e-12)) + self.uncertainty * (1 + distance)

    def next_batch(self, size: int) -> list[Candidate]:
        """The next candidates worth running: [] when none could beat the best measured."""
        todo = [c for c in self.runnable() if c.key not in self.outcomes]
        ranked = sorted(todo, key=self.bound, reverse=True)
        ok = self.measured_ok()
        if ok:
            best = max(self.rate_at_median_step(c, o) for c, o in ok)
            ranked = [c for c in ranked if self.bound(c) > math.log(best)]
        return ranked[:size]

    def table(self) -> list[dict]:
        """Every candidate with what was predicted and measured: the tune report's rows."""
        rows = []
        dropped = {c.key for c in self.dropped_by_oom()}
        for c in self.space.candidates:
            o = self.outcomes.get(c.key)
            status = o.status if o else ("dropped: ran out of memory nearby" if c.key in dropped else c.status)
            reason = (o.error if o else "") or (
                f"predicted {(c.predicted_memory or 0) / GIB:.2f} GiB >= {(self.oom_bound or 0) / GIB:.2f} GiB, "
                "where a candidate "
                "ran out of memory: the memory plan under-estimates here"
                if status.startswith("dropped")
                else c.reason
            )
            rows.append(
                {
                    "candidate": c.label(),
                    "status": status,
                    "reason": reason,
                    "predicted_tokens_per_sec_per_gpu": c.predicted_tokens_per_sec_per_gpu,
                    "calibrated_tokens_per_sec_per_gpu": self.calibrated.get(c.key),
                    "measured_tokens_per_sec_per_gpu": o.tokens_per_sec_per_gpu if o else None,
                    "predicted_memory_gib": c.predicted_memory / GIB if c.predicted_memory else None,
                    "round": o.round if o else None,
                    "trial_dir": o.trial_dir if o else None,
                }
            )
        return rows


def _distance(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """How many axes two candidates differ on (an axis one of them leaves out counts)."""
    va, vb = (dict(o.partition("=")[::2] for o in key) for key in (a, b))
    return sum(va.get(n) != vb.get(n) for n in va.keys() | vb.keys())
