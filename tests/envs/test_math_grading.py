"""Red team, grading: a final answer counts only in a well-formed action (docs/envs/math.md lists each
form; each row there is a case here). Lenient grading is a reward a searched harness would find."""

from __future__ import annotations

import pytest

from whale_envs.math import MathEnv, MathProblem
from whale_envs.math.verify import check
from whale_envs.tasks import ListSource, Task


def step(action: str, gold: str) -> tuple[float, bool, dict]:
    env = MathEnv(tasks=ListSource("custom", [Task("q", MathProblem("What is it?", gold))]), max_tool_calls=0)
    env.reset()
    _, reward, terminated, _, info = env.step(action)
    return reward, terminated, info


ACCEPTED = [
    ("answer: 18", "18"),
    ("The sum is \\boxed{18}.", "18"),
    ("$\\boxed 7$", "7"),
    ("answer: 11\nanswer: 18", "18"),
    ("\\boxed{17} then \\boxed{18}", "18"),
    ("answer: 18\n(5 + 13)", "18"),
    ("answer: 1 000 000", "1000000"),
    ("answer: 10\\,000", "10000"),
    ("answer: 1,000", "1000"),
    ("answer: 18 dollars", "18"),
]

WRONG = [  # well-formed, and not the gold however its characters are read
    ("answer: 1 8", "18"),
    ("answer: 12 34", "1234"),
]

MALFORMED = [  # no final answer at all: an error that costs a turn
    ("\\boxed{18", "18"),
    ("\\boxed{17} and \\boxed{18", "18"),
    ("I think 18", "18"),
    ("answer:\n18", "18"),
    ("answer: \\boxed{18", "18"),
]


@pytest.mark.parametrize(("action", "gold"), ACCEPTED)
def test_accepted_forms_are_solved(action, gold):
    reward, terminated, info = step(action, gold)
    assert reward == 1.0 and terminated and info["solved"], info


@pytest.mark.parametrize(("action", "gold"), WRONG)
def test_lenient_readings_are_wrong(action, gold):
    reward, terminated, info = step(action, gold)
    assert reward == 0.0 and terminated and not info["solved"], info


@pytest.mark.parametrize(("action", "gold"), MALFORMED)
def test_malformed_final_answers_are_not_answers(action, gold):
    reward, terminated, info = step(action, gold)
    assert reward == 0.0 and not terminated and info["error_kind"] == "malformed", info


def test_the_verifier_alone_rejects_an_unclosed_box_and_spaced_digits():
    assert check("\\boxed{18", "18").matcher == "malformed"
    assert not check("\\boxed{18", "18").solved
    assert check("1 8", "18").normalized == "1,8" and not check("1 8", "18").solved
    assert check("1 000", "1000").solved
