"""Retrieval quality of BM25, and of a dense encoder beside it: recall@k of the supporting passages, the
question as the query. Its command line is ``whale retriever recall``:

    whale retriever recall            # the bundled samples, a markdown table
    whale retriever recall "musique:QUESTIONS.json?corpus=CORPUS" --k 1 5 20
    whale retriever recall --encoder ./e5-base-v2      # BM25 and dense, side by side

``recall@k`` is the mean over questions of the share of a question's supporting passages among the top
``k``; ``all@k`` the share of questions with every supporting passage in the top ``k``.

With ``--encoder PATH`` (any local Hugging Face or sentence-transformers encoder folder, embedded as
its configuration says: prefixes and pooling, see :mod:`whale_envs.search.dense`; ``--query-prefix`` /
``--passage-prefix`` / ``--no-prefix`` override the prefixes) every source is scored twice on the same
questions:
BM25 as without the flag, and dense through the code the served dense index runs (a flat index built
over each corpus with :func:`~whale_envs.search.dense.build_index`, searched by
:class:`~whale_envs.search.dense.DenseIndex`). The indexes go to ``--index-dir`` (kept, and reused by
the next run over the same corpus and encoder: a stopped run resumes) or to a temporary folder.

The command prints each table row as soon as it is measured (:func:`markdown_header` first, then
:func:`markdown_row`), so a run stopped part way has printed the rows it finished.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from whale_envs.search.retriever import get_retriever
from whale_envs.tasks import TaskSource, make_source

if TYPE_CHECKING:
    from whale_envs.search.corpus import Corpus, SearchQuestion
    from whale_envs.search.dense import Encoder

DEFAULT_SOURCES = ("hotpotqa", "hotpotqa?sample=dev", "musique", "generated?size=300")

#: Ranks the passages of each question: (questions, k) -> the top-k passage ids of each, in order.
Ranker = Callable[[Sequence["SearchQuestion"], int], list[list[str]]]


@dataclass
class RecallReport:
    source: str
    questions: int
    passages: int  # corpus size (the mean, for per-question corpora)
    recall: dict[int, float]
    all_found: dict[int, float]
    seconds: float
    retriever: str = "bm25"  # "bm25", or "dense" (the encoder's folder name in the table)


def bm25_ranker(cache_dir: str | os.PathLike | None = None) -> Ranker:
    """Each question against the BM25 index of its corpus (the env's in-process retriever)."""

    def rank(questions: Sequence[SearchQuestion], k: int) -> list[list[str]]:
        out = []
        for qa in questions:
            retriever = get_retriever(qa.corpus, cache_dir=cache_dir)
            out.append([hit.passage.id for hit in retriever.search(qa.question, k)])
        return out

    return rank


def dense_ranker(encoder: Encoder, index_dir: str | os.PathLike) -> Ranker:
    """The questions of each distinct corpus against a flat dense index of it, built under ``index_dir``
    (one folder per corpus fingerprint; a finished one is reused), queries encoded in batches."""
    from whale_envs.search.dense import DenseIndex, build_index

    def rank(questions: Sequence[SearchQuestion], k: int) -> list[list[str]]:
        groups: dict[int, list[int]] = {}
        for i, qa in enumerate(questions):
            groups.setdefault(id(qa.corpus), []).append(i)
        out: list[list[str]] = [[] for _ in questions]
        for rows in groups.values():
            corpus = questions[rows[0]].corpus
            folder = Path(index_dir) / corpus.fingerprint[:16]
            folder = build_index(corpus, encoder, folder, kind="flat", progress=_progress(corpus))
            hits = DenseIndex(folder, corpus, encoder).search_batch([questions[i].question for i in rows], k)
            for i, found in zip(rows, hits, strict=True):
                out[i] = [passage.id for passage, _ in found]
        return out

    return rank


def _progress(corpus: Corpus) -> Callable[[int, int], None] | None:
    """A progress line on stderr per embedded chunk, for a corpus big enough to take a while."""
    if len(corpus) < 10_000:
        return None
    return lambda done, total: print(
        f"{corpus.name}: embedded {done}/{total} passages", file=sys.stderr, flush=True
    )


def retrieval_recall(
    source: str | TaskSource,
    ks: Sequence[int] = (1, 3, 5),
    *,
    cache_dir: str | os.PathLike | None = None,
    limit: int | None = None,
    ranker: Ranker | None = None,
    retriever: str = "bm25",
) -> RecallReport:
    """Recall@k of the supporting passages over the tasks of ``source`` that name them (the first
    ``limit`` tasks), ranked by ``ranker`` (default BM25: :func:`bm25_ranker`; named ``retriever`` in
    the report). A source that names no supporting passage is a ValueError."""
    src = make_source("search", source) if isinstance(source, str) else source
    ks = sorted(set(ks))
    start = time.perf_counter()
    questions = [qa for qa in (src.get(t).payload for t in list(src.ids())[:limit]) if qa.supporting]
    if not questions:
        raise ValueError(f"task source {src.name!r} names no supporting passages")
    ranked = (ranker or bm25_ranker(cache_dir))(questions, ks[-1])
    recall = dict.fromkeys(ks, 0.0)
    all_found = dict.fromkeys(ks, 0.0)
    for qa, ids in zip(questions, ranked, strict=True):
        gold = set(qa.supporting)
        for k in ks:
            found = len(gold & set(ids[:k]))
            recall[k] += found / len(gold)
            all_found[k] += found == len(gold)
    n = len(questions)
    return RecallReport(
        source=src.name if not isinstance(source, str) else source,
        questions=n,
        passages=round(sum(len(qa.corpus) for qa in questions) / n),
        recall={k: v / n for k, v in recall.items()},
        all_found={k: v / n for k, v in all_found.items()},
        seconds=time.perf_counter() - start,
        retriever=retriever,
    )


def markdown_header(ks: Sequence[int], by_retriever: bool) -> str:
    """The two header lines of :func:`markdown`'s table."""
    head = ["source", *(["retriever"] if by_retriever else []), "questions", "passages"]
    ks = sorted(set(ks))
    head += [*(f"recall@{k}" for k in ks), *(f"all@{k}" for k in ks)]
    return "| " + " | ".join(head) + " |\n" + "|" + "---|" * len(head)


def markdown_row(r: RecallReport, by_retriever: bool) -> str:
    """One report as a row of :func:`markdown`'s table."""
    ks = sorted(r.recall)
    cells = [f"`{r.source}`", *([r.retriever] if by_retriever else []), str(r.questions), str(r.passages)]
    cells += [f"{r.recall[k]:.3f}" for k in ks] + [f"{r.all_found[k]:.3f}" for k in ks]
    return "| " + " | ".join(cells) + " |"


def markdown(reports: Sequence[RecallReport]) -> str:
    """The reports as a markdown table; a ``retriever`` column when not every report is BM25's."""
    ks = sorted({k for r in reports for k in r.recall})
    by_retriever = any(r.retriever != "bm25" for r in reports)
    return "\n".join([markdown_header(ks, by_retriever), *(markdown_row(r, by_retriever) for r in reports)])


if __name__ == "__main__":  # the command moved to the whale command line (it parses its flags there)
    sys.exit("this table is `whale retriever recall [SOURCE...] [--k 1 3 5] [--encoder PATH]` now")
