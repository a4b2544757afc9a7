"""``render_mode="rgb_array"`` for chess: the board drawn by python-chess (``chess.svg``) and rasterized
by CairoSVG (``pip install 'whale-harness[render]'``; it needs the system's libcairo).
"""

from __future__ import annotations

import io

import chess
import chess.svg
import numpy as np

#: Side of the rendered image in pixels (``chess.svg`` draws the board with coordinates around it).
BOARD_PIXELS = 400


def board_rgb(board: chess.Board, lastmove: chess.Move | None = None, size: int = BOARD_PIXELS) -> np.ndarray:
    """The board as an ``(size, size, 3)`` uint8 array, from the side to move's point of view."""
    try:
        import cairosvg
        from PIL import Image
    except (ImportError, OSError) as exc:  # OSError: cairosvg installed, libcairo missing
        raise ImportError(
            f"render_mode='rgb_array' needs CairoSVG and the cairo library: pip install 'whale-harness[render]' ({exc})"
        ) from None
    svg = chess.svg.board(board, orientation=board.turn, lastmove=lastmove, size=size)
    png = cairosvg.svg2png(bytestring=svg.encode(), output_width=size, output_height=size)
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
