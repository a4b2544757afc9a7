"""Any OpenAI-compatible server (``vllm serve``, SGLang, llama.cpp, a hosted API), standard library only.

With a local tokenizer (``tokenizer=``, by default the model when ``model`` names a local model
directory, as ``vllm serve DIR`` serves it) every prompt is rendered here, chat messages through the
tokenizer's chat template as the transformers and vLLM backends render them, and sent to
``/completions`` as token ids: the server samples exactly what the in-process backends sample for the
same seed, and ``score`` works for chat prompts too. Without one, text prompts go to ``/completions``
and chat messages to ``/chat/completions`` (the server renders them; they cannot be scored).

A batch is sent as concurrent requests (the server batches them). Each request carries its seed.
Token counts come from ``usage``; token ids when the server returns them (vLLM: ``return_token_ids``),
else None, in which case RSFT re-tokenizes the text. ``score`` uses ``/completions`` with ``echo`` and
``logprobs`` (the log-probability of each continuation token after the prompt) where the server
supports it, and raises ``ScoreUnsupported`` otherwise. Every continuation of one ``score`` (a
harness's ``choose``), and with ``score_many`` every continuation of a whole batch, goes in ONE request
as a list prompt (``prompt: [...]``, one choice per prompt, matched by its ``index``), at most
``score_prompts_per_request`` prompts a request; a server that refuses a list prompt is told so in one
line on stderr and scored one request per continuation from then on. ``preflight`` checks, before a run, that the
server answers and serves the model (one-line ``OpenAIError`` otherwise).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from whale_train.llm.base import (
    Completion,
    Prompt,
    Request,
    ScoreUnsupported,
    TokenizerPrompts,
    cut_at_stop,
    fit_prompt,
)
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
        tokenizer: a local model directory whose tokenizer (and chat template) renders and encodes
            prompts here (see the module docstring); default ``model`` when that is a directory.
        chat_template_kwargs: passed to the chat template (Qwen3.5: ``{"enable_thinking": False}``).
        score_prompts_per_request: the most scored sequences (prompt + one continuation) sent in one
            ``/completions`` request; more go as several requests at once.
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
        tokenizer: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        score_prompts_per_request: int = 256,
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
        self.score_prompts_per_request = max(1, int(score_prompts_per_request))
        #: whether the server takes a list prompt for scoring (False once it refused one)
        self.list_prompts = True
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="openai")
        self.prompts: _LocalPrompts | None = None
        #: the served context length, when ``preflight`` read it (vLLM lists ``max_model_len``): with a
        #: local tokenizer, over-long prompts are then cut as the in-process backends cut them
        self.max_model_len: int | None = None
        source = tokenizer if tokenizer is not None else (model if Path(model).is_dir() else None)
        if source is not None:
            from transformers import AutoTokenizer

            if not (Path(source) / "tokenizer_config.json").exists():
                raise OpenAIError(f"tokenizer {source}: not a local model directory with a tokenizer")
            self.prompts = _LocalPrompts(AutoTokenizer.from_pretrained(source), source, chat_template_kwargs)

    @property
    def has_chat_template(self) -> bool:
        return self.prompts.has_chat_template if self.prompts is not None else self._chat

    def preflight(self) -> None:
        """Fail now, in one line, if the server cannot be reached or does not serve ``model`` (a server
        without a ``/models`` listing is taken at its word)."""
        req = urllib.request.Request(self.base_url + "/models", method="GET")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=min(self.timeout, 30.0)) as resp:
                listing = json.loads(resp.read().decode())
        except urllib.error.HTTPError:
            return
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise OpenAIError(f"cannot reach the server at {self.base_url}: {exc}") from None
        except json.JSONDecodeError:
            return
        entries = [m for m in listing.get("data", []) if isinstance(m, dict)]
        served = [m.get("id") for m in entries]
        if served and self.model not in served:
            raise OpenAIError(f"the server at {self.base_url} serves {served}, not {self.model!r} (--model)")
        for m in entries:
            if m.get("id") == self.model and isinstance(m.get("max_model_len"), int):
                self.max_model_len = m["max_model_len"]

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
        prompt_ids = None
        if self.prompts is not None:  # rendered and encoded here, as the in-process backends do
            prompt_text = self.prompts.render(req.prompt)
            prompt_ids = self.prompts.encode(prompt_text)
            if self.max_model_len is not None:  # as the vLLM backend does (base.fit_prompt)
                prompt_ids = fit_prompt(prompt_ids, p.max_tokens, self.max_model_len)
                body["max_tokens"] = min(p.max_tokens, max(1, self.max_model_len - len(prompt_ids)))
            body["prompt"] = prompt_ids
            out = self._post("/completions", body)
            choice = out["choices"][0]
            text = choice.get("text", "")
        elif isinstance(req.prompt, str):
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
            prompt_ids=prompt_ids or choice.get("prompt_token_ids") or out.get("prompt_token_ids"),
            completion_ids=list(ids) if ids is not None else None,
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
        )

    def score(self, prompt: Prompt, continuations: list[str]) -> list[Completion]:
        return self.score_many([(prompt, continuations)])[0]

    def score_many(self, items: Sequence[tuple[Prompt, list[str]]]) -> list[list[Completion]]:
        """``score`` of each (prompt, continuations) item, every sequence of every item in one request
        (see the module docstring)."""
        if self.prompts is not None:
            return self._score_ids(items)
        if any(not isinstance(prompt, str) for prompt, _ in items):
            raise ScoreUnsupported(
                "the OpenAI-compatible backend scores chat prompts with a local tokenizer only "
                "(backend option tokenizer: a model directory)"
            )
        texts = [prompt + cont for prompt, conts in items for cont in conts]  # type: ignore[operator]
        echoed = iter(self._echo_many(texts, logprobs=1))
        results = []
        for prompt, conts in items:
            assert isinstance(prompt, str)
            mine = []
            for cont in conts:
                offsets, values = next(echoed)
                total = sum(
                    v for off, v in zip(offsets, values, strict=False) if off >= len(prompt) and v is not None
                )
                n = sum(1 for off in offsets if off >= len(prompt))
                mine.append(
                    Completion(cont, prompt, None, None, "stop", len(offsets) - n, n, logprob=float(total))
                )
            results.append(mine)
        return results

    def _score_ids(self, items: Sequence[tuple[Prompt, list[str]]]) -> list[list[Completion]]:
        """Prompt and continuations encoded here, sent as token ids; the continuation's log-probability
        is the sum over its own token positions (what the vLLM backend computes in-process)."""
        assert self.prompts is not None
        encoded = []
        for prompt, conts in items:
            text = self.prompts.render(prompt)
            encoded.append((text, self.prompts.encode(text), [(c, self.prompts.encode(c)) for c in conts]))
        sequences = [pids + cids for _, pids, conts in encoded for _, cids in conts]
        echoed = iter(self._echo_many(sequences, logprobs=0))
        results = []
        for text, pids, conts in encoded:
            mine = []
            for cont, cids in conts:
                _, values = next(echoed)
                span = values[len(pids) : len(pids) + len(cids)]
                if len(span) != len(cids) or any(v is None for v in span):
                    raise ScoreUnsupported(
                        f"{self.base_url} returned no log-probability for every continuation token"
                    )
                mine.append(
                    Completion(
                        cont, text, list(pids), cids, "stop", len(pids), len(cids), logprob=float(sum(span))
                    )
                )
            results.append(mine)
        return results

    def _echo_body(self, prompt: Any, logprobs: int) -> dict[str, Any]:
        return {"model": self.model, "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": logprobs}

    def _echo_many(self, prompts: list[Any], logprobs: int) -> list[tuple[list[int], list[float | None]]]:
        """``(text_offset, token_logprobs)`` of each prompt echoed: all of them in one request (a list
        prompt; ``score_prompts_per_request`` at most), or one request each where the server refuses
        a list."""
        if not prompts:
            return []
        if len(prompts) == 1 or not self.list_prompts:
            return list(self._pool.map(lambda p: self._echo_logprobs(self._echo_body(p, logprobs)), prompts))
        size = self.score_prompts_per_request
        chunks = [prompts[i : i + size] for i in range(0, len(prompts), size)]
        try:
            parts = list(self._pool.map(lambda c: self._echo_list(c, logprobs), chunks))
        except _ListRefused as refused:
            # one request per prompt: a prompt the server cannot score fails as before (ScoreUnsupported);
            # when every one is scored, the server refused the list itself: say so once, and stay per prompt
            outs = list(self._pool.map(lambda p: self._echo_logprobs(self._echo_body(p, logprobs)), prompts))
            if self.list_prompts:
                self.list_prompts = False
                print(
                    f"notice: {self.base_url} refused a list prompt ({refused}); "
                    "scoring continuations one request each from now on",
                    file=sys.stderr,
                    flush=True,
                )
            return outs
        return [one for part in parts for one in part]

    def _echo_list(self, prompts: list[Any], logprobs: int) -> list[tuple[list[int], list[float | None]]]:
        """One request for all ``prompts`` (a list prompt): choice ``index`` i is prompt i."""
        try:
            out = self._post("/completions", self._echo_body(prompts, logprobs))
            choices = sorted(out["choices"], key=lambda c: c["index"])
            if [c["index"] for c in choices] != list(range(len(prompts))):
                raise ValueError(f"{len(choices)} choices for {len(prompts)} prompts")
            return [(c["logprobs"]["text_offset"], c["logprobs"]["token_logprobs"]) for c in choices]
        except (OpenAIError, KeyError, TypeError, IndexError, ValueError) as exc:
            raise _ListRefused(str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__) from None

    def _echo_logprobs(self, body: dict[str, Any]) -> tuple[list[int], list[float | None]]:
        try:
            out = self._post("/completions", body)
            lp = out["choices"][0]["logprobs"]
            return lp["text_offset"], lp["token_logprobs"]
        except (OpenAIError, KeyError, TypeError, IndexError) as exc:
            raise ScoreUnsupported(
                f"{self.base_url} cannot score continuations (echo + logprobs): {exc}"
            ) from None


class _ListRefused(Exception):
    """The server did not answer a list prompt as one choice per prompt."""


class _LocalPrompts(TokenizerPrompts):
    """Rendering and encoding with a local tokenizer, exactly as the in-process backends do."""

    def __init__(self, tokenizer: Any, name: str, chat_template_kwargs: dict[str, Any] | None):
        self.tokenizer, self.name = tokenizer, name
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
