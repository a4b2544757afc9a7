"""whale/Math-v0: actions, rewards, the end-of-episode info, bounds, and no answer before the end."""

from __future__ import annotations

import re
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import whale_envs  # noqa: F401  (registers the envs)
from tests.env_steps import step_refused
from whale_envs.data import bundled_path
from whale_envs.math import MathEnv, MathProblem, parse_action
from whale_envs.tasks import ListSource, Task
from whale_envs.text_env import ActionError

FINAL_KEYS = {"solved", "answer", "gold", "extracted", "normalized", "matcher", "verify_timed_out"}


def custom_env(answer: str = "12", question: str = "What is 5 + 7?", **kwargs) -> MathEnv:
    source = ListSource("custom", [Task("q0", MathProblem(question, answer), {"difficulty": 1})])
    return MathEnv(tasks=source, **kwargs)


@pytest.mark.parametrize("tasks", ["generated", "gsm8k", "math", "generated?difficulty=5&families=linear"])
def test_check_env_passes(tasks):
    env = gym.make("whale/Math-v0", tasks=tasks).unwrapped
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env, skip_render_check=False)


def test_default_make_needs_no_files_and_is_seeded():
    env = gym.make("whale/Math-v0")
    obs, info = env.reset(seed=4)
    assert info["task_id"].startswith("math-gen-s0-") and info["question"] in obs
    again = gym.make("whale/Math-v0")
    assert again.reset(seed=4)[0] == obs


@pytest.mark.parametrize(
    ("action", "reward"),
    [
        ("answer: 12", 1.0),
        ("ANSWER:12", 1.0),
        ("answer: 13", 0.0),
        ("5 + 7 = 12, so the answer is $\\boxed{12}$.", 1.0),
        ("answer: 11\nanswer: 12", 1.0),  # the last answer counts
        ("answer: 12\nanswer: 11", 0.0),
        ("\\boxed{12} ... no: \\boxed{13}", 0.0),
        ("answer: \\boxed{12}", 1.0),
    ],
)
def test_final_answers_end_the_episode(action, reward):
    env = custom_env()
    env.reset()
    obs, r, terminated, truncated, info = env.step(action)
    assert (r, terminated, truncated) == (reward, True, False)
    assert FINAL_KEYS <= set(info) and info["solved"] == (reward == 1.0)
    assert info["answer"] == "12" and info["gold"] == "12" and info["matcher"] in ("exact", "numeric")
    assert ("is correct" in obs) == (reward == 1.0)


def test_end_info_records_extraction_and_matcher():
    env = custom_env(answer="\\frac{1}{2}", question="Half of one?")
    env.reset()
    *_, info = env.step("I get $\\boxed{0.5}$")
    assert info["solved"] and info["extracted"] == "0.5" and info["matcher"] == "numeric"
    assert info["gold"] == "\\frac{1}{2}" and info["verify_timed_out"] is False


@pytest.mark.parametrize(
    ("action", "kind", "needle"),
    [
        ("hello", "malformed", "unrecognized action"),
        ("answer:", "malformed", "must be followed by the answer"),
        ("python:   ", "malformed", "must be followed by code"),
        ("\\boxed{}", "malformed", "is empty"),
    ],
)
def test_bad_actions_cost_a_turn_and_change_nothing(action, kind, needle):
    obs0, obs, info = step_refused(custom_env(), action, kind, needle)
    assert obs.endswith(obs0) and info["tool_calls_used"] == 0 and not FINAL_KEYS & set(info)


def test_python_tool_output_is_the_next_observation():
    env = custom_env()
    env.reset()
    obs, reward, terminated, _, info = env.step("python: print(5 + 7)")
    assert not terminated and reward == 0.0
    assert obs.startswith("Python output (call 1 of 4):\n12\n") and "3 calls left" in obs
    assert info["last_tool"]["stdout"] == "12\n" and info["last_tool"]["exit_code"] == 0
    assert info["tool_calls_used"] == 1 and info["tool_calls_left"] == 3
    obs, *_ = env.step("python:\n```python\nx = 3\nprint(x * 4)\n```")
    assert "\n12\n" in obs  # a Markdown fence around the code is removed
    obs, *_, info = env.step("python: 1/0")
    assert "ZeroDivisionError" in obs and "[exit status 1]" in obs and info["last_tool"]["exit_code"] == 1
    *_, info = env.step("answer: 12")
    assert info["solved"]


def test_tool_call_budget_and_turn_bound():
    env = custom_env(max_tool_calls=1, max_turns=3)
    env.reset()
    env.step("python: print(1)")
    obs, _, terminated, truncated, info = env.step("python: print(2)")
    assert info["error_kind"] == "budget" and "no Python tool calls left" in info["error"]
    obs, _, terminated, truncated, info = env.step("python: print(3)")
    assert truncated and not terminated and "Out of turns (3)" in obs
    assert info["solved"] is False and info["answer"] == "12" and info["matcher"] is None
    off = custom_env(max_tool_calls=0)
    off.reset()
    *_, info = off.step("python: print(1)")
    assert info["error_kind"] == "illegal" and off.max_turns == 2


def test_default_turns_follow_the_tool_budget_and_limits_are_options():
    env = gym.make("whale/Math-v0", max_tool_calls=6, tool_limits={"wall_s": 2.0}).unwrapped
    env.reset(seed=0)
    assert env.max_turns == 8 and env.tool_limits.wall_s == 2.0 and env.tool_limits.cpu_s == 10
    with pytest.raises(ValueError, match="max_tool_calls"):
        MathEnv(max_tool_calls=-1)
    with pytest.raises(ValueError, match="wall_s"):
        MathEnv(tool_limits={"wall_s": 0})


def test_no_answer_in_observations_or_info_before_the_end():
    env = gym.make("whale/Math-v0", tasks="gsm8k").unwrapped
    checked = 0
    for task_id in env.task_ids[:300]:
        obs, info = env.reset(options={"task_id": task_id})
        answer, question = env.task.payload.answer, env.task.payload.question
        pattern = re.compile(rf"(?<![\d.,]){re.escape(answer)}(?![\d])")
        if len(answer) < 2 or pattern.search(question):
            continue  # too short to search for, or the number is in the question itself
        obs2, *_, info2 = env.step("not an action")
        texts = [obs, obs2] + [v for d in (info, info2) for v in d.values() if isinstance(v, str)]
        for text in texts:
            assert not pattern.search(text.replace(question, "")), (task_id, text)
        assert not FINAL_KEYS & set(info) and not FINAL_KEYS & set(info2)
        checked += 1
    assert checked > 200


def test_the_tool_cannot_read_the_bundled_answers_the_project_or_our_environment(monkeypatch):
    monkeypatch.setenv("WHALE_TEST_SECRET", "s3cr3t-value")
    env = custom_env()
    env.reset()
    path = bundled_path("gsm8k", "test.jsonl")
    obs, *_ = env.step(f"python: print(open({str(path)!r}).read()[:300])")
    assert "FileNotFoundError" in obs and "Janet" not in obs
    obs, *_ = env.step("python: import whale_envs")
    assert "ModuleNotFoundError" in obs
    obs, *_ = env.step("python: import os; print(dict(os.environ))")
    assert "HOME" in obs and "s3cr3t-value" not in obs and "WHALE_TEST_SECRET" not in obs


def test_parse_action_rules():
    assert parse_action("  python: print(1)") == ("python", "print(1)")
    assert parse_action("answer: 5 apples") == ("answer", "5 apples")
    assert parse_action("blah \\boxed{4} blah \\boxed{5}") == ("answer", "\\boxed{5}")
    assert parse_action("python: print('\\\\boxed{5}')")[0] == "python"  # a tool call may print a box
    with pytest.raises(ActionError):
        parse_action("42")
