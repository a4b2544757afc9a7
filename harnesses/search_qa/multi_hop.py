"""Multi-hop search: search the question, then let the model write follow-up queries from what it has
read (up to two more searches), then answer with a vote over several samples.

Each round shows the passages found so far (the best three, cut short) and asks for the next query or
the answer.
"""

from harnesses.base import extract_tag, majority
from harnesses.search_qa.h0 import SearchH0


class SearchMultiHop(SearchH0):
    name = "search_qa/multi_hop"
    follow_ups = 2
    samples = 4

    def context(self, info, seen):
        shown = "\n".join(f"{p['title']}: {p['text'][:300]}" for p in seen[-3:])
        return f"Question: {info['question']}\nPassages:\n{shown}"

    def run(self, env, llm):
        obs, info = env.reset()
        self.start(obs, info)
        seen = []
        query = info["question"]
        for round_ in range(1 + self.follow_ups):
            obs, reward, terminated, truncated, info = env.step(f"search: {query}")
            if terminated or truncated:
                return
            for p in info.get("passages") or []:
                if p["id"] not in [s["id"] for s in seen]:
                    seen.append(p)
            if round_ == self.follow_ups:
                break
            prompt = self.context(info, seen) + "\nWrite the next search query inside <search></search>."
            reply = llm.complete(self.make_prompt(prompt, info, llm), **self.params())
            query = extract_tag(reply, "search")
            if not query:
                break
        prompt = self.context(info, seen) + "\nAnswer the question inside <answer></answer>."
        replies = llm.sample(self.make_prompt(prompt, info, llm), self.samples, **self.params())
        answers = [extract_tag(r, "answer") or r.strip() for r in replies]
        env.step(f"answer: {majority(answers) or 'unknown'}")
