"""``whale/SearchQA-v0``: multi-turn search question answering over a local BM25 retriever or a
retrieval server (``retriever="http://HOST:PORT/retrieve"``, Search-R1's API, :mod:`.remote`).

The agent sees a question and acts with text:

* ``search: <query>`` returns the ``top_k`` best passages (title and text, each cut to
  ``passage_chars`` characters) as the next observation and in ``info["passages"]`` (a list of
  ``{"id", "title", "text"}``). It costs a turn and one of ``max_searches`` searches.
* ``answer: <text>`` ends the episode. Reward 1.0 when the answer matches any gold alias after SQuAD
  normalization (lowercase, no punctuation, no articles, collapsed whitespace), else 0.0; with a
  ``judge`` (an OpenAI-compatible LLM, off by default) a non-matching answer the judge accepts also
  scores 1.0. ``judge_mode="paper"`` runs the judge as the paper does: asked on every answer, its
  verdict decides, and exact match decides only when the judge fails.

The prefixes are case-insensitive; an empty, unknown or over-budget action costs a turn, changes nothing,
and is explained in the observation and ``info["error"]`` (``info["error_kind"]``: ``malformed`` for
an unparsable or empty action, ``illegal`` for a query with no searchable word, ``budget`` for a search
past ``max_searches``). ``max_turns`` defaults to
``max_searches + 2`` (every search, the answer, and one mistake); running out of turns truncates the
episode with reward 0.

``info`` always has ``question``, ``query`` and ``passages`` (this turn's search, else None / []),
``searches_used``, ``max_searches``, ``top_k``, ``passage_chars`` and ``corpus_size``. At the end it
also has ``solved``, ``answers`` (gold answer first), ``prediction``, ``em``, ``f1``, ``supporting`` (the
gold passage ids, None when the source names none), ``gold_retrieved`` (a supporting passage was ever
returned by a search; None when unknown), ``gold_recall`` (the share of them that were),
``answer_retrieved`` (a gold alias appears in a passage text shown to the agent), ``retrieved`` (ids of
every passage shown, in order), and ``judge`` / ``judge_error`` (None without a judge).
Nothing about the answer or the gold passages is in an observation or ``info`` before the end.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from typing import Any

from whale_envs import workers
from whale_envs.search.corpus import SearchQuestion
from whale_envs.search.judge import JudgeError, LLMJudge
from whale_envs.search.remote import RemoteRetriever
from whale_envs.search.retriever import Hit, Retriever, get_retriever
from whale_envs.search.scoring import contains_answer, exact_match, f1_score
from whale_envs.tasks import Task, TaskSource
from whale_envs.text_env import ActionError, Outcome, TextEnv, show_action

# Register the task sources of this domain (importing the module is enough).
from . import sources as _sources  # noqa: F401

_ACTION = re.compile(r"\s*(search|answer)\s*:(.*)\Z", re.IGNORECASE | re.DOTALL)
_USAGE = "reply with 'search: <query>' to search the passages or 'answer: <text>' to answer"


def parse_action(action: str) -> tuple[str, str]:
    """``"Search:  big   cats"`` -> ``("search", "big cats")``; raises ActionError when malformed or empty."""
    match = _ACTION.match(action)
    if match is None:
        if not action.strip():
            raise ActionError(f"empty action: {_USAGE}")
        raise ActionError(f"malformed action {show_action(action)}: {_USAGE}")
    kind, argument = match.group(1).lower(), " ".join(match.group(2).split())
    if not argument:
        what = "query" if kind == "search" else "answer"
        raise ActionError(f"empty {what}: write it after '{kind}:', e.g. '{kind}: {_EXAMPLE[kind]}'")
    return kind, argument


_EXAMPLE = {"search": "capital of France", "answer": "Paris"}


@functools.lru_cache(maxsize=64)
def _remote(url: str) -> RemoteRetriever:
    """One client per URL for the process (a task source's ``retriever=`` option)."""
    return RemoteRetriever(url)


def cut(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, at a word boundary when one is near, marked ``...``."""
    if len(text) <= limit:
        return text
    head = text[: max(1, limit - 4)]
    space = head.rfind(" ")
    if space >= len(head) * 0.7:
        head = head[:space]
    return head.rstrip() + " ..."


class SearchQAEnv(TextEnv[SearchQuestion]):
    """Search QA as a text environment (see the module docstring).

    Args:
        tasks: ``generated`` (default), ``hotpotqa[:PATH]``, ``musique[:PATH]``, ``nq[:PATH]?corpus=PATH``
            (see :mod:`whale_envs.search.sources`), or a TaskSource.
        top_k: passages per search (1-50).
        passage_chars: per-passage text budget in characters (at least 20).
        max_searches: searches per episode (0 = answer closed-book).
        cache_dir: where BM25 indexes are cached (default ``$WHALE_CACHE_DIR`` or ``~/.cache/whale``).
        judge: an :class:`LLMJudge`, or a mapping of its fields, to accept answers exact match misses.
        judge_mode: ``"rescue"`` (default: the judge is asked only when exact match fails) or
            ``"paper"`` (asked on every answer; exact match only when the judge fails).
        retriever: a retrieval server's URL (Search-R1's API), a :class:`RemoteRetriever`, or a mapping
            of its fields (``url``, ``timeout``, ``retries``): every search goes there instead of the
            task's corpus. Default: the task source's ``retriever=`` option, else BM25 in process.
        split, task_options, max_turns, render_mode (``**options``): as for every WHALE env (``TextEnv``).
    """

    domain = "search"

    def __init__(
        self,
        tasks: str | TaskSource = "generated",
        *,
        top_k: int = 3,
        passage_chars: int = 500,
        max_searches: int = 4,
        cache_dir: str | os.PathLike | None = None,
        judge: LLMJudge | Mapping[str, Any] | None = None,
        judge_mode: str = "rescue",
        retriever: str | RemoteRetriever | Mapping[str, Any] | None = None,
        **options: Any,
    ):
        for name, value, lo, hi in (
            ("top_k", top_k, 1, 50),
            ("passage_chars", passage_chars, 20, 100_000),
            ("max_searches", max_searches, 0, 1000),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise ValueError(f"{name} must be an integer in {lo}-{hi}, got {value!r}")
        if isinstance(judge, Mapping):
            judge = LLMJudge(**judge)
        if judge is not None and not callable(judge):
            raise ValueError(f"judge must be an LLMJudge or a mapping of its fields, got {judge!r}")
        if judge_mode not in ("rescue", "paper"):
            raise ValueError(f"judge_mode must be 'rescue' or 'paper', got {judge_mode!r}")
        if isinstance(retriever, str):
            retriever = RemoteRetriever(retriever)
        elif isinstance(retriever, Mapping):
            retriever = RemoteRetriever(**retriever)
        elif retriever is not None and not isinstance(retriever, RemoteRetriever):
            raise ValueError(f"retriever must be a URL, a RemoteRetriever or a mapping, got {retriever!r}")
        super().__init__(tasks, **options)
        first = self.source.get(self.task_ids[0]).payload if self.task_ids else None
        if retriever is None and first is not None and first.corpus is None and first.retriever is None:
            raise ValueError(
                f"the questions of {self.source.name!r} have no local corpus: pass retriever=URL (a server "
                "speaking Search-R1's API, e.g. 'whale retriever serve') or corpus=PATH in the task spec"
            )
        self.remote = retriever
        self.judge_mode = judge_mode
        self.top_k = top_k
        self.passage_chars = passage_chars
        self.max_searches = max_searches
        self.cache_dir = cache_dir
        self.judge = judge

    def _default_max_turns(self, task: Task[SearchQuestion]) -> int:
        return self.max_searches + 2

    # ------------------------------------------------------------------ episode state

    def chance_action(self, rng) -> str:
        """A guess without searching: a random word of the question."""
        words = [w.strip("?,.'\"") for w in self.qa.question.split()]
        return f"answer: {rng.choice([w for w in words if w] or ['yes'])}"

    def _start(self, task: Task[SearchQuestion]) -> str:
        self.qa = task.payload
        self.retriever: Retriever | RemoteRetriever = self._retriever_for(self.qa)
        self.searches = 0
        self.query: str | None = None
        self.hits: list[Hit] = []
        self.results_turn = -1  # the turn whose search produced self.hits
        self.shown: dict[str, str] = {}  # id -> text shown, every passage of the episode, in order
        self.prediction: str | None = None
        self.em = False
        self.f1 = 0.0
        self.judge_verdict: bool | None = None
        self.judge_error: str | None = None
        self.solved = False
        return ""

    def _retriever_for(self, qa: SearchQuestion) -> Retriever | RemoteRetriever:
        if self.remote is not None:
            return self.remote
        if qa.retriever is not None:
            return _remote(qa.retriever)
        if qa.corpus is None:
            raise ValueError("this question has no local corpus and no retriever URL: pass retriever=URL")
        return get_retriever(qa.corpus, cache_dir=self.cache_dir)

    def _apply(self, action: str) -> Outcome:
        kind, argument = parse_action(action)
        if kind == "search":
            return self._search(argument)
        return self._answer(argument)

    def _search(self, query: str) -> Outcome:
        if self.searches >= self.max_searches:
            raise ActionError(
                f"no searches left (the budget is {self.max_searches}); reply with 'answer: <text>'",
                kind="budget",
            )
        if not self.retriever.has_terms(query):
            raise ActionError(
                f"the query {show_action(query)} has no searchable words (only stopwords, "
                "punctuation or one-letter words): search for names or content words",
                kind="illegal",
            )
        hits = workers.call("retrieval", self.retriever.search, query, self.top_k)  # bounded pool
        self.searches += 1
        self.query, self.hits, self.results_turn = query, hits, self.turn
        for hit in hits:
            self.shown.setdefault(hit.passage.id, cut(hit.passage.text, self.passage_chars))
        return Outcome()

    def _answer(self, prediction: str) -> Outcome:
        qa = self.qa
        self.prediction = prediction
        self.em = exact_match(prediction, qa.answers)
        self.f1 = f1_score(prediction, qa.answers)
        self.solved = self.em
        if self.judge is not None and (self.judge_mode == "paper" or not self.em):
            try:
                self.judge_verdict = bool(self.judge(qa.question, qa.answers, prediction))
                self.solved = self.judge_verdict
            except JudgeError as exc:
                self.judge_error = str(exc)
        verdict = "Correct." if self.solved else "Incorrect."
        return Outcome(
            reward=1.0 if self.solved else 0.0,
            terminated=True,
            feedback=f"Your answer: {prediction}\n{verdict} The episode is over.",
        )

    # ------------------------------------------------------------------ what the agent sees

    def _current_hits(self) -> list[Hit]:
        return self.hits if self.results_turn == self.turn else []

    def _passage_dicts(self) -> list[dict[str, str]]:
        return [
            {"id": h.passage.id, "title": h.passage.title, "text": self.shown[h.passage.id]}
            for h in self._current_hits()
        ]

    def _public_info(self) -> dict[str, Any]:
        searched = self.results_turn == self.turn
        return {
            "question": self.qa.question,
            "query": self.query if searched else None,
            "passages": self._passage_dicts(),
            "searches_used": self.searches,
            "max_searches": self.max_searches,
            "top_k": self.top_k,
            "passage_chars": self.passage_chars,
            "corpus_size": len(self.qa.corpus) if self.qa.corpus is not None else None,
        }

    def _final_info(self) -> dict[str, Any]:
        qa = self.qa
        supporting = list(qa.supporting) if qa.supporting is not None else None
        found = [s for s in supporting if s in self.shown] if supporting else []
        return {
            "solved": self.solved,
            "answers": list(qa.answers),
            "prediction": self.prediction,
            "em": self.em,
            "f1": self.f1,
            "supporting": supporting,
            "gold_retrieved": bool(found) if supporting else None,
            "gold_recall": len(found) / len(supporting) if supporting else None,
            "answer_retrieved": any(contains_answer(text, qa.answers) for text in self.shown.values()),
            "retrieved": list(self.shown),
            "judge": self.judge_verdict,
            "judge_error": self.judge_error,
        }

    def _observe(self) -> str:
        lines = [f"Question: {self.qa.question}"]
        if self.results_turn == self.turn:
            lines += ["", f"Search results for: {self.query}"]
            if not self.hits:
                lines.append("No passage matches this query.")
            for i, hit in enumerate(self.hits, start=1):
                lines.append(f"[{i}] {hit.passage.title}\n{self.shown[hit.passage.id]}")
        left = self.max_searches - self.searches
        lines += ["", f"Searches left: {left}."]
        if left > 0:
            lines.append(
                "Reply with 'search: <query>' to search the passages, or 'answer: <text>' to answer."
            )
        else:
            lines.append("Reply with 'answer: <text>' to answer.")
        return "\n".join(lines)
