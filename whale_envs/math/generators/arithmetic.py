"""Arithmetic chains: ``What is 12 + 7 - 4?``

=====  ==============================================================================
level  problems
=====  ==============================================================================
1      ``a + b`` or ``a - b`` with single digits, never negative
2      ``a ± b ± c`` with a, b in 5-20 and c in 1-9 (the "medium" band), never negative
3      three two-digit numbers with ``+``, ``-`` and one ``*``
4      four numbers of 1-3 digits, ``+ - *`` and one pair of parentheses
5      five numbers of 3-7 digits with ``+ - *``, at least one ``*`` (big-integer work: use the tool)
=====  ==============================================================================

The answer is the integer value with the usual precedence (``*`` before ``+``/``-``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from whale_envs.math.generators.base import FamilyConfig, sample


@dataclass
class ArithmeticConfig(FamilyConfig):
    """Options of the arithmetic family (see :class:`FamilyConfig`)."""


def _chain(rng: random.Random, numbers: list[int], ops: str) -> str:
    parts = [str(numbers[0])]
    for n in numbers[1:]:
        parts += [rng.choice(ops), str(n)]
    return " ".join(parts)


def _expression(rng: random.Random, level: int) -> str:
    if level == 1:
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        if rng.random() < 0.5:
            return f"{a} + {b}"
        return f"{max(a, b)} - {min(a, b)}"
    if level == 2:
        while True:
            expr = _chain(rng, [rng.randint(5, 20), rng.randint(5, 20), rng.randint(1, 9)], "+-")
            if eval(expr) >= 0:  # noqa: S307 - our own digits and operators
                return expr
    if level == 3:
        nums = [rng.randint(10, 99) for _ in range(3)]
        ops = ["*", rng.choice("+-")]
        rng.shuffle(ops)
        return f"{nums[0]} {ops[0]} {nums[1]} {ops[1]} {nums[2]}"
    if level == 4:
        nums = [rng.randint(2, 999) if rng.random() < 0.7 else rng.randint(2, 30) for _ in range(4)]
        ops = [rng.choice("+-*") for _ in range(3)]
        k = rng.randrange(3)  # parenthesize nums[k] op nums[k+1]
        tokens = [str(n) for n in nums]
        tokens[k] = "(" + tokens[k]
        tokens[k + 1] = tokens[k + 1] + ")"
        return " ".join(t for pair in zip(tokens, [*ops, ""], strict=True) for t in pair if t)
    nums = [rng.randint(100, 9_999_999) for _ in range(5)]
    ops = [rng.choice("+-*") for _ in range(4)]
    ops[rng.randrange(4)] = "*"  # at least one big product
    return " ".join(t for pair in zip(map(str, nums), [*ops, ""], strict=True) for t in pair if t)


def generate(rng: random.Random, level: int) -> tuple[str, str]:
    """One arithmetic problem of ``level``: ``(question, answer)``."""
    expr = _expression(rng, level)
    return f"What is {expr}?", str(eval(expr))  # noqa: S307 - our own digits and operators


def problems(config: ArithmeticConfig | None = None, n: int | None = None) -> list[tuple[str, str]]:
    """(question, answer) pairs for ``config`` (default: level 1, seed 0)."""
    return sample(generate, config or ArithmeticConfig(), n)
