"""The one JSON-over-HTTP POST with retries of the package (standard library only): the OpenAI-compatible
backend and the LLM proposer both talk to OpenAI-style servers through it.

A connection error, a timeout, an unreadable body, HTTP 429 and 5xx are retried with exponential
backoff (0.5 s, 1 s, 2 s, ... at most 8 s); any other HTTP status fails at once. The failure is raised
as the caller's own exception type, with the status and the start of the server's answer.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

RETRIED_STATUS = (429, 500, 502, 503, 504)


def post_json(
    base_url: str,
    path: str,
    body: dict[str, Any],
    *,
    api_key: str = "",
    timeout: float = 120.0,
    retries: int = 3,
    error: type[Exception] = RuntimeError,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """POST ``body`` as JSON to ``base_url + path`` and return the decoded answer; failures after
    ``retries`` attempts raise ``error`` with a message that starts with ``path``. ``headers`` are
    added to the request (e.g. Anthropic's ``x-api-key`` instead of the bearer ``api_key``)."""
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **(headers or {})}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    last: Exception = error(f"{path}: no attempt made (retries={retries})")
    for attempt in range(retries):
        req = urllib.request.Request(base_url + path, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read().decode())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            last = error(f"{path}: HTTP {exc.code}: {detail}")
            if exc.code not in RETRIED_STATUS:
                raise last from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, json.JSONDecodeError) as exc:
            last = error(f"{path}: cannot reach {base_url}: {exc}")
        time.sleep(min(8.0, 0.5 * 2**attempt))
    raise last
