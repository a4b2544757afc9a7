"""The mechanism library renders candidates from real code: ``core.code_of`` copies a method whole,
``core.body_of`` a part's body (no ``def`` line, no docstring), both with whole-word replacements."""

from __future__ import annotations

import pytest

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


def test_a_library_renders_the_code_it_imported_when_its_file_changes_under_a_running_process(tmp_path):
    """A run's package edited or updated under it (a ``git pull`` during a long run): ``inspect.getsource``
    would read the new file at the old line numbers and render another function, or fail. The library
    renders from the lines it kept at import; a file not kept that moved stops with one line."""
    import importlib.util

    def load(name: str, text: str):
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module, path

    first = "def a(self):\n    return 1\n\n\ndef b(self):\n    return 2\n"
    kept, path = load("kept_mechanisms", first)
    core.keep_sources(kept)
    path.write_text("def b(self):\n    return 2\n\n\ndef a(self):\n    return 3\n")  # a and b swapped
    assert core.code_of(kept.b) == "def b(self):\n    return 2\n"  # as imported, not line 5 of the new file
    assert core.body_of(kept.a) == "return 1\n"

    loose, path = load("loose_mechanisms", first)
    path.write_text("\n\n\n\n" + first)  # moved down before its first render: not rendered from the new file
    with pytest.raises(
        RuntimeError, match=r"the source of b moved in .*loose_mechanisms\.py since it was imported"
    ):
        core.code_of(loose.b)
