"""Self-consistency: sample several boxed answers to h0's prompt and answer with the most frequent one.

No tool calls; a small model's individual samples are noisy, and their majority is more often right.
"""

from harnesses.base import extract_boxed, majority
from harnesses.math.h0 import MathH0


class MathVote(MathH0):
    name = "math/vote"
    samples = 8

    def build_prompt(self, text, info):
        return f"{text}\nPut the final answer in \\boxed{{}}."

    def act(self, obs, info, llm):
        prompt = self.make_prompt(self.format_observation(obs, info), info, llm)
        answers = [extract_boxed(t) for t in llm.sample(prompt, self.samples, **self.params())]
        best = majority([a.replace(" ", "") for a in answers if a])
        return f"answer: {best}" if best is not None else "answer: 0"
