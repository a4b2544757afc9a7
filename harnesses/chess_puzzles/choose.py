"""Choose among the legal moves by model likelihood (h0's prompt, a different way to get the move).

Instead of letting the model write a move (which a small model often gets wrong), pick the legal move
whose ``<move>uci</move>`` answer the model finds most likely. Never illegal; one model call per move.
The choice is a scoring call: recorded with the move it picked, never trained on (the model sampled
nothing; RSFT trains only on sampled tokens).
"""

from harnesses.chess_puzzles.h0 import ChessH0


class ChessChoose(ChessH0):
    name = "chess_puzzles/choose"

    def act(self, obs, info, llm):
        prompt = self.make_prompt(self.format_observation(obs, info), info, llm)
        return self.most_likely(prompt, info, llm)

    def most_likely(self, prompt, info, llm):
        """The legal move whose answer the model finds most likely (never illegal)."""
        moves = self.legal(info)
        return moves[llm.choose(prompt, [self.option(m) for m in moves])]
