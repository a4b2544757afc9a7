"""A retrieval server speaking Search-R1's API, over BM25 or a dense index (stdlib ``http.server``).

    POST /retrieve  {"queries": [...], "topk": 3, "return_scores": true}  -> {"result": [[...], ...]}
    GET  /health    -> {"status": "ok", "backend": "bm25", "passages": 994}

(the reply format is in :mod:`whale_envs.search.remote`). Many rollout workers can query at once: a
``ThreadingHTTPServer`` takes the connections and one :class:`Batcher` thread runs their queries
together, up to ``max_batch`` queries per backend call (a dense encoder embeds them in one forward
pass), waiting at most ``batch_wait_s`` for company.

Error policy: a bad payload gets HTTP 400 with a one-line JSON ``{"error": ...}``; a backend failure
HTTP 500 with its message; the server keeps running either way.

Limits (:class:`Limits`, each a ``whale retriever serve`` option): the server trusts neither the size
nor the cost of a request. A body needs a valid ``Content-Length`` (missing: 411; negative or not an
integer: 400; over ``max_body``: 413, all answered before any of the body is read); a request over
``max_queries`` queries, ``max_topk`` or ``max_hits`` (queries x topk), or whose reply would pass
``max_reply_bytes``, gets 400/413 naming the cap; a request head must arrive within ``head_timeout``
seconds (an idle keep-alive connection is closed then too) and a body within ``body_timeout``; at most
``max_connections`` connections are served at once (one thread each), a further one waits up to
``queue_wait_s`` for a free slot and is then answered 503.

    whale retriever serve --corpus wiki.jsonl [--index DIR] --port 8000
"""

from __future__ import annotations

import io
import json
import queue
import re
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from whale_envs.search.corpus import Corpus, Passage


@dataclass(frozen=True)
class Limits:
    """What one client may cost the server (see the module docstring); every field is a
    ``whale retriever serve`` option of the same name (``max_body`` is ``--max-body``).

    The defaults fit Search-R1's own client, which sends a whole rollout batch in one request
    (512 prompts x 5 samples = 2560 queries, topk 3), and 512 concurrent rollout workers.
    """

    max_body: int = 1 << 20  #: request body bytes
    max_queries: int = 4096  #: queries in one request
    max_topk: int = 100  #: passages per query
    max_hits: int = 16384  #: queries x topk in one request
    max_reply_bytes: int = 16 << 20  #: bytes of one reply
    head_timeout: float = 10.0  #: seconds to receive a request line and headers (and keep-alive idle)
    body_timeout: float = 30.0  #: seconds to receive a body, and to send a reply
    max_connections: int = 1024  #: connections served at once (one thread each)
    queue_wait_s: float = 1.0  #: how long a connection over max_connections waits for a slot

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not value > 0:
                raise ValueError(f"retrieval server limit {name} must be positive, got {value!r}")


#: Largest request body accepted by default (bytes).
MAX_BODY = Limits.max_body
MAX_TOPK = Limits.max_topk


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


class RequestRefused(ValueError):
    """A request over one of the server's :class:`Limits` (HTTP ``status``, one-line message)."""

    def __init__(self, message: str, status: int = 413):
        super().__init__(message)
        self.status = status


def parse_request(body: bytes, limits: Limits = Limits()) -> tuple[list[str], int, bool]:  # noqa: B008
    """(queries, topk, return_scores) of a /retrieve body; ValueError with a one-line reason
    (:class:`RequestRefused`, a ValueError too, when it is over a cap of ``limits``)."""
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
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        raise ValueError(f"'topk' must be a positive integer, got {topk!r:.40}")
    if topk > limits.max_topk:
        raise RequestRefused(
            f"'topk' {topk} is over the server's cap of {limits.max_topk} (--max-topk)", status=400
        )
    if len(queries) > limits.max_queries:
        raise RequestRefused(
            f"{len(queries)} queries in one request is over the server's cap of {limits.max_queries} "
            "(--max-queries); send them in several requests"
        )
    if len(queries) * topk > limits.max_hits:
        raise RequestRefused(
            f"{len(queries)} queries x topk {topk} = {len(queries) * topk} passages is over the "
            f"server's cap of {limits.max_hits} per request (--max-hits); send fewer queries or a smaller topk"
        )
    return queries, topk, bool(payload.get("return_scores", False))


def reply_body(results: list[list[tuple[Passage, float]]], scores: bool, max_bytes: int) -> bytes:
    """The /retrieve reply, built a query at a time: RequestRefused as soon as it passes ``max_bytes``
    (so an oversized reply is never held whole)."""
    parts: list[bytes] = []
    size = len(b'{"result": []}')
    for hits in results:
        if scores:
            items: list[Any] = [{"document": document(p), "score": s} for p, s in hits]
        else:
            items = [document(p) for p, _ in hits]
        part = json.dumps(items, ensure_ascii=False).encode("utf-8")
        size += len(part) + 2
        if size > max_bytes:
            raise RequestRefused(
                f"the reply would be over the server's cap of {max_bytes} bytes (--max-reply-bytes); "
                "send fewer queries or a smaller topk"
            )
        parts.append(part)
    return b'{"result": [' + b", ".join(parts) + b"]}"


class _DeadlineReader(io.RawIOBase):
    """A socket's reading side that fails with TimeoutError once ``deadline`` (monotonic) has passed,
    however slowly the peer trickles bytes in (a per-recv timeout alone would not stop that)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the client took too long to send its request")
            self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


_DIGITS = re.compile(r"[0-9]{1,19}")


class RequestLog:
    """What the server did, for whoever runs it: with ``per_request`` one line per request (client, path,
    status, queries, milliseconds); otherwise, every ``every_s`` seconds that saw traffic, one summary line
    (requests, queries, errors by status, p50 / p95 latency). ``write`` takes each line (default: stderr)."""

    def __init__(
        self, write: Callable[[str], None] | None = None, *, every_s: float = 10.0, per_request: bool = False
    ):
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.every_s = every_s
        self.per_request = per_request
        self._lock = threading.Lock()
        self._reset()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not per_request and every_s > 0:
            self._thread = threading.Thread(target=self._loop, name="retrieval-log", daemon=True)
            self._thread.start()

    def _reset(self) -> None:
        self._requests, self._queries, self._errors, self._ms = 0, 0, Counter(), []

    def record(self, client: str, path: str, status: int, queries: int, seconds: float) -> None:
        ms = 1000 * seconds
        if self.per_request:
            self.write(f"{client} {path} {status} queries={queries} {ms:.1f} ms")
            return
        with self._lock:
            self._requests += 1
            self._queries += queries
            if status >= 400:
                self._errors[status] += 1
            self._ms.append(ms)

    def summary(self) -> str | None:
        """The window's line (None when it saw no request), and a new window."""
        with self._lock:
            if not self._requests:
                return None
            ms = sorted(self._ms)
            errors = ", ".join(f"{n}×{code}" for code, n in sorted(self._errors.items())) or "none"
            line = (
                f"{self._requests} requests, {self._queries} queries, errors {errors}; latency p50 "
                f"{ms[len(ms) // 2]:.1f} ms, p95 {ms[min(len(ms) - 1, int(0.95 * len(ms)))]:.1f} ms"
            )
            self._reset()
        return line

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            line = self.summary()
            if line:
                self.write(line)

    def close(self) -> None:
        self._stop.set()
        line = self.summary()
        if line:
            self.write(line)


class RetrievalServer(ThreadingHTTPServer):
    """The HTTP server; ``serve_forever()`` in a thread of your own, ``shutdown()`` + ``server_close()``
    to stop (``close()`` does both and stops the batcher)."""

    daemon_threads = True

    def __init__(
        self,
        backend: SearchBackend,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        limits: Limits | None = None,
        request_log: RequestLog | None = None,
        **batch: Any,
    ):
        self.backend = backend
        self.limits = limits or Limits()
        self.request_log = request_log  # None: nothing is logged (a server inside a test or a benchmark)
        self._slots = threading.BoundedSemaphore(self.limits.max_connections)
        self.refused = 0  # connections answered 503 for want of a slot (for tests)
        # the listen backlog holds connections while the slots are full (socketserver's default is 5)
        self.request_queue_size = self.limits.max_connections
        self.batcher = Batcher(backend, **batch)
        super().__init__((host, port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """One thread per connection, at most ``max_connections`` at once: a further connection waits
        up to ``queue_wait_s`` for a slot (new ones stay in the listen backlog meanwhile), then 503."""
        if not self._slots.acquire(timeout=self.limits.queue_wait_s):
            self.refused += 1
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _refuse(self, request: socket.socket) -> None:
        data = json.dumps(
            {
                "error": f"server busy: {self.limits.max_connections} connections open "
                "(--max-connections); retry later"
            }
        ).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
        )
        try:
            request.settimeout(0.5)
            request.sendall(head.encode() + data)
        except OSError:
            pass
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):  # a client that went away or timed out: not news
            return
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/retrieve"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.batcher.close()
        if self.request_log is not None:
            self.request_log.close()


class _Handler(BaseHTTPRequestHandler):
    server: RetrievalServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # the head and the body of a reply are two writes: without TCP_NODELAY the body waits for the
        # client's delayed ACK of the head (40 ms on Linux) on every request of a keep-alive connection
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        # the head (request line + headers) must arrive within head_timeout, however slowly it trickles
        self._reader.deadline = time.monotonic() + self.server.limits.head_timeout
        self._started, self._queries = None, 0
        super().handle_one_request()

    def parse_request(self) -> bool:  # the head has arrived: the request's time starts now
        self._started = time.monotonic()
        return super().parse_request()

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise
        pass

    def _reply(
        self, code: int, payload: Any = None, *, data: bytes | None = None, close: bool = False
    ) -> None:
        if data is None:
            data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        log = self.server.request_log
        if log is not None and self._started is not None:  # before anything goes out: a client that has
            # its answer (even only the status line of an error) finds its request counted
            path = self.path if len(self.path) <= 64 else self.path[:64] + "..."
            log.record(self.client_address[0], path, code, self._queries, time.monotonic() - self._started)
        self.connection.settimeout(self.server.limits.body_timeout)  # a client that never reads its reply
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:  # the body was left unread: the connection cannot carry another request
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        try:
            self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def _content_length(self) -> int | None:
        """The body's length, or None after answering 400/411/413 (nothing of the body read)."""
        limit = self.server.limits.max_body
        if self.headers.get("Transfer-Encoding"):
            self._reply(
                411, {"error": "send the body with a Content-Length (no Transfer-Encoding)"}, close=True
            )
            return None
        values = self.headers.get_all("Content-Length") or []
        if not values:
            self._reply(411, {"error": "a POST needs a Content-Length header"}, close=True)
            return None
        value = values[0].strip()
        if len(set(v.strip() for v in values)) > 1 or not _DIGITS.fullmatch(value):
            shown = ", ".join(values)
            self._reply(
                400,
                {"error": f"Content-Length must be one non-negative integer, got {shown!r:.60}"},
                close=True,
            )
            return None
        length = int(value)
        if length > limit:
            self._reply(
                413,
                {"error": f"a body of {length} bytes is over the server's cap of {limit} (--max-body)"},
                close=True,
            )
            return None
        return length

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
        limits = self.server.limits
        length = self._content_length()
        if length is None:
            return
        self._reader.deadline = time.monotonic() + limits.body_timeout
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            self._reply(
                408, {"error": f"the body did not arrive within {limits.body_timeout:g} s"}, close=True
            )
            return
        if len(body) < length:  # the client closed early
            self.close_connection = True
            return
        try:
            queries, topk, scores = parse_request(body, limits)
        except RequestRefused as exc:
            self._reply(exc.status, {"error": str(exc)})
            return
        except ValueError as exc:
            self._reply(400, {"error": str(exc)})
            return
        del body
        self._queries = len(queries)
        try:
            results = self.server.batcher.submit(queries, topk)
        except Exception as exc:  # noqa: BLE001
            self._reply(500, {"error": f"{type(exc).__name__}: {exc}"})
            return
        try:
            data = reply_body(results, scores, limits.max_reply_bytes)
        except RequestRefused as exc:
            self._reply(exc.status, {"error": str(exc)})
            return
        del results
        self._reply(200, data=data)
