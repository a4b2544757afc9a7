"""A retrieval server speaking Search-R1's API, over BM25 or a dense index (stdlib ``http.server``).

    POST /retrieve  {"queries": [...], "topk": 3, "return_scores": true}  -> {"result": [[...], ...]}
    GET  /health    -> {"status": "ok", "backend": "bm25", "passages": 994}

(the reply format is in :mod:`whale_envs.search.remote`). Many rollout workers can query at once: a
``ThreadingHTTPServer`` takes the connections and one :class:`Batcher` thread runs their queries
together, up to ``max_batch`` queries per backend call (a dense encoder embeds them in one forward
pass), waiting at most ``batch_wait_s`` for company.

Error policy: a bad payload gets HTTP 400 with a one-line JSON ``{"error": ...}``; a backend failure
HTTP 500 with its message; the server keeps running either way.

    whale retriever serve --corpus wiki.jsonl [--index DIR] --port 8000
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from whale_envs.search.corpus import Corpus, Passage

#: Largest request body accepted (bytes).
MAX_BODY = 1 << 20
MAX_TOPK = 1000


class SearchBackend(Protocol):
    """What the server serves: ``k`` (passage, score) pairs per query, best first."""

    name: str

    def __len__(self) -> int: ...

    def search_batch(self, queries: Sequence[str], k: int) -> list[list[tuple[Passage, float]]]: ...


class BM25Backend:
    """BM25 (:mod:`whale_envs.search.retriever`) over a corpus, index cached on disk as usual."""

    name = "bm25"

    def __init__(self, corpus: Corpus, cache_dir: str | None = None):
        from whale_envs.search.retriever import get_retriever

        self.corpus = corpus
        self.retriever = get_retriever(corpus, cache_dir=cache_dir)

    def __len__(self) -> int:
        return len(self.corpus)

    def search_batch(self, queries: Sequence[str], k: int) -> list[list[tuple[Passage, float]]]:
        return [[(h.passage, h.score) for h in self.retriever.search(q, k)] for q in queries]


def document(passage: Passage) -> dict[str, str]:
    """A passage as Search-R1's corpus stores it: ``{"id", "contents": '"Title"\\ntext'}``."""
    return {"id": passage.id, "contents": f'"{passage.title}"\n{passage.text}'}


class Batcher:
    """Runs the queries of concurrent requests together (see the module docstring)."""

    def __init__(self, backend: SearchBackend, *, max_batch: int = 64, batch_wait_s: float = 0.002):
        self.backend = backend
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self._queue: queue.Queue[tuple[list[str], int, Future] | None] = queue.Queue()
        self.batches = 0  # backend calls made (for tests and the benchmark)
        self._thread = threading.Thread(target=self._loop, name="retrieval-batcher", daemon=True)
        self._thread.start()

    def submit(self, queries: list[str], k: int) -> list[list[tuple[Passage, float]]]:
        future: Future = Future()
        self._queue.put((queries, k, future))
        return future.result()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            group = [first]
            size = len(first[0])
            while size < self.max_batch:
                try:
                    item = self._queue.get(timeout=self.batch_wait_s)
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # stop after this batch
                    break
                group.append(item)
                size += len(item[0])
            self._run(group)

    def _run(self, group: list[tuple[list[str], int, Future]]) -> None:
        queries = [q for qs, _, _ in group for q in qs]
        k = max(k for _, k, _ in group)
        try:
            results = self.backend.search_batch(queries, k) if queries else []
            self.batches += 1
        except Exception as exc:  # noqa: BLE001 (reported to every waiting request, server lives on)
            for _, _, future in group:
                future.set_exception(exc)
            return
        at = 0
        for qs, qk, future in group:
            future.set_result([r[:qk] for r in results[at : at + len(qs)]])
            at += len(qs)


def parse_request(body: bytes) -> tuple[list[str], int, bool]:
    """(queries, topk, return_scores) of a /retrieve body; ValueError with a one-line reason."""
    try:
        payload = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the body is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise ValueError("the body must be a JSON object with 'queries'")
    queries = payload.get("queries")
    if isinstance(queries, str):
        queries = [queries]
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise ValueError("'queries' must be a list of strings")
    topk = payload.get("topk", 3)
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= MAX_TOPK:
        raise ValueError(f"'topk' must be an integer in 1-{MAX_TOPK}, got {topk!r}")
    return queries, topk, bool(payload.get("return_scores", False))


class RetrievalServer(ThreadingHTTPServer):
    """The HTTP server; ``serve_forever()`` in a thread of your own, ``shutdown()`` + ``server_close()``
    to stop (``close()`` does both and stops the batcher)."""

    daemon_threads = True

    def __init__(self, backend: SearchBackend, host: str = "127.0.0.1", port: int = 8000, **batch: Any):
        self.backend = backend
        self.batcher = Batcher(backend, **batch)
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/retrieve"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.batcher.close()


class _Handler(BaseHTTPRequestHandler):
    server: RetrievalServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise
        pass

    def _reply(self, code: int, payload: Any) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.rstrip("/") != "/health":
            self._reply(404, {"error": "unknown path; POST /retrieve or GET /health"})
            return
        backend = self.server.backend
        self._reply(200, {"status": "ok", "backend": backend.name, "passages": len(backend)})

    def do_POST(self) -> None:  # noqa: N802
        if self.path.rstrip("/") != "/retrieve":
            self._reply(404, {"error": "unknown path; POST /retrieve"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._reply(413, {"error": f"body over {MAX_BODY} bytes"})
            return
        try:
            queries, topk, scores = parse_request(self.rfile.read(length))
        except ValueError as exc:
            self._reply(400, {"error": str(exc)})
            return
        try:
            results = self.server.batcher.submit(queries, topk)
        except Exception as exc:  # noqa: BLE001
            self._reply(500, {"error": f"{type(exc).__name__}: {exc}"})
            return
        if scores:
            out = [[{"document": document(p), "score": s} for p, s in hits] for hits in results]
        else:
            out = [[document(p) for p, _ in hits] for hits in results]
        self._reply(200, {"result": out})
