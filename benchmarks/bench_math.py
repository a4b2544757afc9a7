"""Math env speed: the verifier per answer, the sandbox's overhead per trivial tool call, env steps.

Run with ``make bench``; ``make test`` runs each once (``--benchmark-disable``).
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import whale_envs  # noqa: F401
from whale_envs.math.sources import load_gsm8k
from whale_envs.math.verify import check
from whale_envs.sandbox import Limits, run_python


@pytest.mark.benchmark(group="math-verify")
def test_verify_numeric_answer(benchmark):
    """The common case: a number against a number (exact / numeric matcher)."""
    result = benchmark(check, "The total is \\boxed{1,250} dollars", "1250")
    assert result.solved


@pytest.mark.benchmark(group="math-verify")
def test_verify_symbolic_answer(benchmark):
    """A LaTeX expression that only math-verify can decide."""
    check("2\\sqrt{2}", "\\sqrt{8}")  # warm the imports
    result = benchmark(check, "\\frac{2\\sqrt{2}}{4}", "\\frac{1}{\\sqrt{2}}")
    assert result.solved and result.matcher == "math_verify"


@pytest.mark.benchmark(group="math-verify")
def test_verify_gsm8k_test_split(benchmark):
    """All 1319 GSM8K gold answers, boxed (one round = the whole split)."""
    tasks = list(load_gsm8k())

    def run():
        return sum(check(f"\\boxed{{{t.payload.answer}}}", t.payload.answer).solved for t in tasks)

    assert benchmark(run) == 1319


@pytest.mark.benchmark(group="math-tool")
def test_sandbox_trivial_call(benchmark):
    """The sandbox's overhead: a fresh jailed interpreter that prints one line."""
    result = benchmark(run_python, "print(1)", Limits())
    assert result.ok and result.stdout == "1\n"


@pytest.mark.benchmark(group="math-tool")
def test_env_step_with_tool_call(benchmark):
    env = gym.make("whale/Math-v0", max_turns=10**6, max_tool_calls=10**6)
    env.reset(seed=0)
    obs, *_ = benchmark(env.step, "python: print(6 * 7)")
    assert "42" in obs
