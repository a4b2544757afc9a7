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
    the highest log-likelihood; recorded as a call whose completion is that option, so RSFT can train
    on it), ``score(prompt, continuations) -> list[float]``, and ``has_chat_template``. A prompt is
    text or chat messages ``[{"role": "user", "content": ...}]``. Params: ``temperature``, ``top_p``,
    ``max_tokens``, ``stop``.

Every call through the handles is recorded by the engine (the trajectory), outside the harness's
reach. ``Harness`` offers the usual loop as overridable hooks, so a small idea is a small diff:

    format_observation -> build_prompt -> llm -> parse_action (-> on_parse_error, retry) -> env.step
                                                                   -> give_up? -> on_feedback

Harness files may import only ``harnesses.base`` names and a small standard-library allow-list (see
``harnesses.validate``); they run in a separate worker process unless they ship with the package and
trusted execution is asked for.
"""

from __future__ import annotations

import re
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
