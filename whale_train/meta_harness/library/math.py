"""Math mechanisms: how the problem is shown, the answer format and its parser, the Python tool (offered,
withheld, or used as a calculator step: the model writes an expression, the env's sandbox evaluates it),
self-consistency votes, a hint, and memory of solved problems.

No mechanism does arithmetic: numbers come from the model or from running the model's expression in
the env's own tool.
"""

from __future__ import annotations

import re

from harnesses.math.calculator import MathCalculator
from whale_train.meta_harness.library import core
from whale_train.meta_harness.library.core import Choice, Constant, DomainLibrary, Genome, memory_slot
from whale_train.rollout import Trajectory

SLOTS = {
    "observation": {
        "full": Choice("the problem, the last Python output and any error (h0)"),
        "env_text": Choice("the env's own observation text", {"parse": 0.3}),
        "question": Choice("the problem and any error only (a shorter context)", {"wrong": 0.2}),
    },
    "output": {
        "boxed": Choice("the final answer in \\boxed{} (h0)"),
        "answer_line": Choice("a reply 'answer: <value>'", {"parse": 0.5}),
        "lenient": Choice(
            "\\boxed{} asked for; else an 'answer:' line; else the last number in the reply",
            {"parse": 1.0, "truncated": 0.5},
        ),
    },
    "tool": {
        "offer": Choice("the Python tool offered in the prompt (h0)"),
        "none": Choice(
            "no tool: every reply is an answer",
            {"tool": 1.0, "incomplete": 0.4, "parse": 0.3, "tool_helps": -1.0},
        ),
        "calculator": Choice(
            "a calculator step: the model writes an expression, the env's Python evaluates it, that value is the"
            " answer; without a usable value, replies with the tool offered (math/calculator)",
            {"wrong": 0.5, "tool": 0.3, "tool_helps": 0.6},
        ),
    },
    "action": {
        "generate": Choice("one sample per reply (h0)"),
        "vote": Choice(
            "self-consistency: the most frequent answer (or expression) among several samples", {"wrong": 0.8}
        ),
        "prefer_tool": Choice(
            "several samples: while the tool is unused, one that runs Python if any; else the most frequent answer",
            {"tool_helps": 1.5, "wrong": 0.3},
        ),
    },
    "hint": core.hint_slot(
        numeric=Choice("a hint: the answer is a single number", {"parse": 0.3, "wrong": 0.2})
    ),
    "memory": memory_slot("problem"),
}

CONSTANTS = {
    "temperature": core.temperature({"wrong": 0.3, "parse": 0.2}),
    "samples": core.samples(lambda g: g["slots"]["action"] != "generate", per="reply"),
    "max_tokens": Constant((32, 48, 96), "tokens per reply", {"truncated": 1.0}),
    "format_retries": core.format_retries(),
}

H0 = core.seed_genome(
    "math", SLOTS, {"temperature": 1.0, "samples": 8, "max_tokens": 48, "format_retries": 1}
)

FORMATS = {
    "boxed": "Put the final answer in \\boxed{}.",
    "answer_line": "Reply with answer: <the final answer>.",
    "lenient": "Put the final answer in \\boxed{}.",
}
HINTS = {"none": "", "numeric": "The answer is a single number. "}


def render(g: Genome, name: str) -> str:
    s, c = g["slots"], g["constants"]
    attrs = {"temperature": c["temperature"], "max_tokens": c["max_tokens"]}
    if s["action"] == "generate":
        attrs["format_retries"] = c["format_retries"]
    else:
        attrs["samples"] = c["samples"]
    memory = s["memory"] == "examples"
    parts = [core.candidate_header(name, g, attrs)]

    if s["observation"] == "env_text":
        parts.append(
            core.define(
                "format_observation(self, obs, info)",
                "return obs",
                doc="The env's own text: the problem, tool output, how to reply, and any error.",
            )
        )
    else:
        tool_output = """
            tool = info.get("last_tool")
            if tool:
                text += f"\\nPython output: {(tool.get('stdout') or tool.get('stderr') or '').strip()[:400]}"
            """
        parts.append(
            core.define(
                "format_observation(self, obs, info)",
                """text = f"Problem: {info['question']}\"""",
                tool_output if s["observation"] == "full" else "",
                """
                if info.get("error"):
                    text += f"\\nYour previous reply was not understood: {info['error']}"
                return text
                """,
            )
        )

    instruction = core.py(HINTS[s["hint"]] + FORMATS[s["output"]])
    examples = """
        shown = [f"Example: Problem: {q}\\nAnswer: {self.answer_text(a)}" for q, a in EXAMPLES if q != info["question"]]
        text = "\\n\\n".join(shown[: self.max_examples] + [text])
        """
    if s["tool"] != "none":  # offered (also after a calculator step, as in math/calculator)
        ending = f"""
            tool_line = "To run Python first, reply python: <code> and print the result. " if info.get("tool_calls_left") else ""
            return text + "\\n" + tool_line + {instruction}
            """
    else:
        ending = f'return text + "\\n" + {instruction}'
    parts.append(
        core.define(
            "build_prompt(self, text, info)",
            examples if memory else "",
            ending,
            doc="Solved problems first (never the current one), then the problem." if memory else "",
        )
    )
    if memory:
        shown = '"\\\\boxed{" + answer + "}"' if s["output"] != "answer_line" else '"answer: " + answer'
        parts.append(core.define("answer_text(self, answer)", f"return {shown}"))

    python = """
        if text.lower().startswith("python:"):
            return text
        """
    if s["output"] == "boxed":
        body = """
            boxed = extract_boxed(text)
            return f"answer: {boxed}" if boxed else None
            """
    elif s["output"] == "answer_line":
        body = """
            found = re.search(r"answer:\\s*(.+)", text, flags=re.I)
            return f"answer: {found.group(1).strip()}" if found else None
            """
    else:
        body = """
            found = extract_boxed(text)
            if not found:
                line = re.search(r"answer:\\s*(.+)", text, flags=re.I)
                numbers = re.findall(r"-?\\d+(?:\\.\\d+)?(?:/\\d+)?", text)
                found = line.group(1).strip() if line else (numbers[-1] if numbers else None)
            return f"answer: {found}" if found else None
            """
    parts.append(
        core.define(
            "parse_action(self, text, info)",
            "text = text.strip()",
            python if s["tool"] != "none" else "",
            body,
            doc="The answer in the reply: boxed, else an answer: line, else its last number."
            if s["output"] == "lenient"
            else "",
        )
    )

    if s["action"] != "generate":
        parts.append(
            core.define(
                "answers(self, actions)",
                """
                values = [a.split(":", 1)[1].replace(" ", "") for a in actions if a and a.startswith("answer:")]
                best = majority(values)
                return f"answer: {best}" if best is not None else None
                """,
                doc="The most frequent answer among parsed replies (None if none is an answer).",
            )
        )
        prefer_tool = """
            if info.get("tool_calls_left") and not info.get("last_tool"):
                for action in actions:
                    if action and action.lower().startswith("python:"):
                        return action
            """
        parts.append(
            core.define(
                "act(self, obs, info, llm)",
                """
                prompt = self.make_prompt(self.format_observation(obs, info), info, llm)
                replies = llm.sample(prompt, self.samples, **self.params())
                actions = [self.parse_action(r, info) for r in replies]
                """,
                prefer_tool if s["action"] == "prefer_tool" else "",
                "return self.answers(actions) or next((a for a in actions if a), replies[0])",
                doc="Several samples: while the tool is unused, take one that runs Python (computing with the\n"
                "        tool is more reliable than in the head); else the most frequent answer."
                if s["action"] == "prefer_tool"
                else "Self-consistency: the most frequent answer among several samples.",
            )
        )

    if s["tool"] == "calculator":
        if s["action"] == "vote":
            parts.append(
                core.define(
                    "expression(self, prompt, llm)",
                    """
                    replies = llm.sample(prompt, self.samples, **self.params())
                    return majority([e.strip() for e in (extract_tag(r, "expr") for r in replies) if e])
                    """,
                    doc="The most frequent expression among several samples.",
                )
            )
        else:
            parts.append(core.method(core.code_of(MathCalculator.expression)))
        parts.append(core.method(core.code_of(MathCalculator.run)))
    examples = [(e["question"], e["answer"]) for e in g.get("examples") or []] if memory else []
    prefix = core.string_list("EXAMPLES", examples, "Solved problems from the archive (problem, answer).")
    return prefix + core.join_methods(*parts)


def harvest(traj: Trajectory) -> dict[str, str] | None:
    """A solved problem: its text and the answer given."""
    return core.harvest_answered(traj, re.compile(r"Problem: (.+)"))


LIBRARY = DomainLibrary("math", SLOTS, CONSTANTS, H0, render, harvest)
