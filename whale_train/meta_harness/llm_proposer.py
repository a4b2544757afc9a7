"""The LLM proposer: an OpenAI-compatible chat model reads the archive and writes new harness code.

The model works through function calls (the OpenAI ``tools`` interface): ``list_files``, ``read_file``
and ``grep`` over the archive folder only (``tools.ArchiveTools``); ``validate_candidate`` to prototype
(the same gates the search applies: AST rules, the prompt-only rule, ``check_harness`` with null
models); ``submit_candidate(source, hypothesis)`` to propose. A reply without tool calls that holds a
fenced Python block counts as a submission too. The instructions follow Meta-Harness practice: read the
traces, change a mechanism rather than a constant, no dataset-specific hints, prototype first.

Token usage (and cost, from the configured prices) is recorded per candidate in its meta.json and per
iteration in the iteration record. Standard library only (``urllib``).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from harnesses import base as harness_base
from harnesses.validate import ALLOWED_MODULES
from whale_train.domains import domain_for
from whale_train.meta_harness import evaluate
from whale_train.meta_harness.config import MetaHarnessConfig
from whale_train.meta_harness.llm_api import HTTPChat
from whale_train.meta_harness.proposer import Proposal, ProposalContext, ProposerError
from whale_train.meta_harness.tools import ArchiveTools, ToolError

SYSTEM = """You are a harness engineer. A harness is the Python code around a language model: it builds \
the model's prompts, calls it, parses what it says, and drives an environment ({env_id}) to solve tasks. \
Propose new harnesses that solve more tasks with the current model (version {version}).

Your files are the archive folder (read-only), one folder per harness tried so far:
  <id>/harness.py        its source
  <id>/meta.json         parents, hypothesis, mechanisms, validation status and reason
  <id>/evals/<v>.json    its score under model version v: per-task rewards, mean, failure counts, LLM calls, tokens
  <id>/traces/<v>.jsonl  one JSON line per episode: every prompt and completion, every env step and error
  search/                the search settings and one record per iteration (decisions and their numbers)

How to work:
1. Read the incumbent's source and its traces. Find where episodes fail: unparseable replies, illegal \
actions, wrong answers, wasted calls. Compare with the other candidates' scores and traces.
2. Form one hypothesis about a mechanism: how the context is built, how the output is constrained and \
parsed, retries with the env's feedback, choosing among listed options by likelihood (llm.choose), \
self-consistency votes (llm.sample), tool use, query rewriting, memory of solved examples. Prefer \
changing a mechanism to tuning a constant: a number tweaked alone rarely matters.
3. No dataset-specific hints: never hard-code anything about particular tasks, questions, answers or \
ids. The harness is also measured on held-out tasks.
4. The harness must not solve tasks itself (no chess, sympy or solver logic): with a model that \
answers nothing it must stay at chance level, or it is rejected.
5. Prototype before proposing: call validate_candidate with your source and fix what it reports.
6. Submit with submit_candidate(source, hypothesis): a complete module with exactly one harness class. \
The hypothesis says what you changed, why, and what you expect to see in the traces.
{prompt_only}
The harness contract (harnesses/base.py):
{contract}
Imports allowed: {imports}{shipped}.
The env's info dict has: {info}
"""

PROMPT_ONLY = """
PROMPT-ONLY MODE: you may change only the string constants (prompt text) of the seed harness \
{seed_id}/harness.py. Any other difference in the code is rejected.
"""


def _tool(name: str, description: str, required: tuple[str, ...] = (), **properties: str | tuple[str, str]):
    """An OpenAI function tool. A property is its JSON type, or (type, description)."""
    props = {
        key: {"type": p} if isinstance(p, str) else {"type": p[0], "description": p[1]}
        for key, p in properties.items()
    }
    parameters: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        parameters["required"] = list(required)
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TOOLS = [
    _tool(
        "list_files",
        "List a folder of the archive (folders end with /).",
        path=("string", "relative to the archive; default ."),
    ),
    _tool(
        "read_file",
        "Read a text file of the archive, from a character offset.",
        ("path",),
        path="string",
        offset="integer",
        length="integer",
    ),
    _tool(
        "grep",
        "Lines matching a Python regular expression in the archive's text files.",
        ("pattern",),
        pattern="string",
        path="string",
    ),
    _tool(
        "validate_candidate",
        "Check harness source against the rules and run it with null models (no score).",
        ("source",),
        source="string",
    ),
    _tool(
        "submit_candidate",
        "Propose a harness: its full source and the hypothesis behind it.",
        ("source", "hypothesis"),
        source="string",
        hypothesis="string",
        parent=("string", "the id it builds on (default: the incumbent)"),
    ),
]

_FENCED = re.compile(r"```(?:python)?\n(.*?)```", re.S)


def harness_facts(ctx: ProposalContext) -> dict[str, str]:
    """What both proposers' instructions say of the env and of a harness: ``env_id``, ``version``,
    ``contract``, ``imports`` (allowed), ``shipped`` (the harnesses it may import) and ``info``."""
    domain = domain_for(ctx.env_id)
    shipped = (
        f", and the shipped harnesses (e.g. `from harnesses.{domain.harness_dir}.h0 import ...`)"
        if domain.harness_dir
        else " (the seed harness is not importable: copy what you need of its code)"
    )
    return {
        "env_id": ctx.env_id,
        "version": ctx.model_version,
        "contract": harness_base.__doc__,
        "imports": ", ".join(sorted(m for m in ALLOWED_MODULES if m != "__future__")),
        "shipped": shipped,
        "info": domain.describe_info(),
    }


class LLMProposer(HTTPChat):
    """Proposes through an OpenAI-compatible ``/chat/completions`` endpoint with tool calls.

    Args:
        base_url: e.g. ``http://localhost:8000/v1``.
        model: the served model's name.
        api_key: default: the environment variable ``api_key_env``.
        max_turns: requests per iteration (tool calls included) before giving up on missing candidates.
        temperature: the proposer's sampling temperature.
        timeout / retries: per request; retries on connection errors, 429 and 5xx.
        price_prompt / price_completion: USD per million tokens, for the recorded cost.
        check: the search config, for ``validate_candidate`` (the same gates as the search).
        env_kwargs: the env options, for ``validate_candidate``.
    """

    name = "llm"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        max_turns: int = 30,
        temperature: float = 0.7,
        timeout: float = 300.0,
        retries: int = 3,
        price_prompt: float = 0.0,
        price_completion: float = 0.0,
        check: MetaHarnessConfig | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ):
        api_key = api_key if api_key is not None else os.environ.get(api_key_env, "")
        super().__init__(base_url, model, api_key, temperature=temperature, timeout=timeout, retries=retries)
        self.max_turns = max_turns
        self.price_prompt = price_prompt
        self.price_completion = price_completion
        self.check = check or MetaHarnessConfig()
        self.env_kwargs = env_kwargs or {}

    @classmethod
    def from_config(cls, config: MetaHarnessConfig, env_kwargs: dict[str, Any] | None = None) -> LLMProposer:
        return cls(
            config.llm.base_url or "",
            config.llm.model or "",
            api_key_env=config.llm.api_key_env,
            max_turns=config.llm.max_turns,
            temperature=config.llm.temperature,
            timeout=config.llm.timeout,
            price_prompt=config.llm.price_prompt,
            price_completion=config.llm.price_completion,
            check=config,
            env_kwargs=env_kwargs,
        )

    # ------------------------------------------------------------------ the conversation

    def propose(self, ctx: ProposalContext) -> list[Proposal]:
        tools = ArchiveTools(ctx.archive.root)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self._system(ctx)},
            {"role": "user", "content": self._task(ctx)},
        ]
        proposals: list[Proposal] = []
        usage = _Usage()
        for _turn in range(self.max_turns):
            if len(proposals) >= len(ctx.slots):
                break
            reply = self._chat(messages)
            usage.add(reply.get("usage") or {}, self.price_prompt, self.price_completion)
            message = (reply.get("choices") or [{}])[0].get("message") or {}
            calls = message.get("tool_calls") or []
            messages.append(
                {
                    "role": "assistant",
                    "content": message.get("content") or "",
                    **({"tool_calls": calls} if calls else {}),
                }
            )
            if not calls:
                found = _fenced_submission(message.get("content") or "")
                if found:
                    proposals.append(self._proposal(ctx, *found, None, usage))
                    messages.append({"role": "user", "content": self._more(ctx, proposals)})
                else:
                    messages.append(
                        {
                            "role": "user",
                            "content": "Use the tools to read the archive, then call submit_candidate.",
                        }
                    )
                continue
            for call in calls:
                fn = call.get("function") or {}
                result = self._tool(
                    ctx, tools, fn.get("name", ""), fn.get("arguments") or "{}", proposals, usage
                )
                messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": result})
        if proposals and usage.pending():
            proposals[-1].usage = _merge(proposals[-1].usage, usage.take())
        if not proposals:
            raise ProposerError(f"the LLM proposer submitted no candidate in {self.max_turns} turns")
        return proposals[: len(ctx.slots)]

    def _tool(
        self,
        ctx: ProposalContext,
        tools: ArchiveTools,
        name: str,
        arguments: str,
        proposals: list[Proposal],
        usage: _Usage,
    ) -> str:
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
        except json.JSONDecodeError as exc:
            return f"error: the arguments are not JSON: {exc}"
        try:
            if name == "list_files":
                return tools.list_files(args.get("path", "."))
            if name == "read_file":
                return tools.read_file(args["path"], args.get("offset", 0), args.get("length"))
            if name == "grep":
                return tools.grep(args["pattern"], args.get("path", "."))
            if name == "validate_candidate":
                return self._validate(ctx, str(args["source"]))
            if name == "submit_candidate":
                if len(proposals) >= len(ctx.slots):
                    return "error: all candidates of this iteration are submitted already"
                parent = args.get("parent") or ctx.incumbent
                if parent not in ctx.archive:
                    parent = ctx.incumbent
                proposals.append(
                    self._proposal(ctx, str(args["source"]), str(args["hypothesis"]), parent, usage)
                )
                return f"recorded ({len(proposals)} of {len(ctx.slots)}). " + self._more(ctx, proposals)
        except ToolError as exc:
            return f"error: {exc}"
        except KeyError as exc:
            return f"error: missing argument {exc}"
        return f"error: unknown tool {name!r}"

    def _validate(self, ctx: ProposalContext, source: str) -> str:
        seed_source = ctx.archive.get(ctx.seed_id).source if ctx.prompt_only else None
        v = evaluate.validate(source, "prototype", ctx.env_id, self.env_kwargs, self.check, seed_source)
        if v.ok:
            return f"ok: passes validation and check_harness (null-model scores {v.check.get('null_scores')})"
        return f"rejected: {v.reason}"

    def _proposal(
        self, ctx: ProposalContext, source: str, hypothesis: str, parent: str | None, usage: _Usage
    ) -> Proposal:
        return Proposal(
            source=source,
            hypothesis=hypothesis.strip(),
            parents=[parent or ctx.incumbent],
            change="prompt" if ctx.prompt_only else "rewrite",
            components={"model": self.model},
            usage=usage.take(),
        )

    def _more(self, ctx: ProposalContext, proposals: list[Proposal]) -> str:
        left = len(ctx.slots) - len(proposals)
        return f"Propose {left} more, each a different mechanism." if left > 0 else "That is all, thank you."

    # ------------------------------------------------------------------ prompts

    def _system(self, ctx: ProposalContext) -> str:
        prompt_only = PROMPT_ONLY.format(seed_id=ctx.seed_id) if ctx.prompt_only else ""
        return SYSTEM.format(**harness_facts(ctx), prompt_only=prompt_only)

    def _task(self, ctx: ProposalContext) -> str:
        return ctx.standing() + f"\nPropose {len(ctx.slots)} candidate(s), each a different mechanism."

    # ------------------------------------------------------------------ HTTP

    def _chat(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"model": self.model, "messages": messages, "tools": TOOLS, "temperature": self.temperature}
        return self.post("/chat/completions", body)


class _Usage:
    """Token counts and cost since the last candidate was recorded."""

    def __init__(self):
        self._now = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0}

    def add(self, usage: dict[str, Any], price_prompt: float, price_completion: float) -> None:
        p, c = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        self._now["requests"] += 1
        self._now["prompt_tokens"] += p
        self._now["completion_tokens"] += c
        self._now["cost_usd"] += (p * price_prompt + c * price_completion) / 1e6

    def pending(self) -> bool:
        return self._now["requests"] > 0

    def take(self) -> dict[str, Any]:
        out, self._now = (
            self._now,
            {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0},
        )
        return out


def _merge(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    return {k: (a or {}).get(k, 0) + v for k, v in b.items()}


def _fenced_submission(content: str) -> tuple[str, str] | None:
    """(source, hypothesis) from a reply with a fenced Python block and a 'Hypothesis:' line."""
    m = _FENCED.search(content)
    if not m:
        return None
    hyp = re.search(r"hypothesis:\s*(.+)", content, flags=re.I)
    return m.group(1), (hyp.group(1).strip() if hyp else "(no hypothesis given)")
