"""The rollout engine: rewards flow from the env, every call is recorded, the same seed gives the same
rollouts whatever the batching, and the metrics are right."""

from __future__ import annotations

import re

import chess
import gymnasium as gym
import pytest

import whale_envs  # noqa: F401
from harnesses.loader import load_harness
from whale_train.llm.hf import TransformersLLM
from whale_train.llm.scripted import ScriptedLLM
from whale_train.rollout import (
    EnvStep,
    RolloutConfig,
    Trajectory,
    categorize,
    read_jsonl,
    run_rollouts,
    summarize,
    write_jsonl,
)

LICHESS = {"tasks": "lichess", "split": "test"}


def lichess_oracle(chat: bool = True) -> ScriptedLLM:
    """A model that knows the Lichess solutions (the test is trusted; the harness is not)."""
    env = gym.make("whale/Chess-v0", **LICHESS).unwrapped
    answers = {}
    for task_id in env.task_ids:
        puzzle = env.source.get(task_id).payload
        board = puzzle.start_board()
        for i, move in enumerate(puzzle.line):
            if i % 2 == 0:
                answers[board.fen()] = move
            board.push(chess.Move.from_uci(move))

    def reply(prompt: str) -> str:
        fen = re.search(r"FEN: (\S+ \S+ \S+ \S+ \S+ \S+)", prompt).group(1)
        return f"<move>{answers[fen]}</move>"

    return ScriptedLLM(reply, chat=chat)


@pytest.mark.parametrize("trusted", [True, False])
def test_an_oracle_model_under_h0_solves_everything(trusted):
    ids = gym.make("whale/Chess-v0", **LICHESS).unwrapped.task_ids[:30]
    trajs = run_rollouts(
        load_harness("chess_puzzles/h0"),
        "whale/Chess-v0",
        lichess_oracle(),
        ids,
        env_kwargs=LICHESS,
        config=RolloutConfig(k=2, trusted=trusted, concurrency=8),
    )
    assert len(trajs) == 60 and [t.task_id for t in trajs[:2]] == [ids[0], ids[0]]
    assert all(t.solved and t.reward == 1.0 and t.failure == "" for t in trajs)
    summary = summarize(trajs)
    assert summary["mean"] == summary["pass_at_k"] == 1.0 and summary["k"] == 2
    t = trajs[0]
    assert len(t.calls) == len(t.steps) >= 1  # one model call per move
    assert t.calls[0].kind == "sample" and t.calls[0].completion.startswith("<move>")
    assert t.final_info["solved"] and "line" in t.final_info["solution"]


def test_same_seed_same_rollouts_whatever_the_batching(fresh_model_dir):
    llm = TransformersLLM(fresh_model_dir)
    ids = gym.make("whale/Chess-v0", split="test").unwrapped.task_ids[:6]
    h0 = load_harness("chess_puzzles/h0")

    def go(seed, concurrency):
        config = RolloutConfig(k=2, seed=seed, concurrency=concurrency, trusted=True)
        trajs = run_rollouts(h0, "whale/Chess-v0", llm, ids, config=config)
        return [[c.completion_ids for c in t.calls] for t in trajs]

    a = go(1, 12)
    assert a == go(1, 3)  # different batch compositions, same samples
    assert a != go(2, 12)


def test_trajectories_round_trip_through_jsonl(tmp_path):
    trajs = run_rollouts(
        load_harness("chess_puzzles/h0"),
        "whale/Chess-v0",
        lichess_oracle(),
        gym.make("whale/Chess-v0", **LICHESS).unwrapped.task_ids[:3],
        env_kwargs=LICHESS,
        config=RolloutConfig(trusted=True),
    )
    path = write_jsonl(trajs, tmp_path / "traces.jsonl")
    assert [t.to_dict() for t in read_jsonl(path)] == [t.to_dict() for t in trajs]


def _traj(task, solved, difficulty=1, failure_steps=None):
    t = Trajectory(task, 0, 0, "h", "env", 0, difficulty=difficulty, solved=solved, reward=float(solved))
    t.steps = failure_steps or [EnvStep("x", "", float(solved), True, False)]
    t.failure = categorize(t)
    return t


def test_summarize_mean_se_pass_at_k_and_breakdown():
    trajs = [_traj("a", True), _traj("a", False), _traj("b", False, 2), _traj("b", False, 2)]
    s = summarize(trajs)
    assert s["tasks"] == 2 and s["k"] == 2
    assert s["mean"] == pytest.approx(0.25)
    assert s["se"] == pytest.approx(0.25)  # per-task means 0.5, 0.0: sd 0.3536 / sqrt(2)
    assert s["pass_at_k"] == pytest.approx(0.5)
    assert s["by_difficulty"] == {"1": {"tasks": 1, "mean": 0.5}, "2": {"tasks": 1, "mean": 0.0}}
    assert s["failures"] == {"wrong_answer": 3}


def test_failure_categories():
    malformed = [
        EnvStep("?", "", 0.0, False, False, "bad", "malformed"),
        EnvStep("?", "", 0.0, False, True, "bad", "malformed"),
    ]
    assert _traj("a", False, failure_steps=malformed).failure == "parse_error"
    illegal = [EnvStep("e2e5", "", 0.0, False, True, "illegal", "illegal")]
    assert _traj("a", False, failure_steps=illegal).failure == "illegal_action"
    t = _traj("a", False)
    t.error = "timeout: ..."
    assert categorize(t) == "timeout"
    t.error = "harness_error: boom"
    assert categorize(t) == "harness_error"


@pytest.mark.slow
def test_the_worker_runs_the_tool_calls_of_different_episodes_at_once():
    """Env steps of untrusted episodes are served off the thread that reads the worker: the sandboxed
    tool calls of four episodes overlap in the sandbox pool (they used to run one after another)."""
    from whale_envs import workers

    size = workers.pool("sandbox").workers
    pool = workers.configure("sandbox", 2)  # a fresh pool: its counters are this test's
    try:
        llm = ScriptedLLM(lambda prompt: "python: import time; time.sleep(0.5); print(7)")
        ids = gym.make("whale/Math-v0", split="test").unwrapped.task_ids[:4]
        trajs = run_rollouts(
            load_harness("math/h0"), "whale/Math-v0", llm, ids, config=RolloutConfig(concurrency=4)
        )
        assert all(t.error is None for t in trajs)
        assert any(s.action.startswith("python:") for t in trajs for s in t.steps)
        assert pool.stats()["max_running"] == 2
    finally:
        workers.configure("sandbox", size)


def test_rollouts_in_a_reusing_workers_block_share_a_worker_and_give_the_same_trajectories(monkeypatch):
    """``reusing_workers`` (a run's units, ``check_harness``'s evaluation per stand-in): the block's
    rollouts of one harness with the same settings start one sandboxed worker, not one each; another
    model flag gets a worker of its own; the trajectories are those of rollouts each with a fresh
    worker; every worker of the block has ended when the block ends; an inner block keeps its own."""
    from whale_train.rollout import reusing_workers, workers

    started = []
    spawn = workers.spawn_python
    monkeypatch.setattr(
        workers, "spawn_python", lambda *a, **kw: started.append(spawn(*a, **kw)) or started[-1]
    )
    harness = load_harness("chess_puzzles/h0")
    ids = gym.make("whale/Chess-v0", **LICHESS).unwrapped.task_ids[:6]

    def rollouts(chat: bool = True) -> list:
        oracle = lichess_oracle(chat)
        config = RolloutConfig(k=2, concurrency=4)
        trajs = run_rollouts(harness, "whale/Chess-v0", oracle, ids, env_kwargs=LICHESS, config=config)
        return [(t.task_id, t.reward, [s.action for s in t.steps]) for t in trajs]

    fresh = [rollouts(), rollouts()]
    assert len(started) == 2
    started.clear()
    with reusing_workers():
        shared = [rollouts(), rollouts(), rollouts(chat=False), rollouts()]
        assert len(started) == 2  # one for the chat flag, one without it
        assert all(p.poll() is None for p in started)  # kept for the block's next rollout
    assert shared[:2] == fresh and shared[3] == fresh[0] and all(r for _, r, _ in shared[2])
    assert all(p.poll() is not None for p in started)  # ended (and reaped) with the block
    started.clear()
    with reusing_workers():
        assert rollouts() == fresh[0] and len(started) == 1
        with reusing_workers():  # an inner block keeps workers of its own
            assert rollouts() == fresh[0] and len(started) == 2
        assert started[1].poll() is not None and started[0].poll() is None
        assert rollouts() == fresh[0] and len(started) == 2  # the outer block's worker again
