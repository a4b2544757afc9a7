"""Linear equations in one unknown: ``Solve for x: 4x + 7 = 31``

=====  ==============================================================================
level  problems
=====  ==============================================================================
1      ``x + a = b`` with single digits (x from 0 to 9)
2      ``x - a = b`` or ``a x = b`` in the "medium" band (a 5-20 or 2-9, x 1-20)
3      ``a x + b = c``: coefficient 2-12, x from -20 to 20
4      ``a x + b = c x + d``: x on both sides, x from -50 to 50
5      ``a(x + b) - c = d x + e`` with 3-4 digit coefficients and x up to 5 digits
=====  ==============================================================================

The answer (the value of x) is always an integer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from whale_envs.math.generators.base import FamilyConfig, sample, signed


@dataclass
class LinearEquationConfig(FamilyConfig):
    """Options of the linear-equation family (see :class:`FamilyConfig`)."""


def term(coef: int, var: str = "x") -> str:
    """``coef`` times ``var`` as written by hand: ``x``, ``-x``, ``3x``."""
    return var if coef == 1 else f"-{var}" if coef == -1 else f"{coef}{var}"


def generate(rng: random.Random, level: int) -> tuple[str, str]:
    """One equation of ``level``: ``(question, answer)``."""
    if level == 1:
        x, a = rng.randint(0, 9), rng.randint(1, 9)
        eq = f"x + {a} = {x + a}"
    elif level == 2:
        if rng.random() < 0.5:
            x, a = rng.randint(1, 20), rng.randint(5, 20)
            eq = f"x - {a} = {x - a}"
        else:
            x, a = rng.randint(1, 20), rng.randint(2, 9)
            eq = f"{a}x = {a * x}"
    elif level == 3:
        a, x, b = rng.randint(2, 12), rng.randint(-20, 20), rng.randint(-50, 50)
        eq = f"{term(a)} {signed(b)} = {a * x + b}"
    elif level == 4:
        x = rng.randint(-50, 50)
        a, c = rng.sample([k for k in range(-12, 13) if k != 0], 2)
        b = rng.randint(-60, 60)
        d = a * x + b - c * x
        eq = f"{term(a)} {signed(b)} = {term(c)} {signed(d)}"
    else:
        x = rng.randint(-99_999, 99_999)
        a, d = rng.sample(range(101, 9999), 2)
        b, c = rng.randint(-9999, 9999), rng.randint(100, 99_999)
        e = a * (x + b) - c - d * x
        eq = f"{a}(x {signed(b)}) - {c} = {term(d)} {signed(e)}"
    return f"Solve for x: {eq}", str(x)


def problems(config: LinearEquationConfig | None = None, n: int | None = None) -> list[tuple[str, str]]:
    """(question, answer) pairs for ``config`` (default: level 1, seed 0)."""
    return sample(generate, config or LinearEquationConfig(), n)
