"""Math reasoning: ``whale/Math-v0`` and its task sources (``generated``, ``gsm8k``, ``math``)."""

from whale_envs.math.env import MathEnv, parse_action
from whale_envs.math.generators import FAMILIES, MathGenConfig, generate_pairs
from whale_envs.math.problem import MathProblem
from whale_envs.math.verify import Verdict, check

__all__ = [
    "FAMILIES",
    "MathEnv",
    "MathGenConfig",
    "MathProblem",
    "Verdict",
    "check",
    "generate_pairs",
    "parse_action",
]
