"""Model-free LLMs that a harness cannot tell from a real model: what ``check_harness`` runs.

A harness that "solves tasks without the model" may try to behave well only when it thinks the model
is fake. So these stand-ins look real where a harness could look:

* ``LogLikelihoodNull`` (modes ``empty`` / ``random``): completions carry no information (empty or
  random text); ``score`` returns log-likelihoods as a real model does: negative, longer options lower,
  different for different prompts, the same for the same call every time.
* ``PlausibleWrong``: well-formed answers in the format the prompt asks for (``\\boxed{}``,
  ``answer:``, ``<move>``, a move named in the prompt) that carry no knowledge of the task.
* ``PermutedReal``: the real model, answering a *different* prompt: each request's last message has its
  words shuffled (seeded by the request), so the text is the model's own style and format but not about
  this task.

Every answer depends only on the request (its prompt and seed) and the check's seed, so a check is
reproducible however the calls are batched.
"""

from __future__ import annotations

import hashlib
import os
import random
import re

from whale_train.llm.base import Completion, Prompt, Request, cut_at_stop

_ALPHABET = "abcdefgh12345678 <>/:\\{}+-=xyz"
_WORDS = ("Paris", "1947", "John Smith", "the river", "blue", "Germany", "42", "no", "Mary", "seven")
_MOVE = re.compile(r"\b[a-h][1-8][a-h][1-8][qrbn]?\b")


def _render(prompt: Prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    return "".join(f"<|{m['role']}|>{m['content']}\n" for m in prompt) + "<|assistant|>"


def _unit(*parts: object) -> float:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class _Base:
    version = 0
    has_chat_template = False

    def __init__(self, seed: int = 0, name: str = "null"):
        self.seed = seed
        self.name = name

    def _reply(self, text: str, req: Request) -> str:
        raise NotImplementedError

    def complete(self, requests: list[Request]) -> list[Completion]:
        out = []
        for req in requests:
            text = _render(req.prompt)
            reply, stopped = cut_at_stop(self._reply(text, req), req.params.stop)
            ids = list(range(len(reply)))[: req.params.max_tokens]
            reply = reply[: req.params.max_tokens]
            finish = "stop" if stopped or len(ids) < req.params.max_tokens else "length"
            out.append(Completion(reply, text, None, ids, finish, len(text), len(ids)))
        return out

    def score(self, prompt: Prompt, continuations: list[str]) -> list[Completion]:
        """Log-likelihoods: a per-token cost in [0.3, 6) nats, a function of (seed, prompt, option)."""
        text = _render(prompt)
        out = []
        for c in continuations:
            tokens = max(1, len(c) // 3)
            lp = -sum(0.3 + 5.7 * _unit(self.seed, text, c, i) for i in range(min(tokens, 64)))
            lp *= tokens / min(tokens, 64)
            out.append(Completion(c, text, None, None, "stop", len(text), tokens, logprob=lp))
        return out


class LogLikelihoodNull(_Base):
    """No model: empty or random completions, log-likelihood-shaped scores."""

    def __init__(self, mode: str = "empty", seed: int = 0):
        if mode not in ("empty", "random"):
            raise ValueError(f"mode must be 'empty' or 'random', got {mode!r}")
        super().__init__(seed, f"null-{mode}")
        self.mode = mode

    def _reply(self, text: str, req: Request) -> str:
        if self.mode == "empty":
            return ""
        rng = random.Random(f"{self.seed}/{req.seed}")
        return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 24)))


class PlausibleWrong(_Base):
    """Answers in the asked-for format with content that knows nothing of the task."""

    def __init__(self, seed: int = 0):
        super().__init__(seed, "null-plausible")

    def _reply(self, text: str, req: Request) -> str:
        rng = random.Random(f"{self.seed}/{req.seed}/plausible")
        moves = _MOVE.findall(text[-4000:])
        if moves:
            move = rng.choice(moves)
            return f"<move>{move}</move>" if "<move>" in text else move
        value = str(rng.randint(100, 9999)) if rng.random() < 0.5 else rng.choice(_WORDS)
        lead = rng.choice(("Let me think step by step. ", "", "We compute the result. "))
        if "boxed" in text:
            return f"{lead}The answer is \\boxed{{{value}}}."
        if "<answer>" in text:
            return f"{lead}<answer>{value}</answer>"
        return f"{lead}\nanswer: {value}"


class PermutedReal(_Base):
    """The real model, asked about a shuffled version of each prompt."""

    def __init__(self, llm, seed: int = 0):
        # the model's folder name, not its path: the name lands in check_harness's messages and the ledgers
        super().__init__(seed, f"permuted-{os.path.basename(str(getattr(llm, 'name', 'model')).rstrip('/'))}")
        self.llm = llm
        self.has_chat_template = bool(getattr(llm, "has_chat_template", False))

    def _shuffle(self, prompt: Prompt, key: object) -> Prompt:
        def mix(text: str) -> str:
            words = text.split(" ")
            random.Random(f"{self.seed}/{key}").shuffle(words)
            return " ".join(words)

        if isinstance(prompt, str):
            return mix(prompt)
        return [*prompt[:-1], {**prompt[-1], "content": mix(prompt[-1]["content"])}]

    def complete(self, requests: list[Request]) -> list[Completion]:
        shuffled = [Request(self._shuffle(r.prompt, r.seed), r.params, r.seed) for r in requests]
        outs = self.llm.complete(shuffled)
        for req, c in zip(requests, outs, strict=True):
            c.prompt_text = _render(req.prompt)
        return outs

    def score(self, prompt: Prompt, continuations: list[str]) -> list[Completion]:
        return self.llm.score(self._shuffle(prompt, _render(prompt)), continuations)  # same errors too
