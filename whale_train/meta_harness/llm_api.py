"""Chat with tool calls over two wire formats: the OpenAI-compatible chat API and Anthropic's Messages API.

The agent proposer keeps one neutral conversation and a :class:`ChatAPI` turns it into requests:

* ``openai`` (``OpenAIChat``): ``POST {base_url}/chat/completions`` with ``tools`` of type ``function``;
  the reply's ``message.tool_calls`` (JSON-string ``arguments``) are answered by ``role: tool``
  messages. OpenAI, vLLM (``--enable-auto-tool-choice``), SGLang, llama.cpp and most gateways speak it.
* ``anthropic`` (``AnthropicChat``): ``POST {base_url}/v1/messages`` with ``x-api-key`` and
  ``anthropic-version`` headers, a top-level ``system``, ``tools`` with ``input_schema``; the reply's
  ``tool_use`` content blocks are answered by ``tool_result`` blocks in the next user message.

Standard library only (``whale_train.llm.http.post_json``: retries on connection errors, 429 and 5xx).
Any failure is a ``ProposerError`` naming the endpoint and the status.
"""

from __future__ import annotations

import json
import os
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol

from whale_train.llm.http import post_json
from whale_train.meta_harness.proposer import ProposerError

APIS = ("openai", "anthropic")
ANTHROPIC_VERSION = "2023-06-01"


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model may call: its name, what it does, and a JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass
class ToolCall:
    """One call in a reply. ``arguments`` is None when the model sent arguments that are not a JSON
    object (``error`` says why; the call is answered with that error)."""

    id: str
    name: str
    arguments: dict[str, Any] | None
    error: str | None = None


@dataclass
class Reply:
    """One model turn: its text, its tool calls, the tokens it cost, and the wire form to echo back."""

    text: str
    tool_calls: list[ToolCall]
    input_tokens: int = 0
    output_tokens: int = 0
    stop: str = ""
    raw: Any = None


@dataclass
class Conversation:
    """The neutral history: ``("user", text)``, ``("assistant", Reply)`` and
    ``("tools", [(ToolCall, result text), ...])`` items, in order."""

    system: str
    items: list[tuple[str, Any]] = field(default_factory=list)

    def user(self, text: str) -> None:
        self.items.append(("user", text))

    def assistant(self, reply: Reply) -> None:
        self.items.append(("assistant", reply))

    def results(self, results: list[tuple[ToolCall, str]]) -> None:
        self.items.append(("tools", results))


class ChatAPI(Protocol):
    """One request: the conversation so far and the tools; the model's next turn."""

    name: str
    model: str

    def chat(self, conversation: Conversation, tools: list[ToolSpec]) -> Reply: ...


def _arguments(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    if isinstance(raw, dict):
        return raw, None
    try:
        value = json.loads(raw or "{}")
    except (TypeError, json.JSONDecodeError) as exc:
        return None, f"the arguments are not JSON: {exc}"
    if not isinstance(value, dict):
        return None, "the arguments must be a JSON object"
    return value, None


@dataclass(eq=False, repr=False)  # a client, not a value: compared by identity, its key never printed
class HTTPChat:
    """What both APIs are configured with: the server, the model, the key and the request settings."""

    base_url: str
    model: str
    api_key: str = ""
    _: KW_ONLY
    temperature: float = 0.7
    max_tokens: int = 4096
    timeout: float = 300.0
    retries: int = 3

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")

    def post(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
        """``body`` POSTed to ``base_url + path`` with these settings: the decoded answer (ProposerError
        when it fails). The key goes as a bearer token unless ``headers`` carry it."""
        return post_json(
            self.base_url,
            path,
            body,
            api_key=self.api_key if headers is None else "",
            timeout=self.timeout,
            retries=self.retries,
            error=ProposerError,
            headers=headers,
        )


class OpenAIChat(HTTPChat):
    """The OpenAI-compatible chat API (``base_url`` ends in ``/v1``)."""

    name = "openai"

    def messages(self, conversation: Conversation) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"role": "system", "content": conversation.system}]
        for kind, item in conversation.items:
            if kind == "user":
                out.append({"role": "user", "content": item})
            elif kind == "assistant":
                out.append(item.raw or {"role": "assistant", "content": item.text})
            else:
                for call, text in item:
                    out.append({"role": "tool", "tool_call_id": call.id, "content": text})
        return out

    def chat(self, conversation: Conversation, tools: list[ToolSpec]) -> Reply:
        body = {
            "model": self.model,
            "messages": self.messages(conversation),
            "tools": [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        answer = self.post("/chat/completions", body)
        choices = answer.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            raise ProposerError(f"/chat/completions: no choices in the answer of {self.base_url}")
        message = choices[0].get("message") or {}
        calls = []
        for n, call in enumerate(message.get("tool_calls") or []):
            fn = call.get("function") or {}
            args, error = _arguments(fn.get("arguments"))
            calls.append(ToolCall(str(call.get("id") or f"call_{n}"), str(fn.get("name", "")), args, error))
        raw = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            raw["tool_calls"] = message["tool_calls"]
        usage = answer.get("usage") or {}
        return Reply(
            text=message.get("content") or "",
            tool_calls=calls,
            input_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens") or 0),
            stop=str(choices[0].get("finish_reason") or ""),
            raw=raw,
        )


class AnthropicChat(HTTPChat):
    """Anthropic's Messages API (``base_url`` without ``/v1``, e.g. ``https://api.anthropic.com``)."""

    name = "anthropic"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[: -len("/v1")]

    def messages(self, conversation: Conversation) -> list[dict[str, Any]]:
        """User and assistant turns alternate: tool results and a following user text share a turn."""
        out: list[dict[str, Any]] = []

        def add_user(blocks: list[dict[str, Any]]) -> None:
            if out and out[-1]["role"] == "user":
                out[-1]["content"].extend(blocks)
            else:
                out.append({"role": "user", "content": blocks})

        for kind, item in conversation.items:
            if kind == "user":
                add_user([{"type": "text", "text": item}])
            elif kind == "assistant":
                content = item.raw if item.raw is not None else [{"type": "text", "text": item.text or "."}]
                out.append({"role": "assistant", "content": content})
            else:
                add_user(
                    [{"type": "tool_result", "tool_use_id": call.id, "content": text} for call, text in item]
                )
        return out

    def chat(self, conversation: Conversation, tools: list[ToolSpec]) -> Reply:
        body = {
            "model": self.model,
            "system": conversation.system,
            "messages": self.messages(conversation),
            "tools": [
                {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
            ],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if self.api_key:
            headers["x-api-key"] = self.api_key
        answer = self.post("/v1/messages", body, headers=headers)
        content = answer.get("content")
        if not isinstance(content, list):
            raise ProposerError(f"/v1/messages: no content in the answer of {self.base_url}")
        text, calls = [], []
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                text.append(str(block.get("text", "")))
            elif block.get("type") == "tool_use":
                args, error = _arguments(block.get("input"))
                calls.append(ToolCall(str(block.get("id", "")), str(block.get("name", "")), args, error))
        usage = answer.get("usage") or {}
        inputs = sum(
            int(usage.get(k) or 0)
            for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
        )
        return Reply(
            text="\n".join(text),
            tool_calls=calls,
            input_tokens=inputs,
            output_tokens=int(usage.get("output_tokens") or 0),
            stop=str(answer.get("stop_reason") or ""),
            raw=content,
        )


def make_api(
    api: str,
    base_url: str | None,
    model: str,
    *,
    api_key_env: str | None = None,
    temperature: float = 0.7,
    max_tokens: int = 4096,
    timeout: float = 300.0,
) -> ChatAPI:
    """The client for ``api`` (``openai`` or ``anthropic``); the key is read from ``api_key_env``
    (default ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY``; may be unset for a local server)."""
    if api not in APIS:
        raise ValueError(f"unknown llm.api {api!r}; known: {', '.join(APIS)}")
    env = api_key_env or ("ANTHROPIC_API_KEY" if api == "anthropic" else "OPENAI_API_KEY")
    key = os.environ.get(env, "")
    cls = AnthropicChat if api == "anthropic" else OpenAIChat
    default = "https://api.anthropic.com" if api == "anthropic" else ""
    url = base_url or default
    if not url:
        raise ValueError("llm.api openai needs llm.base_url (e.g. http://localhost:8000/v1)")
    return cls(url, model, key, temperature=temperature, max_tokens=max_tokens, timeout=timeout)
