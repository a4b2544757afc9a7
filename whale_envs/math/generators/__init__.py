"""Procedural math problems (``tasks="generated"``, the default of ``whale/Math-v0``).

One module per family, reasoning-gym style (a config dataclass with ``validate()``, a difficulty
knob 1-5, a seed), each with a plain ``generate(rng, level) -> (question, answer)`` that a warm-start
step can call directly (or ``problems(config, n)`` for a list):

==============  ======================================  ===========================================
family          module                                  level 1 example
==============  ======================================  ===========================================
``arithmetic``  :mod:`.arithmetic`                      ``What is 3 + 5?`` → ``8``
``word``        :mod:`.word_problems`                   ``Tom has 3 apples. He gets 5 more. ...``
``linear``      :mod:`.linear_equations`                ``Solve for x: x + 3 = 8`` → ``5``
``fractions``   :mod:`.fractions`                       ``What is 1/5 + 2/5?`` → ``3/5``
==============  ======================================  ===========================================

Levels (all families): 1 single digits; 2 the "medium" band (numbers 5-20 and a third number 1-9);
3 two-digit numbers and a second operation; 4 several steps; 5 big numbers and many steps, meant for
the Python tool. Source options: ``families`` (comma-separated names or ``all``), ``difficulty`` (a
level or a range ``"1-3"``), ``seed``, ``size``. Task ``idx`` gets family ``families[idx % F]`` and level
``levels[(idx // F) % L]``, and is built from ``random.Random`` seeded by ``(seed, idx)`` alone.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from whale_envs.math.generators import arithmetic, fractions, linear_equations, word_problems
from whale_envs.math.generators.base import LEVELS, FamilyConfig, Generate, item_rng, sample
from whale_envs.math.problem import MathProblem
from whale_envs.tasks import GeneratedSource, GeneratorConfig, Task, config_from_options

#: family name -> ``generate(rng, level) -> (question, answer)``
FAMILIES: dict[str, Generate] = {
    "arithmetic": arithmetic.generate,
    "word": word_problems.generate,
    "linear": linear_equations.generate,
    "fractions": fractions.generate,
}


def generate_pairs(family: str, n: int, *, difficulty: int = 1, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` (question, answer) pairs of one family and level, e.g. for warm-start text.

    Item ``i`` is drawn from ``random.Random`` seeded by ``(seed, i)`` alone, so the same arguments
    always give the same list and a longer list starts with the shorter one.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown math family {family!r}; known: {', '.join(FAMILIES)}")
    return sample(FAMILIES[family], FamilyConfig(difficulty=difficulty, seed=seed, size=max(n, 1)), n)


@dataclass
class MathGenConfig(GeneratorConfig):
    """Options of ``tasks="generated"``.

    Attributes:
        families: comma-separated family names (see :data:`FAMILIES`) or ``"all"``.
        difficulty: a level 1-5 or a range ``"lo-hi"``.
        seed: the generator seed; the same seed gives the same tasks.
        size: number of task ids (tasks are built lazily, on first use).
    """

    LEVELS: ClassVar[tuple[int, ...]] = LEVELS

    difficulty: int | str = "1-3"
    families: str = "all"
    size: int = 5000

    def family_list(self) -> list[str]:
        text = str(self.families).replace(" ", "")
        return list(FAMILIES) if text == "all" else [f for f in text.split(",") if f]

    def validate(self) -> None:
        super().validate()
        families = self.family_list()
        unknown = [f for f in families if f not in FAMILIES]
        if not families or unknown:
            raise ValueError(f"unknown families {unknown or families}; known: {', '.join(FAMILIES)} or 'all'")


def make_generated(path: str | None = None, **options) -> GeneratedSource[MathProblem]:
    """The ``generated`` task source (see the module docstring and :class:`MathGenConfig`)."""
    config: MathGenConfig = config_from_options(MathGenConfig, "math generated tasks", options)
    if path is not None:
        raise ValueError("the generated math source takes no file")
    families, levels = config.family_list(), config.levels()
    plan = {}
    for i in range(config.size):
        family, level = families[i % len(families)], levels[(i // len(families)) % len(levels)]
        plan[f"math-gen-s{config.seed}-{family}-d{level}-{i:05d}"] = (family, level)
    ids = list(plan)

    def make(rng: random.Random, idx: int) -> tuple[Task[MathProblem], str]:
        family, level = plan[ids[idx]]
        question, answer = FAMILIES[family](rng, level)
        meta = {"difficulty": level, "family": family, "seed": config.seed}
        return Task(ids[idx], MathProblem(question, answer), meta), question

    name = f"generated?families={config.families}&difficulty={config.difficulty}&seed={config.seed}"
    return GeneratedSource(f"{name}&size={config.size}", ids, make, seed=config.seed)


__all__ = ["FAMILIES", "LEVELS", "MathGenConfig", "generate_pairs", "item_rng", "make_generated"]
