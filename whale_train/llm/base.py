"""The one LLM interface every backend implements, and the records it returns.

``complete(requests)`` takes a batch of prompts (plain text or chat messages) with per-request
sampling parameters and returns one ``Completion`` each, with the exact token ids: RSFT trains on
what was sampled, not on a re-tokenization. ``score(prompt, continuations)`` returns log-likelihoods
where a backend can compute them (transformers, vLLM); others raise ``ScoreUnsupported``.

Reproducibility: each request carries its own ``seed``. Backends that can (transformers, vLLM) draw a
request's tokens from a generator seeded by it alone, so a rollout does not depend on which other
requests happened to share its batch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

#: A prompt: plain text, or chat messages ``[{"role": "user", "content": "..."}, ...]``.
Prompt = str | list[dict[str, str]]

#: Stop strings of one request, at most, and characters of each: a backend checks every stop string
#: against the tail of each completion at every new token, so their size is bounded for every backend.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


class ScoreUnsupported(RuntimeError):
    """This backend cannot compute log-likelihoods of given continuations."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    Attributes:
        temperature: 0 = greedy; 1 = the model's distribution.
        top_p: nucleus sampling mass (1 = off).
        max_tokens: most new tokens.
        stop: strings that end the completion; the text is cut before the first one, the token ids
            keep the token that completed it (that is what the model generated).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if len(stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}")
        for s in stop:
            if not isinstance(s, str) or len(s) > MAX_STOP_CHARS:
                raise ValueError(
                    f"a stop string is a string of at most {MAX_STOP_CHARS} characters, got {s!r:.60}"
                )
        object.__setattr__(self, "stop", stop)


@dataclass(frozen=True)
class Request:
    prompt: Prompt
    params: SamplingParams = field(default_factory=SamplingParams)
    seed: int = 0


@dataclass
class Completion:
    """One sampled (or chosen) completion.

    ``prompt_text`` is the prompt after the chat template; ``prompt_ids`` / ``completion_ids`` are the
    exact token ids the model saw and produced (None when a remote backend does not return them).
    ``finish_reason``: ``"stop"`` (a stop string or end-of-sequence token) or ``"length"``.
    """

    text: str
    prompt_text: str
    prompt_ids: list[int] | None
    completion_ids: list[int] | None
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    logprob: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class LLM(Protocol):
    """What the rollout engine needs from a model."""

    name: str
    #: Incremented by the trainer after each weight update; stored with every trajectory.
    version: int

    def complete(self, requests: list[Request]) -> list[Completion]: ...

    def score(self, prompt: Prompt, continuations: list[str]) -> list[Completion]:
        """One Completion per continuation, ``logprob`` = its summed log-likelihood given the prompt."""
        ...

    @property
    def has_chat_template(self) -> bool: ...


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """Cut ``text`` before the earliest stop string; return (text, whether one was found)."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def fit_prompt(ids: list[int], max_tokens: int, limit: int) -> list[int]:
    """The prompt ids that fit a context of ``limit`` positions with room for ``max_tokens`` new ones:
    an over-long prompt keeps its end (where the question and the latest turns are). Every local backend
    applies this one rule (transformers: ``max_position_embeddings``; vLLM: ``max_model_len``), so a long
    prompt is cut the same way whichever backend runs it; at least one prompt token is kept."""
    room = max(1, limit - max_tokens)
    return list(ids[-room:]) if len(ids) > room else list(ids)


class TokenizerPrompts:
    """Prompts through a transformers tokenizer (``self.tokenizer``, ``self.name``,
    ``self.chat_template_kwargs``): the transformers and vLLM backends render and encode alike."""

    tokenizer: Any
    name: str
    chat_template_kwargs: dict[str, Any]

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def render(self, prompt: Prompt) -> str:
        """The prompt text the model sees (chat messages go through the chat template)."""
        if isinstance(prompt, str):
            return prompt
        if not self.has_chat_template:
            raise ValueError(f"{self.name} has no chat template: pass the prompt as plain text")
        return self.tokenizer.apply_chat_template(
            prompt, tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]
