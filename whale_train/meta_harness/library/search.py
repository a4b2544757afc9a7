"""Search-QA mechanisms: how the first query is made (the model's own, the question itself, or the
question rewritten to its key words), follow-up queries written from what was read (answering once from
everything read, or reading an answer after each search and letting the model's likelihood pick one),
the passage budget
(how many passages, how long), the answer format and its parser, self-consistency votes, a hint, and
memory of solved questions.

No mechanism reads the answer out of a passage: answers come from the model.
"""

from __future__ import annotations

import re

from harnesses.search_qa.follow_up import SearchFollowUp
from harnesses.search_qa.question_query import SearchQuestionQuery
from whale_train.meta_harness.library import core
from whale_train.meta_harness.library.core import Choice, Constant, DomainLibrary, Genome, memory_slot
from whale_train.rollout import Trajectory

SLOTS = {
    "query": {
        "model": Choice("the model writes the first query, forwarded as is (h0)"),
        "question": Choice("query rewriting: search the question itself", {"missed": 1.0, "wrong": 0.2}),
        "keywords": Choice(
            "query rewriting: the question without its question words", {"missed": 1.0, "wrong": 0.2}
        ),
    },
    "follow_up": {
        "none": Choice("one search (h0)"),
        "model": Choice(
            "follow-up queries written by the model from the passages read so far",
            {"partial": 1.0, "missed": 0.2},
        ),
        "model_choose": Choice(
            "follow-up queries written by the model; an answer read from each search's new passages, and the"
            " one the model finds most likely given every passage read",
            {"partial": 1.0, "misread": 0.3},
        ),
    },
    "answer": {
        "generate": Choice("one sampled answer (h0)"),
        "vote": Choice("self-consistency: the most frequent answer among several samples", {"wrong": 0.7}),
    },
    "output": {
        "tag": Choice("the answer inside <answer></answer>, else the whole reply (h0)"),
        "lenient": Choice(
            "<answer></answer> asked for; else the reply's first line without an 'answer:' prefix or final dot",
            {"parse": 1.0, "wrong": 0.3},
        ),
    },
    "hint": core.hint_slot(
        short=Choice("a hint: answer with a short phrase from the passages", {"wrong": 0.4})
    ),
    "memory": memory_slot("question"),
}

CONSTANTS = {
    "passages": Constant(
        (1, 2, 3), "passages shown per search (the passage budget)", {"missed": 0.6, "partial": 0.3}
    ),
    "passage_chars": Constant((200, 400, 800), "characters shown per passage", {"missed": 0.3, "wrong": 0.1}),
    "temperature": core.temperature({"wrong": 0.4, "parse": 0.2}),
    "samples": core.samples(lambda g: g["slots"]["answer"] == "vote", (4, 8)),
    "follow_ups": Constant(
        (1, 2), "follow-up searches", {"partial": 0.6}, lambda g: g["slots"]["follow_up"] != "none"
    ),
}

H0 = core.seed_genome(
    "search", SLOTS, {"passages": 1, "passage_chars": 800, "temperature": 1.0, "samples": 4, "follow_ups": 1}
)

#: Question words and fillers dropped by the ``keywords`` query rewriting.
STOPWORDS = (
    "what who whom whose which where when why how is are was were does do did the a an of in on at to for "
    "by with from and or that this there it its"
).split()

HINTS = {"none": "", "short": "Answer with a short phrase taken from the passage. "}


def render(g: Genome, name: str) -> str:
    s, c = g["slots"], g["constants"]
    attrs = {
        "temperature": c["temperature"],
        "max_tokens": 32,
        "passages": c["passages"],
        "passage_chars": c["passage_chars"],
    }
    if s["follow_up"] != "none":
        attrs["follow_ups"] = c["follow_ups"]
    if s["answer"] == "vote":
        attrs["samples"] = c["samples"]
    memory = s["memory"] == "examples"
    parts = [core.candidate_header(name, g, attrs)]

    if s["query"] == "model":
        parts.append(core.method(core.code_of(SearchFollowUp.first_query)))
    elif s["query"] == "question":
        parts.append(
            core.define(
                "first_query(self, info, llm)", 'return info["question"]', doc="Search the question itself."
            )
        )
    else:
        parts.append(
            core.define(
                "first_query(self, info, llm)",
                """
                words = re.findall(r"[\\w'-]+", info["question"])
                kept = [w for w in words if w.lower() not in STOPWORDS]
                return " ".join(kept) or info["question"]
                """,
                doc="Query rewriting: the question without its question words and fillers.",
            )
        )
    parts.append(core.method(core.code_of(SearchFollowUp.shown)))
    instruction = core.py("\n" + HINTS[s["hint"]] + "Answer the question inside <answer></answer>.")
    examples = """
        shown = [f"Example: Question: {q}\\nAnswer: <answer>{a}</answer>" for q, a in EXAMPLES if q != info["question"]]
        prompt = "\\n\\n".join(shown[: self.max_examples] + [prompt])
        """
    question = "f\"Question: {info['question']}\\nPassage: {self.shown(seen)}\" + " + instruction
    if memory:
        parts.append(
            core.define(
                "answer_prompt(self, info, seen)",
                f"prompt = {question}",
                examples,
                "return prompt",
                doc="Solved questions first (never the current one), then the question and passages.",
            )
        )
    else:
        parts.append(core.define("answer_prompt(self, info, seen)", f"return {question}"))
    if s["output"] == "tag":
        parts.append(core.method(core.code_of(SearchFollowUp.parse_answer)))
    else:
        parts.append(
            core.define(
                "parse_answer(self, reply)",
                """
                found = extract_tag(reply, "answer") or reply
                found = re.sub(r"^\\s*answer:\\s*", "", found.strip(), flags=re.I)
                lines = [line for line in found.splitlines() if line.strip()]
                return lines[0].strip().rstrip(".") if lines else ""
                """,
                doc="The answer tag; else the reply's first line without an 'answer:' prefix or final dot.",
            )
        )
    if s["answer"] == "vote":
        parts.append(
            core.define(
                "answer(self, info, seen, llm)",
                """
                prompt = self.make_prompt(self.answer_prompt(info, seen), info, llm)
                replies = llm.sample(prompt, self.samples, **self.params())
                return majority([self.parse_answer(r) for r in replies])
                """,
                doc="Self-consistency: the most frequent answer among several samples.",
            )
        )
    else:
        parts.append(core.method(core.code_of(SearchFollowUp.answer)))
    if s["follow_up"] != "none":
        parts.append(core.method(core.code_of(SearchFollowUp.next_query)))
    if s["follow_up"] == "model_choose":
        parts.append(core.method(core.code_of(SearchFollowUp.read)))
        parts.append(core.method(core.code_of(SearchFollowUp.pick)))
        parts.append(core.method(core.code_of(SearchFollowUp.run)))
    elif s["follow_up"] == "model":  # the same loop, answering once from every passage read
        parts.append(
            core.define(
                "read(self, info, new, answers, llm)",
                doc="Nothing is answered between searches: the answer comes from every passage read.",
            )
        )
        parts.append(
            core.define(
                "pick(self, info, seen, answers, llm)",
                "return self.answer(info, seen, llm)",
                doc="One answer, from every passage read.",
            )
        )
        parts.append(core.method(core.code_of(SearchFollowUp.run)))
    else:  # one search: the shipped search_qa/question_query's loop
        parts.append(core.method(core.code_of(SearchQuestionQuery.run)))
    prefix = ""
    if s["query"] == "keywords":
        prefix += f"#: Question words and fillers left out of the query.\nSTOPWORDS = {core.py(' '.join(STOPWORDS))}.split()\n\n\n"
    examples_list = [(e["question"], e["answer"]) for e in g.get("examples") or []] if memory else []
    prefix += core.string_list(
        "EXAMPLES", examples_list, "Solved questions from the archive (question, answer)."
    )
    return prefix + core.join_methods(*parts)


def harvest(traj: Trajectory) -> dict[str, str] | None:
    """A solved question: its text and the answer given."""
    return core.harvest_answered(traj, re.compile(r"Question: (.+)"))


LIBRARY = DomainLibrary("search", SLOTS, CONSTANTS, H0, render, harvest)
