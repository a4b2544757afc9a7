"""A verifiers harness that is one chat call per segment, run in-process.

verifiers' own chat harnesses (``null``, ``bash``) launch a PEP 723 script with ``uv``, which fetches
its dependencies from the network on first use. This one does the same thing without a program: each
segment sends the conversation so far to the run's interception endpoint (so verifiers records the
call on its trace, as for any harness) and returns. No tools, no code execution: the model's reply is
the segment's output, and the env's user turn (a game's next observation, a follow-up question) starts
the next segment.
"""

from __future__ import annotations

import httpx
import verifiers.v1 as vf
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.runtimes import ProgramResult

#: Seconds one model call may take before the segment fails (a policy thinking on a slow CPU included).
CALL_TIMEOUT_S = 600.0


class ChatHarnessConfig(vf.HarnessConfig):
    """No settings of its own; the model, client and sampling are the run's."""


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    """One chat-completions call per segment, in this process (see the module docstring)."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        tool_interception_url: str | None = None,
    ) -> ProgramResult:
        if mcp_urls:
            raise vf.HarnessError(
                "the whale chat harness has no tools; this taskset serves tools (MCP), which it cannot call"
            )
        system, prompt = self.resolve_prompt(data)
        messages: list[dict] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt:
            messages.extend(message_to_wire(m) for m in prompt)
        async with httpx.AsyncClient(timeout=httpx.Timeout(CALL_TIMEOUT_S, connect=10.0)) as client:
            reply = await client.post(
                endpoint.rstrip("/") + "/chat/completions",
                headers={"Authorization": f"Bearer {secret}"},
                json={"model": ctx.model, "messages": messages},
            )
        if reply.status_code != 200:
            return ProgramResult(
                exit_code=1, stdout="", stderr=f"model call: HTTP {reply.status_code}: {reply.text[:500]}"
            )
        content = reply.json()["choices"][0]["message"].get("content") or ""
        return ProgramResult(exit_code=0, stdout=content, stderr="")
