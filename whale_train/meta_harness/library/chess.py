"""Chess-puzzle mechanisms: how the position is shown, in which notation the model answers, the answer
format and its parser, how the move is picked (free generation, likelihood choice among the legal moves,
a vote), an instruction hint, retries with the env's feedback, and memory of solved puzzles.

No mechanism knows chess: moves come from the model (or its likelihoods) and the env's legal-move list.
"""

from __future__ import annotations

import re

from harnesses.chess_puzzles.choose import ChessChoose
from harnesses.chess_puzzles.h0 import ChessH0
from whale_train.meta_harness.library import core
from whale_train.meta_harness.library.core import Choice, Constant, DomainLibrary, Genome, memory_slot
from whale_train.rollout import Trajectory

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


#: The action mechanisms written here (``choose`` is ``chess_puzzles/choose``'s): docstring and body.
ACTS = {
    "vote": (
        "The most frequent legal move among several samples; likelihood choice if none is legal.",
        """
        answers = [self.parse_action(t, info) for t in llm.sample(prompt, self.samples, **self.params())]
        best = majority([a for a in answers if a in self.legal(info)])
        return best if best is not None else self.most_likely(prompt, info, llm)
        """,
    ),
    "generate_choose": (
        "The model's move if it is legal, else the legal move it finds most likely.",
        """
        move = self.parse_action(llm.complete(prompt, **self.params()), info)
        return move if move in self.legal(info) else self.most_likely(prompt, info, llm)
        """,
    ),
}


def _format_line(notation: str, output: str) -> str:
    name = "UCI" if notation == "uci" else "SAN"
    if output == "bare":
        return f"Reply with the move only, in {name}."
    return f"Answer with one legal move in {name} inside <move></move> tags."


def render(g: Genome, name: str) -> str:
    s, c = g["slots"], g["constants"]
    uci = s["notation"] == "uci"
    moves_key = "legal_moves_uci" if uci else "legal_moves_san"
    last_key = "last_opponent_move" if uci else "last_opponent_move_san"
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

    parts.append(
        core.method(
            f'''
            def legal(self, info):
                return info["{moves_key}"]
            '''
        )
    )
    error_line = """
        if info.get("error"):
            lines.append(f"Your previous answer was rejected: {info['error']}")
        return "\\n".join(lines)"""
    if s["observation"] == "env_text":
        parts.append(
            core.method(
                '''
                def format_observation(self, obs, info):
                    """The env's own text: board, FEN, legal moves (UCI), how to reply, and any error."""
                    return obs
                '''
            )
        )
    else:
        if s["observation"] == "full":
            head = f"""
        lines = [f"Chess puzzle. You play {{info['solver_color']}}. {{info['goal']}}"]
        if info.get("{last_key}"):
            lines.append(f"Opponent's last move: {{info['{last_key}']}}")
        lines += [info["board"], f"FEN: {{info['fen']}}", "Legal moves: " + " ".join(self.legal(info))]"""
        elif s["observation"] == "compact":
            head = """
        lines = [f"You play {info['solver_color']}. {info['goal']}", f"FEN: {info['fen']}"]
        lines.append("Legal moves: " + " ".join(self.legal(info)))"""
        else:  # board
            head = """
        lines = [f"You play {info['solver_color']}. {info['goal']}", info["board"]]
        lines.append("Legal moves: " + " ".join(self.legal(info)))"""
        parts.append("    def format_observation(self, obs, info):" + head + error_line)

    instruction = core.py("\n" + HINTS[s["hint"]] + _format_line(s["notation"], s["output"]))
    if s["memory"] == "examples":
        parts.append(
            core.method(
                f'''
                def build_prompt(self, text, info):
                    """Solved puzzles first (never the current one), then the puzzle."""
                    shown = [f"Example: FEN {{fen}}\\nAnswer: {{self.option(move)}}" for fen, move in EXAMPLES if fen != info["fen"]]
                    return "\\n\\n".join(shown[: self.max_examples] + [text + {instruction}])
                '''
            )
        )
    else:
        parts.append(
            core.method(
                f"""
                def build_prompt(self, text, info):
                    return text + {instruction}
                """
            )
        )

    if s["output"] == "tag":
        parse = """
            def parse_action(self, text, info):
                return extract_tag(text, "move")
            """
    elif s["output"] == "bare":
        parse = '''
            def parse_action(self, text, info):
                """The first word of the reply."""
                words = text.split()
                return words[0].strip(".,;:!") if words else None
            '''
    else:
        parse = '''
            def parse_action(self, text, info):
                """The move in <move></move>; else the first word of the reply that names a legal move."""
                tagged = extract_tag(text, "move")
                if tagged:
                    return tagged
                pairs = list(zip(info["legal_moves_uci"], info["legal_moves_san"], self.legal(info)))
                for word in text.split():
                    word = word.strip(".,;:!()+#")
                    for uci, san, listed in pairs:
                        if word in (uci, san):
                            return listed
                return None
            '''
    parts.append(core.method(parse))
    option = '"<move>" + move + "</move>"' if s["output"] != "bare" else "move"
    parts.append(
        core.method(
            f"""
            def option(self, move):
                return {option}
            """
        )
    )

    prompt_line = "prompt = self.make_prompt(self.format_observation(obs, info), info, llm)"
    if s["action"] == "choose":
        parts.append(core.method(core.code_of(ChessChoose.act)))
    elif s["action"] in ACTS:
        doc, body = ACTS[s["action"]]
        parts.append(core.define("act(self, obs, info, llm)", prompt_line, body, doc=doc))
    if s["action"] != "generate":
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
