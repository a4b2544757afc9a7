"""What the tests' fake HTTP servers (an OpenAI-compatible endpoint, an LLM judge) share (``send_json``,
from :mod:`whale_envs.http_json`), and a fake OpenAI-compatible completions server that scores
(``FakeCompletions``)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from whale_envs.http_json import send_json


def fake_logprob(prev: Any, tok: Any) -> float:
    """The fake completions server's log-probability of token ``tok`` after ``prev`` (ints or characters):
    deterministic and different for every pair, so a mix-up of prompts or positions shows in the sums."""
    a = prev if isinstance(prev, int) else ord(prev)
    b = tok if isinstance(tok, int) else ord(tok)
    return -((a * 31 + b * 17) % 97 + 1) / 10.0


class FakeCompletions:
    """An OpenAI-compatible ``/completions`` server on 127.0.0.1 that scores (``echo`` + ``logprobs``,
    ``max_tokens`` 0) what vLLM scores, in vLLM's reply format: a prompt is a string (one token per
    character, ``text_offset`` its position) or token ids, or a LIST of either (one choice per prompt,
    ``index`` = its place in the list). ``requests`` counts the POSTs it answered; ``refuse_lists``
    makes it answer a list prompt with HTTP 400, as a server without list prompts does."""

    def __init__(self, refuse_lists: bool = False):
        from http.server import ThreadingHTTPServer

        self.refuse_lists = refuse_lists
        self.requests = 0
        self.prompts: list[int] = []  # prompts per answered request
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, answer = fake.answer(self.path, body)
                send_json(self, status, answer)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        prompt = body.get("prompt")
        many = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))
        if not path.endswith("/completions") or not body.get("echo") or body.get("max_tokens") != 0:
            return 400, {"error": {"message": "this fake only scores (echo, max_tokens 0)"}}
        if many and self.refuse_lists:
            return 400, {"error": {"message": "prompt must be a string or a list of token ids"}}
        prompts = prompt if many else [prompt]
        with self._lock:
            self.requests += 1
            self.prompts.append(len(prompts))
        choices = [self.echo(p) | {"index": i} for i, p in enumerate(prompts)]
        choices.reverse()  # the client must match choices by index, not by place
        return 200, {
            "choices": choices,
            "usage": {"prompt_tokens": sum(map(len, prompts)), "completion_tokens": 0},
        }

    @staticmethod
    def echo(prompt: str | list[int]) -> dict[str, Any]:
        tokens = list(prompt)
        values = [None] + [fake_logprob(a, b) for a, b in zip(tokens, tokens[1:], strict=False)]
        text = prompt if isinstance(prompt, str) else "".join(f"<{t}>" for t in prompt)
        offsets = list(range(len(tokens)))
        logprobs = {"tokens": [str(t) for t in tokens], "token_logprobs": values, "text_offset": offsets}
        return {"text": text, "logprobs": logprobs, "finish_reason": "length"}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
