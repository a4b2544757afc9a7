"""The mechanism library renders candidates from real code: ``core.code_of`` copies a method whole,
``core.body_of`` a part's body (no ``def`` line, no docstring), both with whole-word replacements."""

from __future__ import annotations

from harnesses.chess_puzzles.h0 import ChessH0
from whale_train.meta_harness.library import core
from whale_train.meta_harness.library.mechanisms import chess as chess_code
from whale_train.meta_harness.library.mechanisms import math as math_code


def test_body_of_is_the_body_without_def_line_or_docstring():
    assert core.body_of(math_code.python_first) == 'if text.lower().startswith("python:"):\n    return text\n'
    method = core.define("parse_action(self, text)", core.body_of(math_code.stripped), doc="Doc.")
    assert method.splitlines() == [
        "    def parse_action(self, text):",
        '        """Doc."""',
        "        text = text.strip()",
    ]


def test_replacements_are_whole_words_taken_as_they_are():
    literal = core.py("Put it in \\boxed{}.")  # a backslash is not a regex escape here
    assert core.body_of(math_code.no_tool, INSTRUCTION=literal) == f'return text + "\\n" + {literal}\n'
    san = core.code_of(ChessH0.format_observation, last_opponent_move="last_opponent_move_san")
    assert san.count("last_opponent_move_san") == 2 and "INSTRUCTION" not in san
    assert core.code_of(chess_code.Notation.legal).startswith("def legal(self, info):\n")
