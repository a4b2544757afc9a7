"""Self-consistency over legal moves, with likelihood choice as the fallback (h0's prompt).

Sample several answers, keep the ones that name a legal move, play the most frequent. When no sample
names a legal move, choose among the legal moves by likelihood (as ``choose.py`` does).
"""

from harnesses.base import extract_tag, majority
from harnesses.chess_puzzles.choose import ChessChoose


class ChessVote(ChessChoose):
    name = "chess_puzzles/vote"
    samples = 8

    def act(self, obs, info, llm):
        prompt = self.make_prompt(self.format_observation(obs, info), info, llm)
        legal = self.legal(info)
        answers = [extract_tag(t, "move") for t in llm.sample(prompt, self.samples, **self.params())]
        move = majority([a.lower() for a in answers if a and a.lower() in legal])
        return move if move is not None else self.most_likely(prompt, info, llm)
