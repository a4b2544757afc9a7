"""The chess puzzle task: a position, the opponent's setup move, and what counts as solving it."""

from __future__ import annotations

import re
from dataclasses import dataclass

import chess

_UCI = re.compile(r"^[a-h][1-8][a-h][1-8][qrbn]?$")


@dataclass(frozen=True)
class ChessPuzzle:
    """One puzzle. Moves are stored in UCI, already checked for legality in sequence.

    Two kinds:

    * a *line* puzzle (Lichess, generated): ``line`` = solver, reply, solver, reply, ..., solver.
      The solver must play every solver move of the line; the env plays the replies. A move that
      checkmates also solves it (the Lichess rule).
    * a *one-move* puzzle (EPD): ``best`` (``bm``: any of them solves) and/or ``avoid`` (``am``:
      any move but these solves).
    """

    fen: str
    setup: str | None = None
    line: tuple[str, ...] = ()
    best: tuple[str, ...] = ()
    avoid: tuple[str, ...] = ()
    goal: str = "Find the best move."

    def start_board(self) -> chess.Board:
        board = chess.Board(self.fen)
        if self.setup:
            board.push_uci(self.setup)
        return board

    @property
    def solver_moves(self) -> int:
        return (len(self.line) + 1) // 2 if self.line else 1


def bare_san(board: chess.Board, move: chess.Move) -> str:
    """SAN without the check/mate suffix: a ``#`` would name the mating move (an answer leak)."""
    return board.san(move).rstrip("+#")


class MoveParseError(ValueError):
    """The text is not a move in this position; the message says why, for the agent.

    ``kind``: ``"malformed"`` (not a move at all) or ``"illegal"`` (a move, but not legal here).
    """

    def __init__(self, message: str, kind: str = "malformed"):
        super().__init__(message)
        self.kind = kind


def parse_move(board: chess.Board, text: str) -> chess.Move:
    """Parse a UCI (``e2e4``, ``e7e8q``, ``e1h1`` for castling) or SAN (``Nf3``, ``O-O``, ``exd8=Q+``) move.

    Raises ``MoveParseError`` with a message meant for the agent when the text is malformed, names
    no legal move, is ambiguous, or is a null move.
    """
    raw = text.strip()
    if not raw:
        raise MoveParseError("empty move: reply with one move in UCI (e2e4) or SAN (Nf3) notation")
    if len(raw) > 12 or any(c.isspace() for c in raw):
        raise MoveParseError(
            f"malformed move {_show(raw)}: expected a single move in UCI (e2e4) or SAN (Nf3) notation"
        )
    token = raw.rstrip("!?")
    if token in ("0000", "--", "Z0", "@@@@", "null"):
        raise MoveParseError("a null move is not allowed: play a legal move")
    if _UCI.match(token.lower()):
        uci = token.lower()
        try:
            move = board.parse_uci(uci)
        except chess.IllegalMoveError:
            raise MoveParseError(_illegal(board, uci), "illegal") from None
        except ValueError:
            raise MoveParseError(f"malformed UCI move {_show(raw)}") from None
        return move
    try:
        return board.parse_san(token)
    except chess.AmbiguousMoveError:
        raise MoveParseError(
            f"ambiguous move {_show(raw)}: add the origin file or rank (e.g. Nbd7), or use UCI"
        ) from None
    except chess.IllegalMoveError:
        raise MoveParseError(_illegal(board, raw), "illegal") from None
    except ValueError:
        raise MoveParseError(
            f"malformed move {_show(raw)}: expected a single move in UCI (e2e4) or SAN (Nf3) notation"
        ) from None


def _illegal(board: chess.Board, shown: str) -> str:
    why = " (your king is in check)" if board.is_check() else ""
    return f"illegal move {_show(shown)} in this position{why}; choose one of the legal moves"


def _show(text: str) -> str:
    return repr(text if len(text) <= 20 else text[:20] + "...")
