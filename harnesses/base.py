"""The harness contract.

A harness drives one episode: ``run(env, llm)`` resets the env, builds prompts, calls the LLM, parses
actions, steps the env, and may retry, vote, call the env's tools, or keep per-episode state. The
rollout engine makes a fresh harness object for every episode, so ``self`` is per-episode state.

The harness sees the env and the model only through two narrow handles:

``env``
    ``reset() -> (obs, info)`` (once per episode: the engine has already chosen the task) and
    ``step(action) -> (obs, reward, terminated, truncated, info)``. ``info`` is a plain dict.
``llm``
    ``complete(prompt, **params) -> str``, ``sample(prompt, n, **params) -> list[str]``,
    ``complete_many(prompts, **params) -> list[str]``, ``choose(prompt, options) -> int`` (the option with
    the highest log-likelihood; a scoring call, never training data: the options are the harness's
    text), ``score(prompt, continuations) -> list[float]``, and ``has_chat_template``. A prompt is
    text or chat messages ``[{"role": "user", "content": ...}]``. Params: ``temperature``, ``top_p``,
    ``max_tokens``, ``stop``. These methods are written once, in ``ENV_METHODS`` / ``LLM_METHODS`` below:
the proxies a harness gets and the trusted side that serves the calls derive from that list.

Every call through the handles is recorded by the engine (the trajectory), outside the harness's
reach. ``Harness`` offers the usual loop as overridable hooks, so a small idea is a small diff:

    format_observation -> build_prompt -> llm -> parse_action (-> on_parse_error, retry) -> env.step
                                                                   -> give_up? -> on_feedback

Harness files may import only ``harnesses.base`` names and a small standard-library allow-list (see
``harnesses.validate``); they run in a separate worker process unless they ship with the package and
trusted execution is asked for.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

Prompt = str | list[dict[str, str]]


class HarnessCallError(RuntimeError):
    """A handle call was refused (bad arguments, a limit reached, the model failed); raised in the harness."""


class EnvHandle(Protocol):
    def reset(self) -> tuple[str, dict[str, Any]]: ...

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]: ...


class LLMHandle(Protocol):
    has_chat_template: bool

    def complete(self, prompt: Prompt, **params: Any) -> str: ...

    def sample(self, prompt: Prompt, n: int, **params: Any) -> list[str]: ...

    def complete_many(self, prompts: list[Prompt], **params: Any) -> list[str]: ...

    def choose(self, prompt: Prompt, options: list[str]) -> int: ...

    def score(self, prompt: Prompt, continuations: list[str]) -> list[float]: ...


# ---------------------------------------------------------------------------- the handle methods, once


@dataclass(frozen=True)
class HandleMethod:
    """One method of a handle as every side sees it: the harness API (the Protocols above), the
    proxies that forward a call (``EnvProxy``/``LLMProxy``: in the worker, in process) and the trusted side
    that serves it (``whale_train.rollout.episode.Episode._op_<name>``). A call travels as
    ``(name, {argument: value, ..., "params": {...}})``."""

    name: str
    args: tuple[str, ...]  # the positional arguments, in order (each may also be passed by keyword)
    doc: str
    lists: tuple[str, ...] = ()  # the arguments sent as lists (any iterable is accepted)
    params: bool = False  # takes sampling parameters as keywords, sent as one ``params`` object
    tuple_result: bool = False  # the reply is a tuple (JSON brings it back as a list)

    def signature(self) -> inspect.Signature:
        """The method's signature, ``self`` first."""
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        names = ("self", *self.args)
        parameters = [inspect.Parameter(n, kind) for n in names]
        if self.params:
            parameters.append(inspect.Parameter("params", inspect.Parameter.VAR_KEYWORD))
        return inspect.Signature(parameters)

    def message(self, bound: inspect.BoundArguments) -> dict[str, Any]:
        """The arguments of one call as they travel to the trusted side."""
        values = dict(bound.arguments)
        values.pop("self", None)
        out = {name: list(values[name]) if name in self.lists else values[name] for name in self.args}
        if self.params:
            out["params"] = dict(values.get("params", {}))
        return out


ENV_METHODS = (
    HandleMethod("reset", (), "Start the episode: ``(obs, info)``. Once per episode.", tuple_result=True),
    HandleMethod(
        "step",
        ("action",),
        "Act: ``(obs, reward, terminated, truncated, info)``.",
        tuple_result=True,
    ),
)

LLM_METHODS = (
    HandleMethod(
        "complete",
        ("prompt",),
        "One completion of ``prompt`` (text or chat messages) with the sampling ``params`` "
        "(``temperature``, ``top_p``, ``max_tokens``, ``stop``).",
        params=True,
    ),
    HandleMethod("sample", ("prompt", "n"), "``n`` completions of the same prompt.", params=True),
    HandleMethod(
        "complete_many",
        ("prompts",),
        "One completion of each prompt, in one batch.",
        lists=("prompts",),
        params=True,
    ),
    HandleMethod(
        "choose",
        ("prompt", "options"),
        "The index of the option with the highest log-likelihood after ``prompt`` (a scoring call: "
        "recorded with the option it picked, never trained on).",
        lists=("options",),
    ),
    HandleMethod(
        "score",
        ("prompt", "continuations"),
        "The log-likelihood of each continuation after ``prompt`` (nothing to train on).",
        lists=("continuations",),
    ),
)

#: Every handle method by name: what the trusted side serves.
HANDLE_METHODS = {m.name: m for m in ENV_METHODS + LLM_METHODS}

for _protocol, _methods in ((EnvHandle, ENV_METHODS), (LLMHandle, LLM_METHODS)):
    for _m in _methods:
        getattr(_protocol, _m.name).__doc__ = _m.doc


class _Proxy:
    def __init__(self, call: Callable[[str, dict[str, Any]], Any]):
        self._call = call


class EnvProxy(_Proxy):
    """An ``env`` handle whose every method forwards the call as ``call(name, arguments)`` and returns
    the reply (the worker forwards over its pipe, the in-process executor to the ``Episode``)."""


class LLMProxy(_Proxy):
    """An ``llm`` handle that forwards like ``EnvProxy``."""

    def __init__(self, call: Callable[[str, dict[str, Any]], Any], has_chat_template: bool):
        super().__init__(call)
        self.has_chat_template = has_chat_template


def _forwarder(method: HandleMethod) -> Callable[..., Any]:
    sig = method.signature()

    def forward(self, *args, **kwargs):
        value = self._call(method.name, method.message(sig.bind(self, *args, **kwargs)))
        return tuple(value) if method.tuple_result else value

    forward.__name__ = method.name
    forward.__qualname__ = method.name
    forward.__doc__ = method.doc
    forward.__signature__ = sig  # type: ignore[attr-defined]
    return forward


for _cls, _methods in ((EnvProxy, ENV_METHODS), (LLMProxy, LLM_METHODS)):
    for _m in _methods:
        setattr(_cls, _m.name, _forwarder(_m))


class Harness:
    """Base class: the usual observe → prompt → complete → parse → step loop, as hooks.

    Class attributes set the sampling of every call (``temperature``, ``max_tokens``, ``stop``) and
    how many times an unparseable completion is retried (``format_retries``). Override ``run`` for a
    different control flow altogether.
    """

    name: str = "harness"
    temperature: float = 1.0
    max_tokens: int = 32
    stop: tuple[str, ...] = ()
    format_retries: int = 1
    use_chat: bool = True  # send chat messages when the model has a chat template
    #: The one memory across episodes: plain JSON values (few-shot examples) that the caller builds
    #: from the *train* split (``RolloutConfig(examples=...)``); the same for every episode, never fed
    #: by evaluation episodes. Anything else a harness keeps (class attributes, module globals) starts
    #: afresh in every episode: each episode runs in a process of its own.
    examples: tuple = ()

    # ------------------------------------------------------------------------ the loop

    def run(self, env: EnvHandle, llm: LLMHandle) -> None:
        obs, info = env.reset()
        self.start(obs, info)
        while True:
            action = self.act(obs, info, llm)
            obs, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated or self.give_up(obs, info):
                return
            self.on_feedback(obs, info)

    def act(self, obs: str, info: dict[str, Any], llm: LLMHandle) -> str:
        """One action: prompt the model, parse, retry on a parse failure; the raw text if all fail."""
        prompt = self.make_prompt(self.format_observation(obs, info), info, llm)
        text = llm.complete(prompt, **self.params())
        action = self.parse_action(text, info)
        for _ in range(self.format_retries):
            if action is not None:
                break
            prompt = self.on_parse_error(prompt, text, info)
            text = llm.complete(prompt, **self.params())
            action = self.parse_action(text, info)
        return action if action is not None else text

    # ------------------------------------------------------------------------ hooks

    def start(self, obs: str, info: dict[str, Any]) -> None:
        """Called after ``reset``: set up per-episode state."""
        self.history: list[tuple[str, str]] = []

    def format_observation(self, obs: str, info: dict[str, Any]) -> str:
        """The text of the state the model sees (default: the env's observation as is)."""
        return obs

    def build_prompt(self, text: str, info: dict[str, Any]) -> str:
        """The user message (or the whole text prompt for a model without a chat template)."""
        return text

    def make_prompt(self, text: str, info: dict[str, Any], llm: LLMHandle) -> Prompt:
        """Wrap the built prompt as chat messages when the model has a chat template."""
        content = self.build_prompt(text, info)
        if self.use_chat and llm.has_chat_template:
            return [{"role": "user", "content": content}]
        return content

    def parse_action(self, text: str, info: dict[str, Any]) -> str | None:
        """The env action in a completion, or None when it cannot be parsed (default: stripped text)."""
        text = text.strip()
        return text or None

    def on_parse_error(self, prompt: Prompt, text: str, info: dict[str, Any]) -> Prompt:
        """The prompt for a retry after an unparseable completion (default: the same prompt)."""
        return prompt

    def give_up(self, obs: str, info: dict[str, Any]) -> bool:
        """Called after a step that did not end the episode: True ends it here (e.g. after too many
        rejected actions in a row; default: never)."""
        return False

    def on_feedback(self, obs: str, info: dict[str, Any]) -> None:
        """Called after a step that did not end the episode (e.g. an error message or a tool result)."""
        self.history.append((obs, info.get("error") or ""))

    def params(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "max_tokens": self.max_tokens, "stop": list(self.stop)}


# ---------------------------------------------------------------------------- parsing helpers


def extract_tag(text: str, tag: str) -> str | None:
    """The content of the last ``<tag>...</tag>`` in ``text`` (a missing closing tag is tolerated)."""
    found = re.findall(rf"<{tag}>\s*(.*?)\s*(?:</{tag}>|$)", text, flags=re.S)
    found = [f for f in found if f]
    return found[-1].strip() if found else None


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (balanced braces) in ``text``."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def majority(values: list[str]) -> str | None:
    """The most frequent non-empty value (first seen wins ties), or None."""
    counts: dict[str, int] = {}
    for v in values:
        if v:
            counts[v] = counts.get(v, 0) + 1
    return max(counts, key=lambda v: counts[v]) if counts else None
