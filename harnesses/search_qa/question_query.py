"""Query rewriting: search with the question itself, show the top three passages, then ask for the answer.

The model's own query (h0) is often poor for a small model; the question's words are a strong BM25
query. One model call per episode.
"""

from harnesses.base import extract_tag
from harnesses.search_qa.h0 import SearchH0


class SearchQuestionQuery(SearchH0):
    name = "search_qa/question_query"
    passages = 3

    def run(self, env, llm):
        obs, info = env.reset()
        self.start(obs, info)
        obs, reward, terminated, truncated, info = env.step(f"search: {info['question']}")
        if terminated or truncated:
            return
        passages = (info.get("passages") or [])[: self.passages]
        reply = llm.complete(self.make_prompt(self.answer_prompt(info, passages), info, llm), **self.params())
        env.step(f"answer: {self.clean(reply)}")

    def clean(self, reply):
        return extract_tag(reply, "answer") or reply.strip() or "unknown"
