"""Chess puzzles: ``whale/Chess-v0`` and its task sources (``generated``, ``lichess``, ``epd``)."""

from whale_envs.chess.env import ChessEnv
from whale_envs.chess.generator import ChessGenConfig
from whale_envs.chess.puzzle import ChessPuzzle, parse_move

__all__ = ["ChessEnv", "ChessGenConfig", "ChessPuzzle", "parse_move"]
