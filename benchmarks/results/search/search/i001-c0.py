"""Candidate i001-c0 (offline proposer; parents: h0).

Hypothesis: h0 solves 25.0% ± 2.7 of 256 harness tasks under model v0 (failures: wrong_answer 75%;
2.0 LLM calls per episode). Mechanism follow_up: none -> model_choose (follow-up queries written by
the model; an answer read from each search's new passages, and the one the model finds most likely
given every passage read). Aimed at: partial, misread; expected to raise the success rate.
"""

from harnesses.base import Harness, extract_tag


class Candidate(Harness):
    """Offline-proposer harness (query: model; follow_up: model_choose; answer: generate; output: tag; hint: none; memory: none)."""

    name = "i001-c0"
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
        return f"Question: {info['question']}\nPassage: {self.shown(seen)}" + "\nAnswer the question inside <answer></answer>."

    def parse_answer(self, reply):
        return extract_tag(reply, "answer") or reply.strip()

    def answer(self, info, seen, llm):
        prompt = self.make_prompt(self.answer_prompt(info, seen), info, llm)
        return self.parse_answer(llm.complete(prompt, **self.params()))

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
            found = self.answer(info, new, llm) if new else None
            if found and found not in answers:
                answers.append(found)  # what this search's passages say
            if round_ == self.follow_ups:
                break
            prompt = f"Question: {info['question']}\nPassages:\n{self.shown(seen)}\nWrite the next search query inside <search></search>."
            query = extract_tag(llm.complete(self.make_prompt(prompt, info, llm), **self.params()), "search")
            if not query:
                break
        env.step(f"answer: {self.pick(info, seen, answers, llm) or 'unknown'}")
