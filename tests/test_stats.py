"""t2i_gcpo.stats: the intervals against hand-computed values and against scipy's own routines."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sp

from t2i_gcpo.stats import mean_ci95, standard_error, welch_ci95


def test_standard_error_hand_computed_and_as_scipy():
    # 1, 2, 3, 4: s² = 5/3, s.e. = √(5/3) / 2
    assert standard_error([1.0, 2.0, 3.0, 4.0, float("nan")]) == pytest.approx(math.sqrt(5 / 3) / 2)
    x = np.random.default_rng(0).normal(size=17)
    assert standard_error(x) == pytest.approx(sp.sem(x))
    assert math.isnan(standard_error([1.0])) and math.isnan(standard_error([]))


def test_mean_interval_hand_computed():
    m, lo, hi, n = mean_ci95([1.0, 2.0, 3.0, float("nan")])
    half = 4.302653 * 1.0 / math.sqrt(3)  # t_{0.975, 2} · s / √n with s = 1
    assert (m, n) == (2.0, 3) and lo == pytest.approx(2 - half) and hi == pytest.approx(2 + half)
    assert mean_ci95([5.0])[:1] == (5.0,) and all(math.isnan(v) for v in mean_ci95([5.0])[1:3])
    m, lo, hi, n = mean_ci95([float("nan")])
    assert n == 0 and all(math.isnan(v) for v in (m, lo, hi))


def test_mean_interval_matches_scipy():
    x = np.random.default_rng(1).normal(0.3, 2.0, size=23)
    m, lo, hi, n = mean_ci95(x)
    want = sp.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=sp.sem(x))
    assert n == 23 and m == pytest.approx(x.mean()) and (lo, hi) == pytest.approx(want)


def test_welch_interval_hand_computed():
    # a = 1, 2, 3, 4: mean 2.5, s² = 5/3; b = 2, 4, 6: mean 4, s² = 4. Squared standard errors
    # 5/12 and 4/3, sum 7/4; Welch–Satterthwaite ν = (7/4)² / ((5/12)²/3 + (4/3)²/2) = 3.2347
    se2 = 5 / 12 + 4 / 3
    dof = se2**2 / ((5 / 12) ** 2 / 3 + (4 / 3) ** 2 / 2)
    assert dof == pytest.approx(3.2347, abs=1e-4)
    half = 3.055713 * math.sqrt(se2)  # t_{0.975, ν} · √(7/4), ν = 3.234719
    diff, lo, hi = welch_ci95([1.0, 2.0, 3.0, 4.0, float("nan")], [2.0, 4.0, 6.0])
    assert diff == -1.5 and (lo, hi) == pytest.approx((-1.5 - half, -1.5 + half), abs=1e-5)
    assert lo == pytest.approx(-5.542328, abs=1e-5)
    # equal variances and sizes: ν = 2n − 2, Student's pooled interval
    d, lo, hi = welch_ci95([1.0, 2.0, 3.0], [2.0, 3.0, 4.0])
    assert (d, hi - d) == (-1.0, pytest.approx(2.776445 * math.sqrt(2 / 3)))
    assert welch_ci95([1.0, 1.0], [3.0, 3.0]) == (-2.0, -2.0, -2.0)  # no spread: a point
    d, lo, hi = welch_ci95([1.0], [2.0, 3.0])
    assert d == -1.5 and math.isnan(lo) and math.isnan(hi)
    assert all(math.isnan(x) for x in welch_ci95([], [1.0, 2.0]))


def test_welch_interval_matches_scipy():
    rng = np.random.default_rng(2)
    a, b = rng.normal(1.0, 1.0, size=9), rng.normal(0.0, 3.0, size=14)
    diff, lo, hi = welch_ci95(a, b)
    ci = sp.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx(a.mean() - b.mean()) and (lo, hi) == pytest.approx((ci.low, ci.high))
