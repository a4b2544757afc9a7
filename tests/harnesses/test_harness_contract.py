"""Harness code is untrusted: validation rejects the dangerous, the worker contains the rest,
and one bad harness never stops an evaluation."""

from __future__ import annotations

import pytest

from harnesses.loader import harness_from_source, load_harness, shipped_harnesses
from harnesses.validate import HarnessValidationError, load_class, validate_source
from whale_train.check import check_harness
from whale_train.llm.scripted import NullLLM, ScriptedLLM
from whale_train.rollout import EpisodeLimits, RolloutConfig, run_rollouts

HEADER = "from harnesses.base import Harness\n"
ENV_ID = "whale/Chess-v0"
TASKS = {"tasks": "lichess", "split": "test"}


def chess_ids(n: int) -> list[str]:
    import gymnasium as gym

    return gym.make(ENV_ID, **TASKS).unwrapped.task_ids[:n]


def run(source: str, *, n: int = 4, k: int = 1, llm=None, **limits):
    """``source`` on ``n`` chess tasks under the default episode limits and ``limits``. The harness's
    time limit is wall-clock from the episode's start, so only the test of a looping harness sets a
    short one: under a loaded CI, an honest episode's start alone has taken more than 1.5 s."""
    ref = harness_from_source(source, "candidate")
    config = RolloutConfig(k=k, concurrency=4, limits=EpisodeLimits(**limits))
    return run_rollouts(ref, ENV_ID, llm or NullLLM("random"), chess_ids(n), env_kwargs=TASKS, config=config)


# ------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("import os\n" + HEADER + "class H(Harness): pass\n", "import of 'os' is not allowed"),
        ("import chess\n" + HEADER + "class H(Harness): pass\n", "import of 'chess' is not allowed"),
        (
            "from sympy import solve\n" + HEADER + "class H(Harness): pass\n",
            "import from 'sympy' is not allowed",
        ),
        ("import subprocess\n" + HEADER + "class H(Harness): pass\n", "not allowed"),
        (
            HEADER + "class H(Harness):\n    def run(self, env, llm):\n        env._env.task\n",
            "private attribute '_env'",
        ),
        (
            HEADER + "class H(Harness):\n    def run(self, env, llm):\n        env.__dict__\n",
            "'__dict__' is not allowed",
        ),
        (
            HEADER + "class H(Harness):\n    def run(self, env, llm):\n        ().__class__.__bases__\n",
            "'__bases__' is not allowed",
        ),
        (
            HEADER + "class H(Harness):\n    def run(self, env, llm):\n        open('/etc/passwd')\n",
            "'open' is not allowed",
        ),
        (
            HEADER + "class H(Harness):\n    def run(self, env, llm):\n        eval('1')\n",
            "'eval' is not allowed",
        ),
        (
            HEADER + "class H(Harness):\n    def run(self, env, llm):\n        getattr(env, 'x')\n",
            "'getattr'",
        ),
        (HEADER + "x = '{0.x}'.format_map({})\nclass H(Harness): pass\n", "'format_map'"),
        ("from harnesses import base\nclass H(base.Harness): pass\n", "import from 'harnesses'"),
        ("def f(:\n", "syntax error"),
        (HEADER + "class A(Harness): pass\nclass B(Harness): pass\n", "several harness classes"),
        ("import json\n", "no harness class"),
    ],
)
def test_validation_rejects_with_the_rule_and_line(source, why):
    with pytest.raises(HarnessValidationError, match=why):
        validate_source(source, "h.py")


def test_harness_named_explicitly_and_building_on_a_shipped_one():
    source = HEADER + "class A(Harness): pass\nclass B(A): pass\nHARNESS = B\n"
    assert validate_source(source).class_name == "B"
    source = "from harnesses.chess_puzzles.h0 import ChessH0\nclass Mine(ChessH0):\n    max_tokens = 8\n"
    assert validate_source(source).class_name == "Mine"


def test_module_views_do_not_lead_to_os():
    source = (
        "import json\n" + HEADER + "class H(Harness):\n    def run(self, env, llm):\n"
        "        j = json\n        j.codecs\n"  # an alias: the lint cannot follow it, the view has no codecs
    )
    cls = load_class(source, restricted=True)
    with pytest.raises(AttributeError):
        cls().run(None, None)


def test_every_shipped_harness_validates():
    names = shipped_harnesses()
    assert {n.split("/")[0] for n in names} == {"chess_puzzles", "generic", "math", "search_qa"}
    for name in names:
        ref = load_harness(name)
        assert ref.shipped and ref.class_name


def test_trusted_execution_only_for_shipped_harnesses(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(HEADER + "class H(Harness): pass\n")
    ref = load_harness(path)
    assert not ref.shipped
    with pytest.raises(HarnessValidationError, match="only for harnesses shipped"):
        ref.load_trusted()


# ------------------------------------------------------------------------------------ containment


LOOPS = (
    HEADER
    + "class H(Harness):\n    def run(self, env, llm):\n        env.reset()\n        while True:\n            pass\n"
)
HOG = (
    HEADER
    + "class H(Harness):\n    def run(self, env, llm):\n        env.reset()\n        x = bytearray(10 * 1024 ** 3)\n"
)
RAISES = HEADER + "class H(Harness):\n    def run(self, env, llm):\n        raise ValueError('boom')\n"
RESETS = (
    HEADER + "class H(Harness):\n    def run(self, env, llm):\n        env.reset()\n        env.reset()\n"
)
CHATTY = (
    HEADER
    + "class H(Harness):\n    def run(self, env, llm):\n        env.reset()\n        while True:\n            llm.complete('x')\n"
)


@pytest.mark.slow
def test_a_harness_that_loops_forever_times_out_and_the_run_goes_on():
    trajs = run(LOOPS, n=3, harness_seconds=1.5)
    assert len(trajs) == 3
    assert {t.failure for t in trajs} == {"timeout"}
    assert all("computed for more than 1.5 s" in t.error for t in trajs)
    good = run(load_harness("chess_puzzles/h0").source, n=3)  # the next evaluation is unaffected
    assert all(t.failure in ("parse_error", "illegal_action") for t in good), [t.error for t in good]


def test_a_harness_that_allocates_10_gb_is_contained():
    trajs = run(HOG, n=2)
    assert len(trajs) == 2
    assert all(t.failure == "harness_error" for t in trajs)
    assert all("MemoryError" in t.error or "memory" in t.error for t in trajs)


def test_exceptions_reset_twice_and_call_limits_are_recorded_per_episode():
    trajs = run(RAISES, n=2)
    assert all(t.failure == "harness_error" and "ValueError: boom" in t.error for t in trajs)
    trajs = run(RESETS, n=2)
    assert all("may be called once per episode" in t.error for t in trajs)
    trajs = run(CHATTY, n=2, max_llm_calls=5)
    assert all("LLM call limit reached (5" in t.error and len(t.calls) == 5 for t in trajs)


def test_worker_cannot_see_the_project_or_the_network():
    probe = (
        HEADER
        + "import json\n"
        + "class H(Harness):\n"
        + "    def run(self, env, llm):\n"
        + "        obs, info = env.reset()\n"
        + "        llm.complete(json.dumps(sorted(info)))\n"
        + "        env.step('e2e4')\n"
    )
    seen = []
    trajs = run(probe, n=1, llm=ScriptedLLM(lambda text: seen.append(text) or ""))
    assert trajs[0].error is None
    assert "solution" not in seen[0] and "fen" in seen[0]  # the harness sees public info only


def test_check_harness_flags_a_harness_that_never_calls_the_model():
    first_move = (
        HEADER
        + "class H(Harness):\n"
        + "    def run(self, env, llm):\n"
        + "        obs, info = env.reset()\n"
        + "        while True:\n"
        + "            obs, r, te, tr, info = env.step(info['legal_moves_uci'][0])\n"
        + "            if te or tr:\n"
        + "                return\n"
    )
    report = check_harness(harness_from_source(first_move), ENV_ID, n_tasks=8)
    assert not report.ok
    assert any("no LLM call recorded" in p for p in report.problems)


def test_check_harness_rejects_a_math_solver():
    solver = (
        HEADER
        + "import re\n"
        + "class Adder(Harness):\n"
        + "    def run(self, env, llm):\n"
        + "        obs, info = env.reset()\n"
        + "        llm.complete('hi')\n"
        + "        nums = [int(n) for n in re.findall(r'\\d+', info['question'])]\n"
        + "        env.step(f'answer: {sum(nums)}')\n"
    )
    report = check_harness(
        harness_from_source(solver),
        "whale/Math-v0",
        env_kwargs={"tasks": "generated?families=arithmetic&difficulty=1"},
    )
    assert not report.ok
    assert any(p.startswith("solver:") for p in report.problems), report


@pytest.mark.parametrize("name", shipped_harnesses())
def test_every_seed_harness_passes_check_harness(name):
    env_id = {
        "chess_puzzles": "whale/Chess-v0",
        "generic": "whale/ReasoningGym-v0",
        "math": "whale/Math-v0",
        "search_qa": "whale/SearchQA-v0",
    }[name.split("/")[0]]
    report = check_harness(name, env_id, n_tasks=8)
    assert report.ok, str(report)
    assert report.episodes == 48  # 8 tasks x 2 samples x 3 stand-in models
