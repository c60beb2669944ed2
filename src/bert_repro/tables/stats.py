"""How far a table's numbers can be trusted: the spread of a cell over the seeds that ran (mean, std and a 95%
t-interval), and the paper's comparisons checked on paired (same-seed) differences.

A comparison is ``row a - row b on column c``. Its verdict reads the 95% t-interval of the mean paired
difference against the sign of the paper's difference: ``agrees`` when the interval lies on the paper's side
of 0, ``disagrees`` when it lies on the other side, ``inconclusive`` when it holds 0 (or fewer than two seeds
pair up).
A paper difference of exactly 0 has no side: the interval can only disagree (exclude 0) or be inconclusive.
"""

from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import dataclass

from scipy import stats

LEVEL = 0.95
VERDICTS = ("agrees", "disagrees", "inconclusive")


@dataclass
class Spread:
    """A cell's runs: mean, sample std and the 95% t-interval of the mean (None below two runs)."""

    mean: float
    std: float | None
    n: int
    ci_low: float | None
    ci_high: float | None


def _interval(values: list[float]) -> tuple[float | None, float | None]:
    if len(values) < 2:
        return None, None
    if statistics.pstdev(values) == 0:  # identical runs: scipy's interval is NaN there, the mean is exact
        return values[0], values[0]
    with warnings.catch_warnings():  # nearly equal values: scipy warns of precision loss; the interval holds
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = stats.ttest_1samp(values, 0.0).confidence_interval(LEVEL)
    return float(ci.low), float(ci.high)


def spread(values: list[float]) -> Spread:
    if not values:
        raise ValueError("spread of no values")
    low, high = _interval(values)
    std = statistics.stdev(values) if len(values) > 1 else None
    return Spread(statistics.fmean(values), std, len(values), low, high)


def paired(a: dict[int, float], b: dict[int, float]) -> tuple[Spread | None, list[int]]:
    """The spread of a[seed] - b[seed] over the seeds both ran (the paired t-interval), and those seeds."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None, []
    return spread([a[s] - b[s] for s in seeds]), seeds


def verdict(paper_diff: float | None, low: float | None, high: float | None) -> str:
    if paper_diff is None or low is None or high is None or math.isnan(low) or math.isnan(high):
        return "inconclusive"
    if paper_diff == 0:
        return "disagrees" if low > 0 or high < 0 else "inconclusive"
    side = 1 if paper_diff > 0 else -1
    if side * low > 0 and side * high > 0:
        return "agrees"
    if side * low < 0 and side * high < 0:
        return "disagrees"
    return "inconclusive"


def compare(a: dict[int, float], b: dict[int, float], paper_diff: float | None) -> dict:
    """One comparison: ours_diff (the mean paired difference), its interval, the seeds paired, the verdict."""
    diff, seeds = paired(a, b)
    low, high = (diff.ci_low, diff.ci_high) if diff else (None, None)
    return {"paper_diff": paper_diff, "ours_diff": diff.mean if diff else None, "ci_low": low,
            "ci_high": high, "n": len(seeds), "seeds": seeds, "verdict": verdict(paper_diff, low, high)}
