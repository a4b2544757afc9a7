"""Chess-puzzle mechanisms: how the position is shown, in which notation the model answers, the answer
format and its parser, how the move is picked (free generation, likelihood choice among the legal moves,
a vote), an instruction hint, retries with the env's feedback, and memory of solved puzzles.

No mechanism knows chess: moves come from the model (or its likelihoods) and the env's legal-move list.
Their code is in ``mechanisms/chess.py`` (and the shipped ``harnesses/chess_puzzles/``); ``render``
picks it.
"""

from __future__ import annotations

import re

from harnesses.chess_puzzles.choose import ChessChoose
from harnesses.chess_puzzles.h0 import ChessH0
from whale_train.meta_harness.library import core
from whale_train.meta_harness.library.core import Choice, Constant, DomainLibrary, Genome, memory_slot
from whale_train.meta_harness.library.mechanisms import chess as m
from whale_train.rollout import Trajectory

core.keep_sources(m, ChessH0, ChessChoose)  # the code candidates are rendered from, as imported

SLOTS = {
    "observation": {
        "full": Choice("goal, opponent's last move, board, FEN and the legal moves (h0)"),
        "env_text": Choice("the env's own observation text, worded as the env words it", {"parse": 0.3}),
        "compact": Choice("goal, FEN and the legal moves only (a shorter context)", {"wrong": 0.2}),
        "board": Choice("goal, board diagram and the legal moves, no FEN", {"wrong": 0.2}),
    },
    "notation": {
        "uci": Choice("moves listed and answered in UCI (h0)"),
        "san": Choice("moves listed and answered in SAN", {"illegal": 0.3, "parse": 0.2}),
    },
    "output": {
        "tag": Choice("the move inside <move></move> tags (h0)"),
        "bare": Choice("the move alone on one line", {"parse": 0.5, "truncated": 0.5}),
        "lenient": Choice(
            "<move></move> asked for; any legal move named in the reply accepted",
            {"parse": 1.0, "illegal": 0.4},
        ),
    },
    "action": {
        "generate": Choice("the model writes the move (h0)"),
        "choose": Choice(
            "the legal move whose answer the model finds most likely: never illegal nor unparseable",
            {"illegal": 1.2, "parse": 1.0, "incomplete": 0.5},
        ),
        "vote": Choice(
            "self-consistency: the most frequent legal move among several samples, likelihood choice if none",
            {"wrong": 0.6, "illegal": 0.8, "parse": 0.6},
        ),
        "generate_choose": Choice(
            "the model writes the move; when it is not legal, likelihood choice among the legal moves",
            {"illegal": 1.0, "parse": 0.8},
        ),
    },
    "hint": core.hint_slot(
        checks=Choice("a hint: look at checks first, a mate is a check with no escape", {"wrong": 0.4}),
        legal_only=Choice("a hint: only a move from the list is accepted", {"illegal": 0.4}),
    ),
    "memory": memory_slot("puzzle"),
}

CONSTANTS = {
    "temperature": core.temperature(
        {"wrong": 0.3, "illegal": 0.3, "parse": 0.2}, lambda g: g["slots"]["action"] != "choose"
    ),
    "samples": core.samples(lambda g: g["slots"]["action"] == "vote"),
    "format_retries": core.format_retries(reply="answer"),
    "illegal_retries": Constant(
        (0, 1, 2, 3),
        "retries after an illegal move, with the env's message",
        {"illegal": 0.4, "incomplete": 0.5},
        lambda g: g["slots"]["action"] in ("generate", "vote"),
    ),
}

H0 = core.seed_genome(
    "chess", SLOTS, {"temperature": 1.0, "samples": 8, "format_retries": 1, "illegal_retries": 1}
)

HINTS = {
    "none": "",
    "checks": "Look at the moves that give check first: a mate is a check the opponent cannot escape. ",
    "legal_only": "Only a move from the legal moves list is accepted. ",
}

#: The position line of observation compact (the FEN) and board (the diagram), as the candidate's code.
POSITIONS = {"compact": "f\"FEN: {info['fen']}\"", "board": 'info["board"]'}


def _format_line(notation: str, output: str) -> str:
    name = "UCI" if notation == "uci" else "SAN"
    if output == "bare":
        return f"Reply with the move only, in {name}."
    return f"Answer with one legal move in {name} inside <move></move> tags."


def render(g: Genome, name: str) -> str:
    s, c = g["slots"], g["constants"]
    attrs = {
        "temperature": c["temperature"],
        "max_tokens": 16,
        "stop": ("\n",) if s["output"] == "bare" else ("</move>",),
    }
    if s["action"] == "generate":
        attrs["format_retries"] = c["format_retries"]
    attrs["illegal_retries"] = c["illegal_retries"]
    if s["action"] == "vote":
        attrs["samples"] = c["samples"]
    parts = [core.candidate_header(name, g, attrs)]

    # the mechanisms are written for UCI: under SAN the same code reads the SAN fields of info
    fields = {"legal_moves_uci": "legal_moves_san", "last_opponent_move": "last_opponent_move_san"}
    fields = fields if s["notation"] == "san" else {}
    parts.append(core.method(core.code_of(m.Notation.legal, **fields)))
    if s["observation"] in POSITIONS:  # compact and board: one method, its own position line
        observation, fields = m.ObservationShort, {**fields, "POSITION": POSITIONS[s["observation"]]}
    else:
        observation = {"full": ChessH0, "env_text": m.ObservationEnvText}[s["observation"]]  # full: h0's own
    parts.append(core.method(core.code_of(observation.format_observation, **fields)))

    instruction = core.py("\n" + HINTS[s["hint"]] + _format_line(s["notation"], s["output"]))
    memory = m.MemoryExamples if s["memory"] == "examples" else m.MemoryNone
    parts.append(core.method(core.code_of(memory.build_prompt, INSTRUCTION=instruction)))

    output = {"tag": m.OutputTag, "bare": m.OutputBare, "lenient": m.OutputLenient}[s["output"]]
    parts.append(core.method(core.code_of(output.parse_action)))
    option = m.OutputBare.option if s["output"] == "bare" else m.OutputTag.option
    parts.append(core.method(core.code_of(option)))

    if s["action"] != "generate":  # generate: Harness.act
        act = {"choose": ChessChoose, "vote": m.ActionVote, "generate_choose": m.ActionGenerateChoose}
        parts.append(core.method(core.code_of(act[s["action"]].act)))
        parts.append(core.method(core.code_of(ChessChoose.most_likely)))
    # the loop is Harness.run; h0's per-position retry budget ends an episode after too many illegal moves
    parts += [core.method(core.code_of(ChessH0.start)), core.method(core.code_of(ChessH0.give_up))]
    examples = [(e["fen"], e["move"]) for e in g.get("examples") or []] if s["memory"] == "examples" else []
    prefix = core.string_list("EXAMPLES", examples, "Solved puzzles from the archive (FEN, the move played).")
    return prefix + core.join_methods(*parts)


_FEN = re.compile(r"FEN: (\S+ [wb] \S+ \S+ \d+ \d+)")


def harvest(traj: Trajectory) -> dict[str, str] | None:
    """A puzzle solved in one move without errors: its FEN and the move."""
    if len(traj.steps) != 1 or traj.steps[0].error:
        return None
    m = _FEN.search(traj.reset_observation)
    return {"fen": m.group(1), "move": traj.steps[0].action.strip()} if m else None


LIBRARY = DomainLibrary("chess", SLOTS, CONSTANTS, H0, render, harvest)
