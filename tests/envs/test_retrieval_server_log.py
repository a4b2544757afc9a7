"""`whale retriever serve` says what it does: a summary line per window that saw traffic
(requests, queries, errors, latency), or a line per request with ``--log-requests``; nothing when idle."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

from whale_envs.search.corpus import Corpus, Passage
from whale_envs.search.server import BM25Backend, RequestLog, RetrievalServer

CORPUS = Corpus(
    "tiny", [Passage(f"p{i}", f"Title {i}", f"passage {i} about topic {i % 5}") for i in range(50)]
)


def _post(url: str, payload: dict) -> int:
    req = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _serve(log: RequestLog) -> RetrievalServer:
    server = RetrievalServer(BM25Backend(CORPUS), "127.0.0.1", 0, request_log=log)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_one_line_per_request_names_client_status_queries_and_time():
    lines: list[str] = []
    server = _serve(RequestLog(lines.append, per_request=True))
    try:
        assert _post(server.url, {"queries": ["topic 1", "topic 2"], "topk": 2}) == 200
        assert _post(server.url, {"queries": ["x"], "topk": 10_000}) == 400  # over --max-topk
    finally:
        server.close()
    assert len(lines) == 2
    assert lines[0].startswith("127.0.0.1 /retrieve 200 queries=2 ") and lines[0].endswith(" ms")
    assert lines[1].startswith("127.0.0.1 /retrieve 400 queries=0 ")


def test_summaries_count_each_window_and_say_nothing_when_idle():
    lines: list[str] = []
    log = RequestLog(lines.append, every_s=0)  # no timer thread: the test asks for each window
    server = _serve(log)
    try:
        assert log.summary() is None  # idle: no line
        for _ in range(3):
            assert _post(server.url, {"queries": ["topic 3"], "topk": 1}) == 200
        assert _post(server.url, {"queries": ["x"], "topk": 10_000}) == 400  # over --max-topk
        line = log.summary()
        assert line is not None and line.startswith("4 requests, 3 queries, errors 1×400; latency p50 ")
        assert log.summary() is None  # a new window
    finally:
        server.close()
    assert lines == []  # close() with an empty window writes nothing
