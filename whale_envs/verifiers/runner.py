"""Running verifiers episodes for a Gymnasium env: one service per taskset, shared by the process.

A ``TasksetRunner`` holds a verifiers ``Env`` built by verifiers' own loader (``vf.load_environment``:
the taskset's own ``Env`` when its package exports one, else ``SingleAgentEnv``), with every seat
played by the in-process chat harness (``whale_verifiers``) in the local subprocess runtime, and the
model client pointed at the policy bridge. It runs on an event loop of its own, in a daemon thread;
``start(task)`` runs one episode there and returns its ``EpisodeChannel``, on which the env reads the
model calls and the finished episode.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import queue
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import verifiers.v1 as vf

from whale_envs.verifiers.bridge import Bridge, ModelCall

#: The harness id every seat plays with: the top-level module ``whale_verifiers`` (verifiers' loader
#: imports a harness by its id), which exports ``ChatHarness``.
HARNESS_ID = "whale_verifiers"
#: The env variable the bridge's (unused) API key is read from; any other name than verifiers' default
#: keeps it from reading a Prime CLI config.
KEY_VAR = "WHALE_VERIFIERS_BRIDGE_KEY"
#: Seconds an episode may take to answer (its next model call, or its end) before the env gives up on it.
ANSWER_TIMEOUT_S = 600.0


class VerifiersError(ValueError):
    """A taskset cannot be run here (one line: which taskset, and why)."""


@dataclass
class Finished:
    """The episode ended: its reward (the taskset's own, summed over its rewards) or the error it ended on."""

    reward: float
    rewards: dict[str, float]
    error: str | None = None


class EpisodeChannel:
    """One running episode: ``next()`` gives its next ``ModelCall``, or ``Finished`` once it is over."""

    def __init__(self, runner: TasksetRunner, name: str, calls: queue.Queue):
        self._runner, self._name, self._calls = runner, name, calls
        self.future: Future | None = None

    def next(self) -> ModelCall | Finished:
        try:
            return self._calls.get(timeout=ANSWER_TIMEOUT_S)
        except queue.Empty:
            self.abandon()
            return Finished(0.0, {}, error=f"the episode did not answer within {ANSWER_TIMEOUT_S:g} s")

    def abandon(self) -> None:
        """Stop the episode (the env ended it first, or was reset); a call it still has waiting fails."""
        self._runner.bridge.close(self._name)
        if self.future is not None:
            self.future.cancel()
        while True:
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, ModelCall):
                item.answer(None)


def role_names(taskset_id: str) -> list[str]:
    """The seats of the env verifiers pairs with ``taskset_id`` (``agent`` for a plain taskset)."""
    config = vf.resolve_env_config({"taskset": {"id": taskset_id}})
    return list(vf.agent_config_fields(config) if hasattr(vf, "agent_config_fields") else _roles(config))


def _roles(config: Any) -> dict[str, Any]:
    return {name: value for name, value in config if isinstance(value, vf.AgentConfig)}


class TasksetRunner:
    """See the module docstring; one per (taskset id, taskset args) in a process (``runner_for``)."""

    def __init__(self, taskset_id: str, taskset_args: Mapping[str, Any]):
        self.taskset_id = taskset_id
        try:
            base = vf.resolve_env_config({"taskset": {"id": taskset_id, **taskset_args}})
        except ModuleNotFoundError as exc:
            raise VerifiersError(f"taskset {taskset_id!r}: not installed ({exc.msg.split('.')[0]})") from None
        except (ValueError, TypeError) as exc:
            raise VerifiersError(f"taskset {taskset_id!r}: bad taskset_args: {_one_line(exc)}") from None
        seat = {"harness": {"id": HARNESS_ID}, "runtime": {"type": "subprocess"}}
        data = base.model_dump()
        for name in _roles(base):
            data[name] = {**data[name], **seat}
        self.config = vf.resolve_env_config(data)
        self.env = vf.load_environment(self.config)
        self.bridge = Bridge()
        self.client = vf.EvalClientConfig(base_url=self.bridge.base_url, api_key_var=KEY_VAR)
        self._names = itertools.count()
        self._loop = asyncio.new_event_loop()
        ready: Future = Future()
        threading.Thread(
            target=self._serve, args=(ready,), name=f"whale-verifiers-{taskset_id}", daemon=True
        ).start()
        ready.result(timeout=120)

    @property
    def taskset(self) -> vf.Taskset:
        return self.env.taskset

    def _serve(self, ready: Future) -> None:
        asyncio.set_event_loop(self._loop)

        async def hold() -> None:
            try:
                async with self.env.serving():
                    ready.set_result(None)
                    await asyncio.Event().wait()  # serving until the process ends
            except Exception as exc:  # noqa: BLE001 (reported to the constructor)
                if not ready.done():
                    ready.set_exception(exc)

        self._loop.run_until_complete(hold())

    def start(self, task: vf.Task) -> EpisodeChannel:
        """Run one episode of ``task``; its model calls and its end arrive on the returned channel."""
        name = f"whale-episode-{next(self._names)}"
        calls = self.bridge.open(name)
        channel = EpisodeChannel(self, name, calls)
        ctx = vf.ModelContext(model=name, client=self.client)

        async def run() -> None:
            try:
                episode = await self.env.run_episode(task, ctx)
                calls.put(finished(episode))
            except BaseException as exc:
                calls.put(Finished(0.0, {}, error=f"{type(exc).__name__}: {_one_line(exc)}"))
                raise

        channel.future = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return channel


def finished(episode: vf.Episode) -> Finished:
    """The reward of a finished episode: the sum of its traces' rewards (each the taskset's weighted sum)."""
    rewards: dict[str, float] = {}
    for trace in episode.traces:
        for key, reward in trace.rewards.items():
            if reward is not None:
                rewards[key] = rewards.get(key, 0.0) + reward.value
    error = None
    if episode.errors or not all(t.ok for t in episode.traces):
        last = (
            episode.errors[-1]
            if episode.errors
            else next((t.error for t in episode.traces if not t.ok), None)
        )
        error = f"{getattr(last, 'type', 'Error')}: {_one_line(getattr(last, 'message', last))}"
    return Finished(sum(rewards.values()), rewards, error)


def _one_line(exc: object) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


_RUNNERS: dict[tuple[str, str], TasksetRunner] = {}
_LOCK = threading.Lock()


def runner_for(taskset_id: str, taskset_args: Mapping[str, Any] | None = None) -> TasksetRunner:
    """The process's runner for this taskset and these args (built on first use)."""
    key = (taskset_id, json.dumps(dict(taskset_args or {}), sort_keys=True, default=str))
    with _LOCK:
        runner = _RUNNERS.get(key)
        if runner is None:
            runner = _RUNNERS[key] = TasksetRunner(taskset_id, dict(taskset_args or {}))
        return runner
