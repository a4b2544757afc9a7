"""Math reasoning (``whale/Math-v0``): the shipped ``math/`` harnesses, the math mechanism library, the
math warm-start formats."""

from __future__ import annotations

from whale_envs import MATH_ID
from whale_train.domains.registry import Domain, register_domain

MATH = Domain(
    name="math",
    env_id=MATH_ID,
    base_harness="math/h0",
    harness_dir="math",
    harnesses=("math/h0", "math/vote", "math/calculator"),
    info_fields=(
        "question",
        "tool_calls_left",
        "last_tool (stdout, stderr, exit_code)",
        "error",
        "error_kind",
    ),
    actions="'answer: <value>' (or a \\boxed{} answer) ends the episode; 'python: <code>' runs code in a sandbox.",
    library="whale_train.meta_harness.library.math:LIBRARY",
    pretrain_formats="whale_train.pretrain.formats:MATH",
    prompt_edits="whale_train.meta_harness.prompt_only:MATH_EDITS",
)

register_domain(MATH)
