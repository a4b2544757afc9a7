"""Passages, corpora and the search question task payload.

A :class:`Corpus` is an ordered, immutable tuple of :class:`Passage` objects with unique ids. Its
``fingerprint`` (SHA-256 of every id, title and text, in order) names it in the retriever caches, so
two equal corpora share one index however they were loaded. File sources share one corpus among all
their questions (and among all envs built from the same files); the generator gives each question a
small world of its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Passage:
    """One retrievable passage. ``id`` is unique in its corpus and stable across loads of the same file."""

    id: str
    title: str
    text: str

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "title": self.title, "text": self.text}


def unique_ids(titles: Sequence[str]) -> list[str]:
    """Passage ids from titles: the title itself when it is unique, else ``"Title (n)"`` (n = 1, 2, ...
    in corpus order), never colliding with another title."""
    counts: dict[str, int] = {}
    for t in titles:
        counts[t] = counts.get(t, 0) + 1
    taken = set(counts)
    seen: dict[str, int] = {}
    ids = []
    for t in titles:
        if counts[t] == 1:
            ids.append(t)
            continue
        n = seen.get(t, 0)
        while True:
            n += 1
            candidate = f"{t} ({n})"
            if candidate not in taken:
                break
        seen[t] = n
        taken.add(candidate)
        ids.append(candidate)
    return ids


class Corpus:
    """An ordered collection of passages with unique ids.

    Args:
        name: where the passages come from (shown in messages and ``info``).
        passages: the passages, in a stable order (the retriever's document order).
        persist: whether the retriever may cache this corpus's index on disk. File corpora say yes;
            the generator's small per-question worlds say no (they index in milliseconds).
    """

    def __init__(self, name: str, passages: Iterable[Passage], *, persist: bool = True):
        self.name = name
        self.passages: tuple[Passage, ...] = tuple(passages)
        self.persist = persist
        self._by_id = {p.id: i for i, p in enumerate(self.passages)}
        if len(self._by_id) != len(self.passages):
            dup = next(p.id for i, p in enumerate(self.passages) if self._by_id[p.id] != i)
            raise ValueError(f"corpus {name!r}: duplicate passage id {dup!r}")
        if not self.passages:
            raise ValueError(f"corpus {name!r} has no passages")

    def __len__(self) -> int:
        return len(self.passages)

    def __getitem__(self, i: int) -> Passage:
        return self.passages[i]

    def __contains__(self, passage_id: object) -> bool:
        return passage_id in self._by_id

    def index_of(self, passage_id: str) -> int:
        return self._by_id[passage_id]

    def get(self, passage_id: str) -> Passage:
        return self.passages[self._by_id[passage_id]]

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 (hex) of the passages' ids, titles and texts in order: the key of the index caches."""
        h = hashlib.sha256()
        for p in self.passages:
            for part in (p.id, p.title, p.text):
                data = part.encode("utf-8", "surrogatepass")
                h.update(len(data).to_bytes(8, "little"))
                h.update(data)
        return h.hexdigest()

    def __repr__(self) -> str:
        return f"Corpus({self.name!r}, {len(self.passages)} passages)"


@dataclass(frozen=True, eq=False)
class SearchQuestion:
    """The payload of a search QA task. Everything but ``question`` is private to the env until the end.

    Attributes:
        question: the question text shown to the agent.
        answers: the gold answer first, then its aliases; any of them scores 1.
        corpus: the passages the agent can search (shared by all questions of a file source); None when
            the passages live behind a retrieval server only (Search-R1's 21M-passage Wikipedia).
        supporting: ids of the supporting (gold) passages in ``corpus``; None when the source names none
            (NQ-open with a user corpus), in which case only ``answer_retrieved`` is reported.
        retriever: the URL of a retrieval server speaking Search-R1's API that the env searches instead
            of ``corpus`` (the source's ``retriever=`` option); None = search ``corpus`` in process.
    """

    question: str
    answers: tuple[str, ...]
    corpus: Corpus | None
    supporting: tuple[str, ...] | None = None
    retriever: str | None = None

    def __post_init__(self) -> None:
        if not self.answers:
            raise ValueError("a search question needs at least one gold answer")
        if self.corpus is None and self.supporting is not None:
            raise ValueError("supporting passages need a corpus to be in")
        if self.supporting is not None and self.corpus is not None:
            missing = [s for s in self.supporting if s not in self.corpus]
            if missing:
                raise ValueError(f"supporting passage(s) {missing} are not in corpus {self.corpus.name!r}")
