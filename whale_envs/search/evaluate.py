"""Retrieval quality of the BM25 retriever: recall@k of the supporting passages, the question as the query.

    python -m whale_envs.search.evaluate            # the bundled samples, a markdown table
    python -m whale_envs.search.evaluate "musique:QUESTIONS.json?corpus=CORPUS" --k 1 5 20

``recall@k`` is the mean over questions of the share of a question's supporting passages among the top
``k``; ``all@k`` the share of questions with every supporting passage in the top ``k``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from whale_envs.search.retriever import get_retriever
from whale_envs.tasks import TaskSource, make_source

DEFAULT_SOURCES = ("hotpotqa", "hotpotqa?sample=dev", "musique", "generated?size=300")


@dataclass
class RecallReport:
    source: str
    questions: int
    passages: int  # corpus size (the mean, for per-question corpora)
    recall: dict[int, float]
    all_found: dict[int, float]
    seconds: float


def retrieval_recall(
    source: str | TaskSource,
    ks: Sequence[int] = (1, 3, 5),
    *,
    cache_dir: str | os.PathLike | None = None,
    limit: int | None = None,
) -> RecallReport:
    """Recall@k of the supporting passages over the tasks of ``source`` that name them."""
    src = make_source("search", source) if isinstance(source, str) else source
    ks = sorted(set(ks))
    recall = dict.fromkeys(ks, 0.0)
    all_found = dict.fromkeys(ks, 0.0)
    n = sizes = 0
    start = time.perf_counter()
    for task_id in list(src.ids())[:limit]:
        qa = src.get(task_id).payload
        if not qa.supporting:
            continue
        retriever = get_retriever(qa.corpus, cache_dir=cache_dir)
        ranked = [hit.passage.id for hit in retriever.search(qa.question, ks[-1])]
        gold = set(qa.supporting)
        for k in ks:
            found = len(gold & set(ranked[:k]))
            recall[k] += found / len(gold)
            all_found[k] += found == len(gold)
        n += 1
        sizes += len(qa.corpus)
    if n == 0:
        raise ValueError(f"task source {src.name!r} names no supporting passages")
    return RecallReport(
        source=src.name if not isinstance(source, str) else source,
        questions=n,
        passages=round(sizes / n),
        recall={k: v / n for k, v in recall.items()},
        all_found={k: v / n for k, v in all_found.items()},
        seconds=time.perf_counter() - start,
    )


def markdown(reports: Sequence[RecallReport]) -> str:
    ks = sorted({k for r in reports for k in r.recall})
    head = ["source", "questions", "passages", *(f"recall@{k}" for k in ks), *(f"all@{k}" for k in ks)]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in reports:
        cells = [f"`{r.source}`", str(r.questions), str(r.passages)]
        cells += [f"{r.recall[k]:.3f}" for k in ks] + [f"{r.all_found[k]:.3f}" for k in ks]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="*", default=list(DEFAULT_SOURCES), help="task source specs")
    parser.add_argument("--k", nargs="+", type=int, default=[1, 3, 5], help="cut-offs (default 1 3 5)")
    parser.add_argument("--cache-dir", default=None, help="index cache folder (default: the usual one)")
    args = parser.parse_args(argv)
    reports = [retrieval_recall(s, args.k, cache_dir=args.cache_dir) for s in args.sources]
    print(markdown(reports))


if __name__ == "__main__":
    main()
