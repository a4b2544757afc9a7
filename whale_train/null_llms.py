"""Model-free LLMs that a harness cannot tell from the real model: what ``check_harness`` runs.

A harness that "solves tasks without the model" may try to behave well only when it thinks the model
is fake. So the stand-ins copy everything a harness can observe through its ``llm`` handle from the
real model being checked (``like=``):

* ``has_chat_template``: exactly the real model's flag, and chat prompts are rendered (or refused,
  with the same error) by the real model's own ``render``.
* determinism: an answer is a function of the rendered prompt, the sampling parameters and, only when
  ``temperature > 0``, the request's seed -- as in the real backends (``whale_train.llm.base``): at
  temperature 0 the same prompt gives the same text whatever the request, its seed or its batch.
  ``max_tokens`` cuts the same answer at a token boundary (the real model's tokenizer when it has one),
  ``stop`` strings cut it as the backends do, and ``finish_reason`` says which.
* ``score``: log-likelihoods as a real model returns them: negative, longer options lower, a function
  of (prompt, option) only, the same on every repeat.

The stand-ins:

* ``LogLikelihoodNull`` (modes ``empty`` / ``random``): completions carry no information.
* ``PlausibleWrong``: well-formed answers in the format the prompt asks for (``\\boxed{}``,
  ``answer:``, ``<move>``, a move named in the prompt) that carry no knowledge of the task.
* ``OtherTaskReal``: the real model, answering *another task's* prompt: every text of a task (its
  observation, its public info fields) found in a prompt is replaced by the same field of another task
  of the same env (``swaps``, a fixed derangement of the check's tasks). The answer is the model's own,
  in the model's format, and about a real task of the env -- only not this one. Unlike a word shuffle,
  it keeps an order-insensitive question ("what is 3 + 5") from being answered correctly, so an honest
  harness (a self-consistency vote) is not mistaken for a solver. The same prompt always gets the same
  substitute, so the real model's determinism is kept too.

``Likeness(llm)`` is what the stand-ins copy, detached from the model (its own copy of the tokenizer):
the weight-free stand-ins run with it on the proposer's lane while the model trains on another thread.

Nothing here raises for what a harness sends, except what the real model would raise for it.
"""

from __future__ import annotations

import copy
import hashlib
import os
import random
import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from whale_train.llm.base import Completion, Prompt, Request, TokenizerPrompts, cut_at_stop

_ALPHABET = "abcdefgh12345678 <>/:\\{}+-=xyz"
_WORDS = ("Paris", "1947", "John Smith", "the river", "blue", "Germany", "42", "no", "Mary", "seven")
_MOVE = re.compile(r"\b[a-h][1-8][a-h][1-8][qrbn]?\b")
#: Pieces of text a tokenizer-less stand-in counts as one token (word pieces of up to 4 letters, digit
#: groups of up to 3, one punctuation mark, a whitespace run): every character is in exactly one piece.
_PIECE = re.compile(r" ?[A-Za-z]{1,4}| ?\d{1,3}| ?[^\sA-Za-z\d]|\s+")


def _render(prompt: Prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    return "".join(f"<|{m['role']}|>{m['content']}\n" for m in prompt) + "<|assistant|>"


def _unit(*parts: object) -> float:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _model_name(llm: Any) -> str:
    # the model's folder name, not its path: the name lands in check_harness's messages and the ledgers
    return os.path.basename(str(getattr(llm, "name", "model")).rstrip("/")) or "model"


class Likeness(TokenizerPrompts):
    """What a harness can see of ``llm`` and the stand-ins copy (``like=``): its name, its chat flag and
    rendering, its tokenizer, with no weights and no shared state: the tokenizer is a deep copy, since
    one is not safe to use from two threads (the trainer's, the proposer lane's) at once. A model that
    prompts through its tokenizer (``TokenizerPrompts``: the transformers and vLLM backends) renders
    through the copy; any other keeps its own ``render``."""

    version = 0

    def __init__(self, llm: Any):
        self.name = str(getattr(llm, "name", "model"))
        self._flag = bool(llm.has_chat_template)
        self._own_render = None if isinstance(llm, TokenizerPrompts) else getattr(llm, "render", None)
        self.tokenizer = copy.deepcopy(getattr(llm, "tokenizer", None))
        self.chat_template_kwargs = dict(getattr(llm, "chat_template_kwargs", None) or {})

    @property
    def has_chat_template(self) -> bool:
        return self._flag

    def render(self, prompt: Prompt) -> str:
        if self._own_render is not None:
            return self._own_render(prompt)
        if self.tokenizer is None:
            return _render(prompt)
        return super().render(prompt)


class _Mimic:
    """What the stand-ins copy from the real model ``like`` (or, without one, a model whose chat flag
    is ``chat``): the chat flag, prompt rendering and its errors, and token boundaries."""

    version = 0

    def __init__(self, seed: int, name: str, like: Any = None, chat: bool = False):
        self.seed = seed
        self.name = name
        self.like = like
        self.has_chat_template = bool(like.has_chat_template) if like is not None else bool(chat)
        self._tokenizer = getattr(like, "tokenizer", None)

    def render(self, prompt: Prompt) -> str:
        """The real model's rendering (the same text, the same error for a chat prompt it refuses)."""
        render = getattr(self.like, "render", None)
        return render(prompt) if callable(render) else _render(prompt)

    def tokens(self, text: str) -> list[str]:
        """``text`` as the real model's tokens would cut it (pieces whose concatenation is ``text``)."""
        if self._tokenizer is not None:
            try:
                ids = self._tokenizer(text, add_special_tokens=False)["input_ids"]
                pieces, done = [], ""
                for i in range(1, len(ids) + 1):
                    prefix = self._tokenizer.decode(ids[:i])
                    if not prefix.startswith(done):  # not prefix-stable: fall back to plain pieces
                        raise ValueError
                    pieces.append(prefix[len(done) :])
                    done = prefix
                if done == text:
                    return [p for p in pieces if p] or ([text] if text else [])
            except Exception:  # noqa: BLE001 - any tokenizer oddity: the plain pieces below
                pass
        return _PIECE.findall(text)

    def count(self, text: str) -> int:
        """How many tokens the real model would count in ``text``."""
        if self._tokenizer is not None:
            try:
                return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])
            except Exception:  # noqa: BLE001 - any tokenizer oddity: the plain pieces below
                pass
        return len(_PIECE.findall(text))

    def finish(self, req: Request, text: str, full: str) -> Completion:
        """``full`` (the whole answer) cut as a backend cuts it: at ``max_tokens`` tokens, then before
        the first stop string; ``finish_reason`` "length" only when the tokens ran out."""
        pieces = self.tokens(full)
        kept = pieces[: req.params.max_tokens]
        reply, stopped = cut_at_stop("".join(kept), req.params.stop)
        finish = "stop" if stopped or len(pieces) <= req.params.max_tokens else "length"
        ids = [zlib.crc32(p.encode("utf-8", "surrogatepass")) % 50_000 for p in kept]
        return Completion(reply, text, None, ids, finish, self.count(text), len(ids))


class _Base(_Mimic):
    def _reply(self, text: str, rng: random.Random) -> str:
        raise NotImplementedError

    def _rng(self, text: str, req: Request, salt: str) -> random.Random:
        """Seeded by what the real model's answer depends on: the prompt and the sampling parameters,
        and the request's seed only when sampling (temperature 0 is greedy: the seed changes nothing)."""
        p = req.params
        drawn = req.seed if p.temperature > 0 else "greedy"
        return random.Random(f"{self.seed}\x1f{salt}\x1f{text}\x1f{p.temperature}\x1f{p.top_p}\x1f{drawn}")

    def complete(self, requests: list[Request]) -> list[Completion]:
        out = []
        for req in requests:
            text = self.render(req.prompt)
            out.append(self.finish(req, text, self._reply(text, self._rng(text, req, self.name))))
        return out

    def score(self, prompt: Prompt, continuations: list[str]) -> list[Completion]:
        """Log-likelihoods: a per-token cost in [0.3, 6) nats, a function of (seed, prompt, option)."""
        text = self.render(prompt)
        out = []
        for c in continuations:
            tokens = max(1, self.count(c))
            lp = -sum(0.3 + 5.7 * _unit(self.seed, text, c, i) for i in range(min(tokens, 64)))
            lp *= tokens / min(tokens, 64)
            out.append(Completion(c, text, None, None, "stop", self.count(text), tokens, logprob=lp))
        return out


class LogLikelihoodNull(_Base):
    """No model: empty or random completions, log-likelihood-shaped scores."""

    def __init__(self, mode: str = "empty", seed: int = 0, *, like: Any = None, chat: bool = False):
        if mode not in ("empty", "random"):
            raise ValueError(f"mode must be 'empty' or 'random', got {mode!r}")
        super().__init__(seed, f"null-{mode}", like, chat)
        self.mode = mode

    def _reply(self, text: str, rng: random.Random) -> str:
        if self.mode == "empty":
            return ""
        return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 24)))


class PlausibleWrong(_Base):
    """Answers in the asked-for format with content that knows nothing of the task."""

    def __init__(self, seed: int = 0, *, like: Any = None, chat: bool = False):
        super().__init__(seed, "null-plausible", like, chat)

    def _reply(self, text: str, rng: random.Random) -> str:
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


def derangement_swaps(
    texts: Sequence[Mapping[str, str]], seed: int = 0, min_chars: int = 3
) -> dict[str, str]:
    """The substitutions of ``OtherTaskReal``: each task's text of each field -> the same field of the
    next task in a seeded cycle over ``texts`` (one dict of field -> text per task) whose text differs,
    so no task keeps its own (a question two tasks share is swapped too). A text that many tasks share
    (an instruction: more than ``max(2, tasks // 20)`` of them) or shorter than ``min_chars`` is never
    replaced; with fewer than two tasks there is nothing to swap."""
    if len(texts) < 2:
        return {}
    count: dict[str, int] = {}
    for fields in texts:
        for value in set(fields.values()):
            count[value] = count.get(value, 0) + 1
    shared = max(2, len(texts) // 20)
    order = list(range(len(texts)))
    random.Random(f"{seed}/other-task").shuffle(order)
    swaps: dict[str, str] = {}
    for i, task in enumerate(order):
        for field, value in texts[task].items():
            if value in swaps or len(value) < min_chars or count[value] > shared:
                continue
            for step in range(1, len(order)):
                substitute = texts[order[(i + step) % len(order)]].get(field)
                if substitute is not None and substitute != value:
                    swaps[value] = substitute
                    break
    return swaps


class OtherTaskReal(_Mimic):
    """The real model, answering another task's prompt (see the module docstring)."""

    def __init__(self, llm: Any, swaps: Mapping[str, str] | None = None, seed: int = 0):
        super().__init__(seed, f"other-task-{_model_name(llm)}", like=llm)
        self.llm = llm
        self.swaps = dict(swaps or {})
        keys = sorted(self.swaps, key=len, reverse=True)  # the longest text wins where texts overlap
        self._pattern = re.compile("|".join(map(re.escape, keys))) if keys else None

    def swap(self, prompt: Prompt) -> Prompt:
        """``prompt`` with every task text replaced by its substitute, in one pass (a substitute is
        never replaced again); a prompt with no task text in it is sent as is."""

        def sub(text: str) -> str:
            if self._pattern is None or not isinstance(text, str):
                return text
            return self._pattern.sub(lambda m: self.swaps[m.group(0)], text)

        if isinstance(prompt, str):
            return sub(prompt)
        if isinstance(prompt, list):
            return [{**m, "content": sub(m.get("content"))} if isinstance(m, dict) else m for m in prompt]
        return prompt

    def complete(self, requests: list[Request]) -> list[Completion]:
        outs = self.llm.complete([Request(self.swap(r.prompt), r.params, r.seed) for r in requests])
        for req, c in zip(requests, outs, strict=True):
            c.prompt_text = self.render(req.prompt)  # the record shows the prompt the harness sent
        return outs

    def score(self, prompt: Prompt, continuations: list[str]) -> list[Completion]:
        return self.llm.score(self.swap(prompt), continuations)  # the same errors too

    def score_many(self, items: Sequence[tuple[Prompt, list[str]]]) -> list[list[Completion]]:
        many = getattr(self.llm, "score_many", None)
        if callable(many):
            return many([(self.swap(p), c) for p, c in items])
        return [self.score(p, c) for p, c in items]
