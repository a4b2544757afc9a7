"""Candidate i001-c0 (offline proposer; parents: h0).

Hypothesis: h0 solves 32.8% ± 2.9 of 256 harness tasks under model v0 (failures: illegal_action 51%,
wrong_answer 11%, parse_error 5%; 1.7 LLM calls per episode). Mechanism action: generate -> choose
(the legal move whose answer the model finds most likely: never illegal nor unparseable). Aimed at:
illegal, parse, incomplete; expected to raise the success rate.
"""

from harnesses.base import Harness, extract_tag


class Candidate(Harness):
    """Offline-proposer harness (observation: full; notation: uci; output: tag; action: choose; hint: none; memory: none)."""

    name = "i001-c0"
    temperature = 1.0
    max_tokens = 16
    stop = ("</move>",)
    illegal_retries = 1

    def legal(self, info):
        return info["legal_moves_uci"]

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

    def option(self, move):
        return "<move>" + move + "</move>"

    def act(self, obs, info, llm):
        """The legal move whose answer the model finds most likely (never illegal)."""
        prompt = self.make_prompt(self.format_observation(obs, info), info, llm)
        moves = self.legal(info)
        return moves[llm.choose(prompt, [self.option(m) for m in moves])]

    def start(self, obs, info):
        super().start(obs, info)
        self.failures_here = 0

    def run(self, env, llm):
        obs, info = env.reset()
        self.start(obs, info)
        while True:
            action = self.act(obs, info, llm)
            obs, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                return
            if info.get("error"):
                self.failures_here += 1
                if self.failures_here > self.illegal_retries:
                    return  # give up on this position
            else:
                self.failures_here = 0
