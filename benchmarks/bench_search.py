"""SearchQA retriever speed: index build time, query throughput, and a cached second start against the
first. ``make bench`` reports the figures; ``make test`` runs each once.

The cached-start tests time a *start* (build the env from its files, then the first ``reset``) twice with
an empty process cache: first with an empty disk cache (the index is built and saved), then with the
saved index. ``benchmark.extra_info`` carries the seconds and the ratio, for the whole start and for
the index alone (built vs loaded).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path

import pytest

from whale_envs.search import SearchQAEnv
from whale_envs.search import sources as search_sources
from whale_envs.search.corpus import Corpus, Passage
from whale_envs.search.generator import generate_sample
from whale_envs.search.retriever import Retriever, clear_memory_cache
from whale_envs.tasks import make_source


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("WHALE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "whale-cache"))


def musique():
    src = make_source("search", "musique")
    questions = [src.get(i).payload.question for i in src.ids()]
    return src.get(src.ids()[0]).payload.corpus, questions


def synthetic_corpus(n: int) -> Corpus:
    """About ``n`` passages of generated worlds (plain text, ~120 characters each)."""
    passages: list[Passage] = []
    world = 0
    while len(passages) < n:
        sample = generate_sample(random.Random(world), 2, corpus_size=2000)
        passages += [Passage(f"w{world}:{p.id}", p.title, p.text) for p in sample.passages]
        world += 1
    return Corpus(f"synthetic {n}", passages[:n])


@pytest.mark.benchmark(group="search-index")
def test_index_build_musique(benchmark):
    corpus, _ = musique()
    retriever = benchmark(lambda: Retriever(corpus).build())
    benchmark.extra_info["passages"] = len(corpus)
    assert retriever.search("Journal of Psychotherapy Integration", 1)


@pytest.mark.slow
@pytest.mark.benchmark(group="search-index")
def test_index_build_50k_passages(benchmark):
    corpus = synthetic_corpus(50_000)
    retriever = benchmark.pedantic(lambda: Retriever(corpus).build(), rounds=2, iterations=1)
    benchmark.extra_info["passages"] = len(corpus)
    assert len(retriever.search(corpus[123].title, 5)) == 5


@pytest.mark.benchmark(group="search-query")
def test_query_throughput_musique(benchmark):
    corpus, questions = musique()
    retriever = Retriever(corpus).build()

    def run():
        return [retriever.search(q, 5) for q in questions]

    results = benchmark(run)
    benchmark.extra_info["queries_per_round"] = len(questions)
    assert len(results) == 100 and all(results)


@pytest.mark.slow
@pytest.mark.benchmark(group="search-query")
def test_query_throughput_50k_passages(benchmark):
    corpus = synthetic_corpus(50_000)
    retriever = Retriever(corpus).build()
    queries = [f"{corpus[i].title} born" for i in range(0, 50_000, 500)]
    results = benchmark(lambda: [retriever.search(q, 5) for q in queries])
    benchmark.extra_info["queries_per_round"] = len(queries)
    assert results[0][0].passage.title == corpus[0].title


def _start(spec: str, cache_dir: Path) -> tuple[float, float]:
    """Seconds to build an env from its files and reset it, with nothing in the process caches, and the
    part of them spent building or loading the index."""
    clear_memory_cache()
    search_sources.clear_cache()
    start = time.perf_counter()
    env = SearchQAEnv(spec, cache_dir=cache_dir)
    env.reset(seed=0)
    elapsed = time.perf_counter() - start
    assert env.retriever.corpus is env.task.payload.corpus
    return elapsed, env.retriever.build_seconds


def _first_and_second(benchmark, spec: str, tmp_path: Path, rounds: int) -> tuple[float, float]:
    firsts, seconds = [], []
    for i in range(rounds):
        cache = tmp_path / f"cache{i}"
        firsts.append(_start(spec, cache))
        seconds.append(_start(spec, cache))
    first, second = (statistics.median(t for t, _ in runs) for runs in (firsts, seconds))
    index_first, index_second = (statistics.median(i for _, i in runs) for runs in (firsts, seconds))
    benchmark.extra_info.update(
        first_start_s=first,
        second_start_s=second,
        ratio=second / first,
        index_build_s=index_first,
        index_load_s=index_second,
        index_ratio=index_second / index_first,
    )
    return first, second


@pytest.mark.benchmark(group="search-start")
def test_cached_second_start_musique(benchmark, tmp_path):
    first, second = _first_and_second(benchmark, "musique", tmp_path, rounds=3)
    benchmark.pedantic(_start, args=("musique", tmp_path / "cache0"), rounds=3, iterations=1)
    assert second < first  # the saved index is loaded, not rebuilt


@pytest.mark.slow
@pytest.mark.benchmark(group="search-start")
def test_cached_second_start_50k_corpus(benchmark, tmp_path):
    corpus = synthetic_corpus(50_000)
    corpus_file = tmp_path / "corpus.jsonl"
    with open(corpus_file, "w", encoding="utf-8") as fh:
        for p in corpus.passages:
            fh.write(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n")
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"question": "who founded it", "answer": ["x"]}) + "\n", encoding="utf-8")
    spec = f"nq:{questions}?corpus={corpus_file}"
    first, second = _first_and_second(benchmark, spec, tmp_path, rounds=2)
    benchmark.pedantic(_start, args=(spec, tmp_path / "cache0"), rounds=2, iterations=1)
    assert second < first
