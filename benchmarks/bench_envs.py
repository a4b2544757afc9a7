"""Env throughput: episodes (reset + steps) per second. Run with ``make bench``; ``make test`` runs each once."""

from __future__ import annotations

import gymnasium as gym
import pytest

import whale_envs  # noqa: F401


def _lichess_episodes(env, task_ids):
    for task_id in task_ids:
        env.reset(options={"task_id": task_id})
        puzzle = env.unwrapped.source.get(task_id).payload
        for move in puzzle.line[::2]:
            *_, terminated, truncated, _ = env.step(move)
            if terminated or truncated:
                break


@pytest.mark.benchmark(group="env")
def test_chess_lichess_reset_step(benchmark):
    env = gym.make("whale/Chess-v0", tasks="lichess", split="test")
    ids = env.unwrapped.task_ids[:50]
    benchmark(_lichess_episodes, env, ids)


@pytest.mark.benchmark(group="env")
def test_chess_invalid_action_step(benchmark):
    env = gym.make("whale/Chess-v0", tasks="lichess", max_turns=10_000)
    env.reset(seed=0)
    benchmark(env.step, "not a move")
