"""What a new user hit on first contact (issue 41), each fault pinned by a test that failed before its fix:
vector envs that cannot merge infos, a model error found only after a whole run, a report written over
a run's own, an env example that needed our source, harness and label names that change midway, Ctrl-C
noise, and listings that hid what they showed."""

from __future__ import annotations

import gymnasium as gym
import pytest

import whale_envs  # noqa: F401  (registers the envs)

# ------------------------------------------------------------------ 1. vector envs merge every info

MIXED = {
    "whale/Math-v0": ["answer: 5", "python: print(2+3)"],
    "whale/Chess-v0": ["e2e4", "not a move"],
    "whale/SearchQA-v0": ["answer: x", "search: capital"],
}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("env_id", sorted(MIXED))
def test_make_vec_merges_the_infos_of_envs_in_different_states(env_id, mode):
    """One env answers while the other calls a tool (or errs): Gymnasium merges their infos key by key,
    which fails when a key is None in one env and a dict in the other (math's ``last_tool`` was)."""
    envs = gym.make_vec(env_id, num_envs=2, vectorization_mode=mode)
    try:
        envs.reset(seed=0)
        for _ in range(2):
            _obs, _reward, _term, _trunc, info = envs.step(MIXED[env_id])
            assert list(info["task_id"]) and len(info["turn"]) == 2
    finally:
        envs.close()  # returns: an async env left waiting on a failed step used to hang here


def test_math_last_tool_is_a_dict_in_every_step():
    env = gym.make("whale/Math-v0")
    _obs, info = env.reset(seed=0)
    assert info["last_tool"] == {}
    _obs, *_rest, info = env.step("python: print(2+3)")
    assert info["last_tool"]["stdout"] == "5\n"
