"""Chess task sources: Lichess puzzle CSV and EPD test suites (bundled samples or the user's files).

``tasks="lichess"`` loads the bundled 1000-puzzle sample, ``tasks="lichess:PATH"`` a Lichess export
(``PuzzleId,FEN,Moves,Rating,...,Themes,...``). Filters: ``min_rating``, ``max_rating``, ``themes``
(comma-separated; a puzzle passes when it has any of them), ``exclude_themes``.

``tasks="epd"`` loads the five bundled suites (WAC, Arasan 2024, ECM, IQ4, BT-2630), ``tasks="epd:PATH"``
one file or a folder of ``.epd`` files. ``bm`` = any listed move solves; ``am`` = any move but those.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

import chess

from whale_envs.chess.puzzle import ChessPuzzle
from whale_envs.data import bundled_path
from whale_envs.tasks import ListSource, Task, TaskSourceError, existing

LICHESS_COLUMNS = ("PuzzleId", "FEN", "Moves", "Rating", "Themes")


def _as_set(value: str | Iterable[str] | None) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        value = value.replace(",", " ").split()
    return frozenset(v.strip() for v in value if v.strip())


def rating_band(rating: int) -> str:
    """Difficulty bucket for a puzzle rating: 400-point bands ("1200-1599")."""
    lo = max(0, rating // 400 * 400)
    return f"{lo}-{lo + 399}"


def load_lichess(
    path: str | None = None,
    *,
    min_rating: int | None = None,
    max_rating: int | None = None,
    themes: str | Iterable[str] | None = None,
    exclude_themes: str | Iterable[str] | None = None,
) -> ListSource[ChessPuzzle]:
    """Load Lichess puzzles. Task id = ``PuzzleId``; the first move is the opponent's setup move."""
    file = existing(path, "lichess") if path else bundled_path("lichess_puzzles", "puzzles.csv")
    shown = path or "lichess (bundled sample)"
    want, drop = _as_set(themes), _as_set(exclude_themes)
    tasks = []
    with open(file, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in LICHESS_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise TaskSourceError(
                f"{file}: not a Lichess puzzle CSV, missing column(s) {missing} in the header"
            )
        for row_no, row in enumerate(reader, start=2):  # row 1 is the header
            where = f"{file}, row {row_no}"
            puzzle, rating, row_themes = _lichess_row(row, where)
            if min_rating is not None and rating < min_rating:
                continue
            if max_rating is not None and rating > max_rating:
                continue
            if want and not (want & row_themes):
                continue
            if drop & row_themes:
                continue
            meta = {
                "difficulty": rating_band(rating),
                "rating": rating,
                "themes": sorted(row_themes),
                "source": shown,
                "row": row_no,
            }
            tasks.append(Task(row["PuzzleId"], puzzle, meta))
    name = f"lichess:{path}" if path else "lichess"
    if not tasks:
        raise TaskSourceError(f"{name}: no puzzle passes the filters")
    return ListSource(name, tasks)


def _lichess_row(row: dict, where: str) -> tuple[ChessPuzzle, int, frozenset[str]]:
    puzzle_id = (row.get("PuzzleId") or "").strip()
    if not puzzle_id:
        raise TaskSourceError(f"{where}: empty PuzzleId")
    try:
        board = chess.Board(row["FEN"])
    except (ValueError, TypeError) as exc:
        raise TaskSourceError(f"{where} ({puzzle_id}): bad FEN {row.get('FEN')!r}: {exc}") from None
    moves = (row.get("Moves") or "").split()
    if len(moves) < 2:
        raise TaskSourceError(
            f"{where} ({puzzle_id}): Moves needs the setup move and at least one solver move"
        )
    line = []
    for i, uci in enumerate(moves):
        try:
            move = board.parse_uci(uci)
        except ValueError:
            raise TaskSourceError(
                f"{where} ({puzzle_id}): move {i + 1} {uci!r} is not legal in that position"
            ) from None
        line.append(move.uci())
        board.push(move)
    try:
        rating = int(row["Rating"])
    except (ValueError, TypeError):
        raise TaskSourceError(
            f"{where} ({puzzle_id}): Rating {row.get('Rating')!r} is not an integer"
        ) from None
    puzzle = ChessPuzzle(fen=row["FEN"], setup=line[0], line=tuple(line[1:]), goal="Find the best move.")
    return puzzle, rating, _as_set(row.get("Themes"))


def load_epd(path: str | None = None) -> ListSource[ChessPuzzle]:
    """Load EPD suites. Task id = the ``id`` opcode (``file:line`` where a line has none)."""
    if path:
        root = existing(path, "epd", folder_ok=True)
        files = sorted(root.glob("*.epd")) if root.is_dir() else [root]
        if not files:
            raise TaskSourceError(f"epd: no .epd files in {root}")
    else:
        files = sorted(bundled_path("chess_epd").glob("*.epd"))
    tasks = []
    for file in files:
        for line_no, text in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            if text.strip() and not text.lstrip().startswith("#"):
                tasks.append(_epd_line(file, line_no, text))
    return ListSource(f"epd:{path}" if path else "epd", tasks)


def _epd_line(file: Path, line_no: int, text: str) -> Task[ChessPuzzle]:
    where = f"{file}, line {line_no}"
    try:
        board, ops = chess.Board.from_epd(text.strip())
    except ValueError as exc:
        raise TaskSourceError(f"{where}: malformed EPD: {exc}") from None
    best = tuple(m.uci() for m in ops.get("bm", []))
    avoid = tuple(m.uci() for m in ops.get("am", []))
    if not best and not avoid:
        raise TaskSourceError(f"{where}: no 'bm' or 'am' opcode, so nothing defines a solution")
    task_id = str(ops.get("id") or f"{file.name}:{line_no}")
    goal = "Find the best move." if best else "Find a good move (some moves here are mistakes)."
    meta = {"difficulty": file.stem, "suite": file.stem, "source": file.name, "row": line_no}
    return Task(task_id, ChessPuzzle(fen=board.fen(), best=best, avoid=avoid, goal=goal), meta)


def _register() -> None:
    from whale_envs.chess.generator import make_generated
    from whale_envs.tasks import register_generator, register_source

    register_generator("chess", make_generated, "mate-in-1/2 puzzles verified by search (no files)")
    register_source("chess", "lichess", load_lichess, doc="Lichess puzzle CSV (bundled: 1000-puzzle sample)")
    register_source(
        "chess", "epd", load_epd, doc="EPD test suites, bm/am (bundled: WAC, Arasan 2024, ECM, IQ4, BT-2630)"
    )


_register()
