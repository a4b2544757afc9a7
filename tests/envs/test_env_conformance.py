"""Every registered env, with every task source that needs no file of the user's: gymnasium's
``check_env`` passes, arbitrary text never raises, and an invalid action changes nothing."""

from __future__ import annotations

import functools
import subprocess
import sys
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import whale_envs
from whale_envs.tasks import source_kinds


def _domain(env_id: str) -> str:
    return gym.spec(env_id).make().unwrapped.domain


def _cases() -> list[tuple[str, str]]:
    cases = []
    for env_id in sorted(whale_envs.ENVS):
        cases.append((env_id, "default"))
        cases += [
            (env_id, k.kind)
            for k in source_kinds(_domain(env_id))
            if not k.path_required and k.kind != "generated"
        ]
    return cases


CASES = _cases()


@functools.cache
def _env(env_id: str, tasks: str) -> gym.Env:
    return gym.make(env_id) if tasks == "default" else gym.make(env_id, tasks=tasks)


def test_every_domain_has_its_sources_registered():
    assert "whale/Chess-v0" in whale_envs.ENVS
    assert {k.kind for k in source_kinds("chess")} == {"generated", "lichess", "epd"}


@pytest.mark.parametrize(("env_id", "tasks"), CASES)
def test_check_env_passes(env_id, tasks):
    env = _env(env_id, tasks).unwrapped
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a gymnasium warning is a failure too
        check_env(env, skip_render_check=False)


@pytest.mark.parametrize(("env_id", "tasks"), CASES)
def test_same_seed_same_observations(env_id, tasks):
    a, b = gym.make(env_id) if tasks == "default" else gym.make(env_id, tasks=tasks), _env(env_id, tasks)
    first = [a.reset(seed=11)[0]] + [a.reset()[0] for _ in range(3)]
    second = [b.reset(seed=11)[0]] + [b.reset()[0] for _ in range(3)]
    assert first == second


NEAR_MISSES = [
    "e2e4",
    "Nf3",
    "O-O",
    "answer:",
    "answer: ",
    "search:",
    "search: ",
    "python:",
    "\\boxed{",
    "<move>",
]


@pytest.mark.parametrize(("env_id", "tasks"), CASES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    action=st.one_of(
        st.text(max_size=200),
        st.builds(lambda a, b: a + b, st.sampled_from(NEAR_MISSES), st.text(max_size=40)),
        st.binary(max_size=20),
        st.integers(),
        st.none(),
    )
)
def test_arbitrary_actions_never_raise(env_id, tasks, action):
    env = _env(env_id, tasks)
    obs0, info0 = env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step(action)
    assert env.observation_space.contains(obs)
    assert isinstance(reward, float) and isinstance(terminated, bool) and isinstance(truncated, bool)
    if info["error"] is None:
        return  # the text happened to be a valid action; nothing more to check
    assert reward == 0.0 and not terminated
    assert obs.startswith("Error: ") and len(info["error"]) > 10
    unchanged = {k: v for k, v in info.items() if k not in ("turn", "error", "error_kind")}
    assert unchanged == {k: v for k, v in info0.items() if k not in ("turn", "error", "error_kind")}
    assert obs.endswith(obs0.split("\n\n", 1)[-1]) or truncated  # the same state is shown again


def test_make_by_module_path_in_a_fresh_interpreter():
    code = (
        "import gymnasium as gym\n"
        "env = gym.make('whale_envs:whale/Chess-v0', tasks='lichess')\n"
        "obs, info = env.reset(seed=0)\n"
        "print(info['task_id'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip()


def test_step_after_the_end_and_before_reset():
    env = gym.make("whale/Chess-v0", tasks="epd", disable_env_checker=True).unwrapped
    with pytest.raises(gym.error.ResetNeeded):
        env.step("e2e4")
    env.reset(seed=0)
    while True:
        *_, terminated, truncated, _ = env.step("not a move")
        if terminated or truncated:
            break
    obs, reward, terminated, _, info = env.step("e2e4")
    assert "episode is over" in info["error"] and reward == 0.0 and terminated
