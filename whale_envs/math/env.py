"""``whale/Math-v0``: math problems with a strict verifier and a sandboxed Python tool.

Actions (one per step; leading white space ignored, prefixes case-insensitive):

* ``answer: <text>`` — the final answer; ends the episode. When the text holds several answers, the
  **last one counts**: the last ``\\boxed{...}`` if there is one, else the rest of the line of the
  last ``answer:``.
* any text containing a closed ``\\boxed{...}`` — also a final answer (the last box counts), so a
  model's whole worked solution can be sent as is. A last box left unclosed is a malformed action.
  The accepted and rejected forms are listed in docs/envs/math.md.
* ``python: <code>`` — runs ``code`` in a fresh sandboxed interpreter (:mod:`whale_envs.sandbox`); its
  stdout and stderr (cut with a note past ``tool_output_chars``) are the next observation. Each call
  starts from scratch (print what you need). At most ``max_tool_calls`` calls per episode; a Markdown
  code fence around the code is removed.
* anything else — an error that costs a turn and changes nothing.

Reward 1 when the verifier (:func:`whale_envs.math.verify.check`) accepts the answer, else 0. ``info``
holds ``question``, ``tool_calls_used``, ``tool_calls_left``, ``last_tool`` (exit code, limit hit,
output of the last tool call) and the task's public metadata; at the end also ``solved``, ``answer``
(the gold, as the source gives it), ``gold`` (normalized), ``extracted``, ``normalized``, ``matcher``
and ``verify_timed_out``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from whale_envs import workers
from whale_envs.math.dapo import VERIFIERS as DAPO_VERIFIERS
from whale_envs.math.problem import MathProblem
from whale_envs.math.verify import Verdict, boxed_contents, check
from whale_envs.sandbox import Limits, SandboxResult, run_python
from whale_envs.tasks import Task, TaskSource
from whale_envs.text_env import ActionError, Outcome, TextEnv, show_action

# Register the task sources of this domain (importing the module is enough).
from . import sources as _sources  # noqa: F401

#: Default limits of one tool call.
DEFAULT_TOOL_LIMITS = Limits(wall_s=10.0, cpu_s=10, memory_mb=512, max_processes=16, output_bytes=65_536)

_ANSWER = re.compile(r"answer\s*:", re.IGNORECASE)
_PYTHON = re.compile(r"python\s*:", re.IGNORECASE)
_FENCE = re.compile(r"^```[a-zA-Z0-9_+-]*[ \t]*\n?(.*?)\n?```\s*$", re.DOTALL)


def parse_action(action: str) -> tuple[str, str]:
    """Split an action into ``("python", code)``, ``("answer", text)`` or raise :class:`ActionError`."""
    text = action.strip()
    if _PYTHON.match(text):
        code = text[_PYTHON.match(text).end() :].strip("\n").strip(" ")  # type: ignore[union-attr]
        fenced = _FENCE.match(code.strip())
        if fenced:
            code = fenced.group(1)
        if not code.strip():
            raise ActionError("'python:' must be followed by code, e.g. 'python: print(12 * 34)'")
        return "python", code
    boxes = boxed_contents(text)
    opened = list(re.finditer(r"\\(?:boxed|fbox)", text))
    if opened and not boxed_contents(text[opened[-1].start() :]):
        raise ActionError("the last \\boxed{ is not closed; put the final answer in a closed \\boxed{...}")
    if boxes:
        if not boxes[-1].strip():
            raise ActionError("the last \\boxed{} is empty; put the final answer inside it")
        return "answer", "\\boxed{" + boxes[-1] + "}"
    if _ANSWER.match(text):
        last = list(_ANSWER.finditer(text))[-1]
        answer = text[last.end() :].split("\n", 1)[0].strip()  # the rest of the last 'answer:' line
        if not answer:
            raise ActionError("'answer:' must be followed by the answer, e.g. 'answer: 42'")
        return "answer", answer
    raise ActionError(
        f"unrecognized action {show_action(action)}: reply 'answer: <your answer>', "
        "a text with \\boxed{<your answer>}, or 'python: <code>'"
    )


class MathEnv(TextEnv[MathProblem]):
    """Math problems as a text environment.

    Args:
        tasks: ``generated`` (default; options ``families``, ``difficulty``, ``seed``, ``size``),
            ``gsm8k[:PATH]``, ``math[:PATH]`` (options ``levels``, ``subjects``), or a TaskSource.
        max_tool_calls: Python tool calls allowed per episode (0 turns the tool off).
        max_turns: steps per episode; default ``max_tool_calls + 2`` (the tool calls, one mistaken
            action, the answer).
        tool_limits: :class:`~whale_envs.sandbox.Limits` (or a dict of its fields) for each tool call.
        tool_output_chars: longest tool output shown in an observation.
        verify_timeout_s: time limit of the symbolic part of the verifier.
        verifier: ``"whale"`` (default, :mod:`whale_envs.math.verify`), ``"dapo"`` (DAPO's strict
            ``\\boxed{}`` string match, :mod:`whale_envs.math.dapo`) or ``"dapo_minerva"``. With a DAPO
            verifier every action but ``python:`` is a final answer, judged on its whole text.
        split, task_options, render_mode (``**options``): as for every WHALE env (``TextEnv``).
    """

    domain = "math"

    def __init__(
        self,
        tasks: str | TaskSource = "generated",
        *,
        max_tool_calls: int = 4,
        tool_limits: Limits | Mapping[str, Any] | None = None,
        tool_output_chars: int = 4000,
        verify_timeout_s: float = 5.0,
        verifier: str = "whale",
        **options: Any,
    ):
        if verifier != "whale" and verifier not in DAPO_VERIFIERS:
            known = ", ".join(["whale", *DAPO_VERIFIERS])
            raise ValueError(f"verifier must be one of {known}, got {verifier!r}")
        self.verifier = verifier
        if not isinstance(max_tool_calls, int) or max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be a non-negative integer, got {max_tool_calls!r}")
        if tool_limits is None:
            limits = DEFAULT_TOOL_LIMITS
        elif isinstance(tool_limits, Limits):
            limits = tool_limits
        else:
            limits = Limits(**{**asdict(DEFAULT_TOOL_LIMITS), **dict(tool_limits)})
        limits.validate()
        if tool_output_chars < 200:
            raise ValueError(f"tool_output_chars must be at least 200, got {tool_output_chars}")
        if verify_timeout_s <= 0:
            raise ValueError(f"verify_timeout_s must be positive, got {verify_timeout_s}")
        self.max_tool_calls = max_tool_calls
        self.tool_limits = limits
        self.tool_output_chars = tool_output_chars
        self.verify_timeout_s = verify_timeout_s
        super().__init__(tasks, **options)

    @property
    def uses_sandbox(self) -> bool:
        """Whether episodes may run model-written code (the rollout engine checks isolation first)."""
        return self.max_tool_calls > 0

    def _default_max_turns(self, task: Task[MathProblem]) -> int:
        return self.max_tool_calls + 2

    # ------------------------------------------------------------------ episode state

    def chance_action(self, rng) -> str:
        """A guess: a random small integer."""
        return f"answer: {rng.randint(0, 20)}"

    def _start(self, task: Task[MathProblem]) -> str:
        self.problem = task.payload
        self.tool_calls = 0
        self.last_tool: dict[str, Any] | None = None
        self.verdict: Verdict | None = None
        return ""

    def _apply(self, action: str) -> Outcome:
        if self.verifier != "whale" and not _PYTHON.match(action.strip()):
            verdict = DAPO_VERIFIERS[self.verifier](action, self.problem.answer)  # the whole response
            return self._verdict_outcome(verdict)
        kind, body = parse_action(action)
        if kind == "python":
            return self._run_tool(body)
        return self._verdict_outcome(check(body, self.problem.answer, timeout_s=self.verify_timeout_s))

    def _verdict_outcome(self, verdict: Verdict) -> Outcome:
        self.verdict = verdict
        shown = verdict.extracted if len(verdict.extracted or "") <= 200 else verdict.extracted[:200] + "..."
        if verdict.solved:
            return Outcome(reward=1.0, terminated=True, feedback=f"Your answer {shown} is correct.")
        return Outcome(reward=0.0, terminated=True, feedback=f"Your answer {shown} is not correct.")

    def _run_tool(self, code: str) -> Outcome:
        if self.max_tool_calls == 0:
            raise ActionError(
                "the Python tool is off in this env (max_tool_calls=0); reply 'answer: ...'", "illegal"
            )
        if self.tool_calls >= self.max_tool_calls:
            raise ActionError(
                f"no Python tool calls left (all {self.max_tool_calls} used); reply 'answer: <your answer>'",
                "budget",
            )
        self.tool_calls += 1
        result: SandboxResult = workers.call("sandbox", run_python, code, self.tool_limits)  # bounded pool
        text = result.observation(self.tool_output_chars)
        self.last_tool = {
            "exit_code": result.exit_code,
            "limit": result.limit,
            "output_truncated": result.output_truncated,
            "stdout": result.stdout[: self.tool_output_chars],
            "stderr": result.stderr[: self.tool_output_chars],
            "wall_s": round(result.wall_s, 3),
            "isolation": result.isolation,
        }
        return Outcome(feedback=f"Python output (call {self.tool_calls} of {self.max_tool_calls}):\n{text}")

    # ------------------------------------------------------------------ what the agent sees

    def _public_info(self) -> dict[str, Any]:
        meta = {k: v for k, v in self.task.meta.items() if k in ("difficulty", "family", "subject", "level")}
        return {
            "question": self.problem.question,
            "tool_calls_used": self.tool_calls,
            "tool_calls_left": self.max_tool_calls - self.tool_calls,
            "max_tool_calls": self.max_tool_calls,
            # {} before the first call, not None: gym.make_vec merges the infos of its envs key by key
            "last_tool": dict(self.last_tool) if self.last_tool else {},
            **meta,
        }

    def _final_info(self) -> dict[str, Any]:
        v = self.verdict
        return {
            "solved": bool(v and v.solved),
            "answer": self.problem.answer,
            "gold": v.gold if v else None,
            "extracted": v.extracted if v else None,
            "normalized": v.normalized if v else None,
            "matcher": v.matcher if v else None,
            "verify_timed_out": bool(v and v.timed_out),
        }

    def _observe(self) -> str:
        lines = [f"Problem: {self.problem.question}", ""]
        lines.append("Reply with 'answer: <your answer>' or put your final answer in \\boxed{...}.")
        if self.max_tool_calls:
            left = self.max_tool_calls - self.tool_calls
            lines.append(f"To run Python, reply 'python: <code>' and print the result ({left} calls left).")
        return "\n".join(lines)
