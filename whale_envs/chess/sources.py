"""Chess task sources: Lichess puzzle CSV and EPD test suites (bundled samples or the user's files).

``tasks="lichess"`` loads the bundled 1000-puzzle sample, ``tasks="lichess:PATH"`` a Lichess export
(``PuzzleId,FEN,Moves,Rating,...,Themes,...``): the database CSV, the same compressed (``.csv.zst``,
``.csv.gz``), parquet, or ``hf://ORG/NAME[:SPLIT]`` from the Hugging Face cache (offline). Filters:
``min_rating``, ``max_rating``, ``themes`` (comma-separated; a puzzle passes when it has any of them),
``exclude_themes``, ``min_plies`` / ``max_plies`` (solution plies: the moves after the opponent's setup
move; the paper keeps 1-9).

``tasks="epd"`` loads the five bundled suites (WAC, Arasan 2024, ECM, IQ4, BT-2630), ``tasks="epd:PATH"``
one file or a folder of ``.epd`` files. ``bm`` = any listed move solves; ``am`` = any move but those.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import chess

from whale_envs.chess.puzzle import ChessPuzzle
from whale_envs.data import bundled_path
from whale_envs.tabular import is_hub_name, read_rows
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
    min_plies: int | None = None,
    max_plies: int | None = None,
) -> ListSource[ChessPuzzle]:
    """Load Lichess puzzles. Task id = ``PuzzleId``; the first move is the opponent's setup move.

    The file is the database CSV (``lichess_db_puzzle.csv``, also ``.csv.zst`` / ``.csv.gz`` read as a
    stream) or parquet with the same columns (``Themes`` a string or a list). ``min_plies`` /
    ``max_plies`` filter on the solution length in plies: the moves after the setup move (the paper
    keeps 1-9). Cheap filters run before a row's moves are replayed, so the 5M-row database loads in
    the time its kept rows take.
    """
    for name, value in (("min_plies", min_plies), ("max_plies", max_plies)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise TaskSourceError(f"lichess: {name} must be a positive whole number, got {value!r}")
    if path:
        rows = read_rows(path if is_hub_name(path) else existing(path, "lichess"), "lichess")
    else:
        rows = read_rows(bundled_path("lichess_puzzles", "puzzles.csv"), "lichess")
    shown = path or "lichess (bundled sample)"
    want, drop = _as_set(themes), _as_set(exclude_themes)
    tasks = []
    checked = False
    for row_no, where, row in rows:
        if not checked:
            missing = [c for c in LICHESS_COLUMNS if c not in row]
            if missing:
                raise TaskSourceError(
                    f"{where.rsplit(',', 1)[0]}: not a Lichess puzzle file, missing column(s) {missing}"
                )
            checked = True
        row_themes = _as_set(row.get("Themes"))
        if want and not (want & row_themes):
            continue
        if drop & row_themes:
            continue
        plies = len(str(row.get("Moves") or "").split()) - 1
        if (min_plies is not None and plies < min_plies) or (max_plies is not None and plies > max_plies):
            continue
        rating = _rating(row, where)
        if min_rating is not None and rating < min_rating:
            continue
        if max_rating is not None and rating > max_rating:
            continue
        puzzle = _lichess_row(row, where)
        meta = {
            "difficulty": rating_band(rating),
            "rating": rating,
            "plies": plies,
            "themes": sorted(row_themes),
            "source": shown,
            "row": row_no,
        }
        tasks.append(Task(str(row["PuzzleId"]).strip(), puzzle, meta))
    name = f"lichess:{path}" if path else "lichess"
    if not tasks:
        raise TaskSourceError(f"{name}: no puzzle passes the filters")
    return ListSource(name, tasks)


def _rating(row: dict, where: str) -> int:
    try:
        return int(row["Rating"])
    except (ValueError, TypeError):
        raise TaskSourceError(
            f"{where} ({row.get('PuzzleId')}): Rating {row.get('Rating')!r} is not an integer"
        ) from None


def _lichess_row(row: dict, where: str) -> ChessPuzzle:
    puzzle_id = str(row.get("PuzzleId") or "").strip()
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
    return ChessPuzzle(fen=row["FEN"], setup=line[0], line=tuple(line[1:]), goal="Find the best move.")


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
    register_source(
        "chess",
        "lichess",
        load_lichess,
        doc="Lichess puzzle CSV, .csv.zst or parquet; min_plies/max_plies (bundled: 1000-puzzle sample)",
    )
    register_source(
        "chess", "epd", load_epd, doc="EPD test suites, bm/am (bundled: WAC, Arasan 2024, ECM, IQ4, BT-2630)"
    )


_register()
