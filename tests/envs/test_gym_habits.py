"""What Gymnasium users do with an env: async vector envs, pickling, the spec's step limit, printing
the spaces, rendering the chess board as an image."""

from __future__ import annotations

import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest

import whale_envs

ENV_IDS = sorted(whale_envs.ENVS)


def test_async_vector_env_returns_the_real_observations():
    """Gymnasium reads a Text space's shared memory once; the envs' space reads it when looked at."""
    envs = gym.make_vec("whale/Math-v0", num_envs=2, vectorization_mode="async")
    try:
        obs, _info = envs.reset(seed=0)
        singles = [gym.make("whale/Math-v0").reset(seed=s)[0] for s in (0, 1)]
        assert list(obs) == singles  # the vector env seeds env i with seed + i
        obs, reward, *_ = envs.step(("answer: 3", "answer: 4"))
        assert all(0 < len(o) < 1000 and "\t" * 20 not in o for o in obs)
        assert reward.shape == (2,)
    finally:
        envs.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_envs_pickle_mid_episode_and_continue_identically(env_id):
    env = gym.make(env_id)
    env.reset(seed=3)
    clone = pickle.loads(pickle.dumps(env))
    twin = copy.deepcopy(env)
    for action in ("answer: 7", "e2e4", "search: river"):
        a, b, c = env.step(action), clone.step(action), twin.step(action)
        assert a[:4] == b[:4] == c[:4]
        if a[2] or a[3]:
            break
    assert len(pickle.dumps(env)) < 2_000_000  # the spaces pickle as their lengths, not their 63k characters


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_spec_max_episode_steps_is_the_turn_limit(env_id):
    env = gym.make(env_id)
    assert env.spec.max_episode_steps == env.unwrapped.turn_limit
    _obs, info = env.reset(seed=0)
    assert env.spec.max_episode_steps == info["max_turns"]
    steps = 0
    while True:
        steps += 1
        *_, terminated, truncated, _info = env.step("not an action at all")
        if terminated or truncated:
            break
    assert truncated and steps == env.spec.max_episode_steps
    assert gym.make(env_id, max_turns=3).spec.max_episode_steps == 3


def test_space_repr_is_short():
    env = gym.make("whale/Chess-v0")
    assert len(repr(env.observation_space)) < 200 and len(str(env.action_space)) < 200
    assert "32768" in repr(env.observation_space)


def test_chess_rgb_array_draws_the_board():
    env = gym.make("whale/Chess-v0", render_mode="rgb_array")
    env.reset(seed=0)
    image = env.render()
    assert image.shape == (400, 400, 3) and image.dtype == np.uint8
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 10  # squares, pieces, coordinates
    before = image.copy()
    legal = env.unwrapped.board.legal_moves
    env.step(next(iter(legal)).uci())
    assert not np.array_equal(before, env.render())
    assert "rgb_array" in env.metadata["render_modes"]
