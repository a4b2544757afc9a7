"""The verifiers as the paper runs them: DAPO's strict \\boxed{} rule selectable in the math
env, and the LLM judge in the paper's mode (asked on every answer, exact match when it fails)."""

from __future__ import annotations

import gymnasium as gym
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from whale_envs.math.dapo import check_minerva, check_strict_box, last_boxed, normalize_final_answer
from whale_envs.search import JudgeError, SearchQAEnv


@pytest.mark.parametrize(
    ("response", "truth", "solved"),
    [
        ("so the total is \\boxed{42}", "42", True),
        ("\\boxed{42.0}", "42", False),  # strict: string equality, no numeric matching
        ("\\boxed{ 42}", "42", False),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),  # balanced braces
        ("first \\boxed{7} then \\boxed{42}", "42", True),  # the last box counts
        ("\\boxed{42}" + " and some words after it" * 5, "42", False),  # outside the last 100 characters
        ("x" * 5000 + "\\boxed{42}", "42", True),
        ("the answer is 42", "42", False),
        ("\\boxed{42", "42", False),  # unclosed
    ],
)
def test_strict_box_rule(response, truth, solved):
    assert check_strict_box(response, truth).solved is solved


def test_strict_box_reports_what_it_read():
    v = check_strict_box("thinking... \\boxed{12}", "13")
    assert (v.extracted, v.gold, v.matcher, v.solved) == ("12", "13", "dapo_strict", False)
    assert check_strict_box("no box", "13").matcher == "malformed"
    assert last_boxed("\\boxed{a{b}c} \\boxed{d}") == "d" and last_boxed("\\boxed{a{b}") is None


def test_minerva_normalization_is_string_work():
    assert normalize_final_answer("1,000 dollars") == "1000"
    assert normalize_final_answer("x = \\frac12") == "\\frac{1}{2}"
    assert normalize_final_answer("\\text{(B)}") == "(B)"
    assert check_minerva("work\nAnswer: $1,000$", "1000").solved
    assert not check_minerva("no answer line", "1000").solved
    # an answer that is code is compared as text, never run
    assert not check_minerva("Answer: __import__('os').getcwd()", "0").solved


@pytest.fixture
def dapo_file(tmp_path):
    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": "Solve the following math problem step by step.\n\nWhat is 2+3?\n\n"
                        'Remember to put your answer on its own line after "Answer:".'}],
            "reward_model": {"ground_truth": "5", "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": "a"},
        }
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "dapo.parquet")
    return tmp_path / "dapo.parquet"


def test_math_env_selects_the_dapo_verifier(dapo_file):
    spec = f"dapo:{dapo_file}"
    strict = gym.make("whale/Math-v0", tasks=spec, split="all", verifier="dapo", max_tool_calls=0)
    ours = gym.make("whale/Math-v0", tasks=spec, split="all", max_tool_calls=0)
    for env in (strict, ours):
        obs, _ = env.reset(seed=0)
        assert "What is 2+3?" in obs and "Solve the following" not in obs
    _, r, done, _, info = strict.step("2 + 3 = 5, so \\boxed{5}")
    assert (r, done, info["matcher"]) == (1.0, True, "dapo_strict")
    for env, want in ((strict, 0.0), (ours, 1.0)):  # 'answer: 5' has no box: wrong for DAPO, right for ours
        env.reset(seed=0)
        _, r, done, _, info = env.step("answer: 5")
        assert done and r == want
    strict.reset(seed=0)
    _, r, _, _, info = strict.step("\\boxed{5.0}")
    assert r == 0.0 and info["extracted"] == "5.0"
    with pytest.raises(ValueError, match="verifier must be one of whale, dapo, dapo_minerva"):
        gym.make("whale/Math-v0", verifier="lenient")


# ------------------------------------------------------------------------------ the judge's paper mode

TASK = "5ae77176554299540e5a5593"  # bundled HotpotQA, gold "1998"


class Judge:
    """Stands in for LLMJudge's decision (its HTTP path is tested in test_search_env.py)."""

    def __init__(self, verdict):
        self.verdict, self.calls = verdict, 0

    def __call__(self, question, answers, prediction):
        self.calls += 1
        if isinstance(self.verdict, Exception):
            raise self.verdict
        return self.verdict


def answer(env, text):
    env.reset(options={"task_id": TASK})
    return env.step(f"answer: {text}")


def test_paper_mode_asks_the_judge_on_every_answer():
    no = Judge(False)
    env = SearchQAEnv("hotpotqa", judge=no, judge_mode="paper")
    _, reward, _, _, info = answer(env, "1998")  # exact match, but the paper's judge decides
    assert no.calls == 1 and reward == 0.0 and info["em"] is True and info["judge"] is False
    yes = Judge(True)
    env = SearchQAEnv("hotpotqa", judge=yes, judge_mode="paper")
    _, reward, _, _, info = answer(env, "it was 1998")
    assert yes.calls == 1 and reward == 1.0
    rescue = Judge(False)
    env = SearchQAEnv("hotpotqa", judge=rescue)  # ours: an exact match never asks
    _, reward, _, _, _ = answer(env, "1998")
    assert rescue.calls == 0 and reward == 1.0


def test_paper_mode_falls_back_to_exact_match_when_the_judge_fails():
    broken = Judge(JudgeError("judge request failed: timed out"))
    env = SearchQAEnv("hotpotqa", judge=broken, judge_mode="paper")
    _, reward, _, _, info = answer(env, "1998")
    assert reward == 1.0 and info["judge"] is None and "timed out" in info["judge_error"]
    _, reward, _, _, info = answer(env, "1999")
    assert reward == 0.0 and broken.calls == 2
    with pytest.raises(ValueError, match="judge_mode must be"):
        SearchQAEnv("hotpotqa", judge_mode="always")
