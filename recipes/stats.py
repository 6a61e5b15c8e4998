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

    def __str__(self) -> str:
        """``mean ± std`` to four decimals; one value alone has no spread to show, and no value is "-"."""
        if self.n == 0:
            return "-"
        return f"{self.mean:.4f}" + (f" ± {self.std:.4f}" if self.n > 1 else "")


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


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (same order as given; NaN stays NaN and does not
    count in the family): the i-th smallest of m is multiplied by m - i + 1, and adjusted p-values never
    decrease along the sorted order."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    m, adjusted, running = len(tested), [math.nan] * len(pvalues), 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def welch_se_df(a: list[float], b: list[float]) -> tuple[float, float]:
    """The standard error of ``mean(a) - mean(b)`` and its Welch–Satterthwaite degrees of freedom."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)) if va + vb > 0 else math.inf
    return se, df


def tost(a: list[float], b: list[float], margin: float) -> float:
    """p-value of the two one-sided Welch tests that ``|mean(a) - mean(b)| < margin`` (equivalence): below
    0.05 exactly when the 90% interval of the difference lies inside ``(-margin, margin)``. NaN below two
    runs a side."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    difference = statistics.fmean(a) - statistics.fmean(b)
    se, df = welch_se_df(a, b)
    if se == 0:
        return 0.0 if abs(difference) < margin else 1.0
    below = 1 - float(scipy_stats.t.cdf((difference + margin) / se, df))  # H0: difference <= -margin
    above = float(scipy_stats.t.cdf((difference - margin) / se, df))  # H0: difference >= +margin
    return max(below, above)


def welch_power(effect: float, std_a: float, n_a: int, std_b: float, n_b: int, alpha: float = 0.05,
                draws: int = 20000, seed: int = 0) -> float:
    """The probability that a two-sided Welch test at ``alpha`` rejects when the true difference of means is
    ``effect`` and the runs are normal with these spreads: simulated over ``draws`` pairs of samples (the
    sample means and variances drawn from their exact distributions), because Welch's estimated degrees of
    freedom make the noncentral-t formula optimistic at 3–5 runs (80% by formula is 70% at 3 runs)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    z = rng.standard_normal(draws)
    va = std_a ** 2 * rng.chisquare(n_a - 1, draws) / (n_a - 1) / n_a  # the sample variances of the means
    vb = std_b ** 2 * rng.chisquare(n_b - 1, draws) / (n_b - 1) / n_b
    df = (va + vb) ** 2 / (va ** 2 / (n_a - 1) + vb ** 2 / (n_b - 1))
    critical = scipy_stats.t.ppf(1 - alpha / 2, df)
    true_se = math.sqrt(std_a ** 2 / n_a + std_b ** 2 / n_b)
    return float(np.mean(np.abs(effect + true_se * z) / np.sqrt(va + vb) > critical))


def detectable_effect(std_a: float, n_a: int, std_b: float, n_b: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true difference of means that a two-sided Welch test at ``alpha`` detects with probability
    ``power`` at these spreads and run counts (:func:`welch_power`). "Not distinguishable" then reads
    "smaller than this, if anything". NaN below two runs a side."""
    if n_a < 2 or n_b < 2 or math.isnan(std_a) or math.isnan(std_b):
        return math.nan
    scale = math.sqrt(std_a ** 2 / n_a + std_b ** 2 / n_b)
    if scale == 0:
        return 0.0
    low, high = 0.0, scale
    while welch_power(high, std_a, n_a, std_b, n_b, alpha) < power:
        low, high = high, high * 2
    for _ in range(40):  # bisection on one fixed set of draws: the power is monotone in the effect
        middle = (low + high) / 2
        low, high = (middle, high) if welch_power(middle, std_a, n_a, std_b, n_b, alpha) < power else (low, middle)
    return high
