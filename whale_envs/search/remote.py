"""A client of a retrieval server speaking Search-R1's API (stdlib only).

The API, as Search-R1's ``retrieval_server.py`` serves it (and ``whale retriever serve`` too)::

    POST /retrieve  {"queries": ["q1", ...], "topk": 3, "return_scores": true}
    ->              {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext"}, "score": 12.3}, ...], ...]}

(with ``return_scores`` false each inner list holds the documents themselves). A document's
``contents`` is Search-R1's ``"Title"\\ntext``; ``title``/``text`` keys are read when present instead.

Error policy: a request that fails (refused, timed out, HTTP 5xx, not JSON) is retried ``retries``
times with a growing pause; then :class:`RetrieverUnavailable` says which URL failed, how, and how to
start a server. A 4xx or a reply of the wrong shape is not retried (:class:`RetrieverError`).
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from whale_envs.search.corpus import Passage
from whale_envs.search.retriever import Hit


class RetrieverError(RuntimeError):
    """The retrieval server answered, but not as Search-R1's API says (bad request, wrong shape)."""


class RetrieverUnavailable(RetrieverError):
    """The retrieval server could not be reached (after the retries)."""


def check_url(url: str) -> str:
    """``url`` when it is an ``http(s)://host[:port]/path`` URL; ValueError naming it otherwise."""
    parts = urllib.parse.urlsplit(str(url))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"retriever must be a URL like http://127.0.0.1:8000/retrieve, got {url!r}")
    return str(url)


def passage_of(document: Any, where: str) -> Passage:
    """A :class:`Passage` from one document of a reply (Search-R1's ``{"id", "contents"}``)."""
    if not isinstance(document, dict):
        raise RetrieverError(f"{where}: a document should be a JSON object, got {document!r:.80}")
    if "contents" in document:
        first, _, rest = str(document["contents"]).partition("\n")
        title, text = first.strip().strip('"'), rest.strip()
    else:
        title, text = str(document.get("title", "")), str(document.get("text", ""))
    pid = document.get("id")
    if pid is None:  # a stable id from the content, so 'retrieved' lists stay comparable
        pid = hashlib.sha256(f"{title}\n{text}".encode()).hexdigest()[:16]
    return Passage(str(pid), title, text)


@dataclass
class RemoteRetriever:
    """Searches through a retrieval server (see the module docstring). Thread-safe (no shared state).

    Attributes:
        url: the server's endpoint, e.g. ``http://127.0.0.1:8000/retrieve``.
        timeout: seconds per request.
        retries: further tries after a failed request (0 = one try).
        backoff: pause before the first retry, doubled each time.
    """

    url: str
    timeout: float = 30.0
    retries: int = 3
    backoff: float = 0.5

    def __post_init__(self) -> None:
        check_url(self.url)
        if self.timeout <= 0 or self.retries < 0 or self.backoff < 0:
            raise ValueError("retriever timeout must be positive, retries and backoff non-negative")

    def has_terms(self, query: str) -> bool:
        """Any non-blank query goes to the server (it tokenizes with its own rules)."""
        return bool(query.strip())

    def search(self, query: str, k: int) -> list[Hit]:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: list[str], k: int) -> list[list[Hit]]:
        """The ``k`` best passages of every query, best first, in one request."""
        reply = self._post({"queries": list(queries), "topk": int(k), "return_scores": True})
        result = reply.get("result") if isinstance(reply, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise RetrieverError(
                f"{self.url}: expected {{'result': [one list per query]}} for {len(queries)} queries, "
                f"got {str(reply)[:120]!r}"
            )
        out = []
        for qi, items in enumerate(result):
            if not isinstance(items, list):
                raise RetrieverError(f"{self.url}: result {qi} should be a list, got {items!r:.80}")
            hits = []
            for rank, item in enumerate(items[:k]):
                where = f"{self.url}: result {qi}, document {rank}"
                if isinstance(item, dict) and "document" in item:
                    score = item.get("score", 0.0)
                    doc = item["document"]
                else:
                    score, doc = 0.0, item
                try:
                    value = float(score)
                except (TypeError, ValueError):
                    raise RetrieverError(f"{where}: score {score!r:.40} is not a number") from None
                hits.append(Hit(passage_of(doc, where), value, rank))
            out.append(hits)
        return out

    def _post(self, payload: dict[str, Any]) -> Any:
        data = json.dumps(payload).encode("utf-8")
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            request = urllib.request.Request(
                self.url, data=data, headers={"Content-Type": "application/json"}, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    body = response.read()
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:200].decode("utf-8", "replace")
                if exc.code < 500:
                    raise RetrieverError(
                        f"{self.url} refused the request: HTTP {exc.code} {detail}"
                    ) from None
                last = f"HTTP {exc.code} {detail}"
                continue
            except (urllib.error.URLError, OSError) as exc:
                last = str(getattr(exc, "reason", exc))
                continue
            try:
                return json.loads(body.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                last = f"a reply that is not JSON: {body[:80]!r}"
        raise RetrieverUnavailable(
            f"retrieval server {self.url} did not answer after {self.retries + 1} tries ({last}); "
            "start one with 'whale retriever serve --corpus CORPUS' or check the URL"
        )
