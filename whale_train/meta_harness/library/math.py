"""Math mechanisms: how the problem is shown, the answer format and its parser, the Python tool (offered,
withheld, or used as a calculator step: the model writes an expression, the env's sandbox evaluates it),
self-consistency votes, a hint, and memory of solved problems.

No mechanism does arithmetic: numbers come from the model or from running the model's expression in
the env's own tool. Their code is in ``mechanisms/math.py`` (and ``harnesses/math/calculator.py``);
``render`` picks and assembles it.
"""

from __future__ import annotations

import re

from harnesses.math.calculator import MathCalculator
from harnesses.math.h0 import MathH0
from whale_train.meta_harness.library import core
from whale_train.meta_harness.library.core import Choice, Constant, DomainLibrary, Genome, memory_slot
from whale_train.meta_harness.library.mechanisms import math as m
from whale_train.rollout import Trajectory

core.keep_sources(m, MathH0, MathCalculator)  # the code candidates are rendered from, as imported

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

    observation = {
        "full": MathH0,  # h0's own method
        "env_text": m.ObservationEnvText,
        "question": m.ObservationQuestion,
    }[s["observation"]]
    parts.append(core.method(core.code_of(observation.format_observation)))

    instruction = core.py(HINTS[s["hint"]] + FORMATS[s["output"]])
    parts.append(
        core.define(
            "build_prompt(self, text, info)",
            core.body_of(m.examples_first) if memory else "",
            core.body_of(m.tool_offered if s["tool"] != "none" else m.no_tool, INSTRUCTION=instruction),
            doc="Solved problems first (never the current one), then the problem." if memory else "",
        )
    )
    if memory:
        shown = m.boxed_answer if s["output"] != "answer_line" else m.answer_line
        parts.append(core.define("answer_text(self, answer)", core.body_of(shown)))

    parse = {"boxed": m.parse_boxed, "answer_line": m.parse_answer_line, "lenient": m.parse_lenient}
    parts.append(
        core.define(
            "parse_action(self, text, info)",
            core.body_of(m.stripped),
            core.body_of(m.python_first) if s["tool"] != "none" else "",
            core.body_of(parse[s["output"]]),
            doc="The answer in the reply: boxed, else an answer: line, else its last number."
            if s["output"] == "lenient"
            else "",
        )
    )

    if s["action"] != "generate":
        parts.append(core.method(core.code_of(m.ActionVote.answers)))
        act = m.ActionPreferTool.act if s["action"] == "prefer_tool" else m.ActionVote.act
        parts.append(core.method(core.code_of(act)))

    if s["tool"] == "calculator":
        expression = m.CalculatorVote if s["action"] == "vote" else MathCalculator
        parts.append(core.method(core.code_of(expression.expression)))
        parts.append(core.method(core.code_of(MathCalculator.run)))
    examples = [(e["question"], e["answer"]) for e in g.get("examples") or []] if memory else []
    prefix = core.string_list("EXAMPLES", examples, "Solved problems from the archive (problem, answer).")
    return prefix + core.join_methods(*parts)


def harvest(traj: Trajectory) -> dict[str, str] | None:
    """A solved problem: its text and the answer given."""
    return core.harvest_answered(traj, re.compile(r"Problem: (.+)"))


LIBRARY = DomainLibrary("math", SLOTS, CONSTANTS, H0, render, harvest)
