"""How far a table's numbers can be trusted: a cell's spread over seeds (mean, std, 95% t-interval), and the
paper's comparisons on paired (same-seed) differences. A verdict reads that interval against the sign of the
paper's difference: ``agrees`` on the paper's side of 0, ``disagrees`` on the other (or off a paper difference
of exactly 0), ``inconclusive`` when it holds 0 or fewer than two seeds pair up."""

from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import dataclass

from scipy import stats

LEVEL = 0.95


@dataclass
class Spread:
    mean: float
    std: float | None  # sample std; it and the interval are None below two values
    n: int
    ci_low: float | None
    ci_high: float | None


def spread(values: list[float]) -> Spread:
    if not values:
        raise ValueError("spread of no values")
    std = statistics.stdev(values) if len(values) > 1 else None
    low = high = values[0] if std == 0 else None  # identical runs: scipy's interval is NaN, the mean exact
    if std:
        with warnings.catch_warnings():  # nearly equal values: scipy warns of precision loss
            warnings.simplefilter("ignore", RuntimeWarning)
            low, high = map(float, stats.ttest_1samp(values, 0.0).confidence_interval(LEVEL))
    return Spread(statistics.fmean(values), std, len(values), low, high)


def paired(a: dict[int, float], b: dict[int, float]) -> tuple[Spread | None, list[int]]:
    """The spread of a[seed] - b[seed] over the seeds both ran, and those seeds."""
    seeds = sorted(set(a) & set(b))
    return (spread([a[s] - b[s] for s in seeds]) if seeds else None), seeds


def verdict(paper_diff: float | None, low: float | None, high: float | None) -> str:
    if paper_diff is None or low is None or high is None or math.isnan(low + high) or low <= 0 <= high:
        return "inconclusive"
    return "agrees" if paper_diff and (low > 0) == (paper_diff > 0) else "disagrees"


def compare(a: dict[int, float], b: dict[int, float], paper_diff: float | None) -> dict:
    diff, seeds = paired(a, b)
    low, high = (diff.ci_low, diff.ci_high) if diff else (None, None)
    return {"paper_diff": paper_diff, "ours_diff": diff.mean if diff else None, "ci_low": low,
            "ci_high": high, "n": len(seeds), "seeds": seeds, "verdict": verdict(paper_diff, low, high)}
