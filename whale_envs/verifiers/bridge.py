"""The policy bridge: a loopback OpenAI-compatible server whose "model" is the caller of ``step``.

verifiers runs an episode by calling a model over HTTP. To make that episode a Gymnasium env, the
bridge answers each chat-completions call by handing its messages to the env (the next observation)
and waiting for the env's next ``step`` action, which goes back as the assistant's reply. Calls are
routed by their ``model`` field: each episode runs under a model name of its own, so one bridge serves
every env of the process.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from whale_envs.http_json import send_json


@dataclass
class ModelCall:
    """One call of the episode's model: the messages it was sent, and where its reply goes."""

    messages: list[dict[str, Any]]
    _reply: queue.Queue = field(default_factory=lambda: queue.Queue(maxsize=1))

    def answer(self, text: str | None) -> None:
        """Send ``text`` as the model's reply; None fails the call (the episode was abandoned)."""
        self._reply.put(text)


class Bridge:
    """The loopback server (see the module docstring). ``open(name)`` gives the queue an episode's calls
    arrive on; ``close(name)`` stops routing to it (a late call is refused)."""

    def __init__(self) -> None:
        self._routes: dict[str, queue.Queue] = {}
        self._lock = threading.Lock()
        bridge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # no access log on stderr
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    return send_json(self, 404, {"error": {"message": f"no route {self.path}"}})
                text = bridge._serve(str(body.get("model", "")), list(body.get("messages") or []))
                if text is None:
                    return send_json(self, 503, {"error": {"message": "the episode is over"}})
                if body.get("stream"):
                    return self._stream(str(body.get("model", "")), text)
                return send_json(self, 200, _completion(str(body.get("model", "")), text))

            def _stream(self, model: str, text: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                chunk = _completion(model, text)
                chunk["object"] = "chat.completion.chunk"
                choice = chunk["choices"][0]
                choice["delta"] = choice.pop("message")
                for event in (chunk, "[DONE]"):
                    line = event if isinstance(event, str) else json.dumps(event)
                    self.wfile.write(f"data: {line}\n\n".encode())
                self.wfile.flush()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        threading.Thread(
            target=self._server.serve_forever, name="whale-verifiers-bridge", daemon=True
        ).start()

    def open(self, name: str) -> queue.Queue:
        calls: queue.Queue = queue.Queue()
        with self._lock:
            self._routes[name] = calls
        return calls

    def close(self, name: str) -> None:
        with self._lock:
            self._routes.pop(name, None)

    def _serve(self, name: str, messages: list[dict[str, Any]]) -> str | None:
        with self._lock:
            calls = self._routes.get(name)
        if calls is None:
            return None
        call = ModelCall(messages)
        calls.put(call)
        return call._reply.get()


def _completion(model: str, text: str) -> dict[str, Any]:
    return {
        "id": f"whale-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }
