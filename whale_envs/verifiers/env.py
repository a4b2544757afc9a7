"""``whale/Verifiers-v0``: any verifiers taskset as a WHALE text env.

The taskset's own environment runs the exchange (verifiers' loader picks it: the taskset's ``Env``, or
``SingleAgentEnv``), and the taskset's own rewards are the env's reward. Each ``step`` is one reply of
the model; the next observation is what the taskset's environment sends next (a game's next state, a
follow-up question), and the episode ends when the environment ends it. ``reset`` starts a verifiers
episode and shows its first model call (system prompt and prompt).

    env = gym.make("whale/Verifiers-v0", taskset="textarena", taskset_args={"game": "Wordle-v0"})

A taskset is code its user chose to install and runs trusted, in this process, like the user's own env.
Tasksets whose exchange is not plain text (a container, a tool server, an LLM judge) are refused with a
one-line reason when the env is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from whale_envs.tasks import Task
from whale_envs.text_env import Outcome, TextEnv
from whale_envs.verifiers.bridge import ModelCall
from whale_envs.verifiers.runner import EpisodeChannel, Finished, runner_for
from whale_envs.verifiers.source import DOMAIN

#: Model replies an episode may take unless ``max_turns`` says otherwise (the taskset usually ends it first).
DEFAULT_MAX_TURNS = 16


def render(messages: list[dict[str, Any]]) -> str:
    """The text of what the model is sent new in a call: everything after its own last reply (the first
    call: the system prompt and the prompt; later: the user turn or the tool results)."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    return "\n\n".join(_text(m.get("content")) for m in messages[last + 1 :]).strip()


def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts: the text ones
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


class VerifiersEnv(TextEnv):
    """See the module docstring."""

    domain = DOMAIN

    def __init__(
        self,
        taskset: str | None = None,
        taskset_args: Mapping[str, Any] | None = None,
        *,
        tasks: str = "taskset",
        size: int | None = None,
        split: str = "all",
        task_options: Mapping[str, Any] | None = None,
        max_turns: int | None = None,
        render_mode: str | None = None,
    ):
        options = {"taskset": taskset, "taskset_args": dict(taskset_args or {}), **dict(task_options or {})}
        if size is not None:
            options["size"] = size
        super().__init__(
            tasks, split=split, task_options=options, max_turns=max_turns, render_mode=render_mode
        )
        self.taskset_id = str(taskset)
        self._taskset_args = options["taskset_args"]
        self._runner = runner_for(self.taskset_id, self._taskset_args)
        self._channel: EpisodeChannel | None = None
        self._call: ModelCall | None = None
        self._end: Finished | None = None

    def _default_max_turns(self, task: Task) -> int:
        return DEFAULT_MAX_TURNS

    def _start(self, task: Task) -> str:
        self._stop()
        self._end = None
        self._channel = self._runner.start(task.payload)
        first = self._channel.next()
        if isinstance(first, Finished):
            self._channel = None
            raise RuntimeError(
                f"taskset {self.taskset_id!r}, task {task.id!r}: the episode ended before the model was called"
                + (f" ({first.error})" if first.error else "")
            )
        self._call = first
        return ""

    def _apply(self, action: str) -> Outcome:
        assert self._call is not None and self._channel is not None
        self._call.answer(action)
        self._call = None
        event = self._channel.next()
        if isinstance(event, ModelCall):
            self._call = event
            return Outcome()
        self._end, self._channel = event, None
        note = f" (the taskset's episode failed: {event.error})" if event.error else ""
        return Outcome(reward=event.reward, terminated=True, feedback=f"The episode is over{note}.")

    def _observe(self) -> str:
        return render(self._call.messages) if self._call is not None else ""

    def _final_info(self) -> dict[str, Any]:
        end = self._end or Finished(0.0, {}, error="cut short by max_turns")
        return {
            "solved": end.error is None and end.reward >= 1.0,
            "rewards": dict(end.rewards),
            "episode_error": end.error or "",
        }

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        result = super().step(action)
        if self.done:
            self._stop()  # out of turns: the taskset's episode is abandoned
        return result

    def close(self) -> None:
        self._stop()
        super().close()

    def _stop(self) -> None:
        if self._call is not None:
            self._call.answer(None)
            self._call = None
        if self._channel is not None:
            self._channel.abandon()
            self._channel = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(_runner=None, _channel=None, _call=None)  # a copy starts with no episode running
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._runner = runner_for(self.taskset_id, self._taskset_args)
