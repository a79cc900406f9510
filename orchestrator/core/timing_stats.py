"""What a trial's timed steps say, and how sure one can be of it.

A step time is reported as the median of the timed steps, never their mean: one step that
a busy neighbour slowed threefold moves a mean of eight steps by a quarter and the median
not at all. Beside it: the interquartile range (how the steps scatter) and a
distribution-free confidence interval of the median, from the order statistics whose ranks
the binomial distribution with p = 1/2 gives (the sign-test interval; Conover, "Practical
Nonparametric Statistics", 3rd ed., sec. 3.2). It assumes nothing of the steps' shape,
which on a shared machine is anything but normal. With fewer than six steps no interval
reaches 95 %: the widest (the smallest and the largest step) is given with the
confidence it has.

Pure functions: a result's figures, the report's verdicts and the tests all use these.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

CONFIDENCE = 0.95
# Steps whose interquartile range passes this share of their median scatter more than a
# quiet machine's do: the trial is marked noisy. Chosen from quiet runs: the 72 trials of
# bench/memory_matrix.py run alone on the 2-core CI machine, 4 timed steps each, had a
# median of 9 %, a 95th percentile of 29 % and two above 35 % (38 %, 41 %); the trial a
# busy neighbour slowed in the issue that asked for this had 75 % (bench/RESULTS.md).
NOISY_RELATIVE_IQR = 0.35


@dataclass(frozen=True)
class Spread:
    """The median of some measurements, their quartiles and the median's interval."""

    median: float
    q1: float
    q3: float
    ci_low: float
    ci_high: float
    confidence: float  # what the interval covers: CONFIDENCE, or less with fewer than 6 values
    n: int

    @property
    def relative_iqr(self) -> float:
        return (self.q3 - self.q1) / self.median if self.median else math.inf

    def noisy(self, threshold: float = NOISY_RELATIVE_IQR) -> str | None:
        """Why these measurements cannot be trusted as one figure, or None."""
        if self.relative_iqr > threshold:
            return (
                f"the timed steps scatter: their interquartile range is {self.relative_iqr:.0%} of the median "
                f"(quiet runs stayed within {threshold:.0%} in 70 of 72 trials); was the machine busy?"
            )
        return None

    def as_dict(self) -> dict:
        return asdict(self)


def quantile(values: list[float], q: float) -> float:
    """The q-quantile, interpolated linearly between order statistics (numpy's default)."""
    xs = sorted(values)
    position = q * (len(xs) - 1)
    low = math.floor(position)
    high = min(low + 1, len(xs) - 1)
    return xs[low] + (xs[high] - xs[low]) * (position - low)


def coverage(n: int, j: int) -> float:
    """What x_(j) .. x_(n+1-j) covers of the median of n values: 1 - 2 P(Binomial(n, 1/2) < j)."""
    return 1 - 2 * sum(_half_binomial(n, i) for i in range(j))


def _half_binomial(n: int, i: int) -> float:
    """P(Binomial(n, 1/2) = i), in floats through log-gamma: no n-bit integers."""
    return math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2))


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(low, high, coverage): the narrowest interval x_(j) .. x_(n+1-j) that covers the
    median with at least `confidence`; the whole range where even it covers less (then
    with what it covers). One pass over the binomial's terms: a 4,000-step trial's interval
    took 268 s when each j summed its tail again in n-bit integers."""
    xs, n = sorted(values), len(values)
    j, below = 1, _half_binomial(n, 0)  # below: P(Binomial(n, 1/2) < j)
    while j + 1 <= (n + 1) // 2:
        wider = below + _half_binomial(n, j)
        if 1 - 2 * wider < confidence:
            break
        below, j = wider, j + 1
    return xs[j - 1], xs[n - j], 1 - 2 * below


def spread(values: list[float]) -> Spread:
    """The median, quartiles and the median's interval of at least one value."""
    if not values:
        raise ValueError("no values to summarise")
    low, high, coverage = median_interval(values)
    return Spread(
        median=quantile(values, 0.5),
        q1=quantile(values, 0.25),
        q3=quantile(values, 0.75),
        ci_low=low,
        ci_high=high,
        confidence=coverage,
        n=len(values),
    )


def beyond_noise(a: Spread, b: Spread) -> bool:
    """Whether two medians differ by more than either's interval allows: the intervals do
    not overlap, and both are intervals of CONFIDENCE (with fewer than six steps none is:
    one step's "interval" is the step itself, and covers nothing)."""
    return sure(a) and sure(b) and (a.ci_high < b.ci_low or b.ci_high < a.ci_low)


def sure(s: Spread) -> bool:
    """Whether a spread's interval covers its median with CONFIDENCE (a tolerance for floats)."""
    return s.confidence >= CONFIDENCE - 1e-9


def precise_enough(step_times: list[float], target: float, min_steps: int) -> bool:
    """Whether timed steps pin their median to within `target` (the 95 % interval's half
    width over the median) after at least `min_steps` of them: run.timing_ci's stop rule."""
    if len(step_times) < max(min_steps, 2):
        return False
    s = spread(step_times)
    return s.confidence >= CONFIDENCE and (s.ci_high - s.ci_low) / 2 <= target * s.median
