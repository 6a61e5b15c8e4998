"""The sweep's statistics against outcomes known in advance: Holm's adjustment on a worked example, the
equivalence test at its edges and against the 90% interval it is equivalent to, and the detectable effect
against a simulation of the test it describes."""

import math
import random
import statistics

import pytest
from scipy import stats as scipy_stats

from recipes.stats import detectable_effect, holm, tost, welch, welch_se_df


def test_holm_on_a_worked_example():
    # sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → raised to 0.06 (monotone)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.02]) == [0.02]  # a family of one is not adjusted
    adjusted = holm([0.01, math.nan, 0.02])  # an untested comparison is not counted in the family
    assert math.isnan(adjusted[1]) and adjusted[0] == pytest.approx(0.02) and adjusted[2] == pytest.approx(0.02)


def test_tost_is_the_90_percent_interval_inside_the_margin():
    a, b = [1.00, 1.02, 0.99, 1.01, 1.00], [1.01, 1.00, 1.02, 1.00, 1.03]
    difference = statistics.fmean(a) - statistics.fmean(b)
    se, df = welch_se_df(a, b)
    half = scipy_stats.t.ppf(0.95, df) * se
    edge = max(abs(difference - half), abs(difference + half))  # the margin at which the 90% interval touches it
    assert tost(a, b, edge * 1.001) < 0.05 < tost(a, b, edge * 0.999)
    assert tost(a, b, edge) == pytest.approx(0.05, abs=1e-6)


def test_tost_at_its_edges():
    a = [0.0, 0.1, -0.1, 0.05, -0.05]
    shifted = [x + 1.0 for x in a]  # a true difference of exactly 1
    assert tost(shifted, a, 1.0) == pytest.approx(0.5)  # on the margin: half-way
    assert tost(shifted, a, 100.0) < 1e-6  # far inside: equivalent
    assert tost(shifted, a, 0.5) > 0.99  # far outside: not
    assert tost(shifted, a, 1.0) == tost(a, shifted, 1.0)  # symmetric
    assert math.isnan(tost([1.0], a, 1.0))


def test_the_detectable_effect_is_detected_80_percent_of_the_time_in_simulation():
    rng = random.Random(0)
    for n, std in ((3, 0.01), (5, 0.01), (8, 0.02)):
        effect = detectable_effect(std, n, std, n)
        rejected, trials = 0, 4000
        for _ in range(trials):
            a = [rng.gauss(effect, std) for _ in range(n)]
            b = [rng.gauss(0.0, std) for _ in range(n)]
            rejected += welch(a, b)[1] < 0.05
        assert rejected / trials == pytest.approx(0.8, abs=0.035), (n, std, effect)
    # The numbers behind "with 3 seeds at std 0.01, a 0.01-nat effect is seen 12% of the time": more runs
    # or less spread shrink what can be seen, as the formula must.
    assert detectable_effect(0.01, 3, 0.01, 3) > detectable_effect(0.01, 5, 0.01, 5) > detectable_effect(0.005, 5, 0.005, 5)
    assert math.isnan(detectable_effect(0.01, 1, 0.01, 5))


def test_the_summary_and_its_interval_by_hand():
    from recipes.stats import summarize

    s = summarize([1.0, 2.0, 4.0])
    # mean 7/3; sample variance ((4/3)² + (1/3)² + (5/3)²) / 2 = 7/3; t(0.975, 2 degrees of freedom) = 4.302653
    assert (s.n, s.mean, s.std) == (3, pytest.approx(7 / 3), pytest.approx(math.sqrt(7 / 3)))
    half = 4.302652729911275 * math.sqrt(7 / 3) / math.sqrt(3)
    assert (s.low, s.high) == (pytest.approx(7 / 3 - half), pytest.approx(7 / 3 + half))
    assert str(s) == "2.3333 ± 1.5275"
    assert summarize([1.0, 3.0]).std == pytest.approx(math.sqrt(2))  # two runs have a spread
    one, none = summarize([0.5]), summarize([])
    assert (one.n, one.mean, str(one)) == (1, 0.5, "0.5000") and math.isnan(one.std) and math.isnan(one.low)
    assert (none.n, str(none)) == (0, "-") and math.isnan(none.mean)


def test_welch_by_hand_at_its_edges():
    # one side without spread is still a Welch test: t = (1 - 2) / √(0 + 1/3), 2 degrees of freedom
    difference, p = welch([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])
    assert difference == -1.0 and p == pytest.approx(2 * scipy_stats.t.cdf(-math.sqrt(3), 2))
    assert welch([1.0, 1.0], [1.0, 1.0]) == (0.0, 1.0)  # no spread anywhere: equal, or
    assert welch([1.0, 1.0], [2.0, 2.0]) == (-1.0, 0.0)  # certainly different
    difference, p = welch([1.0], [1.0, 2.0])
    assert difference == -0.5 and math.isnan(p)  # one run: a difference, no test
    difference, p = welch([], [1.0, 2.0])
    assert math.isnan(difference) and math.isnan(p)
    # equal spreads and counts: Welch's degrees of freedom are the pooled test's 2n - 2
    se, df = welch_se_df([1.0, 2.0, 3.0], [2.0, 3.0, 4.0])
    assert (se, df) == (pytest.approx(math.sqrt(2 / 3)), pytest.approx(4.0))
    assert welch_se_df([1.0, 1.0], [2.0, 2.0]) == (0.0, math.inf)


def test_the_equivalence_test_and_the_detectable_effect_without_spread():
    assert tost([1.0, 1.0], [1.5, 1.5], 0.6) == 0.0  # |difference| 0.5 inside the margin: equivalent, surely
    assert tost([1.0, 1.0], [1.5, 1.5], 0.5) == 1.0  # on the margin is not inside it
    assert detectable_effect(0.0, 3, 0.0, 3) == 0.0
    assert 0 < detectable_effect(0.01, 2, 0.01, 2) < math.inf  # two runs a side are enough to test
