"""Procedurally generated chess puzzles (``tasks="generated"``), verified by exhaustive search.

Difficulty levels (the knob):

=====  =======================================================================================
level  family
=====  =======================================================================================
1      mate in 1 with few pieces: K+Q / K+R / K+R+R / K+Q+R vs a king (maybe with pawns), and
       back-rank mates (a king boxed in by its own pawns)
2      mate in 1 in a middlegame position reached by a random playout from the initial position
3      mate in 2 with few pieces: the key move is unique and there is no mate in 1
4      mate in 2 in a random-playout position: the key move is unique and there is no mate in 1
=====  =======================================================================================

As on Lichess, every non-final solver move is the only move that works (checked by
:func:`~whale_envs.chess.search.mate_in_two_keys`), and at the final move any mate counts. The
opponent's scripted reply is its most stubborn defence. Half the puzzles are mirrored so that the
solver plays Black. Task ``idx`` is built from ``random.Random`` seeded by ``(seed, idx)`` alone.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar

import chess

from whale_envs.chess.puzzle import ChessPuzzle
from whale_envs.chess.search import has_mate_in_one, mate_in_two_keys, mating_moves, stubborn_reply
from whale_envs.tasks import GeneratedSource, GeneratorConfig, Task, config_from_options, split_of

LEVELS = (1, 2, 3, 4)


@dataclass
class ChessGenConfig(GeneratorConfig):
    """Options of ``tasks="generated"``: ``difficulty`` (a level 1-4 or a range), ``seed``, ``size``."""

    LEVELS: ClassVar[tuple[int, ...]] = LEVELS

    difficulty: int | str = "1-2"
    size: int = 4000


# ---------------------------------------------------------------------------------- positions


def _place(rng: random.Random, board: chess.Board, pieces: list[tuple[int, int]]) -> bool:
    """Put (piece_type, color) pieces on random empty squares; pawns avoid the back ranks."""
    for piece_type, color in pieces:
        squares = [
            s
            for s in chess.SQUARES
            if board.piece_at(s) is None and (piece_type != chess.PAWN or chess.square_rank(s) not in (0, 7))
        ]
        if not squares:
            return False
        board.set_piece_at(rng.choice(squares), chess.Piece(piece_type, color))
    return True


_ATTACKERS = (
    [chess.QUEEN],
    [chess.ROOK],
    [chess.ROOK, chess.ROOK],
    [chess.QUEEN, chess.ROOK],
    [chess.ROOK, chess.BISHOP],
)


def few_piece_position(rng: random.Random) -> chess.Board:
    """White to move with a small attacking force against a king (plus 0-2 black pawns)."""
    board = chess.Board(None)
    board.turn = chess.WHITE
    pieces = [(chess.KING, chess.WHITE), (chess.KING, chess.BLACK)]
    pieces += [(p, chess.WHITE) for p in rng.choice(_ATTACKERS)]
    pieces += [(chess.PAWN, chess.BLACK)] * rng.choice((0, 0, 1, 2))
    _place(rng, board, pieces)
    return board


def back_rank_position(rng: random.Random) -> chess.Board:
    """A black king on its back rank behind its own pawns; White has a rook or queen (and maybe more)."""
    board = chess.Board(None)
    board.turn = chess.WHITE
    king_file = rng.choice((5, 6, 7)) if rng.random() < 0.7 else rng.choice((0, 1, 2))
    board.set_piece_at(chess.square(king_file, 7), chess.Piece(chess.KING, chess.BLACK))
    for f in range(max(0, king_file - 1), min(7, king_file + 1) + 1):
        rank = 6 if rng.random() < 0.85 else 5
        board.set_piece_at(chess.square(f, rank), chess.Piece(chess.PAWN, chess.BLACK))
    white_king_sq = chess.square(rng.randrange(8), rng.choice((0, 0, 1)))
    if board.piece_at(white_king_sq) is None:
        board.set_piece_at(white_king_sq, chess.Piece(chess.KING, chess.WHITE))
    extra = [(rng.choice((chess.ROOK, chess.QUEEN)), chess.WHITE)]
    extra += [(rng.choice((chess.ROOK, chess.BISHOP, chess.KNIGHT)), chess.BLACK)] * rng.choice((0, 1))
    extra += [(chess.PAWN, chess.WHITE)] * rng.choice((0, 1, 2))
    _place(rng, board, extra)
    return board


def playout_positions(rng: random.Random) -> Iterator[chess.Board]:
    """The positions along a random game from the initial position (from ply 12 on), biased towards
    checks and captures so that kings get exposed. Yields the live board: copy it to keep it."""
    board = chess.Board()
    for ply in range(rng.randint(20, 80)):
        moves = list(board.legal_moves)
        if not moves:
            return
        weights = [1 + 3 * board.is_capture(m) + 3 * board.gives_check(m) for m in moves]
        board.push(rng.choices(moves, weights)[0])
        if ply >= 12:
            yield board


def _usable(board: chess.Board) -> bool:
    return (
        board.king(chess.WHITE) is not None
        and board.king(chess.BLACK) is not None
        and board.is_valid()
        and not board.is_game_over()
    )


# ---------------------------------------------------------------------------------- puzzles


def _mate_in_one(board: chess.Board) -> ChessPuzzle | None:
    mates = mating_moves(board)
    if not mates:
        return None
    first = min(m.uci() for m in mates)
    return ChessPuzzle(fen=board.fen(), line=(first,), goal="Checkmate in 1 move.")


def _mate_in_two(board: chess.Board) -> ChessPuzzle | None:
    if has_mate_in_one(board):
        return None
    keys = mate_in_two_keys(board, stop_after=2)
    if len(keys) != 1:
        return None
    key = keys[0]
    board.push(key)
    reply = stubborn_reply(board)
    board.push(reply)
    mate = min(m.uci() for m in mating_moves(board))
    board.pop()
    board.pop()
    return ChessPuzzle(fen=board.fen(), line=(key.uci(), reply.uci(), mate), goal="Checkmate in 2 moves.")


_FAMILIES = {
    1: (
        lambda rng: [back_rank_position(rng) if rng.random() < 0.35 else few_piece_position(rng)],
        _mate_in_one,
    ),
    2: (playout_positions, _mate_in_one),
    3: (lambda rng: [few_piece_position(rng)], _mate_in_two),
    4: (playout_positions, _mate_in_two),
}
_FAMILY_NAMES = {
    1: "few-piece/back-rank mate in 1",
    2: "playout mate in 1",
    3: "few-piece mate in 2",
    4: "playout mate in 2",
}


def generate_puzzle(
    rng: random.Random, level: int, *, split: str | None = None, split_fn: Callable[[str], str] = split_of
) -> ChessPuzzle:
    """Draw positions from ``rng`` until one is a valid puzzle of ``level`` (and whose FEN is in ``split``
    under ``split_fn``, if given: the run's keyed split by default)."""
    positions, verify = _FAMILIES[level]
    while True:
        flip = rng.random() < 0.5  # half the puzzles: the solver plays Black
        for live in positions(rng):
            board = live.mirror() if flip else live.copy(stack=False)
            if split is not None and split_fn(board.fen()) != split:
                continue  # cheap check first: the content must land in the task id's split
            if not _usable(board):
                continue
            puzzle = verify(board)
            if puzzle is not None:
                return puzzle


def make_generated(path: str | None = None, **options) -> GeneratedSource[ChessPuzzle]:
    """The ``generated`` task source (see the module docstring and :class:`ChessGenConfig`)."""
    config: ChessGenConfig = config_from_options(ChessGenConfig, "chess generated tasks", options)
    levels = config.levels()
    level_of = {
        f"chess-gen-s{config.seed}-d{levels[i % len(levels)]}-{i:05d}": levels[i % len(levels)]
        for i in range(config.size)
    }

    def make(rng: random.Random, idx: int) -> tuple[Task[ChessPuzzle], str]:
        task_id = ids[idx]
        level = level_of[task_id]
        puzzle = generate_puzzle(rng, level, split=split_of(task_id))
        meta = {"difficulty": level, "family": _FAMILY_NAMES[level], "seed": config.seed}
        return Task(task_id, puzzle, meta), puzzle.fen

    ids = list(level_of)
    name = f"generated?difficulty={config.difficulty}&seed={config.seed}&size={config.size}"
    return GeneratedSource(name, ids, make, seed=config.seed)
