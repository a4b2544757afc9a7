"""Word problems from templates: ``Tom has 12 apples. He buys 7 more and then gives 4 to Mia. ...``

=====  ==============================================================================
level  problems
=====  ==============================================================================
1      one step, single digits: has a, gets / gives away b
2      two steps, the "medium" band: has a (5-20), buys b (5-20), gives away c (1-9)
3      groups: boxes of b items, some eaten or added (numbers up to 12 x 12)
4      shopping: two kinds of items at unit prices, paid with a note; the change
5      production over days and weeks with 3-5 digit numbers (many steps: use the tool)
=====  ==============================================================================

The sentences come from a handful of fixed templates with names and objects drawn from short lists,
so the text is plain and regular. Every answer is a non-negative integer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from whale_envs.math.generators.base import FamilyConfig, sample

NAMES = [("Tom", "He"), ("Mia", "She"), ("Sam", "He"), ("Ana", "She"), ("Leo", "He"), ("Zoe", "She")]
ITEMS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "stamps", "cards"]
GOODS = [("pens", "notebooks"), ("apples", "pears"), ("cups", "plates"), ("balls", "kites")]
PRODUCTS = ["toys", "chairs", "bottles", "bricks", "shirts"]


@dataclass
class WordProblemConfig(FamilyConfig):
    """Options of the word-problem family (see :class:`FamilyConfig`)."""


def generate(rng: random.Random, level: int) -> tuple[str, str]:
    """One word problem of ``level``: ``(question, answer)``."""
    (name, pron), item = rng.choice(NAMES), rng.choice(ITEMS)
    friend = rng.choice([n for n, _ in NAMES if n != name])
    if level == 1:
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        if rng.random() < 0.5:
            q = f"{name} has {a} {item}. {pron} gets {b} more. How many {item} does {name} have now?"
            return q, str(a + b)
        a, b = max(a, b), min(a, b)
        q = f"{name} has {a} {item}. {pron} gives {b} to {friend}. How many {item} does {name} have now?"
        return q, str(a - b)
    if level == 2:
        a, b, c = rng.randint(5, 20), rng.randint(5, 20), rng.randint(1, 9)
        if rng.random() < 0.5:
            q = (
                f"{name} has {a} {item}. {pron} buys {b} more and then gives {c} to {friend}. "
                f"How many {item} does {name} have now?"
            )
            return q, str(a + b - c)
        a, b = max(a, b), min(a, b)
        q = (
            f"{name} has {a} {item}. {pron} gives {b} to {friend} and then finds {c} more. "
            f"How many {item} does {name} have now?"
        )
        return q, str(a - b + c)
    if level == 3:
        boxes, per, c = rng.randint(2, 12), rng.randint(2, 12), rng.randint(1, 9)
        if rng.random() < 0.5 and c <= boxes * per:
            q = (
                f"{name} buys {boxes} boxes of {item}. Each box has {per} {item}. {pron} gives {c} "
                f"to {friend}. How many {item} does {name} have now?"
            )
            return q, str(boxes * per - c)
        q = (
            f"{name} buys {boxes} boxes of {item}. Each box has {per} {item}. {pron} already had {c} "
            f"{item}. How many {item} does {name} have now?"
        )
        return q, str(boxes * per + c)
    if level == 4:
        (g1, g2), a, b = rng.choice(GOODS), rng.randint(2, 15), rng.randint(2, 15)
        p, r = rng.randint(2, 25), rng.randint(2, 25)
        total = a * p + b * r
        note = next(n for n in (20, 50, 100, 200, 500, 1000) if n > total)
        q = (
            f"{name} buys {a} {g1} at {p} dollars each and {b} {g2} at {r} dollars each. "
            f"{pron} pays with a {note} dollar note. How many dollars of change does {pron.lower()} get?"
        )
        return q, str(note - total)
    product = rng.choice(PRODUCTS)
    per_day, days = rng.randint(1000, 99_999), rng.randint(10, 365)
    weeks = days // 7
    made = per_day * days
    per_week = rng.randint(1000, max(1001, made // max(weeks, 1)))
    shipped = per_week * weeks
    broken = rng.randint(100, 9999)
    q = (
        f"A factory makes {per_day} {product} each day for {days} days. It ships {per_week} {product} "
        f"each week for {weeks} weeks, and {broken} of the {product} it made are broken. "
        f"How many unbroken {product} are left at the factory?"
    )
    answer = made - shipped - broken
    if answer < 0:
        return generate(rng, level)
    return q, str(answer)


def problems(config: WordProblemConfig | None = None, n: int | None = None) -> list[tuple[str, str]]:
    """(question, answer) pairs for ``config`` (default: level 1, seed 0)."""
    return sample(generate, config or WordProblemConfig(), n)
