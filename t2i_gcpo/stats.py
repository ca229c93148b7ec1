"""Confidence intervals for the comparisons the toolkit reports: the Student-t interval of a mean
(paired differences included), Welch's interval of a difference of two means, and the standard
error — scipy.stats' own, with nan values left out everywhere (a run that has no score yet) and a
sample without spread read as a point."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable

import numpy as np


def _finite(values: Iterable[float]) -> np.ndarray:
    a = np.asarray(list(values), dtype=np.float64)
    return a[~np.isnan(a)]


def standard_error(values: Iterable[float]) -> float:
    """s / √n over the non-nan values (s with n − 1 in the denominator); nan below 2 values."""
    from scipy.stats import sem

    a = _finite(values)
    return float(sem(a)) if a.size > 1 else math.nan


def mean_ci95(values: Iterable[float]) -> tuple[float, float, float, int]:
    """(mean, low, high, n) over the non-nan values: Student-t 95 % interval of the mean.
    n = 1 gives (x, nan, nan, 1); n = 0 gives nans and 0."""
    from scipy.stats import t

    a = _finite(values)
    n, m = int(a.size), float(a.mean()) if a.size else math.nan
    if n < 2 or np.ptp(a) == 0:  # one value: no interval; no spread: a point
        return (m, m if n > 1 else math.nan, m if n > 1 else math.nan, n)
    low, high = t.interval(0.95, n - 1, loc=m, scale=standard_error(a))
    return (m, float(low), float(high), n)


def welch_ci95(a: Iterable[float], b: Iterable[float]) -> tuple[float, float, float]:
    """(mean(a) − mean(b), low, high) over the non-nan values: Welch's 95 % interval of the difference
    of two means with unequal variances (t quantile at the Welch–Satterthwaite dof). The interval is nan
    when either side has fewer than 2 values, and a point when both have zero spread."""
    from scipy.stats import ttest_ind

    x, y = _finite(a), _finite(b)
    diff = float(x.mean() - y.mean()) if x.size and y.size else math.nan
    if x.size < 2 or y.size < 2:
        return (diff, math.nan, math.nan)
    if np.ptp(x) == 0 and np.ptp(y) == 0:
        return (diff, diff, diff)
    with warnings.catch_warnings():  # precision loss for values that differ by rounding: still the formula's
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = ttest_ind(x, y, equal_var=False).confidence_interval(0.95)
    return (diff, float(ci.low), float(ci.high))


def proportions_se(cells: Iterable[tuple[float, int]]) -> float:
    """Standard error of the unweighted mean of K proportions, the k-th a share p_k of n_k 0/1 outcomes
    drawn independently: √(Σ_k p_k(1 − p_k)/n_k) / K; one cell gives √(p(1 − p)/n). The sampling error
    of GenEval's overall (the mean of its tags' scores) or a held-out accuracy, the prompts fixed and
    their images drawn anew: prompts of unequal difficulty only make the true error smaller than this.
    nan without cells or with an empty one."""
    cells = list(cells)
    if not cells or any(n < 1 for _, n in cells):
        return math.nan
    return math.sqrt(sum(p * (1 - p) / n for p, n in cells)) / len(cells)


def linear_ci95(groups: Iterable[tuple[float, Iterable[float]]]) -> tuple[float, float, float]:
    """(estimate, low, high) of a weighted sum of group means, θ = Σ_k w_k x̄_k, the groups independent:
    variance Σ_k w_k² s_k²/n_k, Student-t 95 % interval at the Welch–Satterthwaite degrees of freedom
    (Σ_k v_k)² / Σ_k v_k²/(n_k − 1), v_k = w_k² s_k²/n_k, nan values left out. One group of weight 1 is
    `mean_ci95`; groups (1, b) and (−1, a) are `welch_ci95`; weights 1/K over K groups give the unweighted
    mean of K group means (GenEval's overall, the mean of its tags) with its interval, and over K groups of
    paired differences, the paired change of that mean. The interval is nan when a weighted group has
    fewer than 2 values, and a point when no group has spread."""
    from scipy.stats import t

    estimate, var, dof_den = 0.0, 0.0, 0.0
    parts = [(float(w), _finite(x)) for w, x in groups]
    if not parts or any(x.size == 0 for w, x in parts if w != 0):
        return (math.nan, math.nan, math.nan)
    for w, x in parts:
        if w == 0:
            continue
        estimate += w * float(x.mean())
        if x.size < 2:
            var = math.nan
            continue
        v = w * w * float(x.var(ddof=1)) / x.size
        var += v
        dof_den += v * v / (x.size - 1)
    if not math.isfinite(var):
        return (estimate, math.nan, math.nan)
    if var == 0:
        return (estimate, estimate, estimate)
    low, high = t.interval(0.95, var * var / dof_den, loc=estimate, scale=math.sqrt(var))
    return (estimate, float(low), float(high))
