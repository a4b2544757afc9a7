"""Retrieval as a service, side by side (issue 42): queries/s of ``whale retriever serve`` for BM25 and
dense at 10k and 200k synthetic passages, batched (one request of 32 queries) against one by one (32
requests); the size of each index; recall@10 of the approximate indexes (IVF, IVF-PQ) against flat.

``make bench`` reports the figures (``benchmark.extra_info``); ``make test`` runs each once (the 200k
ones are ``slow``). The dense encoder is a random 1-layer BERT built from a config (hidden size 64):
its speed is the pipeline's, not e5-base-v2's (12 layers, 768 wide, ~100x the compute per passage).
"""

from __future__ import annotations

import json
import threading
import urllib.request

import numpy as np
import pytest

from benchmarks.bench_search import synthetic_corpus
from whale_envs.search.dense import DenseIndex, Encoder, build_index
from whale_envs.search.remote import RemoteRetriever
from whale_envs.search.server import BM25Backend, RetrievalServer

QUERIES = 32


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("WHALE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "whale-cache"))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    folder = tmp_path_factory.mktemp("bench-encoder")
    corpus = synthetic_corpus(2000)
    words = sorted({w.strip('.,"').lower() for p in corpus.passages for w in f"{p.title} {p.text}".split()})
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ":", '"', *words])}
    BertTokenizer(vocab=vocab).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=128)  # fmt: skip
    BertModel(config).save_pretrained(folder)
    return Encoder(folder, max_length=64, batch_size=256)


def queries_of(corpus, n=QUERIES):
    rng = np.random.default_rng(0)
    return [
        corpus[int(i)].title + " " + corpus[int(i)].text.split(".")[0]
        for i in rng.integers(0, len(corpus), n)
    ]


def serve(backend):
    server = RetrievalServer(backend, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def folder_bytes(folder, names):
    return sum((folder / n).stat().st_size for n in names if (folder / n).exists())


def _bench_server(benchmark, backend, corpus, batched):
    server = serve(backend)
    client = RemoteRetriever(server.url)
    queries = queries_of(corpus)
    try:
        if batched:
            benchmark(lambda: client.search_batch(queries, 3))
        else:
            benchmark(lambda: [client.search(q, 3) for q in queries])
        stats = getattr(benchmark, "stats", None)
        if stats is not None:
            benchmark.extra_info["queries_per_s"] = round(QUERIES / stats.stats.mean, 1)
        benchmark.extra_info["passages"] = len(corpus)
        hits = client.search(queries[0], 3)
        assert hits and hits[0].passage.id  # the served answer is a real passage
    finally:
        server.close()


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-by-one"])
@pytest.mark.benchmark(group="retrieval-server-10k")
def test_bm25_server_10k(benchmark, batched):
    corpus = synthetic_corpus(10_000)
    _bench_server(benchmark, BM25Backend(corpus), corpus, batched)


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-by-one"])
@pytest.mark.benchmark(group="retrieval-server-10k")
def test_dense_server_10k(benchmark, batched, encoder, tmp_path):
    corpus = synthetic_corpus(10_000)
    folder = build_index(corpus, encoder, tmp_path / "flat", kind="flat")
    benchmark.extra_info["index_bytes"] = folder_bytes(folder, ["embeddings.f32", "index.faiss"])
    _bench_server(benchmark, DenseIndex(folder, corpus, encoder), corpus, batched)


@pytest.mark.slow
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-by-one"])
@pytest.mark.benchmark(group="retrieval-server-200k")
def test_bm25_server_200k(benchmark, batched):
    corpus = synthetic_corpus(200_000)
    _bench_server(benchmark, BM25Backend(corpus), corpus, batched)


@pytest.fixture(scope="module")
def dense_200k(encoder, tmp_path_factory):
    corpus = synthetic_corpus(200_000)
    folder = build_index(corpus, encoder, tmp_path_factory.mktemp("flat200k"), kind="flat", chunk=8192)
    return corpus, folder


@pytest.mark.slow
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-by-one"])
@pytest.mark.benchmark(group="retrieval-server-200k")
def test_dense_server_200k(benchmark, batched, encoder, dense_200k):
    corpus, folder = dense_200k
    benchmark.extra_info["index_bytes"] = folder_bytes(folder, ["embeddings.f32", "index.faiss"])
    _bench_server(benchmark, DenseIndex(folder, corpus, encoder), corpus, batched)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ivf", "ivfpq"])
@pytest.mark.benchmark(group="retrieval-recall-200k")
def test_approximate_recall_and_size_200k(benchmark, kind, encoder, dense_200k, tmp_path):
    """recall@10 of an approximate index against the flat one (the same vectors), and the index sizes."""
    pytest.importorskip("faiss")
    import shutil

    corpus, flat_folder = dense_200k
    folder = tmp_path / kind
    folder.mkdir()
    for name in ("embeddings.f32", "progress.json"):  # the same vectors: only the index is built
        shutil.copy(flat_folder / name, folder / name)
    build_index(corpus, encoder, folder, kind=kind, pq_m=16)
    flat, approx = DenseIndex(flat_folder, corpus, encoder), DenseIndex(folder, corpus, encoder)
    vectors = encoder.encode(queries_of(corpus, 256), query=True)
    _, exact = flat.search_vectors(vectors, 10)
    _, found = benchmark(lambda: approx.search_vectors(vectors, 10))
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(exact, found, strict=True)])
    if kind == "ivfpq":  # the same index without the exact re-scoring of its candidates
        approx.rerank = 0
        _, coarse = approx.search_vectors(vectors, 10)
        benchmark.extra_info["recall_at_10_no_rerank"] = round(
            float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(exact, coarse, strict=True)])), 3
        )
    benchmark.extra_info.update(
        recall_at_10=round(float(recall), 3),
        index_bytes=folder_bytes(folder, ["index.faiss"]),
        flat_bytes=folder_bytes(flat_folder, ["embeddings.f32"]),
        nprobe=approx.index.nprobe,
    )
    assert recall > 0.5  # far above chance (10 / 200k); the figure itself is in extra_info


def test_health_reports_the_backend(tmp_path):
    corpus = synthetic_corpus(500)
    server = serve(BM25Backend(corpus))
    try:
        reply = json.loads(urllib.request.urlopen(server.url.replace("/retrieve", "/health")).read())
        assert reply == {"status": "ok", "backend": "bm25", "passages": 500}
    finally:
        server.close()
