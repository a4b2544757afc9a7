"""Follow-up search with a likelihood pick, found by the offline Meta-Harness proposer on the shipped
tiny model (benchmarks/results/search/search/i001-c0.py) and kept as a hand-readable shipped harness.
Its methods are the follow-up mechanisms of the offline library, which renders them from this file.

The model writes a query; an answer is read from the first passage found; the model writes one
follow-up query from what it has read, and an answer is read from the new passage; the model's
likelihood then picks among the answers read, given every passage seen. h0 misses most multi-hop
questions a hop short; this reads the next hop without showing a one-hop question more passages at
once (which confuses a small model).
"""

from harnesses.base import Harness, extract_tag


class SearchFollowUp(Harness):
    """Offline-proposer harness (query: model; follow_up: model_choose; answer: generate; output: tag; hint: none; memory: none)."""

    name = "search_qa/follow_up"
    temperature = 1.0
    max_tokens = 32
    passages = 1
    passage_chars = 800
    follow_ups = 1

    def first_query(self, info, llm):
        """The model writes the query."""
        prompt = f"Question: {info['question']}\nWrite a search query inside <search></search>."
        reply = llm.complete(self.make_prompt(prompt, info, llm), **self.params())
        return extract_tag(reply, "search") or reply.strip() or info["question"]

    def shown(self, seen):
        return "\n".join(f"{p['title']}: {p['text'][: self.passage_chars]}" for p in seen)

    def answer_prompt(self, info, seen):
        return (
            f"Question: {info['question']}\nPassage: {self.shown(seen)}"
            + "\nAnswer the question inside <answer></answer>."
        )

    def parse_answer(self, reply):
        return extract_tag(reply, "answer") or reply.strip()

    def answer(self, info, seen, llm):
        prompt = self.make_prompt(self.answer_prompt(info, seen), info, llm)
        return self.parse_answer(llm.complete(prompt, **self.params()))

    def next_query(self, info, seen, llm):
        """The model's next query, written from the passages read so far (None if it writes none)."""
        prompt = f"Question: {info['question']}\nPassages:\n{self.shown(seen)}\nWrite the next search query inside <search></search>."
        return extract_tag(llm.complete(self.make_prompt(prompt, info, llm), **self.params()), "search")

    def read(self, info, new, answers, llm):
        """After each search: the answer its new passages give, kept in ``answers`` for ``pick``."""
        found = self.answer(info, new, llm) if new else None
        if found and found not in answers:
            answers.append(found)

    def pick(self, info, seen, answers, llm):
        """Of the answers read after each search, the one the model finds most likely given every
        passage read (likelihood selection: the model compares, it does not write)."""
        if len(answers) < 2:
            return answers[0] if answers else None
        prompt = self.make_prompt(self.answer_prompt(info, seen), info, llm)
        return answers[llm.choose(prompt, [f"<answer>{a}</answer>" for a in answers])]

    def run(self, env, llm):
        obs, info = env.reset()
        self.start(obs, info)
        seen, answers = [], []
        query = self.first_query(info, llm)
        for round_ in range(1 + self.follow_ups):
            obs, reward, terminated, truncated, info = env.step(f"search: {query}")
            if terminated or truncated:
                return
            ids = [q["id"] for q in seen]
            new = [p for p in (info.get("passages") or [])[: self.passages] if p["id"] not in ids]
            seen += new
            self.read(info, new, answers, llm)
            if round_ == self.follow_ups:
                break
            query = self.next_query(info, seen, llm)
            if not query:
                break
        env.step(f"answer: {self.pick(info, seen, answers, llm) or 'unknown'}")
