"""The chess library's mechanisms (``library/chess.py``) as the code a candidate gets; see ``__init__``.

Written for UCI, h0's notation: under ``notation: san`` the render reads the SAN fields of ``info``
instead (``legal_moves_san`` for ``legal_moves_uci``, ``last_opponent_move_san`` for
``last_opponent_move``) in ``Notation.legal`` and h0's observation. The likelihood choice
(``ChessChoose``), h0's observation and its retry budget (``ChessH0``) ship as harnesses and are
rendered from there.
"""

# The three lists OutputLenient zips are one length (every legal move, in UCI, in SAN, in the chosen
# notation); ``strict=`` is not added because the code is rendered as written, into every candidate.
# ruff: noqa: B905

from __future__ import annotations

from harnesses.base import extract_tag, majority

#: Stand-ins for the candidate module's own: its solved puzzles and its prompt's instruction.
EXAMPLES: list[tuple[str, str]] = []
INSTRUCTION = "\nAnswer with one legal move in UCI inside <move></move> tags."
#: Stand-in for the position line of ``ObservationShort``: the render puts the FEN or the board there.
POSITION = "FEN: ..."


class Notation:
    """Every candidate: the legal moves in the notation the model reads and answers in."""

    def legal(self, info):
        return info["legal_moves_uci"]


# ------------------------------------------------------------------------------------ observation


class ObservationEnvText:
    """observation: env_text."""

    def format_observation(self, obs, info):
        """The env's own text: board, FEN, legal moves (UCI), how to reply, and any error."""
        return obs


class ObservationShort:
    """observation: compact and board, which differ in ``POSITION`` only."""

    def format_observation(self, obs, info):
        lines = [f"You play {info['solver_color']}. {info['goal']}", POSITION]
        lines.append("Legal moves: " + " ".join(self.legal(info)))
        if info.get("error"):
            lines.append(f"Your previous answer was rejected: {info['error']}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------- memory (the prompt)


class MemoryNone:
    """memory: none (h0)."""

    def build_prompt(self, text, info):
        return text + INSTRUCTION


# fmt: off
class MemoryExamples:
    """memory: examples."""

    def build_prompt(self, text, info):
        """Solved puzzles first (never the current one), then the puzzle."""
        shown = [f"Example: FEN {fen}\nAnswer: {self.option(move)}" for fen, move in EXAMPLES if fen != info["fen"]]
        return "\n\n".join(shown[: self.max_examples] + [text + INSTRUCTION])
# fmt: on


# ----------------------------------------------------------------------------------------- output


class OutputTag:
    """output: tag (h0); its ``option`` also under lenient."""

    def parse_action(self, text, info):
        return extract_tag(text, "move")

    def option(self, move):
        return "<move>" + move + "</move>"


class OutputBare:
    """output: bare."""

    def parse_action(self, text, info):
        """The first word of the reply."""
        words = text.split()
        return words[0].strip(".,;:!") if words else None

    def option(self, move):
        return move


class OutputLenient:
    """output: lenient (with ``OutputTag.option``)."""

    def parse_action(self, text, info):
        """The move in <move></move>; else the first word of the reply that names a legal move."""
        tagged = extract_tag(text, "move")
        if tagged:
            return tagged
        pairs = list(zip(info["legal_moves_uci"], info["legal_moves_san"], self.legal(info)))
        for word in text.split():
            word = word.strip(".,;:!()+#")
            for uci, san, listed in pairs:
                if word in (uci, san):
                    return listed
        return None


# ----------------------------------------------------------------------------------------- action


class ActionVote:
    """action: vote (with ``ChessChoose.most_likely``)."""

    def act(self, obs, info, llm):
        """The most frequent legal move among several samples; likelihood choice if none is legal."""
        prompt = self.make_prompt(self.format_observation(obs, info), info, llm)
        answers = [self.parse_action(t, info) for t in llm.sample(prompt, self.samples, **self.params())]
        best = majority([a for a in answers if a in self.legal(info)])
        return best if best is not None else self.most_likely(prompt, info, llm)


class ActionGenerateChoose:
    """action: generate_choose (with ``ChessChoose.most_likely``)."""

    def act(self, obs, info, llm):
        """The model's move if it is legal, else the legal move it finds most likely."""
        prompt = self.make_prompt(self.format_observation(obs, info), info, llm)
        move = self.parse_action(llm.complete(prompt, **self.params()), info)
        return move if move in self.legal(info) else self.most_likely(prompt, info, llm)
