"""h0 for Reverse-v0: show the question and the options, send the reply as the action."""

from harnesses.base import Harness


class ReverseH0(Harness):
    name = "reverse/h0"
    temperature = 1.0
    max_tokens = 8
    stop = ("\n",)

    def build_prompt(self, text, info):
        return f"{text}\nReply with the word only."
