"""The statistics of ``whale compare``: mean ± SD over seeds, Student's t, paired differences with
t-intervals, a Holm correction across claims, and rollouts-to-reach."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from whale_train.stats import mean_se


def mean_sd(xs: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n - 1); None where undefined."""
    n = len(xs)
    if n == 0:
        return None, None
    mean = sum(xs) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (bisection on ``t_cdf``)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2.0


def paired_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """The differences ``a[i] - b[i]`` (paired by seed): their mean, standard error
    (:func:`whale_train.stats.mean_se`), the t-interval at ``level`` and the two-sided p-value of "the mean
    difference is 0". With fewer than two pairs the interval, SE and p are None."""
    if len(a) != len(b):
        raise ValueError("paired samples must have the same length")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    mean, sd = mean_sd(diffs)
    out: dict[str, Any] = {"n": len(diffs), "diffs": diffs, "mean": mean, "sd": sd, "level": level}
    if sd is None:
        out.update(se=None, lo=None, hi=None, t=None, p=None)
        return out
    se = mean_se(diffs)[1]
    df = len(diffs) - 1
    t = t_quantile(0.5 + level / 2.0, df)
    out.update(lo=mean - t * se, hi=mean + t * se, t=t, se=se, p=two_sided_p(mean, se, df))
    return out


def two_sided_p(mean: float, se: float, df: int) -> float:
    """P(|T| >= |mean / se|) for Student's t with ``df`` degrees of freedom (1 when mean = se = 0)."""
    if se == 0:
        return 1.0 if mean == 0 else 0.0
    return min(1.0, 2.0 * (1.0 - t_cdf(abs(mean / se), df)))


def holm(pvalues: Sequence[float | None], alpha: float = 0.05) -> list[dict[str, Any]]:
    """Holm's step-down correction of a family of tests (None: a test that cannot be made, left out).

    For each test: ``p_adjusted`` (Holm's adjusted p-value: the running maximum of (m - j + 1) p_(j) over
    the sorted p-values, capped at 1), ``reject`` (p_adjusted < alpha) and ``level``, the confidence level
    of the interval that matches the decision: the j-th smallest p-value is tested at alpha / (m - j + 1),
    and once a step fails every later one is held to the failed step's level, so an interval at
    ``level`` excludes 0 exactly when Holm rejects."""
    present = [(p, i) for i, p in enumerate(pvalues) if p is not None]
    m = len(present)
    out: list[dict[str, Any]] = [{"p_adjusted": None, "reject": False, "level": None} for _ in pvalues]
    running, failed_at = 0.0, None
    for j, (p, i) in enumerate(sorted(present)):
        running = max(running, min(1.0, (m - j) * p))
        if failed_at is None and p > alpha / (m - j):
            failed_at = j
        step = j if failed_at is None else failed_at
        out[i] = {"p_adjusted": running, "reject": running < alpha, "level": 1.0 - alpha / (m - step)}
    return out


def rollouts_to_reach(evals: Sequence[dict[str, Any]], target: float, eps: float = 1e-9) -> int | None:
    """The rollouts of the first evaluation whose mean reaches ``target``; None when none does."""
    for e in evals:
        if e["mean"] >= target - eps:
            return int(e["rollouts_total"])
    return None
