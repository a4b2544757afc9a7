"""Chess puzzles (``whale/Chess-v0``): the shipped ``chess_puzzles/`` harnesses, the chess mechanism
library, the chess warm-start formats."""

from __future__ import annotations

from whale_envs import CHESS_ID
from whale_train.domains.registry import Domain, register_domain

CHESS = Domain(
    name="chess",
    env_id=CHESS_ID,
    base_harness="chess_puzzles/h0",
    harness_dir="chess_puzzles",
    harnesses=("chess_puzzles/h0", "chess_puzzles/choose", "chess_puzzles/vote"),
    info_fields=(
        "fen",
        "board",
        "legal_moves_uci",
        "legal_moves_san",
        "last_opponent_move",
        "solver_color",
        "goal",
        "error",
        "error_kind",
    ),
    actions="one move in UCI or SAN.",
    options_field="legal_moves_uci",
    library="whale_train.meta_harness.library.chess:LIBRARY",
    pretrain_formats="whale_train.pretrain.formats:CHESS",
    prompt_edits="whale_train.meta_harness.prompt_only:CHESS_EDITS",
)

register_domain(CHESS)
