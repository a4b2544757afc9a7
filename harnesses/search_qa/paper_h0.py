"""paper_h0: the search-QA base harness as the paper's reference runs it (Search-R1 setting).

The reference (a tool-calling harness over Search-R1's retrieval server): system prompt "Answer factual
questions using search when needed.", the user prompt below, at most two assistant turns, the search
tool forced to the top-1 passage cut to 200 tokens, the answer inside ``<answer></answer>``.

Here, in text: turn 1 may answer at once (``<answer>``) or search (``<search>query</search>``, the
query forwarded as is); turn 2 sees the one passage and must answer. Differences from the reference,
documented in docs/PAPER.md: the search is a tag, not an OpenAI tool call; the passage is cut to
800 characters (about 200 tokens) since the harness has no tokenizer; a reply with neither tag is
taken as the answer.
"""

from harnesses.base import Harness, extract_tag

SYSTEM_PROMPT = "Answer factual questions using search when needed."
USE_SEARCH = (
    "Use the search tool if needed: write <search>your query</search>. Put the final answer only "
    "inside <answer>...</answer>."
)
PASSAGE_CHARS = 800  # about 200 tokens
MAX_TURNS = 2


class SearchPaperH0(Harness):
    name = "search_qa/paper_h0"
    temperature = 1.0
    max_tokens = 512

    def chat(self, content, llm):
        if self.use_chat and llm.has_chat_template:
            return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": content}]
        return f"{SYSTEM_PROMPT}\n\n{content}"

    def run(self, env, llm):
        obs, info = env.reset()
        self.start(obs, info)
        prompt = f"Question: {info['question']}\n{USE_SEARCH}"
        for turn in range(MAX_TURNS):
            reply = llm.complete(self.chat(prompt, llm), **self.params())
            answer = extract_tag(reply, "answer")
            query = extract_tag(reply, "search")
            if answer is not None or query is None or turn == MAX_TURNS - 1:
                env.step(f"answer: {answer or reply.strip() or 'unknown'}")
                return
            obs, reward, terminated, truncated, info = env.step(f"search: {query}")
            if terminated or truncated:
                return
            passages = (info.get("passages") or [])[:1]
            shown = "\n".join(f"{p['title']}\n{p['text'][:PASSAGE_CHARS]}" for p in passages)
            prompt = (
                f"{prompt}\n\n{reply.strip()}\n\n<information>{shown or 'No search results found.'}"
                "</information>\nNow put the final answer only inside <answer>...</answer>."
            )
