"""Candidate i001-c1 (offline proposer; parents: h0).

Hypothesis: h0 solves 27.0% ± 2.8 of 256 harness tasks under model v0 (failures: wrong_answer 73%;
1.1 LLM calls per episode). Mechanism tool: offer -> calculator (a calculator step: the model writes
an expression, the env's Python evaluates it, that value is the answer; without a usable value,
replies with the tool offered (math/calculator)). Aimed at: tool_helps, wrong, tool; expected to
raise the success rate.
"""

from harnesses.base import Harness, extract_boxed, extract_tag


class Candidate(Harness):
    """Offline-proposer harness (observation: full; output: boxed; tool: calculator; action: generate; hint: none; memory: none)."""

    name = "i001-c1"
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
        tool_line = "To run Python first, reply python: <code> and print the result. " if info.get("tool_calls_left") else ""
        return text + "\n" + tool_line + "Put the final answer in \\boxed{}."

    def parse_action(self, text, info):
        text = text.strip()
        if text.lower().startswith("python:"):
            return text
        boxed = extract_boxed(text)
        return f"answer: {boxed}" if boxed else None

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
