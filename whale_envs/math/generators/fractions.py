"""Fractions: ``What is 1/4 + 2/3?``

=====  ==============================================================================
level  problems
=====  ==============================================================================
1      ``a/d + b/d``: one single-digit denominator, a sum already in lowest terms
2      ``a/b ± c/d`` with denominators 2-10 (never negative)
3      ``a/b * c/d`` or ``(a/b) / (c/d)`` with numbers up to 12
4      three fractions, ``+ - *`` (usual precedence), denominators up to 20
5      five fractions with denominators up to 99 and ``+ - *``
=====  ==============================================================================

The answer is the exact value in lowest terms: ``p/q``, or an integer when q = 1 (``-3/4`` when
negative). The verifier accepts any equal value (``6/8``, ``0.75``, ``\\frac{3}{4}``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction

from whale_envs.math.generators.base import FamilyConfig, sample


@dataclass
class FractionConfig(FamilyConfig):
    """Options of the fraction family (see :class:`FamilyConfig`)."""


def show(value: Fraction) -> str:
    """A fraction as the answer is written: ``3/4``, ``-3/4``, ``2``."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _frac(rng: random.Random, max_den: int) -> tuple[str, Fraction]:
    den = rng.randint(2, max_den)
    num = rng.randint(1, den - 1) if rng.random() < 0.7 else rng.randint(1, 2 * den)
    return f"{num}/{den}", Fraction(num, den)


def _evaluate(values: list[Fraction], ops: list[str]) -> Fraction:
    """Left-to-right with ``*`` and ``/`` before ``+`` and ``-``."""
    terms, signs = [values[0]], []
    for op, v in zip(ops, values[1:], strict=True):
        if op == "*":
            terms[-1] *= v
        elif op == "/":
            terms[-1] /= v
        else:
            signs.append(op)
            terms.append(v)
    total = terms[0]
    for sign, t in zip(signs, terms[1:], strict=True):
        total = total + t if sign == "+" else total - t
    return total


def generate(rng: random.Random, level: int) -> tuple[str, str]:
    """One fraction problem of ``level``: ``(question, answer)``."""
    if level == 1:
        while True:
            d = rng.randint(3, 9)
            a, b = rng.randint(1, d - 1), rng.randint(1, d - 1)
            value = Fraction(a + b, d)
            if value.denominator == d:
                return f"What is {a}/{d} + {b}/{d}?", show(value)
    count, max_den, ops = {2: (2, 10, "+-"), 3: (2, 12, "*/"), 4: (3, 20, "+-*"), 5: (5, 99, "+-*")}[level]
    while True:
        parts = [_frac(rng, max_den) for _ in range(count)]
        chosen = [rng.choice(ops) for _ in range(count - 1)]
        value = _evaluate([v for _, v in parts], chosen)
        if level == 2 and value < 0:
            continue
        shown = [f"({s})" if "/" in chosen else s for s, _ in parts]  # a/b / c/d would be ambiguous
        text = " ".join(t for pair in zip(shown, [*chosen, ""], strict=True) for t in pair if t)
        return f"What is {text}?", show(value)


def problems(config: FractionConfig | None = None, n: int | None = None) -> list[tuple[str, str]]:
    """(question, answer) pairs for ``config`` (default: level 1, seed 0)."""
    return sample(generate, config or FractionConfig(), n)
