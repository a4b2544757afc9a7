"""Any OpenAI-compatible server (``vllm serve``, SGLang, llama.cpp, a hosted API), standard library only.

Text prompts go to ``/completions``, chat messages to ``/chat/completions``; a batch is sent as
concurrent requests (the server batches them). Each request carries its seed. Token counts come from
``usage``; token ids when the server returns them (vLLM: ``return_token_ids``), else None, in which
case RSFT re-tokenizes the text. ``score`` uses ``/completions`` with ``echo`` and ``logprobs`` where the
server supports it, and raises ``ScoreUnsupported`` otherwise.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from whale_train.llm.base import Completion, Prompt, Request, ScoreUnsupported, cut_at_stop
from whale_train.llm.http import post_json


class OpenAIError(RuntimeError):
    """The server refused or failed a request (after retries)."""


class OpenAILLM:
    """``LLM`` over an OpenAI-compatible HTTP endpoint.

    Args:
        base_url: e.g. ``http://localhost:8000/v1``.
        model: the served model name.
        api_key: default ``$OPENAI_API_KEY`` (many local servers need none).
        concurrency: requests in flight at once.
        timeout: seconds per request; ``retries`` attempts on connection errors and 429/5xx.
        chat: whether chat messages are supported (``/chat/completions``).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        concurrency: int = 32,
        timeout: float = 120.0,
        retries: int = 3,
        chat: bool = True,
        return_token_ids: bool = False,
    ):
        self.base_url = base_url.rstrip("/")
        self.name = model
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        self.concurrency = concurrency
        self.timeout = timeout
        self.retries = retries
        self._chat = chat
        self.return_token_ids = return_token_ids
        self.version = 0
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="openai")

    @property
    def has_chat_template(self) -> bool:
        return self._chat

    # ------------------------------------------------------------------------------ HTTP

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return post_json(
            self.base_url,
            path,
            body,
            api_key=self.api_key,
            timeout=self.timeout,
            retries=self.retries,
            error=OpenAIError,
        )

    # ------------------------------------------------------------------------------ LLM API

    def complete(self, requests: list[Request]) -> list[Completion]:
        return list(self._pool.map(self._one, requests))

    def _one(self, req: Request) -> Completion:
        p = req.params
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "seed": int(req.seed % 2**31),
        }
        if p.stop:
            body["stop"] = list(p.stop)
        if self.return_token_ids:
            body["return_token_ids"] = True
        if isinstance(req.prompt, str):
            body["prompt"] = req.prompt
            out = self._post("/completions", body)
            choice = out["choices"][0]
            text = choice.get("text", "")
            prompt_text = req.prompt
        else:
            body["messages"] = req.prompt
            out = self._post("/chat/completions", body)
            choice = out["choices"][0]
            text = (choice.get("message") or {}).get("content") or ""
            prompt_text = json.dumps(req.prompt, ensure_ascii=False)
        text, _ = cut_at_stop(text, p.stop)
        usage = out.get("usage") or {}
        ids = choice.get("token_ids")
        return Completion(
            text=text,
            prompt_text=prompt_text,
            prompt_ids=choice.get("prompt_token_ids") or out.get("prompt_token_ids"),
            completion_ids=list(ids) if ids is not None else None,
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
        )

    def score(self, prompt: Prompt, continuations: list[str]) -> list[Completion]:
        if not isinstance(prompt, str):
            raise ScoreUnsupported("the OpenAI-compatible backend scores plain-text prompts only")

        def one(cont: str) -> Completion:
            body = {
                "model": self.model,
                "prompt": prompt + cont,
                "max_tokens": 0,
                "echo": True,
                "logprobs": 1,
            }
            try:
                out = self._post("/completions", body)
                lp = out["choices"][0]["logprobs"]
                offsets, values = lp["text_offset"], lp["token_logprobs"]
            except (OpenAIError, KeyError, TypeError, IndexError) as exc:
                raise ScoreUnsupported(
                    f"{self.base_url} cannot score continuations (echo + logprobs): {exc}"
                ) from None
            total = sum(
                v for off, v in zip(offsets, values, strict=False) if off >= len(prompt) and v is not None
            )
            n = sum(1 for off in offsets if off >= len(prompt))
            return Completion(cont, prompt, None, None, "stop", len(offsets) - n, n, logprob=float(total))

        return list(self._pool.map(one, continuations))
