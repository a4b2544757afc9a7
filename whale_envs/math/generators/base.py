"""What every generator family shares: the difficulty scale, the config base class, seeded sampling."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

#: Difficulty levels of every family. 1: single digits (a ~1M-parameter model learns these in
#: minutes); 2: the "medium" band (numbers 5-20 and a third number 1-9); 3: two-digit numbers and a
#: second kind of operation; 4: several steps with 2-3 digit numbers; 5: big numbers and many steps
#: (meant for the Python tool).
LEVELS = (1, 2, 3, 4, 5)

#: ``generate(rng, level) -> (question, answer)``: one problem of a family.
Generate = Callable[[random.Random, int], tuple[str, str]]


@dataclass
class FamilyConfig:
    """Options of one generator family (reasoning-gym style: a dataclass with ``validate()``).

    Attributes:
        difficulty: the level, 1-5 (see :data:`LEVELS`).
        seed: the same seed gives the same problems.
        size: how many problems :func:`sample` makes by default.
    """

    difficulty: int = 1
    seed: int = 0
    size: int = 1000

    def validate(self) -> None:
        if not isinstance(self.difficulty, int) or self.difficulty not in LEVELS:
            raise ValueError(f"difficulty must be one of {LEVELS}, got {self.difficulty!r}")
        if not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"size must be a positive integer, got {self.size!r}")


def item_rng(seed: int, idx: int) -> random.Random:
    """The random stream of item ``idx``: a function of ``(seed, idx)`` only."""
    return random.Random(seed * 2**32 + idx)


def sample(generate: Generate, config: FamilyConfig, n: int | None = None) -> list[tuple[str, str]]:
    """``n`` (default ``config.size``) (question, answer) pairs of one family: for warm-start text."""
    config.validate()
    return [generate(item_rng(config.seed, i), config.difficulty) for i in range(n or config.size)]


def signed(n: int) -> str:
    """``n`` written after an operator: ``+ 3`` or ``- 3``."""
    return f"+ {n}" if n >= 0 else f"- {-n}"
