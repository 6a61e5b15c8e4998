"""Statistics of repeated runs (``recipes.sweep --seeds N``): mean, sample standard deviation, a 95%
Student-t interval of the mean, and Welch's two-sample t-test for a difference of means.

Welch's test is chosen because seeds are few (3–5) and the variants' spreads need not be equal; it is
exact for normal run-to-run noise and conservative-ish otherwise. With fewer than two runs on a side
there is no spread to test against: the interval and the p-value are NaN, never a made-up number.
"""

import math
import statistics
from dataclasses import dataclass

from scipy import stats as scipy_stats


@dataclass(frozen=True)
class Summary:
    """``n`` values: their mean, sample standard deviation and 95% interval of the mean ``[low, high]``."""

    n: int
    mean: float
    std: float
    low: float
    high: float


def summarize(values: list[float]) -> Summary:
    n = len(values)
    if n == 0:
        return Summary(0, math.nan, math.nan, math.nan, math.nan)
    mean = statistics.fmean(values)
    if n < 2:
        return Summary(1, mean, math.nan, math.nan, math.nan)
    std = statistics.stdev(values)
    half = float(scipy_stats.t.ppf(0.975, n - 1)) * std / math.sqrt(n)
    return Summary(n, mean, std, mean - half, mean + half)


def welch(a: list[float], b: list[float]) -> tuple[float, float]:
    """``(mean(a) - mean(b), two-sided p-value of Welch's t-test)``; the p-value is NaN below two runs a side."""
    difference = (statistics.fmean(a) - statistics.fmean(b)) if a and b else math.nan
    if len(a) < 2 or len(b) < 2:
        return difference, math.nan
    if statistics.stdev(a) == 0 and statistics.stdev(b) == 0:
        return difference, 1.0 if difference == 0 else 0.0
    return difference, float(scipy_stats.ttest_ind(a, b, equal_var=False).pvalue)
