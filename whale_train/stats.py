"""The one mean ± standard error of the package.

Scores are means over tasks (or over per-task differences, for a paired comparison); their standard
error is the sample standard deviation (n - 1) over sqrt(n), 0 for a single value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def mean_se(values: Iterable[float]) -> tuple[float, float]:
    """The mean of ``values`` (at least one) and its standard error."""
    xs = list(values)
    n = len(xs)
    mean = sum(xs) / n
    var = sum((x - mean) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var / n)
