"""h0, the base chess harness (as in the paper).

One move per LLM call. The prompt shows the goal, the board, the FEN, the opponent's last move and the
legal moves in UCI; the model answers ``<move>e2e4</move>``. An unparseable answer is retried once
(format retry); an illegal move is retried once with the env's error message (illegal-move retry);
after a second failure on the same position the harness gives up.
"""

from harnesses.base import Harness, extract_tag


class ChessH0(Harness):
    name = "chess_puzzles/h0"
    temperature = 1.0
    max_tokens = 16
    stop = ("</move>",)
    format_retries = 1
    illegal_retries = 1

    def start(self, obs, info):
        super().start(obs, info)
        self.failures_here = 0

    def give_up(self, obs, info):
        """After ``illegal_retries`` rejected moves in a row on one position, give up."""
        if not info.get("error"):
            self.failures_here = 0
            return False
        self.failures_here += 1
        return self.failures_here > self.illegal_retries

    def legal(self, info):
        return info["legal_moves_uci"]

    def option(self, move):
        return "<move>" + move + "</move>"

    def format_observation(self, obs, info):
        lines = [f"Chess puzzle. You play {info['solver_color']}. {info['goal']}"]
        if info.get("last_opponent_move"):
            lines.append(f"Opponent's last move: {info['last_opponent_move']}")
        lines += [info["board"], f"FEN: {info['fen']}", "Legal moves: " + " ".join(self.legal(info))]
        if info.get("error"):
            lines.append(f"Your previous answer was rejected: {info['error']}")
        return "\n".join(lines)

    def build_prompt(self, text, info):
        return text + "\nAnswer with one legal move in UCI inside <move></move> tags."

    def parse_action(self, text, info):
        return extract_tag(text, "move")
