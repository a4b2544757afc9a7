"""Red team, the trusted process: nothing an episode sends stalls it, exhausts it, becomes training
data or breaks its writers, and its clocks do not depend on how loaded the machine is.

Each class below was an attack that succeeded against an earlier engine:

* stalls: a loop on refused handle calls restarted the harness's clock, so the episode never ended;
  sizes (``n`` of ``sample``, stop lists, prompts, ``max_tokens``) were used before they were checked;
* training data: ``llm.choose(p, [text])`` was recorded as a model call whose completion was ``text``,
  and RSFT trained on it (text the model never sampled);
* output: a lone surrogate escape (``"\\ud800"``) passed the protocol and the trace writer crashed;
* load: time a message waited on a busy trusted side was charged to the harness as its compute.

Episodes run through the real worker (forked, sandboxed) with a scripted model, as in
``tests/sandbox/test_harness_worker.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import tracemalloc

import gymnasium as gym
import pytest

from harnesses.base import HarnessCallError
from harnesses.loader import harness_from_source
from harnesses.worker import parse_message
from tests.sandbox.test_harness_worker import (
    HEADER,
    MATH,
    MATH_TASKS,
    math_ids,
    reported,
    rollouts,
    unlinted,  # noqa: F401  (the fixture: a harness past the lint)
)
from whale_train.files import atomic_write_json
from whale_train.llm.scripted import ScriptedLLM
from whale_train.rollout import EpisodeLimits, RolloutConfig, run_rollouts
from whale_train.rollout.batcher import Batcher
from whale_train.rollout.episode import Episode
from whale_train.rollout.records import read_jsonl, write_jsonl
from whale_train.traces import read_episodes

# `make test` runs the tests that time calls side by side on one worker, one after another
pytestmark = pytest.mark.xdist_group("timing")


def harness(body: str) -> object:
    """A legal harness (it passes the lint) whose ``run`` is ``body``."""
    return harness_from_source(
        HEADER
        + "class H(Harness):\n    def run(self, env, llm):\n"
        + "".join(f"        {line}\n" for line in body.splitlines())
    )


def finished_within(seconds: float, fn):
    """``fn()``'s result, or a test failure if it has not returned after ``seconds`` (a stall)."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s: the trusted side is stalled"
    return out[0]


# ------------------------------------------------------------------------------------ 4. stalls


@pytest.mark.parametrize(
    "refused",
    ["env.reset()", "llm.complete('x', max_tokens=10**9)", "env.step('x' * 100000)"],
    ids=["reset-again", "too-many-tokens", "action-too-long"],
)
def test_a_loop_on_refused_calls_ends_as_a_timeout(refused):
    """Each refused call is answered at once; before, each answer restarted the harness's clock and the
    episode (and ``whale eval --episode-timeout 2``, ``whale check``) never ended."""
    loop = harness(
        f"env.reset()\nwhile True:\n    try:\n        {refused}\n    except Exception:\n        pass"
    )
    start = time.monotonic()
    trajs = finished_within(60, lambda: rollouts(loop, n=1, harness_seconds=1.0))
    assert trajs[0].failure == "timeout", trajs[0].error
    assert "without an answered call" in trajs[0].error
    assert time.monotonic() - start < 30


def test_the_hard_limit_ends_an_episode_whose_every_call_is_answered():
    """Answered calls restart the harness's clock; the episode's wall-clock limit nothing restarts."""
    busy = harness("env.reset()\nwhile True:\n    llm.complete('x')")
    trajs = finished_within(
        60, lambda: rollouts(busy, n=1, harness_seconds=5.0, episode_seconds=2.0, max_llm_calls=10**6)
    )
    t = trajs[0]
    assert t.failure == "timeout" and "hard limit" in t.error, t.error
    assert len(t.calls) > 10 and t.wall_seconds < 10


@pytest.fixture
def episode():
    env = gym.make(MATH, **MATH_TASKS)
    batcher = Batcher(ScriptedLLM(["ok"]))
    ep = Episode(env, MATH, math_ids(1)[0], 0, 0, batcher, "attack", EpisodeLimits())
    ep.call("reset", {})
    yield ep
    batcher.close()


def test_a_huge_n_is_refused_before_its_requests_are_built(episode):
    tracemalloc.start()
    try:
        with pytest.raises(HarnessCallError, match="asks for 10000000"):
            episode.call("sample", {"prompt": "x", "n": 10**7, "params": {}})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, f"{peak} bytes were built for a refused call"


@pytest.mark.parametrize(
    ("params", "why"),
    [
        ({"stop": ["a"] * 100_000}, "stop"),  # a backend checks each stop string at every token
        ({"stop": ["a" * 100_000]}, "stop"),
        ({"stop": [1]}, "stop"),
        ({"max_tokens": 2.5}, "max_tokens"),  # accepted before: the backend then failed, a "model error"
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": "1"}, "top_p"),
    ],
)
def test_sampling_parameters_are_checked_before_use(episode, params, why):
    with pytest.raises(HarnessCallError, match=why):
        episode.call("complete", {"prompt": "x", "params": params})
    assert episode.traj.calls == [] and episode._n_requests == 0


@pytest.mark.parametrize(
    ("method", "args"),
    [
        ("complete", {"prompt": "x" * 2_000_000}),
        ("sample", {"prompt": "x" * 100_000, "n": 16}),  # 1.6 M characters to render and encode
        ("complete_many", {"prompts": ["x" * 300_000] * 4}),
        ("complete", {"prompt": [{"role": "user", "content": "x" * 2_000_000}]}),
    ],
)
def test_prompts_over_the_size_limit_are_refused(episode, method, args):
    with pytest.raises(HarnessCallError, match="characters"):
        episode.call(method, {**args, "params": {}})
    assert episode._n_requests == 0


def test_a_refused_size_reaches_the_harness_as_a_clear_error():
    probe = harness(
        "env.reset()\n"
        "try:\n"
        "    llm.sample('x', 10**7)\n"
        "except Exception as exc:\n"
        "    env.step('report ' + str(exc))"
    )
    trajs = rollouts(probe, n=1)
    assert "this call asks for 10000000" in reported(trajs[0]), reported(trajs[0])


# ------------------------------------------------------------------------------------ 5. training data


def test_choose_and_score_are_never_training_data():
    """A one-option choose turned harness text into a "model completion" RSFT trained on; a choose of
    many options trained on the harness's options too. Only what the model sampled is trained on."""
    from transformers import AutoTokenizer

    from whale_train.llm import SHIPPED_MODEL
    from whale_train.rsft import RSFTConfig, accept, examples_from

    planted = "PLANTED harness text the model never sampled"
    probe = harness(
        "env.reset()\n"
        f"llm.choose('q', [{planted!r}])\n"
        f"llm.choose('q', ['x', {planted!r}])\n"
        f"llm.score('q', [{planted!r}])\n"
        "reply = llm.complete('sample this')\n"
        "env.step('answer: ' + reply)"
    )
    llm = ScriptedLLM(["7"], scorer=lambda _p, c: float("PLANTED" in c))
    trajs = rollouts(probe, n=1, llm=llm)
    t = trajs[0]
    assert [c.kind for c in t.calls] == ["choice", "choice", "score", "sample"], t.error
    assert t.calls[1].completion == planted and t.calls[1].completion_ids is None  # recorded, for reading
    tok = AutoTokenizer.from_pretrained(SHIPPED_MODEL)
    config = RSFTConfig(reward_threshold=0.0)
    examples = examples_from(accept(trajs, config), config, tok)
    assert [ex.completion_ids for ex in examples] == [tuple(t.calls[3].completion_ids)]  # the sampled "7"
    trained = [tok.decode(ex.completion_ids) for ex in examples]
    assert not any("PLANTED" in text for text in trained), trained


# ------------------------------------------------------------------------------------ 6. output


def test_parse_message_replaces_lone_surrogates():
    msg, why = parse_message(b'{"op": "call", "args": {"action": "a\\ud800", "\\udc00": ["\\ud83d\\ude00"]}}')
    assert why is None
    assert msg["args"] == {"action": "a\ufffd", "\ufffd": ["\U0001f600"]}  # a surrogate pair stays


def test_a_lone_surrogate_from_an_episode_is_recorded_and_written(unlinted, tmp_path):  # noqa: F811
    """A harness past the lint writes the escape itself; ``whale eval --out`` crashed writing it."""
    ref = unlinted(
        "env.reset()\n"
        "ch = env._call.__self__\n"
        'ch._out.write(\'{"op": "call", "method": "step", "args": {"action": "answer: \\\\ud800"}}\\n\')\n'
        "ch._out.flush()\n"
        "ch._in.readline()"
    )
    trajs = rollouts(ref, n=1)
    assert [s.action for s in trajs[0].steps] == ["answer: \ufffd"]
    write_jsonl(trajs, tmp_path / "traces.jsonl")
    assert [s.action for s in read_jsonl(tmp_path / "traces.jsonl")[0].steps] == ["answer: \ufffd"]


def test_writers_never_crash_on_a_lone_surrogate(tmp_path):
    """What reaches a writer by another road (a remote model's reply, an old record) is written too."""
    trajs = rollouts(harness("env.reset()\nenv.step('answer: 1')"), n=1)
    trajs[0].calls = []
    trajs[0].error = "x\ud800"
    write_jsonl(trajs, tmp_path / "traces.jsonl")
    assert read_jsonl(tmp_path / "traces.jsonl")[0].error == "x\ufffd"
    atomic_write_json(tmp_path / "record.json", {"text": "y\udfff"})  # the search's archive records
    assert json.loads((tmp_path / "record.json").read_text(encoding="utf-8")) == {"text": "y\ufffd"}


def test_whale_traces_reads_a_lone_surrogate_escape(tmp_path):
    """A traces file written by another tool (JSON's default escapes every non-ASCII character) may
    hold one: ``whale traces --show`` crashed printing it."""
    record = rollouts(harness("env.reset()\nenv.step('answer: 1')"), n=1)[0].to_dict()
    record["error"] = "boom \ud800"
    (tmp_path / "traces.jsonl").write_text(json.dumps(record) + "\n", encoding="ascii")
    [(_, _, episode)] = list(read_episodes(tmp_path / "traces.jsonl"))
    assert episode["error"] == "boom \ufffd"
    shown = subprocess.run(
        [sys.executable, "-m", "whale_train.cli", "traces", str(tmp_path), "--show", "1"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        timeout=120,
    )
    assert shown.returncode == 0 and "boom \ufffd" in shown.stdout, shown.stderr[-2000:]


def test_a_model_reply_with_a_lone_surrogate_reaches_the_harness():
    """A remote backend may return one; the reply could not be sent and the episode hung to a timeout."""
    probe = harness("env.reset()\nreply = llm.complete('q')\nenv.step('report ' + reply)")
    trajs = rollouts(probe, n=1, llm=ScriptedLLM(["7\ud800"]), harness_seconds=3.0)
    assert trajs[0].error is None and reported(trajs[0]) == "report 7\ufffd", trajs[0].error


# ------------------------------------------------------------------------------------ 8. load


def _outcomes(trajs) -> list[tuple]:
    return [(t.task_id, t.sample, t.reward, t.failure, [s.action for s in t.steps]) for t in trajs]


THREE_TURNS = "obs, info = env.reset()\nfor i in range(3):\n    reply = llm.complete(obs + str(i))\nenv.step('answer: ' + reply)"


def half_right(text: str) -> str:
    """The answer to "What is a +/- b?" when a is even, else a wrong one (computed here, never run)."""
    m = re.search(r"What is (\d+) ([+-]) (\d+)\?", text)
    if not m:
        return "none"
    a, op, b = int(m[1]), m[2], int(m[3])
    return str(a + b if op == "+" else a - b) if a % 2 == 0 else "-1"


def test_time_the_trusted_side_is_busy_is_not_the_harnesss():
    """The trusted side stops for 1.2 s after each finished episode (as a loaded one does): the calls
    the other episodes sent meanwhile waited on it, and that was charged to them as their compute."""

    def busy(_traj) -> None:
        time.sleep(1.2)

    config = RolloutConfig(k=1, concurrency=4, limits=EpisodeLimits(harness_seconds=1.0))
    trajs = run_rollouts(
        harness(THREE_TURNS),
        MATH,
        ScriptedLLM(half_right),
        math_ids(4),
        env_kwargs=MATH_TASKS,
        config=config,
        progress=busy,
    )
    assert [t.failure for t in trajs if t.failure == "timeout"] == [], [t.error for t in trajs]


def test_a_seeded_evaluation_is_the_same_on_a_saturated_machine():
    """The same seeded evaluation with a tight timeout, with the cores idle and then saturated by two
    busy processes for its whole duration: the same rewards, failures and actions, episode by episode."""

    def evaluate():
        config = RolloutConfig(k=2, seed=3, concurrency=4, limits=EpisodeLimits(harness_seconds=1.0))
        llm = ScriptedLLM(half_right)
        return _outcomes(
            run_rollouts(harness(THREE_TURNS), MATH, llm, math_ids(6), env_kwargs=MATH_TASKS, config=config)
        )

    idle = evaluate()
    burners = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2)]
    try:
        time.sleep(0.3)
        loaded = evaluate()
    finally:
        for p in burners:
            p.kill()
            p.wait()
    assert loaded == idle
    assert {o[3] for o in idle} == {"", "wrong_answer"}, idle  # no timeouts, some solved, some not
