"""The warm-start text of ``whale pretrain``: per domain, the *presentation formats* its tasks are shown in.

Each built-in domain's ``TextFormats`` (``CHESS``, ``MATH``, ``SEARCH`` at the end of this file) is
named by its ``Domain`` in ``whale_train.domains`` (``pretrain_formats``): the formats and their shares
(recorded in the model card), and a maker of ``Example`` s drawn from the domain's task generator.
The prompts of the shipped harnesses are built by calling their own hooks, so they match exactly; the
env's raw observations and other templates, orders and notations give harness search something to
find. Only content whose unkeyed hash (``public_split_of``) is in the train share is used.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import chess

from harnesses.chess_puzzles.h0 import ChessH0
from harnesses.math.h0 import MathH0
from harnesses.search_qa.h0 import SearchH0
from harnesses.search_qa.multi_hop import SearchMultiHop
from whale_envs.chess.env import ChessEnv
from whale_envs.chess.generator import generate_puzzle
from whale_envs.chess.puzzle import bare_san
from whale_envs.chess.search import mating_moves
from whale_envs.math.env import MathEnv
from whale_envs.math.generators import FAMILIES as MATH_FAMILIES
from whale_envs.math.problem import MathProblem
from whale_envs.search.env import cut
from whale_envs.search.generator import SearchSample, generate_sample
from whale_envs.splits import public_split_of
from whale_envs.tasks import ListSource, Task


def _pick(rng: random.Random, shares: dict[str, float]) -> str:
    return rng.choices(list(shares), weights=list(shares.values()))[0]


@dataclass(frozen=True)
class TextFormats:
    """A domain's warm-start text.

    Attributes:
        formats: format name -> share of the domain's examples (recorded in the model card).
        maker: builds a fresh example maker ``(rng, level) -> Example`` for one stream.
        levels_field: the ``PretrainConfig`` field holding the shares of its generator levels (None:
            level 1 only); ``level_keys``: the levels that field may name.
    """

    formats: dict[str, float]
    maker: Callable[[], Callable[[random.Random, int], Any]]
    levels_field: str | None = None
    level_keys: tuple[str, ...] = ("1",)


@dataclass(frozen=True)
class Example:
    """One prompt -> reply pair. ``chat``: the prompt is a user message rendered with the chat template
    (the reply then ends with ``<|im_end|>``); else plain text (the reply ends with ``<|endoftext|>``).
    ``content``: the text behind it (a FEN or a question), always ``train`` under ``public_split_of``."""

    prompt: str
    reply: str
    domain: str
    format: str
    content: str
    chat: bool = True


class _Stage:
    """A one-task env of a domain: ``reset(payload)`` gives the exact observation and ``info`` the env shows."""

    def __init__(self, env_cls: type, payload: Any):
        self.env = env_cls(tasks=ListSource("warm-start", [Task("warm", payload, {})]))

    def reset(self, payload: Any) -> tuple[str, dict[str, Any]]:
        self.env.source = ListSource("warm-start", [Task("warm", payload, {})])
        return self.env.reset(options={"task_id": "warm"})


# ---------------------------------------------------------------------------------------- chess

CHESS_FORMATS = {
    "h0": 0.3,  # chess_puzzles/h0's prompt (board, FEN, legal moves in UCI) -> <move>uci</move>
    "h0_retry": 0.05,  # the same after an illegal answer (the error line h0 adds)
    "obs": 0.15,  # the env's own observation -> a bare UCI or SAN move
    "san": 0.1,  # board + legal moves in SAN -> <move>SAN</move>
    "fen_only": 0.1,  # FEN only, no board, no move list -> <move>uci</move>
    "board_only": 0.1,  # board diagram only -> bare uci
    "shuffled": 0.1,  # legal moves first and shuffled, then board and FEN -> <move>uci</move>
    "text": 0.1,  # plain text (no chat): FEN and legal moves -> "Mate: uci"
}


def _chess_example(rng: random.Random, level: int, stage: _Stage) -> Example:
    puzzle = generate_puzzle(rng, level, split="train", split_fn=public_split_of)
    board = chess.Board(puzzle.fen)
    move = rng.choice(sorted(mating_moves(board), key=chess.Move.uci))
    uci, san = move.uci(), bare_san(board, move)
    obs, info = stage.reset(puzzle)
    fmt = _pick(rng, CHESS_FORMATS)
    h0 = ChessH0()
    color = info["solver_color"].capitalize()
    legal = list(info["legal_moves_uci"])
    if fmt in ("h0", "h0_retry"):
        if fmt == "h0_retry":  # the prompt after an illegal move: the env's error shown
            obs, _, _, _, info = stage.env.step(_illegal_move(rng, board))
        return Example(
            h0.build_prompt(h0.format_observation(obs, info), info),
            f"<move>{uci}</move>",
            "chess",
            fmt,
            puzzle.fen,
        )
    if fmt == "obs":
        return Example(obs, rng.choice((uci, san)), "chess", fmt, puzzle.fen)
    if fmt == "san":
        sans = " ".join(info["legal_moves_san"])
        prompt = (
            f"Chess puzzle. You play {color}. {info['goal']}\n{info['board']}\nFEN: {info['fen']}\n"
            f"Legal moves (SAN): {sans}\nAnswer with one legal move in SAN inside <move></move> tags."
        )
        return Example(prompt, f"<move>{san}</move>", "chess", fmt, puzzle.fen)
    if fmt == "fen_only":
        prompt = (
            f"FEN: {info['fen']}\n{color} to move. {info['goal']}\nGive the move in UCI inside <move></move>."
        )
        return Example(prompt, f"<move>{uci}</move>", "chess", fmt, puzzle.fen)
    if fmt == "board_only":
        prompt = f"{info['board']}\n{color} to move and mate in one. Your move (UCI):"
        return Example(prompt, uci, "chess", fmt, puzzle.fen)
    if fmt == "shuffled":
        rng.shuffle(legal)
        prompt = (
            f"Legal moves: {' '.join(legal)}\n{info['board']}\nFEN: {info['fen']}\n"
            f"You play {color}. {info['goal']} Answer inside <move></move>."
        )
        return Example(prompt, f"<move>{uci}</move>", "chess", fmt, puzzle.fen)
    prompt = f"FEN: {info['fen']}\nLegal moves: {' '.join(legal)}\nMate in one: "
    return Example(prompt, uci, "chess", fmt, puzzle.fen, chat=False)


def _illegal_move(rng: random.Random, board: chess.Board) -> str:
    """A UCI string that is not a legal move in ``board`` (what a weak model writes)."""
    legal = {m.uci() for m in board.legal_moves}
    while True:
        text = chess.square_name(rng.randrange(64)) + chess.square_name(rng.randrange(64))
        if text not in legal and text[:2] != text[2:]:
            return text


# ---------------------------------------------------------------------------------------- math

MATH_FORMATS = {
    "h0": 0.35,  # math/h0's prompt -> \boxed{answer}, sometimes python: print(expression)
    "h0_tool": 0.05,  # math/h0's prompt after a tool call (Python output shown) -> \boxed{output}
    "vote": 0.15,  # math/vote's prompt -> \boxed{answer}
    "expr": 0.2,  # math/calculator's prompt -> <expr>expression</expr>
    "obs": 0.1,  # the env's own observation -> answer: X, sometimes python: print(expression)
    "worked": 0.05,  # "write the computation" -> expression = \boxed{answer}
    "text": 0.1,  # plain text (no chat): "Q: ... A: answer"
}

#: The python share of the replies to h0's prompt and the env observation (the tool is offered there).
PYTHON_SHARE = 0.15


def _signed(a: str, b: str) -> str:
    """``a - b`` written for a human: ``a + 5`` when b is -5."""
    return f"{a} + {b[1:]}" if b.startswith("-") else f"{a} - {b}"


def math_expression(family: str, level: int, question: str) -> str | None:
    """A Python expression built from the numbers of ``question`` whose value is the answer (integer
    families), or the question's own expression (fractions: Python prints a float). None if unknown."""
    nums = re.findall(r"-?\d+", question)
    if family in ("arithmetic", "fractions"):
        m = re.fullmatch(r"What is (.+)\?", question)
        return m.group(1) if m else None
    if family == "word":
        n = re.findall(r"\d+", question)
        if level == 1:
            return f"{n[0]} + {n[1]}" if " gets " in question else f"{n[0]} - {n[1]}"
        if level == 2:
            return f"{n[0]} + {n[1]} - {n[2]}" if " buys " in question else f"{n[0]} - {n[1]} + {n[2]}"
        if level == 3:
            return f"{n[0]} * {n[1]} + {n[2]}" if "already had" in question else f"{n[0]} * {n[1]} - {n[2]}"
        if level == 4:
            return f"{n[4]} - ({n[0]} * {n[1]} + {n[2]} * {n[3]})"
        return f"{n[0]} * {n[1]} - {n[2]} * {n[3]} - {n[4]}"
    if family == "linear":
        eq = question.split(":", 1)[1].strip()
        lhs, rhs = (s.strip() for s in eq.split("="))
        if level == 1:  # x + a = b
            return f"{nums[1]} - {nums[0]}"
        if level == 2:
            if lhs.startswith("x - "):  # x - a = b
                return f"{nums[1]} + {nums[0]}"
            return f"{nums[1]} // {nums[0]}"  # a x = b
        if level == 3:  # a x ± b = c
            m = re.fullmatch(r"(-?\d*)x ([+-]) (\d+)", lhs)
            if not m:
                return None
            a, sign, b = m.groups()
            return f"({rhs} {'-' if sign == '+' else '+'} {b}) // {_coef(a)}"
        if level == 4:  # a x ± b = c x ± d
            ml = re.fullmatch(r"(-?\d*)x ([+-]) (\d+)", lhs)
            mr = re.fullmatch(r"(-?\d*)x ([+-]) (\d+)", rhs)
            if not (ml and mr):
                return None
            a, sb, b = ml.groups()
            c, sd, d = mr.groups()
            num = f"{'-' if sd == '-' else ''}{d} {'-' if sb == '+' else '+'} {b}"
            return f"({num}) // ({_signed(_coef(a), _coef(c))})"
        m = re.fullmatch(r"(\d+)\(x ([+-]) (\d+)\) - (\d+)", lhs)
        mr = re.fullmatch(r"(-?\d*)x ([+-]) (\d+)", rhs)
        if not (m and mr):
            return None
        a, sb, b, c = m.groups()
        d, se, e = mr.groups()
        return f"({'-' if se == '-' else ''}{e} + {c} {'-' if sb == '+' else '+'} {a} * {b}) // ({_signed(a, _coef(d))})"
    return None


def _coef(text: str) -> str:
    return {"": "1", "-": "-1"}.get(text, text)


def _python_value(expr: str) -> str:
    """What ``print(expr)`` shows (our own digits and operators only)."""
    return str(eval(expr, {"__builtins__": {}}))  # noqa: S307 - generated arithmetic, no names


def vote_prompt(obs: str, info: dict[str, Any]) -> str:
    """What math/vote sends: h0's observation text and the boxed-answer line (no tool line)."""
    return f"{MathH0().format_observation(obs, info)}\nPut the final answer in \\boxed{{}}."


def calculator_prompt(question: str, info: dict[str, Any]) -> str:
    """What math/calculator sends first: its own request, through h0's ``build_prompt`` (tool line too)."""
    text = f"Problem: {question}\nWrite one arithmetic expression that computes the answer, inside <expr></expr>."
    return MathH0().build_prompt(text, info)


def _math_example(rng: random.Random, level: int, stage: _Stage) -> Example:
    family = rng.choice(sorted(MATH_FAMILIES))
    while True:
        question, answer = MATH_FAMILIES[family](rng, level)
        if public_split_of(question) == "train":
            break
    expr = math_expression(family, level, question)
    exact = expr is not None and family != "fractions"  # print(expr) shows the answer itself
    obs, info = stage.reset(MathProblem(question, answer))
    h0 = MathH0()
    fmt = _pick(rng, MATH_FORMATS)
    if fmt in ("h0_tool", "expr", "worked") and expr is None:
        fmt = "h0"
    if fmt == "h0_tool" and not exact:
        fmt = "vote"
    boxed = f"\\boxed{{{answer}}}"
    if fmt == "h0":
        reply = f"python: print({expr})" if exact and rng.random() < PYTHON_SHARE else boxed
        return Example(h0.build_prompt(h0.format_observation(obs, info), info), reply, "math", fmt, question)
    if fmt == "h0_tool":
        value = _python_value(expr)
        info = {**info, "tool_calls_used": 1, "tool_calls_left": info["tool_calls_left"] - 1}
        info["last_tool"] = {"exit_code": 0, "stdout": value + "\n", "stderr": ""}
        return Example(
            h0.build_prompt(h0.format_observation(obs, info), info),
            f"\\boxed{{{value}}}",
            "math",
            fmt,
            question,
        )
    if fmt == "vote":
        return Example(vote_prompt(obs, info), boxed, "math", fmt, question)
    if fmt == "expr":
        return Example(calculator_prompt(question, info), f"<expr>{expr}</expr>", "math", fmt, question)
    if fmt == "obs":
        reply = f"python: print({expr})" if exact and rng.random() < PYTHON_SHARE else f"answer: {answer}"
        return Example(obs, reply, "math", fmt, question)
    if fmt == "worked":
        prompt = f"{question}\nWrite the computation, then the final answer in \\boxed{{}}."
        return Example(prompt, f"{expr} = {boxed}", "math", fmt, question)
    return Example(f"Q: {question}\nA: ", answer, "math", fmt, question, chat=False)


# ---------------------------------------------------------------------------------------- search

SEARCH_FORMATS = {
    "h0_query": 0.2,  # search_qa/h0's first prompt -> <search>first entity</search>
    "h0_answer": 0.2,  # search_qa/h0's second prompt (one passage) -> <answer>answer</answer>
    "qq_answer": 0.15,  # search_qa/question_query's prompt (three passages) -> <answer>
    "mh_next": 0.15,  # search_qa/multi_hop's follow-up prompt -> <search>next entity</search>
    "mh_answer": 0.1,  # search_qa/multi_hop's answer prompt -> <answer>
    "obs": 0.1,  # the env's observation (before / after a search) -> search: X / answer: X
    "text": 0.1,  # plain text (no chat): passages then "Question: ... Answer: X"
}

#: Characters of a passage the env shows (``SearchQAEnv.passage_chars``).
PASSAGE_CHARS = 500


def _search_example(rng: random.Random, hops: int) -> Example:
    while True:
        sample = generate_sample(rng, hops)
        if public_split_of(sample.question) == "train":
            break
    by_id = {
        p.id: {"id": p.id, "title": p.title, "text": cut(p.text, PASSAGE_CHARS)} for p in sample.passages
    }
    supporting = [by_id[s.passage_id] for s in sample.steps]
    others = _look_alikes(rng, sample, supporting)
    info = {"question": sample.question}
    h0, mh = SearchH0(), SearchMultiHop()
    start, answer = sample.steps[0].entity, sample.answer
    fmt = _pick(rng, SEARCH_FORMATS)
    if fmt == "mh_next" and hops == 1:
        fmt = "mh_answer"
    if fmt == "h0_query":
        return Example(h0.query_prompt(info), f"<search>{start}</search>", "search", fmt, sample.question)
    if fmt == "h0_answer":
        return Example(
            h0.answer_prompt(info, [supporting[-1]]),
            f"<answer>{answer}</answer>",
            "search",
            fmt,
            sample.question,
        )
    if fmt == "qq_answer":
        shown = _mix_in(rng, supporting, others, 3)
        return Example(
            h0.answer_prompt(info, shown), f"<answer>{answer}</answer>", "search", fmt, sample.question
        )
    if fmt == "mh_next":
        j = rng.randrange(1, hops)  # passages of the first j hops read; the next query names hop j+1
        seen = _mix_in(rng, supporting[:j], others, rng.randint(j, j + 2), keep_last=supporting[j - 1])
        prompt = mh.context(info, seen) + "\nWrite the next search query inside <search></search>."
        return Example(prompt, f"<search>{sample.steps[j].entity}</search>", "search", fmt, sample.question)
    if fmt == "mh_answer":
        seen = _mix_in(rng, supporting, others, min(3, hops + rng.randint(0, 2)))
        prompt = mh.context(info, seen) + "\nAnswer the question inside <answer></answer>."
        return Example(prompt, f"<answer>{answer}</answer>", "search", fmt, sample.question)
    if fmt == "obs":
        lines = [f"Question: {sample.question}"]
        if rng.random() < 0.5:
            lines += ["", "Searches left: 4.", _SEARCH_REPLY]
            return Example("\n".join(lines), f"search: {start}", "search", fmt, sample.question)
        shown = _mix_in(rng, supporting, others, 3)
        lines += ["", f"Search results for: {start}"]
        lines += [f"[{i}] {p['title']}\n{p['text']}" for i, p in enumerate(shown, start=1)]
        lines += ["", f"Searches left: {rng.randint(1, 3)}.", _SEARCH_REPLY]
        return Example("\n".join(lines), f"answer: {answer}", "search", fmt, sample.question)
    shown = _mix_in(rng, supporting, others, min(3, hops + 1))
    context = "\n".join(f"{p['title']}: {p['text']}" for p in shown)
    return Example(
        f"{context}\nQuestion: {sample.question}\nAnswer: ",
        answer,
        "search",
        fmt,
        sample.question,
        chat=False,
    )


_SEARCH_REPLY = "Reply with 'search: <query>' to search the passages, or 'answer: <text>' to answer."


def _look_alikes(rng: random.Random, sample: SearchSample, supporting: list[dict]) -> list[dict]:
    """Passages a search would return next to the right ones: look-alike names first, then others."""
    chain = {p["id"] for p in supporting}
    words = {w for p in supporting for w in p["title"].split()}
    rest = [p for p in sample.passages if p.id not in chain]
    alike = [p for p in rest if set(p.title.split()) & words or p.title[:3] in {t[:3] for t in words}]
    other = [p for p in rest if p not in alike]
    rng.shuffle(alike)
    rng.shuffle(other)
    return [{"id": p.id, "title": p.title, "text": cut(p.text, PASSAGE_CHARS)} for p in alike + other]


def _mix_in(
    rng: random.Random, needed: list[dict], others: list[dict], n: int, keep_last: dict | None = None
) -> list[dict]:
    """``needed`` plus distractors up to ``n`` passages, shuffled (``keep_last`` goes last)."""
    shown = list(needed) + others[: max(0, n - len(needed))]
    rng.shuffle(shown)
    if keep_last is not None:
        shown.remove(keep_last)
        shown.append(keep_last)
    return shown


# ---------------------------------------------------------------------------------------- the domains


def _chess_maker() -> Callable[[random.Random, int], Example]:
    return functools.partial(_chess_example, stage=_Stage(ChessEnv, generate_puzzle(random.Random(0), 1)))


def _math_maker() -> Callable[[random.Random, int], Example]:
    return functools.partial(_math_example, stage=_Stage(MathEnv, MathProblem("What is 1 + 1?", "2")))


def _search_maker() -> Callable[[random.Random, int], Example]:
    return _search_example


CHESS = TextFormats(CHESS_FORMATS, _chess_maker, "chess_levels", ("1", "2"))
MATH = TextFormats(MATH_FORMATS, _math_maker, "math_levels", ("1", "2", "3", "4", "5"))
SEARCH = TextFormats(SEARCH_FORMATS, _search_maker, "search_hops", ("1", "2", "3"))
