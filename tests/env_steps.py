"""What the env tests check the same way in every domain: an invalid action is an error of its kind
that earns nothing and ends nothing."""

from __future__ import annotations

from typing import Any

import gymnasium as gym


def step_refused(env: gym.Env, action: str, kind: str, words: str, **reset: Any) -> tuple[str, str, dict]:
    """Reset ``env`` (``reset`` its keyword arguments) and step ``action``, which must be refused: reward
    0, neither terminated nor truncated, ``info["error_kind"] == kind``, ``words`` in the error and an
    observation that starts with ``Error:``. Returns the first observation, the one after the action
    and its info, for the domain's own checks."""
    obs0, _ = env.reset(**reset)
    obs, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["error_kind"] == kind and words in info["error"] and obs.startswith("Error: "), info
    return obs0, obs, info
