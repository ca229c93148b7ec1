"""Confidence intervals for the comparisons the toolkit reports: the Student-t interval of a mean
(paired differences included), Welch's interval of a difference of two means, and the standard
error. nan values are left out everywhere (a run that has no score yet)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np


def t975(df: float) -> float:
    """Student-t quantile t_{0.975, df} for df > 0 (fractional for Welch's dof)."""
    from scipy.stats import t

    if not df > 0:
        raise ValueError(f"df must be > 0, got {df}")
    return float(t.ppf(0.975, df))


def _finite(values: Iterable[float]) -> np.ndarray:
    a = np.asarray(list(values), dtype=np.float64)
    return a[~np.isnan(a)]


def standard_error(values: Iterable[float]) -> float:
    """s / √n over the non-nan values (s with n − 1 in the denominator); nan below 2 values."""
    a = _finite(values)
    return float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else math.nan


def mean_ci95(values: Iterable[float]) -> tuple[float, float, float, int]:
    """(mean, low, high, n) over the non-nan values: Student-t 95 % interval of the mean.
    n = 1 gives (x, nan, nan, 1); n = 0 gives nans and 0."""
    a = _finite(values)
    n = int(a.size)
    if n == 0:
        return (math.nan, math.nan, math.nan, 0)
    m = float(a.mean())
    if n == 1:
        return (m, math.nan, math.nan, 1)
    half = t975(n - 1) * standard_error(a)
    return (m, m - half, m + half, n)


def welch_ci95(a: Iterable[float], b: Iterable[float]) -> tuple[float, float, float]:
    """(mean(a) − mean(b), low, high) over the non-nan values: Welch's 95 % interval of the difference
    of two means with unequal variances, t quantile at the Welch–Satterthwaite dof
    (s²_a/n_a + s²_b/n_b)² / ((s²_a/n_a)²/(n_a − 1) + (s²_b/n_b)²/(n_b − 1)). The interval is nan
    when either side has fewer than 2 values, and a point when both have zero spread."""
    x, y = _finite(a), _finite(b)
    if x.size == 0 or y.size == 0:
        return (math.nan, math.nan, math.nan)
    diff = float(x.mean() - y.mean())
    if x.size < 2 or y.size < 2:
        return (diff, math.nan, math.nan)
    va, vb = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size  # squared standard errors
    if va + vb == 0:
        return (diff, diff, diff)
    dof = (va + vb) ** 2 / (va**2 / (x.size - 1) + vb**2 / (y.size - 1))
    half = t975(float(dof)) * math.sqrt(va + vb)
    return (diff, diff - half, diff + half)


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
