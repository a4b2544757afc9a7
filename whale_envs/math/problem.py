"""The payload of a math task."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MathProblem:
    """One math question and its gold answer (private: only the env and its verifier read ``answer``).

    Attributes:
        question: the problem text shown to the agent (plain text or LaTeX).
        answer: the gold final answer, as the source gives it (``"18"``, ``"\\frac{14}{3}"``).
    """

    question: str
    answer: str
