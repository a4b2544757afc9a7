"""Search-QA mechanisms: how the first query is made (the model's own, the question itself, or the
question rewritten to its key words), follow-up queries written from what was read (answering once from
everything read, or reading an answer after each search and letting the model's likelihood pick one),
the passage budget (how many passages, how long), the answer format and its parser, self-consistency
votes, a hint, and memory of solved questions.

No mechanism reads the answer out of a passage: answers come from the model. Their code is in
``mechanisms/search.py`` (and the shipped ``harnesses/search_qa/``); ``render`` picks it.
"""

from __future__ import annotations

import re

from harnesses.search_qa.follow_up import SearchFollowUp
from harnesses.search_qa.question_query import SearchQuestionQuery
from whale_train.meta_harness.library import core
from whale_train.meta_harness.library.core import Choice, Constant, DomainLibrary, Genome, memory_slot
from whale_train.meta_harness.library.mechanisms import search as m
from whale_train.rollout import Trajectory

core.keep_sources(
    m, SearchFollowUp, SearchQuestionQuery
)  # the code candidates are rendered from, as imported

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

    query = {"model": SearchFollowUp, "question": m.QueryQuestion, "keywords": m.QueryKeywords}[s["query"]]
    parts.append(core.method(core.code_of(query.first_query)))
    parts.append(core.method(core.code_of(SearchFollowUp.shown)))
    instruction = core.py("\n" + HINTS[s["hint"]] + "Answer the question inside <answer></answer>.")
    prompt = m.MemoryExamples if memory else m.MemoryNone
    parts.append(core.method(core.code_of(prompt.answer_prompt, INSTRUCTION=instruction)))
    output = m.OutputLenient if s["output"] == "lenient" else SearchFollowUp
    parts.append(core.method(core.code_of(output.parse_answer)))
    answer = m.AnswerVote if s["answer"] == "vote" else SearchFollowUp
    parts.append(core.method(core.code_of(answer.answer)))
    if s["follow_up"] != "none":
        parts.append(core.method(core.code_of(SearchFollowUp.next_query)))
    if s["follow_up"] == "model_choose":
        parts.append(core.method(core.code_of(SearchFollowUp.read)))
        parts.append(core.method(core.code_of(SearchFollowUp.pick)))
        parts.append(core.method(core.code_of(SearchFollowUp.run)))
    elif s["follow_up"] == "model":  # the same loop, answering once from every passage read
        parts.append(core.method(core.code_of(m.FollowUpModel.read)))
        parts.append(core.method(core.code_of(m.FollowUpModel.pick)))
        parts.append(core.method(core.code_of(SearchFollowUp.run)))
    else:  # one search: the shipped search_qa/question_query's loop
        parts.append(core.method(core.code_of(SearchQuestionQuery.run)))
    prefix = ""
    if s["query"] == "keywords":  # the candidate's own copy of the words its first_query leaves out
        words = core.py(" ".join(m.STOPWORDS))
        prefix += f"#: Question words and fillers left out of the query.\nSTOPWORDS = {words}.split()\n\n\n"
    examples_list = [(e["question"], e["answer"]) for e in g.get("examples") or []] if memory else []
    prefix += core.string_list(
        "EXAMPLES", examples_list, "Solved questions from the archive (question, answer)."
    )
    return prefix + core.join_methods(*parts)


def harvest(traj: Trajectory) -> dict[str, str] | None:
    """A solved question: its text and the answer given."""
    return core.harvest_answered(traj, re.compile(r"Question: (.+)"))


LIBRARY = DomainLibrary("search", SLOTS, CONSTANTS, H0, render, harvest)
