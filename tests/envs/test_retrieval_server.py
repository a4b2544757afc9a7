"""Retrieval as a service: the server speaks Search-R1's API over BM25 and a dense index, the
SearchQA env searches through it, and a dense index built with a tiny random encoder (made here from a
config and a local vocabulary: no downloads) is exact, resumable and served. Loopback only."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.tiny_bert import save_random_bert, words_of
from whale_envs.search.corpus import Corpus, Passage
from whale_envs.search.dense import DenseIndex, DenseIndexError, Encoder, build_index
from whale_envs.search.remote import RemoteRetriever, RetrieverError, RetrieverUnavailable
from whale_envs.search.server import BM25Backend, RetrievalServer

PASSAGES = [
    ("0", "Paris", "Paris is the capital and largest city of France, on the river Seine."),
    ("1", "The Hobbit", "The Hobbit is a novel by J. R. R. Tolkien, published in 1937."),
    ("2", "Lyon", "Lyon was founded by Lucius Munatius Plancus as a Roman colony."),
    ("3", "Seine", "The Seine is a river in northern France that flows through Paris."),
    ("4", "Tolkien", "John Ronald Reuel Tolkien wrote The Hobbit and The Lord of the Rings."),
    ("5", "Berlin", "Berlin is the capital of Germany, on the river Spree."),
]


def write_corpus(folder: Path) -> Path:
    """PASSAGES in Search-R1's corpus format: ``folder``/wiki.jsonl."""
    path = folder / "wiki.jsonl"
    rows = [{"id": i, "contents": f'"{t}"\n{x}'} for i, t, x in PASSAGES]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture
def corpus_file(tmp_path):
    return write_corpus(tmp_path)


@pytest.fixture
def corpus(corpus_file):
    from whale_envs.search.sources import load_corpus

    return load_corpus(corpus_file)


def serve(backend, **batch):
    server = RetrievalServer(backend, "127.0.0.1", 0, **batch)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server


def post(url, payload):
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture
def bm25_server(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("WHALE_CACHE_DIR", str(tmp_path / "cache"))
    server = serve(BM25Backend(corpus))
    yield server
    server.close()


def test_server_answers_search_r1_payload(bm25_server):
    reply = post(
        bm25_server.url,
        {"queries": ["capital of France", "who wrote the hobbit"], "topk": 2, "return_scores": True},
    )
    assert set(reply) == {"result"} and len(reply["result"]) == 2
    first = reply["result"][0][0]
    assert set(first) == {"document", "score"} and first["document"]["id"] == "0"
    assert first["document"]["contents"].startswith('"Paris"\n') and first["score"] > 0
    assert len(reply["result"][1]) == 2
    assert {d["document"]["id"] for d in reply["result"][1]} == {"1", "4"}
    plain = post(bm25_server.url, {"queries": ["river Seine"], "topk": 1, "return_scores": False})
    assert set(plain["result"][0][0]) == {"id", "contents"}  # Search-R1: documents alone without scores
    health = json.loads(urllib.request.urlopen(bm25_server.url.replace("/retrieve", "/health")).read())
    assert health == {"status": "ok", "backend": "bm25", "passages": 6}


def test_server_rejects_bad_payloads_with_one_line(bm25_server):
    for body, needle in (
        (b"{", "not JSON"),
        (b'{"queries": [1]}', "list of strings"),
        (b'{"queries": ["x"], "topk": 0}', "topk"),
    ):
        request = urllib.request.Request(bm25_server.url, data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=10)
        assert err.value.code == 400 and needle in json.loads(err.value.read())["error"]
    with pytest.raises(RetrieverError, match="HTTP 400"):  # a 4xx is not retried
        RemoteRetriever(bm25_server.url, retries=5, backoff=10).search_batch(["x"], 0)


def test_concurrent_requests_are_batched(corpus):
    class Counting(BM25Backend):
        sizes: list[int] = []

        def search_batch(self, queries, k):
            time.sleep(0.05)  # a slow encoder: requests pile up meanwhile
            self.sizes.append(len(queries))
            return super().search_batch(queries, k)

    server = serve(Counting(corpus), batch_wait_s=0.02)
    try:
        client = RemoteRetriever(server.url)
        queries = ["Paris", "Hobbit", "Lyon", "Seine", "Tolkien", "Berlin"] * 4
        with ThreadPoolExecutor(12) as pool:
            results = list(pool.map(lambda q: client.search(q, 1), queries))
        assert [r[0].passage.title for r in results] == [
            q if q != "Hobbit" else "The Hobbit" for q in queries
        ]
        assert sum(Counting.sizes) == len(queries) and max(Counting.sizes) > 1  # several queries per call
    finally:
        server.close()


def test_searchqa_episode_end_to_end_through_the_server(bm25_server, tmp_path):
    rows = [
        {"id": "test_0", "question": "which river flows through paris", "golden_answers": ["Seine", "the Seine"],
         "data_source": "hotpotqa", "reward_model": {"style": "rule", "ground_truth": {"target": ["Seine"]}}},
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "test.parquet")
    env = gym.make(
        "whale/SearchQA-v0",
        tasks=f"searchr1:{tmp_path / 'test.parquet'}",
        split="all",
        retriever=bm25_server.url,
    )
    obs, info = env.reset(seed=0)
    assert info["question"] == "which river flows through paris" and info["corpus_size"] is None
    obs, reward, done, _, info = env.step("search: river through Paris")
    assert not done and info["passages"][0]["title"] in ("Seine", "Paris")
    assert "flows through Paris" in obs or "river Seine" in obs
    obs, reward, done, _, info = env.step("answer: the Seine")
    assert done and reward == 1.0 and info["solved"] and set(info["retrieved"]) >= {"0", "3"}
    # the same URL as a task-spec option
    env2 = gym.make(
        "whale/SearchQA-v0",
        tasks=f"searchr1:{tmp_path / 'test.parquet'}?retriever={bm25_server.url}",
        split="all",
    )
    env2.reset(seed=0)
    _, _, _, _, info = env2.step("search: Seine")
    assert info["passages"][0]["id"] == "3"


def test_server_down_is_a_clear_error():
    client = RemoteRetriever("http://127.0.0.1:9/retrieve", timeout=2, retries=1, backoff=0)
    with pytest.raises(
        RetrieverUnavailable,
        match=r"127\.0\.0\.1:9/retrieve did not answer after 2 tries .*whale retriever serve",
    ):
        client.search("anything", 3)
    with pytest.raises(ValueError, match="retriever must be a URL"):
        RemoteRetriever("127.0.0.1:8000")


# ------------------------------------------------------------------------------ dense retrieval


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    """A random 1-layer BERT and a word-piece vocabulary of the corpus words, built locally."""
    folder = tmp_path_factory.mktemp("encoders") / "tiny-e5"  # named e5: e5's prefixes
    words = words_of(f"{t} {x}" for _, t, x in PASSAGES) | {"query", "passage"}
    return save_random_bert(folder, words, extra=(".", ","))


def test_encoder_follows_e5_conventions(encoder_dir):
    enc = Encoder(encoder_dir)
    assert (enc.query_prefix, enc.passage_prefix, enc.prefixes_from) == ("query: ", "passage: ", "e5 model")
    assert (enc.pooling, enc.normalize) == ("mean", True)  # no modules.json: e5's mean pooling, normalized
    q = enc.encode(["capital of france"], query=True)
    p = enc.encode(["capital of france"], query=False)
    assert q.shape == (1, 32) and q.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, rtol=1e-5)
    assert not np.allclose(q, p)  # "query: " and "passage: " prefixes differ
    padded = enc.encode(
        ["capital of france", "the hobbit is a novel by tolkien published in 1937"], query=True
    )
    np.testing.assert_allclose(padded[0], q[0], atol=1e-5)  # mean pooling ignores padding


def test_flat_index_is_exact_and_served(encoder_dir, corpus, tmp_path):
    enc = Encoder(encoder_dir)
    folder = build_index(corpus, enc, tmp_path / "idx", kind="flat", chunk=4)
    index = DenseIndex(folder, corpus, enc)
    queries = ["river in france", "novel by tolkien"]
    vectors = enc.encode(queries, query=True)
    passages = enc.encode([f'"{p.title}"\n{p.text}' for p in corpus.passages], query=False)
    brute = np.argsort(-(vectors @ passages.T), axis=1)[:, :3]
    hits = index.search_batch(queries, 3)
    assert [[corpus.index_of(p.id) for p, _ in row] for row in hits] == brute.tolist()
    server = serve(index)
    try:
        reply = post(server.url, {"queries": queries, "topk": 3, "return_scores": True})
        assert [[int(d["document"]["id"]) for d in row] for row in reply["result"]] == brute.tolist()
    finally:
        server.close()


def test_numpy_fallback_matches_faiss(encoder_dir, corpus, tmp_path):
    enc = Encoder(encoder_dir)
    folder = build_index(corpus, enc, tmp_path / "idx", kind="flat")
    with_faiss = DenseIndex(folder, corpus, enc).search_batch(["capital city"], 4)[0]
    (folder / "index.faiss").unlink()  # as on a machine without faiss: the memory-mapped matrix is the index
    plain = DenseIndex(folder, corpus, enc)
    assert plain.index is None and plain.matrix is not None
    without = plain.search_batch(["capital city"], 4)[0]
    assert [p.id for p, _ in without] == [p.id for p, _ in with_faiss]
    np.testing.assert_allclose([s for _, s in without], [s for _, s in with_faiss], rtol=1e-5)


def test_build_resumes_where_it_stopped(encoder_dir, corpus, tmp_path):
    enc = Encoder(encoder_dir)

    class Stop(Exception):
        pass

    def stop_after_first_chunk(done, total):
        if done < total:
            raise Stop

    with pytest.raises(Stop):
        build_index(corpus, enc, tmp_path / "idx", chunk=2, progress=stop_after_first_chunk)
    with pytest.raises(DenseIndexError, match="unfinished build"):
        DenseIndex(tmp_path / "idx", corpus, enc)
    encoded: list[int] = []
    original = enc.encode
    enc.encode = lambda texts, query: (encoded.append(len(texts)), original(texts, query=query))[1]
    build_index(corpus, enc, tmp_path / "idx", chunk=2)
    assert sum(encoded) == len(corpus) - 2  # only the passages not embedded yet
    enc.encode = original
    fresh = build_index(corpus, enc, tmp_path / "fresh", chunk=6)
    a = np.fromfile(tmp_path / "idx" / "embeddings.f32", dtype=np.float32)
    b = np.fromfile(fresh / "embeddings.f32", dtype=np.float32)
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_ivf_index_and_corpus_mismatch(encoder_dir, corpus, tmp_path):
    pytest.importorskip(
        "faiss", reason="ivf needs faiss-cpu (the [retrieval] extra; installed for the tests)"
    )
    enc = Encoder(encoder_dir)
    folder = build_index(corpus, enc, tmp_path / "ivf", kind="ivf", nlist=2)
    index = DenseIndex(folder, corpus, enc, nprobe=2)
    flat = DenseIndex(build_index(corpus, enc, tmp_path / "flat"), corpus, enc)
    assert [p.id for p, _ in index.search_batch(["paris"], 3)[0]] == [
        p.id for p, _ in flat.search_batch(["paris"], 3)[0]
    ]
    pq_folder = build_index(corpus, enc, tmp_path / "ivfpq", kind="ivfpq", nlist=1, pq_m=8)
    pq_index = DenseIndex(pq_folder, corpus, enc)
    assert pq_index.rerank == 10  # PQ candidates re-scored exactly from the memory-mapped vectors
    exact = flat.search_batch(["paris", "tolkien novel"], 3)
    reranked = pq_index.search_batch(["paris", "tolkien novel"], 3)
    assert [[p.id for p, _ in row] for row in reranked] == [[p.id for p, _ in row] for row in exact]
    np.testing.assert_allclose(
        [s for row in reranked for _, s in row], [s for row in exact for _, s in row], rtol=1e-5
    )
    other = Corpus("other", [Passage("x", "X", "something else")])
    with pytest.raises(DenseIndexError, match="another corpus"):
        DenseIndex(folder, other, enc)


def test_cli_build_then_serve_backend(encoder_dir, corpus_file, tmp_path):
    from whale_train.cli import main
    from whale_train.cli.retriever import make_backend

    out = tmp_path / "cli-idx"

    def build(encoder) -> int:
        return main(
            ["retriever", "build", "--corpus", str(corpus_file), "--encoder", str(encoder), "--out", str(out)]
        )

    assert build(encoder_dir) == 0
    backend = make_backend(str(corpus_file), str(out))
    assert backend.name == "dense" and len(backend.search_batch(["paris"], 2)[0]) == 2
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["query_prefix"], meta["passage_prefix"]) == ("query: ", "passage: ")
    assert (meta["pooling"], meta["normalize"]) == ("mean", True)
    assert build(tmp_path) == 2


def test_whale_retriever_serve_command_answers(corpus_file, tmp_path):
    """The command itself, as a user starts it: port 0, the URL read from its first line."""
    import os
    import re
    import subprocess
    import sys

    env = {**os.environ, "WHALE_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "whale_train.cli",
        "retriever",
        "serve",
        "--corpus",
        str(corpus_file),
        "--port",
        "0",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/retrieve", line)
        assert url, (line, proc.stderr.read() if proc.poll() is not None else "")
        reply = post(url.group(0), {"queries": ["Tolkien hobbit"], "topk": 2, "return_scores": True})
        assert {d["document"]["id"] for d in reply["result"][0]} == {"1", "4"}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
