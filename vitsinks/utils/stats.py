"""Small statistics: Welch's t-test for the leaderboards' marks (standard library only) and the NaN-aware mean and
standard deviation of every table."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (modified Lentz)."""
    if x <= 0 or x >= 1:
        return float(x >= 1)
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast below this point; use the symmetry above it
        return 1 - betainc(b, a, 1 - x)
    log_front = a * math.log(x) + b * math.log1p(-x) + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    tiny, f, c, d = 1e-300, 1e-300, 1e-300, 0.0
    for j in range(1, 1000):  # f = 1 / (1 + c_1 / (1 + c_2 / (1 + ...))), c_j the j-th term below
        m, odd = divmod(j - 1, 2)
        num = 1.0 if j == 1 else (-(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)) if odd
                                  else m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)))
        d = 1 / ((1 + num * d) or tiny)
        c = (1 + num / c) or tiny
        f *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return math.exp(log_front) * f / a


def welch_p(m1: float, s1: float, n1: int, m2: float, s2: float, n2: int) -> float:
    """Two-sided p of Welch's t-test (unequal variances) from means, sample stds (ddof 1) and counts (>= 2 each).
    Zero variance on both sides: 1 for equal means, 0 otherwise."""
    v1, v2 = s1 ** 2 / n1, s2 ** 2 / n2
    if v1 + v2 == 0:
        return 1.0 if m1 == m2 else 0.0
    t2 = (m1 - m2) ** 2 / (v1 + v2)
    df = (v1 + v2) ** 2 / (v1 ** 2 / (n1 - 1) + v2 ** 2 / (n2 - 1))
    return betainc(df / 2, 0.5, df / (df + t2))  # P(|T_df| >= |t|)


def nan_mean_std(values: Iterable[float | None]) -> tuple[float, float, int]:
    """(mean, sample std with ddof 1, count) over the values that are not NaN or None (NaN where undefined)."""
    vals = np.array([math.nan if v is None else v for v in values], dtype=float)
    vals = vals[~np.isnan(vals)]
    return (float(vals.mean()) if vals.size else math.nan, float(vals.std(ddof=1)) if vals.size > 1 else math.nan,
            int(vals.size))
