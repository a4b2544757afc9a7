"""Answering an HTTP request with JSON, for the small ``http.server`` endpoints this project serves (the
verifiers bridge's chat endpoint) and the tests' fake servers."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any


def send_json(handler: BaseHTTPRequestHandler, status: int, body: Any) -> None:
    """Answer the request ``handler`` serves with ``status`` and ``body`` as JSON."""
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
