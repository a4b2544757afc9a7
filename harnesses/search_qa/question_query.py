"""Query rewriting: search with the question itself, show the top three passages, then ask for the answer.

The model's own query (h0) is often poor for a small model; the question's words are a strong BM25
query. One model call per episode. Its ``run`` (one search, then the answer) is the offline library's
one-search loop, which renders it from this file.
"""

from harnesses.base import extract_tag
from harnesses.search_qa.h0 import SearchH0


class SearchQuestionQuery(SearchH0):
    name = "search_qa/question_query"
    passages = 3

    def first_query(self, info, llm):
        return info["question"]

    def answer(self, info, seen, llm):
        reply = llm.complete(self.make_prompt(self.answer_prompt(info, seen), info, llm), **self.params())
        return extract_tag(reply, "answer") or reply.strip()

    def run(self, env, llm):
        obs, info = env.reset()
        self.start(obs, info)
        obs, reward, terminated, truncated, info = env.step(f"search: {self.first_query(info, llm)}")
        if terminated or truncated:
            return
        seen = (info.get("passages") or [])[: self.passages]
        env.step(f"answer: {self.answer(info, seen, llm) or 'unknown'}")
