"""How far a table's numbers can be trusted: a cell's spread over seeds (mean, std, 95% t-interval), and the
paper's comparisons on paired (same-seed) differences. A verdict reads that interval against the sign of the
paper's difference: ``agrees`` on the paper's side of 0, ``disagrees`` on the other (or off a paper difference
of exactly 0), ``inconclusive`` when it holds 0 or fewer than two seeds pair up."""

from __future__ import annotations

import math
import statistics
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
    mean, n = statistics.fmean(values), len(values)
    std = statistics.stdev(values) if n > 1 else None
    low = high = mean if std == 0 else None  # identical runs: scipy's interval is NaN, the mean exact
    if std:
        low, high = map(float, stats.t.interval(LEVEL, n - 1, loc=mean, scale=std / math.sqrt(n)))
    return Spread(mean, std, n, low, high)


def verdict(paper_diff: float | None, low: float | None, high: float | None) -> str:
    if paper_diff is None or low is None or high is None or math.isnan(low + high) or low <= 0 <= high:
        return "inconclusive"
    return "agrees" if paper_diff and (low > 0) == (paper_diff > 0) else "disagrees"


def compare(a: dict[int, float], b: dict[int, float], paper_diff: float | None) -> dict:
    """a[seed] - b[seed] over the seeds both ran: its mean, 95% interval and verdict."""
    seeds = sorted(set(a) & set(b))
    diff = spread([a[s] - b[s] for s in seeds]) if seeds else None
    low, high = (diff.ci_low, diff.ci_high) if diff else (None, None)
    return {"paper_diff": paper_diff, "ours_diff": diff.mean if diff else None, "ci_low": low,
            "ci_high": high, "n": len(seeds), "seeds": seeds, "verdict": verdict(paper_diff, low, high)}
