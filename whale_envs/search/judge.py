"""An optional LLM-judge verifier over any OpenAI-compatible chat endpoint (stdlib only; off by default).

The env asks the judge only when normalized exact match fails (an exact match is always correct), and a
judge that cannot be reached never breaks an episode: the env falls back to exact match and reports
``judge_error`` in ``info``.

    env = gym.make("whale/SearchQA-v0", judge={"base_url": "http://localhost:8000/v1", "model": "qwen"})
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

PROMPT = """You are grading an answer to a question. Gold answers are given; the predicted answer is correct \
if it means the same as any of them (other wording, more or less detail that stays accurate).

Question: {question}
Gold answers: {answers}
Predicted answer: {prediction}

Is the predicted answer correct? Reply with one word: yes or no."""


_THINK = re.compile(r"<think>.*?(</think>|\Z)", re.S)


class JudgeError(RuntimeError):
    """The judge could not be asked or gave no yes/no verdict."""


@dataclass
class LLMJudge:
    """A yes/no correctness judge.

    Attributes:
        base_url: the API root, e.g. ``http://localhost:8000/v1`` (``/chat/completions`` is appended).
        model: the model name the server expects.
        api_key: sent as a bearer token; default: the environment variable named by ``api_key_env``.
        api_key_env: where to read the key from when ``api_key`` is None (``OPENAI_API_KEY``).
        timeout: seconds per request.
        max_tokens: room for the verdict (reasoning models may need more).
    """

    base_url: str
    model: str
    api_key: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout: float = 30.0
    max_tokens: int = 8

    def __call__(self, question: str, answers: Sequence[str], prediction: str) -> bool:
        """True when the judge says the prediction is correct; raises JudgeError on any failure."""
        prompt = PROMPT.format(question=question, answers="; ".join(answers), prediction=prediction)
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": self.max_tokens,
        }
        headers = {"Content-Type": "application/json"}
        key = self.api_key if self.api_key is not None else os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        url = self.base_url.rstrip("/") + "/chat/completions"
        try:
            data = json.dumps(body, ensure_ascii=True).encode("utf-8")
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                reply = json.loads(response.read().decode("utf-8"))
            content = reply["choices"][0]["message"]["content"] or ""
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise JudgeError(f"judge request to {url} failed: {exc}") from None
        content = _THINK.sub("", content)  # reasoning models: judge the text after the thinking
        words = content.strip().lower().split()
        verdict = words[0].strip(".,!:;\"'*") if words else ""
        if verdict not in ("yes", "no"):
            raise JudgeError(f"judge gave no yes/no verdict: {content[:80]!r}")
        return verdict == "yes"
