"""A calculator step: the model writes an arithmetic expression, the env's Python tool evaluates it.

First call: ask for one expression that computes the answer (``<expr>...</expr>``). The harness runs
``print(<expression>)`` through the env's sandboxed tool and answers with the printed value. When the
model writes no expression or the tool fails, it falls back to h0's boxed answer.
"""

from harnesses.base import extract_tag
from harnesses.math.h0 import MathH0


class MathCalculator(MathH0):
    name = "math/calculator"
    max_tokens = 48

    def expression(self, prompt, llm):
        return extract_tag(llm.complete(prompt, **self.params()), "expr")

    def run(self, env, llm):
        """A calculator step first: the model writes one expression, the env's Python evaluates it and
        the printed value is the answer. Without a usable value, the usual reply loop."""
        obs, info = env.reset()
        self.start(obs, info)
        if info.get("tool_calls_left"):
            prompt = self.make_prompt(
                f"Problem: {info['question']}\nWrite one arithmetic expression that computes the answer, "
                "inside <expr></expr>.",
                info,
                llm,
            )
            expr = self.expression(prompt, llm)
            if expr:
                obs, reward, terminated, truncated, info = env.step(f"python: print({expr})")
                if terminated or truncated:
                    return
                tool = info.get("last_tool") or {}
                value = (tool.get("stdout") or "").strip()
                if tool.get("exit_code") == 0 and value and "\n" not in value:
                    env.step(f"answer: {value}")
                    return
        while True:
            obs, reward, terminated, truncated, info = env.step(self.act(obs, info, llm))
            if terminated or truncated:
                return
