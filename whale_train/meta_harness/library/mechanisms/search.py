"""The search library's mechanisms (``library/search.py``) as the code a candidate gets; see ``__init__``.

The model's own first query, the follow-up loop and h0's answer and parser ship as harnesses
(``search_qa/follow_up``, ``search_qa/question_query``) and are rendered from there.
"""

from __future__ import annotations

import re

from harnesses.base import extract_tag, majority

#: Question words and fillers dropped by the ``keywords`` query rewriting (the candidate gets its own
#: copy, ``library/search.py``).
STOPWORDS = (
    "what who whom whose which where when why how is are was were does do did the a an of in on at to for "
    "by with from and or that this there it its"
).split()

#: Stand-ins for the candidate module's own: its solved questions and its prompt's instruction.
EXAMPLES: list[tuple[str, str]] = []
INSTRUCTION = "\nAnswer the question inside <answer></answer>."


class QueryQuestion:
    """query: question."""

    def first_query(self, info, llm):
        """Search the question itself."""
        return info["question"]


class QueryKeywords:
    """query: keywords."""

    def first_query(self, info, llm):
        """Query rewriting: the question without its question words and fillers."""
        words = re.findall(r"[\w'-]+", info["question"])
        kept = [w for w in words if w.lower() not in STOPWORDS]
        return " ".join(kept) or info["question"]


class MemoryNone:
    """memory: none (h0)."""

    def answer_prompt(self, info, seen):
        return f"Question: {info['question']}\nPassage: {self.shown(seen)}" + INSTRUCTION


# fmt: off
class MemoryExamples:
    """memory: examples."""

    def answer_prompt(self, info, seen):
        """Solved questions first (never the current one), then the question and passages."""
        prompt = f"Question: {info['question']}\nPassage: {self.shown(seen)}" + INSTRUCTION
        shown = [f"Example: Question: {q}\nAnswer: <answer>{a}</answer>" for q, a in EXAMPLES if q != info["question"]]
        prompt = "\n\n".join(shown[: self.max_examples] + [prompt])
        return prompt
# fmt: on


class OutputLenient:
    """output: lenient."""

    def parse_answer(self, reply):
        """The answer tag; else the reply's first line without an 'answer:' prefix or final dot."""
        found = extract_tag(reply, "answer") or reply
        found = re.sub(r"^\s*answer:\s*", "", found.strip(), flags=re.I)
        lines = [line for line in found.splitlines() if line.strip()]
        return lines[0].strip().rstrip(".") if lines else ""


class AnswerVote:
    """answer: vote."""

    def answer(self, info, seen, llm):
        """Self-consistency: the most frequent answer among several samples."""
        prompt = self.make_prompt(self.answer_prompt(info, seen), info, llm)
        replies = llm.sample(prompt, self.samples, **self.params())
        return majority([self.parse_answer(r) for r in replies])


class FollowUpModel:
    """follow_up: model: ``SearchFollowUp``'s loop (``run``), answering once from every passage read."""

    def read(self, info, new, answers, llm):
        """Nothing is answered between searches: the answer comes from every passage read."""

    def pick(self, info, seen, answers, llm):
        """One answer, from every passage read."""
        return self.answer(info, seen, llm)
