"""The text environment core shared by every WHALE env.

``TextEnv`` is a ``gymnasium.Env[str, str]``: observations and actions are text, and the structured
state a harness needs (legal moves, passages, tool output, ...) rides along in ``info``.

Contract of every subclass (checked by the tests for every registered env):

* ``reset(seed=..., options={"task_id": ...})`` picks a task (seeded through ``np_random``) and starts
  an episode; the same seed gives the same task sequence and the same observations.
* An invalid or malformed action never raises. It costs a turn, leaves the state unchanged, and comes
  back as a clear message in the observation and in ``info["error"]`` (None when the action was fine).
* ``max_turns`` bounds the episode: the step that uses the last turn without ending the episode
  truncates it.
* Answers never appear in an observation or ``info`` before the episode ends. At the end ``info``
  carries ``solved`` and the domain's answer fields.
* An ``info`` key keeps one kind of value in every step (a dict-valued key is ``{}``, never None, when
  empty): ``gym.make_vec`` merges the infos of its envs key by key and cannot merge None with a dict.

A subclass implements ``_start(task)``, ``_apply(action)`` (raise ``ActionError`` for a bad action,
before changing any state), ``_observe()`` and ``_public_info()``, and optionally ``_final_info()``
and ``_default_max_turns(task)``.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import read_from_shared_memory

from whale_envs.tasks import Task, TaskSource, check_split, make_source, split_ids

P = TypeVar("P")

#: Longest observation (characters); longer text is cut with a note.
MAX_OBS_CHARS = 32_768
#: Longest action the action space admits (the env accepts anything, this only sizes the space).
MAX_ACTION_CHARS = 8_192

# Tab, newline, printable ASCII and the whole Basic Multilingual Plane except control characters and
# surrogates: wide enough for every dataset we load (accents, CJK, math symbols). Anything else
# (astral-plane emoji, control bytes) is shown as U+FFFD.
_RANGES = [(0x09, 0x0A), (0x20, 0x7E), (0xA0, 0xD7FF), (0xE000, 0xFFFD)]
CHARSET = frozenset(chr(c) for lo, hi in _RANGES for c in range(lo, hi + 1))
_OUTSIDE = re.compile("[^\t\n\x20-\x7e\u00a0-\ud7ff\ue000-\ufffd]")


class TextSpace(spaces.Text):
    """``spaces.Text`` over CHARSET with a short ``repr`` (the stock one prints all 55k characters) and
    shared memory that works in ``AsyncVectorEnv`` (registered below)."""

    def __reduce__(self):  # pickles as its two lengths, not as 63k characters and their index
        return (_text_space, (self.max_length, self.min_length))

    def __repr__(self) -> str:
        return (
            f"TextSpace({self.min_length}, {self.max_length}, charset=<{len(self.character_set)} characters: "
            "tab, newline, printable ASCII and the Basic Multilingual Plane>)"
        )


@functools.cache
def _text_space_prototype(max_length: int, min_length: int) -> TextSpace:
    return TextSpace(max_length, min_length=min_length, charset=CHARSET)


def _text_space(max_length: int, min_length: int) -> TextSpace:
    """A Text space over CHARSET. Building one indexes 55k characters (~50 ms), so envs share the
    character tables of one prototype and get their own sampling RNG."""
    space = TextSpace.__new__(TextSpace)  # a shallow copy (copy.copy would call __reduce__, i.e. this)
    space.__dict__.update(_text_space_prototype(max_length, min_length).__dict__)
    space._np_random = None
    return space


class _SharedTexts(Sequence):
    """The observations of an ``AsyncVectorEnv`` in shared memory, read when looked at.

    Gymnasium 1.x reads a ``Text`` space's shared memory once, when the vector env is built, so every
    observation came back as the empty buffer (32,768 tab characters). This view decodes the buffer on
    access; ``deepcopy`` (what ``AsyncVectorEnv(copy=True)`` returns) gives a plain tuple of strings.
    """

    def __init__(self, space: TextSpace, memory: Any, n: int):
        self.space, self.memory, self.n = space, memory, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(self.n)))
        if not -self.n <= index < self.n:
            raise IndexError(index)
        size = self.space.max_length
        start = (index % self.n) * size
        data = np.frombuffer(self.memory.get_obj(), dtype=np.int32)[start : start + size]
        chars = self.space.character_list
        return "".join(chars[v] for v in data[data < len(chars)])

    def __eq__(self, other: object) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    def __repr__(self) -> str:
        return repr(tuple(self))

    def __deepcopy__(self, memo: dict) -> tuple[str, ...]:
        return tuple(self)


@read_from_shared_memory.register(TextSpace)
def _read_text_space(space: TextSpace, shared_memory: Any, n: int = 1) -> _SharedTexts:
    return _SharedTexts(space, shared_memory, n)


def fit_text(text: str, max_chars: int = MAX_OBS_CHARS) -> str:
    """Make ``text`` a member of the observation space: unknown characters → U+FFFD, cut to length."""
    text = _OUTSIDE.sub("\ufffd", text)
    if len(text) > max_chars:
        note = f"\n[... cut: {len(text) - max_chars} more characters]"
        text = text[: max_chars - len(note)] + note
    return text


def show_action(action: str, limit: int = 80) -> str:
    """A short, safe rendering of an action for an error message."""
    shown = action if len(action) <= limit else action[:limit] + "..."
    return repr(fit_text(shown))


class ActionError(Exception):
    """Raised by ``_apply`` for an invalid or malformed action; the message goes to the agent.

    ``kind`` names the failure for statistics (``info["error_kind"]``): ``"malformed"`` (the action
    could not be parsed), ``"illegal"`` (parsed, but not allowed in this state), ``"budget"`` (a
    bounded resource such as tool calls is used up), or a domain's own kind.
    """

    def __init__(self, message: str, kind: str = "malformed"):
        super().__init__(message)
        self.kind = kind


@dataclass
class Outcome:
    """What a valid action did: the reward, whether the episode ended, and feedback for the agent."""

    reward: float = 0.0
    terminated: bool = False
    feedback: str = ""


class TextEnv(gym.Env[str, str], Generic[P]):
    """Base class of the WHALE text environments (see the module docstring for the contract)."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}
    #: Domain name under which this env's task sources are registered ("chess", "math", "search").
    domain: ClassVar[str]

    def __init__(
        self,
        tasks: str | TaskSource = "generated",
        *,
        split: str = "all",
        task_options: Mapping[str, Any] | None = None,
        max_turns: int | None = None,
        render_mode: str | None = None,
    ):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.render_mode = render_mode
        # what rebuilds the source after unpickling (a spec string); a TaskSource object is pickled as is
        self._source_spec = (tasks, dict(task_options or {})) if isinstance(tasks, str) else None
        self.source: TaskSource[P] = make_source(self.domain, tasks, **dict(task_options or {}))
        self.split = check_split(split)
        self.task_ids: list[str] = split_ids(self.source, split)
        if not self.task_ids:
            raise ValueError(f"task source {self.source.name!r} has no tasks in split {split!r}")
        self._max_turns_option = max_turns
        self.observation_space = _text_space(MAX_OBS_CHARS, 1)
        self.action_space = _text_space(MAX_ACTION_CHARS, 0)
        self.task: Task[P] | None = None
        self.turn = 0
        self.max_turns = 0
        self.done = True
        self.total_reward = 0.0
        self._last_obs = ""

    # ----------------------------------------------------------------------------- pickling, spec

    def __getstate__(self) -> dict[str, Any]:
        """Envs pickle (multiprocessing, ``copy.deepcopy``): a source named by a spec string is rebuilt
        from it on unpickling (generated sources hold local functions), everything else is kept."""
        state = dict(self.__dict__)
        if state.get("_source_spec") is not None:
            state["source"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.source is None:
            tasks, options = self._source_spec
            self.source = make_source(self.domain, tasks, **options)

    @property
    def spec(self) -> gym.envs.registration.EnvSpec | None:
        """The registration spec, with ``max_episode_steps`` set to this env's turn limit (the env
        truncates there itself, so no ``TimeLimit`` wrapper is needed or added)."""
        spec = self.__dict__.get("_spec")
        if spec is None:
            return None
        limit = self.turn_limit
        return spec if spec.max_episode_steps == limit else dataclasses.replace(spec, max_episode_steps=limit)

    @spec.setter
    def spec(self, value: gym.envs.registration.EnvSpec | None) -> None:
        self.__dict__["_spec"] = value

    @property
    def turn_limit(self) -> int:
        """The most steps an episode can take: ``max_turns`` when given, else the default for the current
        task (before the first reset: the split's first task). Only chess's default depends on the task
        (``2 * solver moves + 2``); math's and search's are fixed."""
        if self._max_turns_option:
            return self._max_turns_option
        if self.task is not None:
            return self.max_turns
        return self._default_max_turns(self.source.get(self.task_ids[0]))

    # ----------------------------------------------------------------------------- subclass hooks

    def _start(self, task: Task[P]) -> str:
        """Set up the world for ``task``; return an optional message shown above the first observation."""
        raise NotImplementedError

    def _apply(self, action: str) -> Outcome:
        """Carry out ``action``; raise ``ActionError`` (state untouched) when it is invalid."""
        raise NotImplementedError

    def _observe(self) -> str:
        """The text of the current state (what the agent needs, never the answer)."""
        raise NotImplementedError

    def _public_info(self) -> dict[str, Any]:
        """Structured fields of the current state for harnesses (never the answer)."""
        return {}

    def _final_info(self) -> dict[str, Any]:
        """Fields revealed when the episode ends: ``solved`` plus the answer."""
        return {}

    def _default_max_turns(self, task: Task[P]) -> int:
        return 8

    def chance_action(self, rng: random.Random) -> str:
        """A valid action chosen at random (no model, no solving): the env's *chance level* is the score of
        playing these. ``check_harness`` rejects a harness that beats it without a model."""
        return "".join(rng.choice("abcdefghij ") for _ in range(8))

    # ----------------------------------------------------------------------------- gym API

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        task_id = options.pop("task_id", None)
        if options:
            raise ValueError(f"unknown reset option(s) {sorted(options)}; accepted: task_id")
        if task_id is None:
            task_id = self.task_ids[int(self.np_random.integers(len(self.task_ids)))]
        try:
            self.task = self.source.get(str(task_id))
        except KeyError:
            raise ValueError(f"task_id {task_id!r} is not in task source {self.source.name!r}") from None
        self.turn = 0
        self.max_turns = self._max_turns_option or self._default_max_turns(self.task)
        self.done = False
        message = self._start(self.task)
        self.total_reward = 0.0
        obs = fit_text(f"{message}\n\n{self._observe()}" if message else self._observe())
        self._last_obs = obs
        return obs, self._info(error=None)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.task is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        if self.done:
            error = "the episode is over; call reset() to start a new one"
            return (
                fit_text(f"Error: {error}"),
                0.0,
                True,
                False,
                {**self._info(error=error), **self._final_info()},
            )
        self.turn += 1
        error: str | None = None
        error_kind: str | None = None
        if not isinstance(action, str):
            error, error_kind = f"an action must be a string, got {type(action).__name__}", "malformed"
            outcome = Outcome()
        else:
            try:
                outcome = self._apply(action)
            except ActionError as exc:
                error, error_kind = str(exc), exc.kind
                outcome = Outcome()
        terminated = outcome.terminated
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        self.total_reward += outcome.reward
        parts = []
        if error:
            parts.append(f"Error: {error}")
        if outcome.feedback:
            parts.append(outcome.feedback)
        if truncated:
            parts.append(f"Out of turns ({self.max_turns}). The episode is over.")
        if not self.done:
            parts.append(self._observe())
        obs = fit_text("\n\n".join(parts))
        info = self._info(error=error)
        info["error_kind"] = error_kind
        if self.done:
            info.update(self._final_info())
        self._last_obs = obs
        return obs, float(outcome.reward), bool(terminated), bool(truncated), info

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._last_obs
        return None

    # ----------------------------------------------------------------------------- helpers

    def _info(self, *, error: str | None) -> dict[str, Any]:
        assert self.task is not None
        return {
            "task_id": self.task.id,
            "turn": self.turn,
            "max_turns": self.max_turns,
            "error": error,
            "error_kind": None,
            **self._public_info(),
        }
