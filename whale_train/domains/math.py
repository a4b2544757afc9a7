"""Math reasoning (``whale/Math-v0``): the shipped ``math/`` harnesses, the math mechanism library, the
math warm-start formats."""

from __future__ import annotations

from whale_envs import MATH_ID
from whale_train.domains.registry import builtin_domain, register_domain

MATH = builtin_domain(
    "math",
    MATH_ID,
    harness_dir="math",
    harnesses=("h0", "vote", "calculator"),
    info_fields=("question", "tool_calls_left", "last_tool (stdout, stderr, exit_code)"),
    actions="'answer: <value>' (or a \\boxed{} answer) ends the episode; 'python: <code>' runs code in a sandbox.",
)

register_domain(MATH)
