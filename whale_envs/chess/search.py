"""Exhaustive mate search with python-chess: what the generator uses to verify its puzzles."""

from __future__ import annotations

import chess


def mating_moves(board: chess.Board) -> list[chess.Move]:
    """Every legal move that checkmates at once."""
    out = []
    for move in board.legal_moves:
        if board.gives_check(move):
            board.push(move)
            if board.is_checkmate():
                out.append(move)
            board.pop()
    return out


def has_mate_in_one(board: chess.Board) -> bool:
    for move in board.legal_moves:
        if board.gives_check(move):
            board.push(move)
            mate = board.is_checkmate()
            board.pop()
            if mate:
                return True
    return False


def forces_mate_next(board: chess.Board) -> bool:
    """After the solver's move (opponent to move): does every reply allow a mate in one?

    False when the opponent has no reply (that is mate or stalemate, not a mate in two).
    """
    replies = list(board.legal_moves)
    if not replies:
        return False
    for reply in replies:
        board.push(reply)
        ok = has_mate_in_one(board)
        board.pop()
        if not ok:
            return False
    return True


def mate_in_two_keys(board: chess.Board, stop_after: int | None = None) -> list[chess.Move]:
    """Every first move that forces mate on the next move whatever the reply (mate-in-one moves excluded).

    ``stop_after`` stops the search once that many keys are found (2 answers "is the key unique?").
    """
    keys = []
    for move in list(board.legal_moves):
        board.push(move)
        ok = not board.is_checkmate() and forces_mate_next(board)
        board.pop()
        if ok:
            keys.append(move)
            if stop_after is not None and len(keys) >= stop_after:
                break
    return keys


def stubborn_reply(board: chess.Board) -> chess.Move:
    """The opponent's reply (opponent to move) that leaves the fewest mating answers; ties by UCI order."""

    def mates_after(reply: chess.Move) -> int:
        board.push(reply)
        n = len(mating_moves(board))
        board.pop()
        return n

    return min(sorted(board.legal_moves, key=chess.Move.uci), key=mates_after)
