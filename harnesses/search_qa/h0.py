"""h0, the base search-QA harness (as in the paper).

At most two assistant turns: the model writes a query, which is forwarded as is; the first passage
found, cut to about 200 tokens, goes into the second prompt; the model answers.
"""

from harnesses.base import Harness, extract_tag

PASSAGE_CHARS = 800  # about 200 tokens


class SearchH0(Harness):
    name = "search_qa/h0"
    temperature = 1.0
    max_tokens = 32

    def query_prompt(self, info):
        return f"Question: {info['question']}\nWrite a search query inside <search></search>."

    def answer_prompt(self, info, passages):
        shown = "\n".join(f"{p['title']}: {p['text'][:PASSAGE_CHARS]}" for p in passages)
        return (
            f"Question: {info['question']}\nPassage: {shown}\nAnswer the question inside <answer></answer>."
        )

    def run(self, env, llm):
        obs, info = env.reset()
        self.start(obs, info)
        reply = llm.complete(self.make_prompt(self.query_prompt(info), info, llm), **self.params())
        query = extract_tag(reply, "search") or reply.strip() or info["question"]
        obs, reward, terminated, truncated, info = env.step(f"search: {query}")
        if terminated or truncated:
            return
        passages = (info.get("passages") or [])[:1]
        reply = llm.complete(self.make_prompt(self.answer_prompt(info, passages), info, llm), **self.params())
        env.step(f"answer: {extract_tag(reply, 'answer') or reply.strip()}")
