"""paper_h0: the math base harness as the paper's reference runs it (ReTool on DAPO-Math-17K).

The reference: no system prompt, the problem followed by "The answer format must be:
\\boxed{'The final answer goes here.'}", at most two assistant turns, a Python code interpreter (the
last expression of the code is printed). A first reply without code ends the episode and is scored
as it is; a reply with a fenced ```python block runs it, and the second reply, which sees the output,
is scored. The score is DAPO's strict ``\\boxed{}`` rule: run it on ``whale/Math-v0`` with
``verifier="dapo"`` (configs/paper/math/*.yaml do), which reads the whole completion.

Differences from the reference (docs/PAPER.md): code runs in the env's sandbox through
``python:`` instead of a SandboxFusion server, and a tool call is a fenced block, not an OpenAI tool
call.
"""

from re import DOTALL, findall

from harnesses.base import Harness

ANSWER_FORMAT = "\nThe answer format must be: \\boxed{'The final answer goes here.'}"
TOOL_HINT = "\nYou may run Python once: put the code in a ```python ... ``` block and stop."
FENCE = r"```python(.*?)```"
MAX_TURNS = 2


def last_expression_printed(code):
    """The reference's rule: the last non-empty line is printed unless it already prints."""
    lines = code.strip("\n").split("\n")
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].strip():
            if not lines[i].lstrip().startswith("print") and not lines[i].startswith((" ", "\t")):
                lines[i] = f"print({lines[i]})"
            break
    return "\n".join(lines)


class MathPaperH0(Harness):
    name = "math/paper_h0"
    temperature = 1.0
    max_tokens = 512  # the default per-request cap of a run (--max-tokens); the paper allows longer

    def run(self, env, llm):
        obs, info = env.reset()
        self.start(obs, info)
        tool = bool(info.get("tool_calls_left"))
        prompt = info["question"] + ANSWER_FORMAT + (TOOL_HINT if tool else "")
        for turn in range(MAX_TURNS):
            reply = llm.complete(self.make_prompt(prompt, info, llm), **self.params())
            code = findall(FENCE, reply, DOTALL)
            if not (tool and code and turn < MAX_TURNS - 1):
                env.step(reply if reply.strip() else "answer: none")
                return
            obs, reward, terminated, truncated, info = env.step("python: " + last_expression_printed(code[0]))
            if terminated or truncated:
                return
            last = info.get("last_tool") or {}
            output = ((last.get("stdout") or "") + (last.get("stderr") or "")).strip() or "no stdout here"
            prompt = f"{prompt}\n\n{reply.strip()}\n\nCode output:\n{output[:2000]}\n\nNow give the final answer in \\boxed{{}}."
