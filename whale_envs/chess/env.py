"""``whale/Chess-v0``: chess puzzles, faithful to Lichess.

* Line puzzles (Lichess, generated): the source's first move is the opponent's setup move, played on
  reset. The solver plays moves 2, 4, ...; the env answers with the scripted replies. Reward 1 only
  when the whole line is played. A move that checkmates also solves it (the Lichess rule: at the final
  move any mate counts). A legal move off the line ends the episode with reward 0.
* One-move puzzles (EPD): ``bm`` = any listed move solves, ``am`` = any move but those solves.
* Moves are accepted in UCI (``e2e4``, ``e7e8q``) and SAN (``Nf3``, ``O-O``, ``exd8=Q``, with or
  without ``+``/``#``). An illegal or malformed move costs a turn, changes nothing, and is explained in
  the observation and ``info["error"]``.
* Retry budgets (the paper's chess env, off by default): ``format_retries=N`` ends the episode with
  reward 0 at the ``N+1``-th malformed action, ``illegal_retries=N`` at the ``N+1``-th illegal move
  (the reference runs 1 and 1); within the budget a bad action costs a turn as always. ``max_turns``
  is the turn limit (the reference's harness sets 9). ``info`` reports ``format_retries_left`` /
  ``illegal_retries_left`` (None when unlimited).
* ``info``: ``fen``, ``board`` (the text diagram), ``side_to_move``, ``legal_moves_uci``, ``legal_moves_san`` (bare SAN: no ``+``/``#``,
  which would name the mate), ``last_opponent_move`` (+ ``_san``), ``solver_move_number``, ``goal``; at the
  end also ``solved``, ``solution`` (the reference line or the bm/am moves) and ``played``.
"""

from __future__ import annotations

from typing import Any

import chess

from whale_envs.chess.puzzle import ChessPuzzle, MoveParseError, bare_san, parse_move
from whale_envs.tasks import Task
from whale_envs.text_env import ActionError, Outcome, TextEnv

# Register the task sources of this domain (importing the module is enough).
from . import sources as _sources  # noqa: F401


class ChessEnv(TextEnv[ChessPuzzle]):
    """Chess puzzles as a text environment. ``tasks``: ``generated`` (default), ``lichess[:PATH]``, ``epd[:PATH]``.

    ``max_turns`` defaults to ``2 * solver moves + 2``: room for one mistaken action per move.
    ``format_retries`` / ``illegal_retries``: malformed / illegal actions forgiven per episode before
    the next one fails it (None = no budget, only ``max_turns``; see the module docstring).
    """

    domain = "chess"
    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}

    def __init__(
        self,
        tasks: Any = "generated",
        *,
        format_retries: int | None = None,
        illegal_retries: int | None = None,
        **options: Any,
    ):
        for name, value in (("format_retries", format_retries), ("illegal_retries", illegal_retries)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name} must be a non-negative integer or None, got {value!r}")
        self.retry_budget = {"malformed": format_retries, "illegal": illegal_retries}
        super().__init__(tasks, **options)

    def render(self) -> Any:
        if self.render_mode == "rgb_array":
            from whale_envs.chess.render import board_rgb

            return board_rgb(self.board, getattr(self, "last_opponent", None))
        return super().render()

    def _default_max_turns(self, task: Task[ChessPuzzle]) -> int:
        return 2 * task.payload.solver_moves + 2

    # ------------------------------------------------------------------ episode state

    def _start(self, task: Task[ChessPuzzle]) -> str:
        self.puzzle = task.payload
        self.board = self.puzzle.start_board()
        self.solver = self.board.turn
        self.played: list[str] = []  # the solver's moves
        self.last_opponent: chess.Move | None = None
        self.last_opponent_san: str | None = None
        if self.puzzle.setup:
            self.last_opponent = chess.Move.from_uci(self.puzzle.setup)
            before = chess.Board(self.puzzle.fen)
            self.last_opponent_san = bare_san(before, self.last_opponent)
        self.solved = False
        self.retries_used = {"malformed": 0, "illegal": 0}
        return ""

    def _apply(self, action: str) -> Outcome:
        try:
            move = parse_move(self.board, action)
        except MoveParseError as exc:
            budget = self.retry_budget.get(exc.kind)
            if budget is not None and self.retries_used[exc.kind] >= budget:
                what = "format" if exc.kind == "malformed" else "illegal-move"
                self.retries_used[exc.kind] += 1
                return self._finish(
                    False, f"Error: {exc}\nNo {what} retries left ({budget}). The puzzle is failed."
                )
            self.retries_used[exc.kind] += 1
            raise ActionError(str(exc), exc.kind) from None
        shown = bare_san(self.board, move)
        self.played.append(move.uci())
        puzzle = self.puzzle
        self.board.push(move)
        if self.board.is_checkmate():  # Lichess: a mate solves the puzzle, whatever the line says
            return self._finish(True, f"{shown} is checkmate. Puzzle solved.")
        if not puzzle.line:  # one-move (EPD) puzzle
            ok = (not puzzle.best or move.uci() in puzzle.best) and move.uci() not in puzzle.avoid
            return self._finish(
                ok,
                f"{shown}: {'correct. Puzzle solved.' if ok else 'not the solution. The puzzle is failed.'}",
            )
        k = 2 * (len(self.played) - 1)  # index of this solver move in the line
        if move.uci() != puzzle.line[k]:
            return self._finish(False, f"{shown} is not the solution. The puzzle is failed.")
        if k + 1 >= len(puzzle.line):
            return self._finish(True, f"{shown}: correct. Puzzle solved.")
        reply = chess.Move.from_uci(puzzle.line[k + 1])
        self.last_opponent, self.last_opponent_san = reply, bare_san(self.board, reply)
        self.board.push(reply)
        return Outcome(
            feedback=f"{shown}: correct. The opponent replied {reply.uci()} ({self.last_opponent_san})."
        )

    def chance_action(self, rng) -> str:
        """A uniformly random legal move."""
        return rng.choice([m.uci() for m in self.board.legal_moves])

    def _finish(self, solved: bool, message: str) -> Outcome:
        self.solved = solved
        return Outcome(reward=1.0 if solved else 0.0, terminated=True, feedback=message)

    # ------------------------------------------------------------------ what the agent sees

    def _side(self, color: chess.Color) -> str:
        return "white" if color == chess.WHITE else "black"

    def _public_info(self) -> dict[str, Any]:
        legal = list(self.board.legal_moves)
        return {
            "fen": self.board.fen(),
            "board": _diagram(self.board),
            "side_to_move": self._side(self.board.turn),
            "solver_color": self._side(self.solver),
            "legal_moves_uci": [m.uci() for m in legal],
            "legal_moves_san": [bare_san(self.board, m) for m in legal],
            "last_opponent_move": self.last_opponent.uci() if self.last_opponent else None,
            "last_opponent_move_san": self.last_opponent_san,
            "solver_move_number": len(self.played) + (0 if self.done else 1),
            "goal": self.puzzle.goal,
            "format_retries_left": self._left("malformed"),
            "illegal_retries_left": self._left("illegal"),
        }

    def _left(self, kind: str) -> int | None:
        budget = self.retry_budget[kind]
        return None if budget is None else max(0, budget - self.retries_used[kind])

    def _final_info(self) -> dict[str, Any]:
        puzzle = self.puzzle
        solution: dict[str, Any] = (
            {"line": list(puzzle.line)}
            if puzzle.line
            else {"best": list(puzzle.best), "avoid": list(puzzle.avoid)}
        )
        return {"solved": self.solved, "solution": solution, "played": list(self.played)}

    def _observe(self) -> str:
        board = self.board
        lines = [f"Chess puzzle. You play {self._side(self.solver).capitalize()}. {self.puzzle.goal}"]
        if self.last_opponent is not None:
            lines.append(f"Opponent's last move: {self.last_opponent.uci()} ({self.last_opponent_san})")
        lines += [
            "",
            "Board (White at the bottom, uppercase = White):",
            _diagram(board),
            "",
            f"FEN: {board.fen()}",
        ]
        lines.append("Legal moves (UCI): " + " ".join(m.uci() for m in board.legal_moves))
        lines.append("Reply with one move in UCI (e2e4) or SAN (Nf3) notation.")
        return "\n".join(lines)


def _diagram(board: chess.Board) -> str:
    rows = []
    for rank in range(7, -1, -1):
        cells = []
        for file in range(8):
            piece = board.piece_at(chess.square(file, rank))
            cells.append(piece.symbol() if piece else ".")
        rows.append(f"{rank + 1} " + " ".join(cells))
    rows.append("  a b c d e f g h")
    return "\n".join(rows)
