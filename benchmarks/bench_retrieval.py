"""Retrieval as a service, side by side (issue 42): queries/s of ``whale retriever serve`` for BM25 and
dense at 10k and 200k synthetic passages, batched (one request of 32 queries) against one by one (32
requests); the size of each index; recall@10 of the approximate indexes (IVF, IVF-PQ) against flat.

``make bench`` reports the figures (``benchmark.extra_info``); ``make test`` runs each once (the large
ones are ``slow``, and there at ``WHALE_BENCH_LARGE`` passages: 40k, the same code at a fifth of the
build; 200k, the size the figures are for, everywhere else). The dense encoder is a random 1-layer
BERT built from a config (hidden size 64): its speed is the pipeline's, not e5-base-v2's (12 layers, 768 wide, ~100x the compute per passage).

Load mode (issue 49): p50/p95 latency and queries/s with 1, 32 and 512 concurrent clients, each
sending one query per request over its own keep-alive connection, driven from ANOTHER process (a small
asyncio client, :func:`drive`, run as ``python -m benchmarks.bench_retrieval --client ...``), against
the same queries sent as one request (the one-batch throughput); the server and its backend run here::

    python -m benchmarks.bench_retrieval --load [--passages 10000 200000] [--backends bm25 dense]

prints the table of docs/envs/search.md ("Under load"). Everything is on 127.0.0.1, bounded in count
(``--queries``, at least ``--per-client`` per client; ``--repeats`` interleaved runs a row, medians) and
time (``--timeout`` per run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from benchmarks.bench_search import synthetic_corpus
from tests.tiny_bert import save_random_bert, words_of
from whale_envs.search.dense import DenseIndex, Encoder, build_index
from whale_envs.search.remote import RemoteRetriever
from whale_envs.search.server import BM25Backend, RetrievalServer

QUERIES = 32


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("WHALE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "whale-cache"))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return Encoder(random_encoder(tmp_path_factory.mktemp("bench-encoder")), max_length=64, batch_size=256)


def random_encoder(folder: Path) -> Path:
    """The benchmarks' encoder, saved to ``folder``: a random 1-layer BERT over the synthetic corpus's
    words (built once per folder)."""
    if not (folder / "config.json").exists():
        words = words_of(f"{p.title} {p.text}" for p in synthetic_corpus(2000).passages)
        save_random_bert(folder, words, hidden_size=64)
    return folder


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


#: Passages of the large tests: 200k (``make bench``), or what ``WHALE_BENCH_LARGE`` says (``make test``).
LARGE = int(os.environ.get("WHALE_BENCH_LARGE", 200_000))


@pytest.fixture(scope="module")
def corpus_large():
    """The large synthetic corpus, made once for the module's large tests (4 s of CPU at 200k)."""
    return synthetic_corpus(LARGE)


@pytest.fixture(scope="module")
def bm25_large(corpus_large):
    """The BM25 backend over :func:`corpus_large`, built once for both ways of sending the queries."""
    return BM25Backend(corpus_large)


@pytest.mark.slow
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-by-one"])
@pytest.mark.benchmark(group="retrieval-server-large")
def test_bm25_server_large(benchmark, batched, corpus_large, bm25_large):
    benchmark.extra_info["passages"] = LARGE
    _bench_server(benchmark, bm25_large, corpus_large, batched)


@pytest.fixture(scope="module")
def dense_large(encoder, corpus_large, tmp_path_factory):
    folder = build_index(
        corpus_large, encoder, tmp_path_factory.mktemp("flat-large"), kind="flat", chunk=8192
    )
    return corpus_large, folder


@pytest.mark.slow
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-by-one"])
@pytest.mark.benchmark(group="retrieval-server-large")
def test_dense_server_large(benchmark, batched, encoder, dense_large):
    corpus, folder = dense_large
    benchmark.extra_info["passages"] = LARGE
    benchmark.extra_info["index_bytes"] = folder_bytes(folder, ["embeddings.f32", "index.faiss"])
    _bench_server(benchmark, DenseIndex(folder, corpus, encoder), corpus, batched)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ivf", "ivfpq"])
@pytest.mark.benchmark(group="retrieval-recall-large")
def test_approximate_recall_and_size_large(benchmark, kind, encoder, dense_large, tmp_path):
    """recall@10 of an approximate index against the flat one (the same vectors), and the index sizes."""
    pytest.importorskip("faiss")
    import shutil

    corpus, flat_folder = dense_large
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
        passages=LARGE,
    )
    assert recall > 0.5  # far above chance (10 / LARGE); the figure itself is in extra_info


def test_health_reports_the_backend(tmp_path):
    corpus = synthetic_corpus(500)
    server = serve(BM25Backend(corpus))
    try:
        reply = json.loads(urllib.request.urlopen(server.url.replace("/retrieve", "/health")).read())
        assert reply == {"status": "ok", "backend": "bm25", "passages": 500}
    finally:
        server.close()


# ------------------------------------------------------------------------------ load mode (issue 49)

REPO = Path(__file__).resolve().parents[1]


async def _client(host: str, port: int, queries: list[str], topk: int, clients: int, batch: bool) -> dict:
    """``clients`` keep-alive connections, each sending one query per request until ``queries`` are
    done (or all of them in one request when ``batch``): latency of every request, and the wall time."""
    todo = iter([queries] if batch else [[q] for q in queries])
    latencies: list[float] = []
    errors: list[str] = []

    async def one_connection() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            for qs in todo:
                body = json.dumps({"queries": qs, "topk": topk}).encode()
                head = (
                    f"POST /retrieve HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n"
                )
                start = time.perf_counter()
                writer.write(head.encode() + body)
                await writer.drain()
                status = (await reader.readline()).split(b" ", 2)
                length = 0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                reply = await reader.readexactly(length)
                latencies.append(time.perf_counter() - start)
                if len(status) < 2 or status[1] != b"200":
                    errors.append(f"HTTP {status[1:2]}: {reply[:200]!r}")
                elif len(json.loads(reply)["result"]) != len(qs):
                    errors.append("a reply without one result per query")
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(one_connection() for _ in range(clients)))
    return {"wall_s": time.perf_counter() - start, "latencies": latencies, "errors": errors[:5]}


def drive(url: str, queries: list[str], clients: int, *, topk: int = 3, batch: bool = False,
          timeout: float = 120.0) -> dict:  # fmt: skip
    """Run the load client in another process (``--client``) against ``url``; its measurements:
    queries/s, p50/p95 latency (seconds), and the requests that failed (none expected)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(queries, f)
    try:
        cmd = [sys.executable, "-m", "benchmarks.bench_retrieval", "--client", url, "--queries-file", f.name,
               "--clients", str(clients), "--topk", str(topk), *(["--batch"] if batch else [])]  # fmt: skip
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
    finally:
        os.unlink(f.name)
    if out.returncode != 0:
        raise RuntimeError(f"the load client failed: {out.stderr[-2000:]}")
    run = json.loads(out.stdout.strip().splitlines()[-1])
    lat = np.array(run["latencies"])
    return {
        "queries_per_s": len(queries) / run["wall_s"],
        "p50_ms": float(np.percentile(lat, 50)) * 1e3,
        "p95_ms": float(np.percentile(lat, 95)) * 1e3,
        "requests": len(lat),
        "errors": run["errors"],
    }


def load_table(
    backend, corpus, clients=(1, 32, 512), *, queries: int = 512, per_client: int = 8, repeats: int = 3,
    timeout: float = 120.0,
) -> list[dict]:  # fmt: skip
    """One row per client count against the one-batch figure: the same queries as one request. Each
    concurrency sends ``max(queries, per_client * clients)`` queries (every client sends a few, so the
    figure is the server's steady state, not its first connections); one-batch and loaded runs
    alternate ``repeats`` times and the row holds the medians (the ratio: the median of the repeats')."""
    server = serve(backend)
    rows = []
    try:
        drive(server.url, queries_of(corpus, 64), 8, timeout=timeout)  # warm up (caches, threads)
        for n in clients:
            qs = queries_of(corpus, max(queries, per_client * n))
            runs, batches = [], []
            for i in range(repeats):  # interleaved, the order alternating: drift in load hits both
                if i % 2 == 0:
                    one = drive(server.url, qs, 1, batch=True, timeout=timeout)
                    loaded = drive(server.url, qs, n, timeout=timeout)
                else:
                    loaded = drive(server.url, qs, n, timeout=timeout)
                    one = drive(server.url, qs, 1, batch=True, timeout=timeout)
                assert not loaded["errors"] and not one["errors"], (loaded["errors"], one["errors"])
                runs.append(loaded)
                batches.append(one)

            def med(xs, key):
                return float(np.median([x[key] for x in xs]))

            ratios = [r["queries_per_s"] / b["queries_per_s"] for r, b in zip(runs, batches, strict=True)]
            rows.append({"clients": n, "queries": len(qs),
                         **{k: med(runs, k) for k in ("queries_per_s", "p50_ms", "p95_ms")},
                         "requests": runs[0]["requests"], "errors": [],
                         "one_batch_queries_per_s": med(batches, "queries_per_s"),
                         "one_batch_ms": med(batches, "p50_ms"),
                         "of_one_batch": float(np.median(ratios)), "ratios": ratios})  # fmt: skip
        rows[-1]["refused_503"] = server.refused
    finally:
        server.close()
    return rows


def test_load_mode_drives_the_server_from_another_process():
    """The load mode at a small size (the figures are docs/envs/search.md's table, from ``--load``)."""
    corpus = synthetic_corpus(2000)
    rows = load_table(BM25Backend(corpus), corpus, clients=(1, 32), queries=64, repeats=2, timeout=60)
    assert [r["clients"] for r in rows] == [1, 32] and all(len(r["ratios"]) == 2 for r in rows)
    assert all(
        r["requests"] == r["queries"] and r["queries_per_s"] > 0 and r["p95_ms"] >= r["p50_ms"] for r in rows
    )


def _dense_backend(corpus, folder: Path):
    """A flat dense index of ``corpus`` under ``folder`` with the random 1-layer encoder of the tests."""
    encoder = Encoder(random_encoder(folder / "encoder"), max_length=64, batch_size=256)
    index = build_index(corpus, encoder, folder / f"flat{len(corpus)}", kind="flat", chunk=8192)
    return DenseIndex(index, corpus, encoder)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--load", action="store_true", help="print the load table (see the module docstring)")
    ap.add_argument("--passages", type=int, nargs="+", default=[10_000, 200_000])
    ap.add_argument("--backends", nargs="+", default=["bm25", "dense"], choices=["bm25", "dense"])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 32, 512])
    ap.add_argument(
        "--queries", type=int, default=512, help="queries per run (at least --per-client per client)"
    )
    ap.add_argument("--per-client", type=int, default=8, help="queries each client sends, at least")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved runs per row (medians)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per load-client run")
    ap.add_argument("--work-dir", default=None, help="index caches (default: a temporary folder)")
    ap.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)  # the load client itself
    ap.add_argument("--queries-file", help=argparse.SUPPRESS)
    ap.add_argument("--topk", type=int, default=3, help=argparse.SUPPRESS)
    ap.add_argument("--batch", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.client:
        from urllib.parse import urlsplit

        where = urlsplit(args.client)
        queries = json.loads(Path(args.queries_file).read_text())
        run = asyncio.run(
            _client(where.hostname, where.port, queries, args.topk, args.clients[0], args.batch)
        )
        print(json.dumps(run))
        return 0
    if not args.load:
        ap.error("--load (or run the benchmarks with pytest)")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-retrieval-"))
    os.environ.setdefault("WHALE_CACHE_DIR", str(work / "whale-cache"))
    print("| backend | passages | build s | clients | queries | p50 ms | p95 ms | queries/s "
          "| one batch queries/s | of one batch |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in args.passages:
        corpus = synthetic_corpus(n)
        for name in args.backends:
            start = time.perf_counter()
            backend = BM25Backend(corpus) if name == "bm25" else _dense_backend(corpus, work)
            build = time.perf_counter() - start
            rows = load_table(backend, corpus, args.clients, queries=args.queries, per_client=args.per_client,
                              repeats=args.repeats, timeout=args.timeout)  # fmt: skip
            for r in rows:
                print(f"| {name} | {n:,} | {build:.0f} | {r['clients']} | {r['queries']} | {r['p50_ms']:.1f} "
                      f"| {r['p95_ms']:.1f} | {r['queries_per_s']:.0f} | {r['one_batch_queries_per_s']:.0f} "
                      f"| {r['of_one_batch']:.0%} ({', '.join(f'{x:.0%}' for x in r['ratios'])}) |",
                      flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
