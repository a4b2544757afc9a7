"""The math library's mechanisms (``library/math.py``) as the code a candidate gets; see ``__init__``.

``math/calculator``'s ``expression`` and ``run`` ship as a harness and are rendered from there.
"""

from __future__ import annotations

import re

from harnesses.base import extract_boxed, extract_tag, majority

#: Stand-ins for the candidate module's own: its solved problems and its prompt's instruction.
EXAMPLES: list[tuple[str, str]] = []
INSTRUCTION = "Put the final answer in \\boxed{}."

# ------------------------------------------------------------------------------------ observation


class ObservationEnvText:
    """observation: env_text."""

    def format_observation(self, obs, info):
        """The env's own text: the problem, tool output, how to reply, and any error."""
        return obs


class ObservationQuestion:
    """observation: question."""

    def format_observation(self, obs, info):
        text = f"Problem: {info['question']}"
        if info.get("error"):
            text += f"\nYour previous reply was not understood: {info['error']}"
        return text


# --------------------------------------------------------- parts of build_prompt(self, text, info)


# fmt: off
def examples_first(self, text, info):
    """First, under memory: examples: the solved problems (never the current one) before the problem."""
    shown = [f"Example: Problem: {q}\nAnswer: {self.answer_text(a)}" for q, a in EXAMPLES if q != info["question"]]
    text = "\n\n".join(shown[: self.max_examples] + [text])


def tool_offered(text, info):
    """Last, where the tool is offered (tool: offer, and calculator, which offers it after its step):
    how to run Python while a call is left, then the instruction."""
    tool_line = "To run Python first, reply python: <code> and print the result. " if info.get("tool_calls_left") else ""
    return text + "\n" + tool_line + INSTRUCTION
# fmt: on


def no_tool(text):
    """Last, under tool: none: the instruction."""
    return text + "\n" + INSTRUCTION


# ------------------------------------------- answer_text(self, answer), under memory: examples (one part)


def boxed_answer(answer):
    """In \\boxed{} (output: boxed or lenient)."""
    return "\\boxed{" + answer + "}"


def answer_line(answer):
    """On an ``answer:`` line (output: answer_line)."""
    return "answer: " + answer


# --------------------------------------------------------- parts of parse_action(self, text, info)


def stripped(text):
    """First: the reply without surrounding whitespace."""
    text = text.strip()


def python_first(text):
    """Then, where the tool is offered (not under tool: none): a reply that runs Python is the action."""
    if text.lower().startswith("python:"):
        return text


def parse_boxed(text):
    """Last, under output: boxed (h0): the answer in \\boxed{}."""
    boxed = extract_boxed(text)
    return f"answer: {boxed}" if boxed else None


def parse_answer_line(text):
    """Last, under output: answer_line: the reply's ``answer:`` line."""
    found = re.search(r"answer:\s*(.+)", text, flags=re.I)
    return f"answer: {found.group(1).strip()}" if found else None


def parse_lenient(text):
    """Last, under output: lenient: boxed, else an ``answer:`` line, else the reply's last number."""
    found = extract_boxed(text)
    if not found:
        line = re.search(r"answer:\s*(.+)", text, flags=re.I)
        numbers = re.findall(r"-?\d+(?:\.\d+)?(?:/\d+)?", text)
        found = line.group(1).strip() if line else (numbers[-1] if numbers else None)
    return f"answer: {found}" if found else None


# ----------------------------------------------------------------------------------------- action


class ActionVote:
    """action: vote (``answers`` also under prefer_tool)."""

    def answers(self, actions):
        """The most frequent answer among parsed replies (None if none is an answer)."""
        values = [a.split(":", 1)[1].replace(" ", "") for a in actions if a and a.startswith("answer:")]
        best = majority(values)
        return f"answer: {best}" if best is not None else None

    def act(self, obs, info, llm):
        """Self-consistency: the most frequent answer among several samples."""
        prompt = self.make_prompt(self.format_observation(obs, info), info, llm)
        replies = llm.sample(prompt, self.samples, **self.params())
        actions = [self.parse_action(r, info) for r in replies]
        return self.answers(actions) or next((a for a in actions if a), replies[0])


class ActionPreferTool:
    """action: prefer_tool (with ``ActionVote.answers``)."""

    def act(self, obs, info, llm):
        """Several samples: while the tool is unused, take one that runs Python (computing with the
        tool is more reliable than in the head); else the most frequent answer."""
        prompt = self.make_prompt(self.format_observation(obs, info), info, llm)
        replies = llm.sample(prompt, self.samples, **self.params())
        actions = [self.parse_action(r, info) for r in replies]
        if info.get("tool_calls_left") and not info.get("last_tool"):
            for action in actions:
                if action and action.lower().startswith("python:"):
                    return action
        return self.answers(actions) or next((a for a in actions if a), replies[0])


class CalculatorVote:
    """tool: calculator under action: vote (otherwise ``MathCalculator.expression``)."""

    def expression(self, prompt, llm):
        """The most frequent expression among several samples."""
        replies = llm.sample(prompt, self.samples, **self.params())
        return majority([e.strip() for e in (extract_tag(r, "expr") for r in replies) if e])
