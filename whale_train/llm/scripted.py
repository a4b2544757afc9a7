"""LLMs without a model: for checking harnesses (``check_harness``) and for tests of the engine.

``ScriptedLLM`` answers every request with a function of the prompt text (or from a list, in turn);
``NullLLM`` answers with empty or random text and random scores, so a harness evaluated with it
measures what the harness achieves *without* the model: it must stay at the env's chance level.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from whale_train.llm.base import Completion, Prompt, Request, cut_at_stop


def _render(prompt: Prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    return "".join(f"<|{m['role']}|>{m['content']}\n" for m in prompt) + "<|assistant|>"


class ScriptedLLM:
    """Completions from ``script(prompt_text) -> str`` (or, for a list, its items in turn, cycling).

    ``score`` ranks continuations with ``scorer(prompt_text, continuation) -> float`` (default: 0).
    """

    version = 0

    def __init__(
        self,
        script: Callable[[str], str] | Sequence[str],
        *,
        scorer: Callable[[str, str], float] | None = None,
        chat: bool = False,
        name: str = "scripted",
    ):
        self._script = script
        self._scorer = scorer
        self._turn = 0
        self.name = name
        self._chat = chat
        self.calls: list[str] = []

    @property
    def has_chat_template(self) -> bool:
        return self._chat

    def _next(self, text: str) -> str:
        if callable(self._script):
            return self._script(text)
        out = self._script[self._turn % len(self._script)]
        self._turn += 1
        return out

    def complete(self, requests: list[Request]) -> list[Completion]:
        out = []
        for req in requests:
            text = _render(req.prompt)
            self.calls.append(text)
            reply, stopped = cut_at_stop(self._next(text), req.params.stop)
            ids = list(range(len(reply)))[: req.params.max_tokens]
            finish = "stop" if stopped or len(reply) <= req.params.max_tokens else "length"
            out.append(Completion(reply, text, None, ids, finish, len(text), len(ids)))
        return out

    def score(self, prompt: Prompt, continuations: list[str]) -> list[Completion]:
        text = _render(prompt)
        scorer = self._scorer or (lambda _p, _c: 0.0)
        return [
            Completion(c, text, None, None, "stop", len(text), len(c), logprob=float(scorer(text, c)))
            for c in continuations
        ]


class NullLLM(ScriptedLLM):
    """No model at all: ``mode="empty"`` answers "", ``mode="random"`` random short text; scores are
    random. Each answer depends only on its request's seed (and a score on the prompt and option), so
    a check is reproducible however the calls are batched."""

    ALPHABET = "abcdefgh12345678 <>/:\\{}+-=xyz"

    def __init__(self, mode: str = "empty", seed: int = 0):
        if mode not in ("empty", "random"):
            raise ValueError(f"mode must be 'empty' or 'random', got {mode!r}")
        self.mode = mode
        self.seed = seed
        super().__init__([""], name=f"null-{mode}")

    def complete(self, requests: list[Request]) -> list[Completion]:
        out = []
        for req in requests:
            text = _render(req.prompt)
            reply = ""
            if self.mode == "random":
                rng = random.Random(f"{self.seed}/{req.seed}")
                reply = "".join(rng.choice(self.ALPHABET) for _ in range(rng.randint(0, 24)))
            ids = list(range(len(reply)))
            out.append(Completion(reply, text, None, ids, "stop", len(text), len(ids)))
        return out

    def score(self, prompt: Prompt, continuations: list[str]) -> list[Completion]:
        text = _render(prompt)
        return [
            Completion(
                c,
                text,
                None,
                None,
                "stop",
                len(text),
                len(c),
                logprob=random.Random(f"{self.seed}/{text}/{c}").random(),
            )
            for c in continuations
        ]
