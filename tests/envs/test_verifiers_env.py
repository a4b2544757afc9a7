"""verifiers (the real package, v1 API) and WHALE both ways.

* ``whale/Verifiers-v0``: a taskset written here from verifiers' public API alone, scored by its own
  reward, runs as a WHALE env (one reply per step, multi-turn included), under ``whale eval`` with
  ``generic/h0`` and ``whale train``; WHALE's keyed split applies over its tasks.
* ``whale_verifiers``: verifiers' own loader and ``vf-eval`` run ``whale/Math-v0`` and ``whale/Chess-v0``
  against a local OpenAI-compatible server (``transformers serve`` on the shipped model); replaying the
  same completions through ``whale eval`` gives the same reward on every task.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import whale_envs
from tests.http_fake import send_json
from tests.lazy import LazyModule
from tests.small_train import run_train, small_train_config
from tests.train.test_trainer import MODEL, units
from whale_envs.tasks import TaskSourceError
from whale_train.cli import main
from whale_train.rollout.episode import harness_view

#: verifiers.v1 (the envs extra: pip install 'whale-harness[envs]'), imported by the first test using it
vf = LazyModule("verifiers.v1")

VENV_BIN = Path(sys.executable).parent

#: A taskset as its author writes it, from verifiers' public API alone: the reward is its own.
ARITH = """
import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: int


class ArithTask(vf.Task[ArithData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply.strip() == str(self.data.answer) else 0.0


class ArithConfig(vf.TasksetConfig):
    num_tasks: int = 12
    subset: str = "train"


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self):
        start = 0 if self.config.subset == "train" else 1000
        for i in range(start, start + self.config.num_tasks):
            prompt = f"What is {i} + {i + 3}? Reply with the number only."
            yield ArithTask(ArithData(id=f"{self.config.subset}-{i}", prompt=prompt, answer=2 * i + 3), self.config.task)


__all__ = ["ArithTaskset"]
"""

#: A multi-turn taskset: its own Env asks a follow-up question after the model's first reply.
DIALOG = """
import verifiers.v1 as vf


class DialogData(vf.TaskData):
    a: int


class DialogTask(vf.Task[DialogData, vf.State, vf.TaskConfig]):
    pass


class DialogEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class DialogEnv(vf.Env[DialogEnvConfig]):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as interaction:
            first = await interaction.turn()
            second = await interaction.turn("Now double your answer. Reply with the number only.")
        right = first.last_reply == str(task.data.a + 1) and second.last_reply == str(2 * (task.data.a + 1))
        interaction.trace.record_reward("both_right", float(right))


class DialogTaskset(vf.Taskset[DialogTask, vf.TasksetConfig]):
    def load(self):
        for a in range(6):
            yield DialogTask(DialogData(id=f"d{a}", prompt=f"What is {a} + 1? Reply with the number only.", a=a))


__all__ = ["DialogEnv", "DialogTaskset"]
"""

#: A taskset whose tasks need a container: refused in one line.
BOXED = """
import verifiers.v1 as vf


class BoxTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    NEEDS_CONTAINER = True


class BoxTaskset(vf.Taskset[BoxTask, vf.TasksetConfig]):
    def load(self):
        yield BoxTask(vf.TaskData(prompt="ls /"))


__all__ = ["BoxTaskset"]
"""

TASKSETS = {"whale_test_arith": ARITH, "whale_test_dialog": DIALOG, "whale_test_boxed": BOXED}
ENV = "whale/Verifiers-v0"


@pytest.fixture(scope="module", autouse=True)
def tasksets(tmp_path_factory):
    """The tasksets above, installed as verifiers expects (an importable top-level module each)."""
    folder = tmp_path_factory.mktemp("tasksets")
    for name, source in TASKSETS.items():
        (folder / f"{name}.py").write_text(source)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


def _sum(text: str) -> int:
    a, b = map(int, re.search(r"What is (\d+) \+ (\d+)", text).groups())
    return a + b


# ------------------------------------------------------------------------------------ the env itself


def test_a_taskset_s_own_reward_scores_a_right_reply_1_and_a_wrong_one_0():
    env = gym.make(ENV, taskset="whale_test_arith", taskset_args={"num_tasks": 6})
    for shift, reward in ((0, 1.0), (1, 0.0)):
        obs, info = env.reset(options={"task_id": "train-4"})
        assert obs == "What is 4 + 7? Reply with the number only." and info["turn"] == 0
        assert "11" not in json.dumps(harness_view(info))  # the answer (task data) never shows
        obs, r, terminated, truncated, info = env.step(str(_sum(obs) + shift))
        assert (r, terminated, truncated) == (reward, True, False)
        assert info["solved"] is (reward == 1.0) and info["rewards"] == {"correct": reward}
    env.close()


def test_multi_turn_the_taskset_s_user_turn_is_the_next_observation():
    env = gym.make(ENV, taskset="whale_test_dialog").unwrapped
    obs, _ = env.reset(options={"task_id": "d2"})
    assert obs.startswith("What is 2 + 1?")
    obs, r, terminated, _, _ = env.step("3")
    assert (obs, r, terminated) == ("Now double your answer. Reply with the number only.", 0.0, False)
    _, r, terminated, _, info = env.step("6")
    assert (r, terminated, info["rewards"]) == (1.0, True, {"both_right": 1.0})
    # out of turns: the env truncates and abandons the taskset's episode; the next reset starts afresh
    short = gym.make(ENV, taskset="whale_test_dialog", max_turns=1).unwrapped
    short.reset(options={"task_id": "d1"})
    _, r, terminated, truncated, info = short.step("2")
    assert (r, terminated, truncated, info["solved"]) == (0.0, False, True, False)
    obs, _ = short.reset(options={"task_id": "d0"})
    assert obs.startswith("What is 0 + 1?")


def test_gymnasium_s_checker_passes():
    env = gym.make(ENV, taskset="whale_test_arith", taskset_args={"num_tasks": 6}).unwrapped
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env, skip_render_check=True)


def test_whale_s_keyed_split_applies_and_a_taskset_s_own_eval_set_is_a_source_of_its_own():
    args = {"taskset": "whale_test_arith", "taskset_args": {"num_tasks": 40}}
    ids = {s: set(gym.make(ENV, split=s, **args).unwrapped.task_ids) for s in ("train", "harness", "test")}
    assert (
        ids["train"]
        and ids["test"]
        and not (ids["train"] & ids["test"])
        and not (ids["harness"] & ids["test"])
    )
    assert set().union(*ids.values()) == {f"train-{i}" for i in range(40)}
    # the harness is shown the same of a task whichever split the env was built on (the id is opaque)
    views = []
    for split in ("all", next(s for s, v in ids.items() if "train-7" in v)):
        obs, info = gym.make(ENV, split=split, **args).reset(options={"task_id": "train-7"})
        views.append((obs, harness_view(info)))
    assert views[0] == views[1] and "train-7" not in json.dumps(views[0])
    # the taskset's own eval set: spec options are taskset args
    evals = gym.make(ENV, taskset="whale_test_arith", tasks="taskset?subset=eval&num_tasks=5").unwrapped
    assert evals.task_ids == [f"eval-{i}" for i in range(1000, 1005)]


def test_a_taskset_that_cannot_run_here_says_why_in_one_line():
    cases = {
        "no_such_taskset_xyz": "not installed",
        "whale_test_boxed": "need a container",
        None: "needs taskset=ID",
    }
    for taskset, words in cases.items():
        with pytest.raises(TaskSourceError) as err:
            gym.make(ENV, taskset=taskset)
        assert words in str(err.value) and "\n" not in str(err.value)


def test_textarena_the_bundled_taskset_needs_nltk_data_it_downloads_at_load():
    """verifiers' textarena taskset (its five games) loads NLTK's ``words`` corpus, which it downloads
    from the NLTK data server on first use; no package on the index ships it, so offline it cannot
    load, and the env says so in one line."""
    with pytest.raises(TaskSourceError) as err:
        gym.make(ENV, taskset="textarena", taskset_args={"game": "Wordle-v0"}, size=2)
    message = str(err.value)
    assert "\n" not in message and ("'words' not found" in message or "nltk" in message.lower()), message


# ------------------------------------------------------------------------------ whale eval / train


class ChatServer:
    """An OpenAI-compatible server on 127.0.0.1 whose replies are ``reply(prompt text)``."""

    def __init__(self, reply: Callable[[str], str]):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                send_json(self, 200, {"data": [{"id": "fake", "object": "model"}]})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if "messages" in body:
                    text = "\n".join(str(m.get("content") or "") for m in body["messages"])
                    message = {"role": "assistant", "content": reply(text)}
                    choice = {"index": 0, "message": message, "finish_reason": "stop"}
                else:
                    choice = {"index": 0, "text": reply(str(body.get("prompt"))), "finish_reason": "stop"}
                server.prompts.append(body)
                send_json(
                    self, 200, {"id": "x", "object": "chat.completion", "choices": [choice], "usage": {}}
                )

        self.prompts: list[dict] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _whale_eval(tmp_path: Path, server: ChatServer, *env_args: str, limit: int = 4) -> dict:
    out = tmp_path / f"eval-{time.monotonic_ns()}"
    argv = ["eval", "--env", *env_args, "--harness", "generic/h0", "--backend", "openai"]
    argv += [
        "--base-url",
        server.url,
        "--model",
        "fake",
        "--limit",
        str(limit),
        "--k",
        "1",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    results["traces"] = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    return results


@pytest.mark.slow
def test_whale_eval_with_generic_h0_scores_by_the_taskset_s_reward(tmp_path):
    env = [ENV, "--env-option", "taskset=whale_test_arith", "--env-option", "taskset_args={num_tasks: 24}"]
    for shift, mean in ((0, 1.0), (1, 0.0)):
        server = ChatServer(lambda text, shift=shift: str(_sum(text) + shift))
        try:
            results = _whale_eval(tmp_path, server, *env, "--split", "all")
        finally:
            server.close()
        assert results["mean"] == mean and len(results["traces"]) == 4 and not results["errors"]


@pytest.mark.slow
def test_whale_train_on_a_verifiers_taskset_reaches_a_harness_phase(tmp_path):
    env_options = {"taskset": "whale_test_arith", "taskset_args": {"num_tasks": 40}}
    config = small_train_config(
        "verifiers-arith", ENV, budget=24, tasks=4, env_options=env_options, harness="generic/h0", model=MODEL
    )
    phases = {u["phase"] for u in units(run_train(tmp_path, config))}
    assert "harness" in phases, phases


# ----------------------------------------------------------- WHALE's envs under verifiers' own eval


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served():
    """``transformers serve`` on the shipped model: its OpenAI base URL and the model name it serves."""
    port = free_port()
    cmd = [str(VENV_BIN / "transformers"), "serve", MODEL, "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read()[-2000:]
                assert time.monotonic() < deadline, "transformers serve did not come up in 300 s"
                time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1", MODEL
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _vf_eval(served, env_id: str, n: int, out: Path) -> list:
    """verifiers' own CLI (``vf-eval``, its loader finding ``whale_verifiers`` by id): its episodes."""
    url, model = served
    cmd = [str(VENV_BIN / "vf-eval"), "whale-verifiers", "--env.taskset.env", env_id, "-n", str(n)]
    cmd += ["-m", model, "--client.base-url", url, "--client.api-key-var", "WHALE_TEST_KEY"]
    cmd += [
        "--sampling.max-tokens",
        "24",
        "--sampling.temperature",
        "1.0",
        "--no-push",
        "--no-rich",
        "-o",
        str(out),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    (traces,) = out.glob("*/traces.jsonl")
    return [vf.WireEpisode.model_validate_json(line) for line in traces.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize(("env_id", "n"), [("whale/Math-v0", 4), ("whale/Chess-v0", 3)])
def test_verifiers_eval_runs_whale_envs_and_replayed_rewards_equal_whale_eval_s(served, env_id, n, tmp_path):
    episodes = _vf_eval(served, env_id, n, tmp_path / "vf")
    assert len(episodes) == n and all(e.ok for e in episodes), [e.errors for e in episodes]
    rewards, replies = {}, {}
    for episode in episodes:
        (trace,) = episode.traces
        rewards[episode.task.data.task_id] = trace.reward
        messages = trace.messages
        for i, m in enumerate(messages):  # each observation -> the completion that answered it
            if m.role == "user" and i + 1 < len(messages) and messages[i + 1].role == "assistant":
                replies[str(m.content)] = messages[i + 1].content or ""
    assert replies and all(isinstance(r, float) for r in rewards.values())

    def replay(text: str) -> str:
        seen = [obs for obs in replies if obs in text]
        assert seen, f"no recorded completion for the prompt {text[-300:]!r}"
        return replies[max(seen, key=len)]

    server = ChatServer(replay)
    try:
        results = _whale_eval(tmp_path, server, env_id, "--split", "test", limit=n)
    finally:
        server.close()
    ours = {t["task_id"]: t["reward"] for t in results["traces"]}
    assert ours == rewards


def test_verifiers_loader_finds_whale_s_taskset_harness_and_env_by_id():
    config = vf.resolve_env_config({"taskset": {"id": "whale-verifiers", "env": whale_envs.CHESS_ID}})
    env = vf.load_environment(config)
    assert type(env).__name__ == "WhaleEnv" and config.agent_harnesses()["agent"].id == "whale-verifiers"
    first = next(iter(env.taskset.take(1)))
    assert first.data.env == whale_envs.CHESS_ID and first.data.prompt.startswith("Chess puzzle.")
    assert first.data.task_id == gym.make(whale_envs.CHESS_ID, split="test").unwrapped.task_ids[0]
