"""h0, the base math harness (as in the paper): a boxed final answer, the Python tool available.

The prompt is the problem and the two ways to reply. A completion with ``\\boxed{...}`` is the final
answer; one starting with ``python:`` runs code in the env's sandbox and the output comes back in the
next prompt. An unparseable completion is retried once, then sent as it is (the env explains why it
is not an action).
"""

from harnesses.base import Harness, extract_boxed


class MathH0(Harness):
    name = "math/h0"
    temperature = 1.0
    max_tokens = 48
    format_retries = 1

    def format_observation(self, obs, info):
        text = f"Problem: {info['question']}"
        tool = info.get("last_tool")
        if tool:
            text += f"\nPython output: {(tool.get('stdout') or tool.get('stderr') or '').strip()[:400]}"
        if info.get("error"):
            text += f"\nYour previous reply was not understood: {info['error']}"
        return text

    def build_prompt(self, text, info):
        tool_line = (
            "To run Python first, reply python: <code> and print the result. "
            if info.get("tool_calls_left")
            else ""
        )
        return f"{text}\n{tool_line}Put the final answer in \\boxed{{}}."

    def parse_action(self, text, info):
        text = text.strip()
        if text.lower().startswith("python:"):
            return text
        boxed = extract_boxed(text)
        return f"answer: {boxed}" if boxed else None
