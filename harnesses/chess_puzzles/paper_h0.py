"""paper_h0: the chess base harness as the paper's reference runs it (Lichess puzzles, 1-9 plies).

The reference: the system prompt and user prompt below, one move per call as ``<move>uci</move>``,
the move parsed from ``<move>`` tags, else ``[uci]`` brackets, else a bare UCI word; two different
moves in one reply are ambiguous (no move). The retry budgets (1 format retry, 1 illegal-move retry)
and the 9-turn limit are the env's (``format_retries=1, illegal_retries=1, max_turns=9`` in
configs/paper/chess/*.yaml): this harness sends what it parsed, or the raw reply, and lets the env
count.
"""

import re

from harnesses.base import Harness

SYSTEM_PROMPT = (
    "You solve chess tactics by choosing one legal move at a time.\n"
    "Use only the board position and legal moves shown in the prompt. Do not claim\n"
    "hidden engine analysis or external knowledge. Return exactly one move."
)
INSTRUCTIONS = (
    "Return exactly one move as <move>uci</move>, for example <move>e2e4</move>.\nDo not include explanation."
)
UCI = "[a-h][1-8][a-h][1-8][qrbn]?"
PATTERNS = (rf"<move>\s*({UCI})\s*</move>", rf"\[\s*({UCI})\s*\]", rf"\b({UCI})\b")


def parse_move(text):
    """The one UCI move of a reply, or None (no move, or two different ones)."""
    for pattern in PATTERNS:
        found = [m.lower() for m in re.findall(pattern, text, re.IGNORECASE)]
        if found:
            unique = list(dict.fromkeys(found))
            return unique[0] if len(unique) == 1 else None
    return None


class ChessPaperH0(Harness):
    name = "chess_puzzles/paper_h0"
    temperature = 1.0
    max_tokens = 256
    format_retries = 0  # the env counts format retries

    def format_observation(self, obs, info):
        text = obs.strip()
        if info.get("error"):
            text += f"\nYour previous answer was rejected: {info['error']}"
        return text

    def make_prompt(self, text, info, llm):
        content = f"Solve the current chess puzzle position.\n\n{text}\n\n{INSTRUCTIONS}"
        if self.use_chat and llm.has_chat_template:
            return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": content}]
        return f"{SYSTEM_PROMPT}\n\n{content}"

    def parse_action(self, text, info):
        return parse_move(text)
