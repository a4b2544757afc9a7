"""Chess puzzles (``whale/Chess-v0``): the shipped ``chess_puzzles/`` harnesses, the chess mechanism
library, the chess warm-start formats."""

from __future__ import annotations

from whale_envs import CHESS_ID
from whale_train.domains.registry import builtin_domain, register_domain

CHESS = builtin_domain(
    "chess",
    CHESS_ID,
    harness_dir="chess_puzzles",
    harnesses=("h0", "choose", "vote"),
    info_fields=(
        "fen",
        "board",
        "legal_moves_uci",
        "legal_moves_san",
        "last_opponent_move",
        "solver_color",
        "goal",
    ),
    actions="one move in UCI or SAN.",
    options_field="legal_moves_uci",
)

register_domain(CHESS)
