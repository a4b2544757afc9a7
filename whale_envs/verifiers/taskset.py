"""WHALE's envs as a verifiers taskset: ``whale_verifiers`` (verifiers' loader imports it by that id).

Each task is one task of a registered WHALE env: its prompt is the env's first observation, and
``WhaleEnv`` plays it turn by turn, the model's reply being the env's action and the env's next
observation the next user turn, until the env ends the episode. The reward is the episode's total
reward by WHALE's own verifier (``whale_reward``); ``solved`` goes to the trace's info.

    vf-eval whale-verifiers --env.taskset.env whale/Chess-v0 -n 8 -m MODEL --client.base-url URL

The tasks come from the env's ``split`` (``test`` by default), in the env's order, so the same task
ids as ``whale eval --split test``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import verifiers.v1 as vf

from whale_envs import MATH_ID  # importing whale_envs registers the built-in envs

#: The system prompt of every task: the env's observations say what a valid reply is.
SYSTEM_PROMPT = "Solve the task. Each reply of yours is one action; follow the reply format the task states."


class WhaleTasksetConfig(vf.TasksetConfig):
    env: str = MATH_ID
    """The WHALE env (a registered Gymnasium id, or ``module:EnvId`` for a user's env)."""
    tasks: str | None = None
    """Its task source spec (``whale tasks --help``); None: the env's default."""
    split: str = "test"
    """The WHALE split the tasks come from (``all`` for every task)."""
    env_options: dict[str, Any] = {}
    """More keyword arguments of ``gym.make`` (``max_turns``, a source's options, ...)."""


class WhaleData(vf.TaskData):
    env: str
    task_id: str
    env_kwargs: dict[str, Any] = {}


class WhaleTask(vf.Task[WhaleData, vf.State, vf.TaskConfig]):
    """Scored by ``WhaleEnv`` while it plays the task (the env's reward is known when it ends)."""

    @property
    def key(self) -> str:
        return f"{self.data.env}:{self.data.task_id}"


def make_env(data: WhaleData) -> gym.Env:
    """The WHALE env of a task, as ``whale eval`` builds it (its checker off: it only wraps)."""
    return gym.make(data.env, disable_env_checker=True, **data.env_kwargs).unwrapped


class WhaleTaskset(vf.Taskset[WhaleTask, WhaleTasksetConfig]):
    def load(self) -> Iterator[WhaleTask]:
        c = self.config
        kwargs = {**c.env_options, "split": c.split, **({"tasks": c.tasks} if c.tasks else {})}
        env = gym.make(c.env, disable_env_checker=True, **kwargs).unwrapped
        for task_id in env.task_ids:
            obs, _ = env.reset(options={"task_id": task_id})
            data = WhaleData(
                id=task_id,
                name=task_id,
                prompt=obs,
                system_prompt=SYSTEM_PROMPT,
                env=c.env,
                task_id=task_id,
                env_kwargs=kwargs,
            )
            yield WhaleTask(data, c.task)


class WhaleEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())
    """The seat: the in-process chat harness (this module's), on the host (it runs no code)."""


class WhaleEnv(vf.Env[WhaleEnvConfig]):
    """Plays a ``WhaleTask`` against its WHALE env (see the module docstring)."""

    async def run(self, task: WhaleTask, agents: vf.Agents) -> None:
        env = make_env(task.data)
        obs, info = env.reset(options={"task_id": task.data.task_id})
        total, done = 0.0, False
        async with agents.agent.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                obs, reward, terminated, truncated, info = env.step(segment.last_reply)
                total += float(reward)
                if terminated or truncated:
                    done = True
                    break
                segment = await interaction.turn(obs)
        trace = interaction.trace
        trace.record_reward("whale_reward", total)
        trace.info["solved"] = bool(info.get("solved", False)) if done else False
        trace.info["turns"] = int(info.get("turn", 0))
