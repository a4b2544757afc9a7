"""``whale pretrain``: the CPU default model, trained from scratch on text generated from the three domains.

The recipe, in order (every step seeded by ``PretrainConfig.seed``):

1. **Warm-start text.** :func:`examples` draws an endless stream of prompt -> reply pairs from the task
   generators of the three domains (chess mate-in-1 puzzles, math problems, fictional-world search
   questions), each rendered in one of several *presentation formats*: the prompts the shipped
   harnesses send (built by calling their own hooks, so they match exactly), the env's raw
   observations, and other templates, orders and answer notations, with and without move lists or
   passages, as chat turns or as plain text. The model is therefore not tied to one harness's format:
   harness search has something to find and RSFT something to adapt. Math replies also teach
   expression writing (``<expr>12 + 7 - 4</expr>``, ``python: print(12 + 7 - 4)``), so a calculator
   step is a real mechanism. Only content that hashes to the *train* split is used (the env's
   ``split_of`` on the FEN or question), so no test task is ever seen verbatim.
2. **Tokenizer.** A byte-level BPE (``tiny.train_tokenizer``: ~1k tokens, digits split, ChatML template)
   trained on a sample of that text.
3. **Model.** A fresh ``Qwen3ForCausalLM`` of ``size`` (``tiny`` ~0.9M parameters, ``small`` ~5M).
4. **Supervised pass.** AdamW with linear warm-up and cosine decay, length-bucketed batches of about
   ``batch_tokens`` tokens; full weight on the reply tokens, a per-domain ``prompt_loss_weights`` on the
   prompt (search passages repeat names, which teaches the model to copy them; a math question's
   random digits teach nothing).
   With ``--minutes`` the step count is fixed at the end of the warm-up from the speed measured so
   far (so the schedule is a pure function of the step count, recorded in the card: ``--steps N``
   replays it). Ctrl-C stops training and still saves what is done.
5. **Save and card.** ``save_pretrained`` (loads with ``AutoModelForCausalLM`` / ``AutoTokenizer``
   offline), ``README.md`` (the model card: config, data seed, minutes, data mix, measured
   accuracies) and ``whale_pretrain.json`` (the same, machine-readable, with the SHA-256 of the
   weight and tokenizer files).
6. **Calibration.** Optionally (``--eval-tasks N``) the saved model is evaluated exactly as
   ``whale eval`` would (mean@k ± SE on the first N tasks of each domain's default generated test
   split) under h0, or under every shipped harness (``--eval-harnesses all``); the numbers go into the
   card.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
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
from whale_envs.tasks import ListSource, Task, split_of

DOMAINS = ("chess", "math", "search")

#: The env and the shipped harnesses of each domain, for the calibration in the card.
EVAL_ENVS = {"chess": "whale/Chess-v0", "math": "whale/Math-v0", "search": "whale/SearchQA-v0"}
EVAL_HARNESSES = {
    "chess": ("chess_puzzles/h0", "chess_puzzles/choose", "chess_puzzles/vote"),
    "math": ("math/h0", "math/vote", "math/calculator"),
    "search": ("search_qa/h0", "search_qa/question_query", "search_qa/multi_hop", "search_qa/follow_up"),
}

#: The weight and tokenizer files whose SHA-256 the card records.
HASHED_FILES = ("model.safetensors", "tokenizer.json")


@dataclass
class PretrainConfig:
    """Everything that decides the model ``whale pretrain`` writes (recorded in the card).

    Attributes:
        out: the output directory (``save_pretrained`` files, ``README.md``, ``whale_pretrain.json``).
        size: ``tiny`` (~0.9M parameters) or ``small`` (~5M); see ``whale_train.tiny.SIZES``.
        minutes: wall-clock budget of the supervised pass (data generation included); ignored when
            ``steps`` is set.
        steps: a fixed number of optimizer steps instead of a time budget (replays a recorded run).
        seed: seeds the tokenizer sample, the data stream and order, and the initialization.
        lr: peak learning rate (AdamW); linear warm-up over ``warmup_steps``, then cosine decay to
            ``lr * min_lr_ratio``.
        min_lr_ratio: final learning rate as a fraction of ``lr``.
        warmup_steps: linear warm-up steps; with ``minutes``, the step count is fixed after them.
        weight_decay: AdamW weight decay (not on norms or biases).
        batch_tokens: about this many tokens (padding included) per optimizer step.
        max_len: examples longer than this many tokens are cut from the left.
        prompt_loss_weights: loss weight of prompt tokens per domain (reply tokens weigh 1).
        mix: share of examples per domain, ``"chess=0.4,math=0.3,search=0.3"``.
        chess_levels: share of chess generator levels, ``"1=0.9,2=0.1"`` (mate-in-1 levels only).
        math_levels: share of math generator levels (1-5); the four families are equally likely.
        search_hops: share of search hop counts (1-3).
        vocab_size: tokenizer vocabulary size (special tokens included).
        tokenizer_docs: examples the tokenizer is trained on.
        eval_tasks: tasks of each domain's test split in the card's calibration (0 = none).
        eval_k: samples per task (mean@k).
        eval_harnesses: ``h0`` (each domain's base harness) or ``all`` (every shipped harness).
        eval_domains: comma-separated domains to calibrate.
        threads: torch CPU threads for training and calibration (0 = torch's default). On a machine
            shared with other work, 1 thread is steadier than 2.
    """

    out: str = "tiny-model"
    size: str = "tiny"
    minutes: float = 30.0
    steps: int | None = None
    seed: int = 0
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 100
    weight_decay: float = 0.05
    batch_tokens: int = 4096
    max_len: int = 768
    prompt_loss_weights: str = "chess=0.1,math=0.05,search=1"
    mix: str = "chess=0.06,math=0.72,search=0.22"
    chess_levels: str = "1=0.95,2=0.05"
    math_levels: str = "1=0.45,2=0.35,3=0.15,4=0.05"
    search_hops: str = "1=0.5,2=0.3,3=0.2"
    vocab_size: int = 1024
    tokenizer_docs: int = 3000
    eval_tasks: int = 0
    eval_k: int = 8
    eval_harnesses: str = "h0"
    eval_domains: str = "chess,math,search"
    threads: int = 0

    def validate(self) -> None:
        from whale_train.tiny import SIZES

        if self.size not in SIZES:
            raise ValueError(f"size must be one of {', '.join(SIZES)}, got {self.size!r}")
        if self.steps is None and not self.minutes > 0:
            raise ValueError(f"minutes must be positive, got {self.minutes!r}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be at least 1, got {self.steps!r}")
        if self.eval_harnesses not in ("h0", "all"):
            raise ValueError(f"eval_harnesses must be 'h0' or 'all', got {self.eval_harnesses!r}")
        unknown = set(self.domain_list()) - set(DOMAINS)
        if unknown:
            raise ValueError(f"unknown eval domains {sorted(unknown)}; known: {', '.join(DOMAINS)}")
        for name, keys in (
            ("mix", DOMAINS),
            ("chess_levels", ("1", "2")),
            ("math_levels", ("1", "2", "3", "4", "5")),
            ("search_hops", ("1", "2", "3")),
            ("prompt_loss_weights", DOMAINS),
        ):
            shares = parse_shares(getattr(self, name))
            if set(shares) - set(keys) or (not shares and name != "prompt_loss_weights"):
                raise ValueError(f"{name}: keys must be among {', '.join(keys)}, got {getattr(self, name)!r}")

    def domain_list(self) -> list[str]:
        return [d for d in self.eval_domains.replace(" ", "").split(",") if d]


def parse_shares(text: str) -> dict[str, float]:
    """``"a=0.4,b=0.6"`` -> ``{"a": 0.4, "b": 0.6}`` (shares need not sum to 1; zeros are dropped)."""
    out = {}
    for part in text.replace(" ", "").split(","):
        if part:
            key, _, value = part.partition("=")
            if float(value) < 0:
                raise ValueError(f"negative share in {text!r}")
            if float(value) > 0:
                out[key] = float(value)
    return out


def _pick(rng: random.Random, shares: dict[str, float]) -> str:
    return rng.choices(list(shares), weights=list(shares.values()))[0]


# ============================================================================ warm-start examples


@dataclass(frozen=True)
class Example:
    """One prompt -> reply pair. ``chat``: the prompt is a user message rendered with the chat template
    (the reply then ends with ``<|im_end|>``); else plain text (the reply ends with ``<|endoftext|>``).
    ``content``: the env's split key of the task behind it (a FEN or a question), always in ``train``."""

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
    puzzle = generate_puzzle(rng, level, split="train")
    board = chess.Board(puzzle.fen)
    move = rng.choice(sorted(mating_moves(board), key=chess.Move.uci))
    uci, san = move.uci(), bare_san(board, move)
    obs, info = stage.reset(puzzle)
    fmt = _pick(rng, CHESS_FORMATS)
    h0 = ChessH0()
    color = info["solver_color"].capitalize()
    legal = list(info["legal_moves_uci"])
    if fmt == "h0":
        return Example(
            h0.build_prompt(h0.format_observation(obs, info), info),
            f"<move>{uci}</move>",
            "chess",
            fmt,
            puzzle.fen,
        )
    if fmt == "h0_retry":
        wrong = _illegal_move(rng, board)
        obs, _, _, _, info = stage.env.step(wrong)
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
        if split_of(question) == "train":
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
        if split_of(sample.question) == "train":
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


# ---------------------------------------------------------------------------------------- the stream


def examples(config: PretrainConfig, stream: str = "train") -> Iterator[Example]:
    """The endless warm-start stream: a pure function of ``config`` (seed, shares) and ``stream``."""
    rng = random.Random(f"whale-pretrain/{stream}/{config.seed}")
    mix = parse_shares(config.mix)
    levels = {
        "chess": parse_shares(config.chess_levels),
        "math": parse_shares(config.math_levels),
        "search": parse_shares(config.search_hops),
    }
    chess_stage = _Stage(ChessEnv, generate_puzzle(random.Random(0), 1))
    math_stage = _Stage(MathEnv, MathProblem("What is 1 + 1?", "2"))
    while True:
        domain = _pick(rng, mix)
        level = int(_pick(rng, levels[domain]))
        if domain == "chess":
            yield _chess_example(rng, level, chess_stage)
        elif domain == "math":
            yield _math_example(rng, level, math_stage)
        else:
            yield _search_example(rng, level)


# ============================================================================ tokens and batches


def chat_prompt(user: str) -> str:
    """The ChatML text of one user turn and the assistant header (what ``tiny.CHAT_TEMPLATE`` renders)."""
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def example_text(ex: Example) -> tuple[str, str]:
    """(prompt text, reply text) as the model sees them, end-of-turn token included in the reply."""
    if ex.chat:
        return chat_prompt(ex.prompt), ex.reply + "<|im_end|>"
    return ex.prompt, ex.reply + "<|endoftext|>"


@dataclass
class Batch:
    input_ids: Any  # LongTensor [n, width], right-padded
    attention_mask: Any  # LongTensor [n, width]
    weights: Any  # FloatTensor [n, width]: the loss weight of predicting each token (0 on padding)
    tokens: int  # real (unpadded) tokens
    domains: Counter


def batches(config: PretrainConfig, tokenizer, chunk: int = 1024) -> Iterator[Batch]:
    """Length-bucketed batches of about ``config.batch_tokens`` tokens (padding included), in an order
    fixed by the seed: ``chunk`` examples are tokenized, sorted by length, cut into batches, shuffled."""
    import torch

    rng = random.Random(f"whale-pretrain/batches/{config.seed}")
    stream = examples(config)
    pad = tokenizer.pad_token_id
    prompt_weight = {d: 0.0 for d in DOMAINS} | parse_shares(config.prompt_loss_weights)
    while True:
        exs = [next(stream) for _ in range(chunk)]
        texts = [example_text(e) for e in exs]
        prompts = tokenizer([p for p, _ in texts], add_special_tokens=False)["input_ids"]
        replies = tokenizer([r for _, r in texts], add_special_tokens=False)["input_ids"]
        rows = []
        for ex, p, r in zip(exs, prompts, replies, strict=True):
            ids = (p + r)[-config.max_len :]
            w = ([prompt_weight[ex.domain]] * len(p) + [1.0] * len(r))[-config.max_len :]
            w[0] = 0.0  # nothing predicts the first token
            rows.append((ids, w, ex.domain))
        rows.sort(key=lambda row: len(row[0]))
        groups, current = [], []
        for row in rows:
            if current and (len(current) + 1) * len(row[0]) > config.batch_tokens:
                groups.append(current)
                current = []
            current.append(row)
        groups.append(current)
        rng.shuffle(groups)
        for group in groups:
            width = max(len(ids) for ids, _, _ in group)
            input_ids = torch.full((len(group), width), pad, dtype=torch.long)
            mask = torch.zeros((len(group), width), dtype=torch.long)
            weights = torch.zeros((len(group), width), dtype=torch.float32)
            for i, (ids, w, _) in enumerate(group):
                input_ids[i, : len(ids)] = torch.tensor(ids)
                mask[i, : len(ids)] = 1
                weights[i, : len(ids)] = torch.tensor(w)
            domains: Counter = Counter()
            for ids, _, domain in group:
                domains[domain] += len(ids)
            yield Batch(input_ids, mask, weights, int(mask.sum()), domains)


def tokenizer_corpus(config: PretrainConfig) -> list[str]:
    """The texts the tokenizer is trained on: ``tokenizer_docs`` examples of their own seeded stream."""
    stream = examples(config, stream="tokenizer")
    return ["".join(example_text(next(stream))) for _ in range(config.tokenizer_docs)]


# ============================================================================ training


def lr_at(step: int, total: int, config: PretrainConfig) -> float:
    """Learning rate of optimizer step ``step`` (1-based) of ``total``: linear warm-up, cosine decay."""
    if step <= config.warmup_steps:
        return config.lr * step / config.warmup_steps
    span = max(1, total - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    floor = config.lr * config.min_lr_ratio
    return floor + (config.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class TrainRecord:
    """What the supervised pass did (goes into the card)."""

    steps: int = 0
    planned_steps: int = 0
    seconds: float = 0.0
    tokens: int = 0
    tokens_by_domain: dict[str, int] = field(default_factory=dict)
    final_loss: float | None = None
    interrupted: bool = False


def train(model, tokenizer, config: PretrainConfig, console=None) -> TrainRecord:
    """The supervised pass (see the module docstring). Returns the record; Ctrl-C ends it early."""
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=(0.9, 0.95),
    )
    record = TrainRecord(planned_steps=config.steps or 0)
    budget = None if config.steps else config.minutes * 60
    total = (
        config.steps or 10**9
    )  # in minutes mode: fixed at the end of the warm-up (which it does not affect)
    by_domain: Counter = Counter()
    recent: list[float] = []
    log_lines = console is not None and not console.is_terminal
    model.train()
    start = time.monotonic()
    stream = batches(config, tokenizer)
    columns = (
        TextColumn("[bold]pretrain"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}  lr {task.fields[lr]}  {task.fields[tps]} tok/s"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        job = bar.add_task("train", total=config.steps, loss="-", lr="-", tps="-")
        step = 0
        try:
            while step < total:
                step += 1
                batch = next(stream)
                lr = lr_at(step, total, config)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                targets = batch.input_ids[:, 1:]
                w = batch.weights[:, 1:]
                ce = torch.nn.functional.cross_entropy(
                    logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
                )
                loss = (ce * w.reshape(-1)).sum() / w.sum().clamp(min=1e-6)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                record.steps = step
                record.tokens += batch.tokens
                by_domain.update(batch.domains)
                recent = (recent + [loss.item()])[-50:]
                elapsed = time.monotonic() - start
                if budget is not None and step == config.warmup_steps:
                    per_step = elapsed / step
                    total = max(step + 1, int(budget / per_step))
                    record.planned_steps = total
                    bar.update(job, total=total)
                if log_lines and step % 100 == 0:  # no live bar in a log file: a line now and then
                    console.print(
                        f"step {step}/{total if total < 10**9 else '?'}  loss {sum(recent) / len(recent):.3f}  "
                        f"lr {lr:.1e}  {record.tokens / elapsed:,.0f} tok/s  {elapsed / 60:.1f} min"
                    )
                bar.update(
                    job,
                    completed=step,
                    loss=f"{sum(recent) / len(recent):.3f}",
                    lr=f"{lr:.1e}",
                    tps=f"{record.tokens / elapsed:,.0f}",
                )
        except KeyboardInterrupt:
            record.interrupted = True
    model.eval()
    record.seconds = round(time.monotonic() - start, 1)
    record.tokens_by_domain = dict(sorted(by_domain.items()))
    record.final_loss = round(sum(recent) / len(recent), 4) if recent else None
    if not record.planned_steps:
        record.planned_steps = total if total < 10**9 else step
    return record


# ============================================================================ calibration


def calibrate(
    model_dir: str | Path,
    config: PretrainConfig,
    console=None,
    on_result: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """mean@k ± SE of the saved model under each domain's h0 (or every shipped harness), measured exactly
    as ``whale eval --model DIR --harness H --split test --limit N --k K --seed 0 --trusted`` does.

    Every domain's h0 runs first, then the other harnesses; ``on_result(name, result)`` sees each result
    as it comes. The returned dict is in ``EVAL_HARNESSES`` order."""
    import gymnasium as gym
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from harnesses.loader import load_harness
    from whale_train.llm import load_llm
    from whale_train.rollout import EpisodeLimits, RolloutConfig, run_rollouts, summarize

    llm = load_llm("transformers", str(model_dir))
    rollout = RolloutConfig(k=config.eval_k, seed=0, concurrency=128, trusted=True, limits=EpisodeLimits())
    count = max(map(len, EVAL_HARNESSES.values())) if config.eval_harnesses == "all" else 1
    plan = [
        (d, EVAL_HARNESSES[d][i])
        for i in range(count)
        for d in config.domain_list()
        if i < len(EVAL_HARNESSES[d])
    ]
    results: dict[str, dict[str, Any]] = {}
    for domain, name in plan:
        env_id = EVAL_ENVS[domain]
        env = gym.make(env_id, split="test").unwrapped
        ids = env.task_ids[: config.eval_tasks]
        columns = (TextColumn(f"[bold]{name}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as bar:
            job = bar.add_task(name, total=len(ids) * config.eval_k)
            start = time.monotonic()
            trajs = run_rollouts(
                load_harness(name),
                env_id,
                llm,
                ids,
                env_kwargs={"split": "test"},
                config=rollout,
                progress=lambda _t, bar=bar, job=job: bar.advance(job),
            )
        s = summarize(trajs)
        results[name] = {
            "env": env_id,
            "tasks_source": env.source.name,
            "tasks": s["tasks"],
            "k": s["k"],
            "mean": round(s["mean"], 4),
            "se": round(s["se"], 4),
            "pass_at_k": round(s["pass_at_k"], 4),
            "by_difficulty": {d: round(v["mean"], 4) for d, v in s["by_difficulty"].items()},
            "failures": s["failures"],
            "wall_seconds": round(time.monotonic() - start, 1),
        }
        if console is not None:
            console.print(
                f"{name}: mean@{s['k']} {100 * s['mean']:.1f}% ± {100 * s['se']:.1f} ({s['tasks']} tasks)"
            )
        if on_result is not None:
            on_result(name, results[name])
    order = [n for names in EVAL_HARNESSES.values() for n in names]
    return {n: results[n] for n in order if n in results}


# ============================================================================ files and card


def sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_card(out: str | Path, info: dict[str, Any]) -> Path:
    """Write ``whale_pretrain.json`` (``info``) and ``README.md`` (the model card rendered from it)."""
    out = Path(out)
    (out / "whale_pretrain.json").write_text(json.dumps(info, indent=2) + "\n")
    path = out / "README.md"
    path.write_text(render_card(info))
    return path


LIMITS = """\
- Chess: it learns to copy a legal move from the list and the few-piece and back-rank mate-in-1 patterns
  it was trained on (generator level 1); on mates in middlegame positions (level 2) it is near the
  rate of a random legal move. It never saw mate-in-2 puzzles.
- Math: direct answers are mostly right only for single-digit problems; two-digit numbers and
  multiplication are beyond it. It writes expressions (`<expr>`, `python: print(...)`) by copying the
  numbers of the problem, so a calculator step solves what it cannot compute; fraction expressions
  print floats, which the verifier rejects unless they are exact.
- Search: it copies names from the question into a query and from a passage into an answer; reading a
  chain of passages (multi-hop) is mostly beyond it.
- It is a test fixture for the WHALE machinery on a CPU, not a useful assistant: outside the
  formats above it produces fluent-looking nonsense."""


def harness_gaps(cal: dict[str, dict[str, Any]]) -> list[str]:
    """One line per non-h0 harness: its mean@k minus its domain's h0, in points and standard errors."""
    lines = []
    for domain, names in EVAL_HARNESSES.items():
        base = cal.get(names[0])
        for name in names[1:]:
            r = cal.get(name)
            if base is None or r is None:
                continue
            gap = r["mean"] - base["mean"]
            se = math.hypot(r["se"], base["se"])
            z = f"{gap / se:+.1f} SE" if se else "no spread"
            lines.append(f"{domain}: `{name}` {100 * gap:+.1f} points vs `{names[0]}` ({z})")
    return lines


def render_card(info: dict[str, Any]) -> str:
    cfg, tr, model = info["config"], info["training"], info["model"]
    tokens = tr["tokens"] or 1
    share = ", ".join(f"{d} {100 * n / tokens:.0f}%" for d, n in tr["tokens_by_domain"].items())
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "---",
        "",
        f"# WHALE CPU default model ({cfg['size']})",
        "",
        f"A {model['parameters'] / 1e6:.2f}M-parameter `{model['architecture']}` trained from scratch by "
        f"`whale pretrain` on text generated from the three WHALE domains (chess mate-in-1 puzzles, math "
        f"problems, fictional-world search questions), in several presentation formats per domain. It loads "
        f"like any Qwen checkpoint (`AutoModelForCausalLM` / `AutoTokenizer`, offline) and answers in ChatML.",
        "",
        "## How it was made",
        "",
        "```",
        info["command"],
        "```",
        "",
        f"- Data seed {cfg['seed']}; the same seed gives the same tokenizer, the same examples and the same "
        f"batch order. Replay exactly this schedule with `--steps {tr['steps']}`.",
        f"- Training: {tr['steps']} optimizer steps"
        + (f" (interrupted; {tr['planned_steps']} planned)" if tr["interrupted"] else "")
        + f" in {tr['seconds'] / 60:.1f} minutes on {info['machine']}, {tr['tokens'] / 1e6:.1f}M tokens "
        f"({share}); final loss {tr['final_loss']}.",
        f"- Optimizer: AdamW, lr {cfg['lr']} with {cfg['warmup_steps']} warm-up steps and cosine decay to "
        f"{cfg['lr'] * cfg['min_lr_ratio']:.0e}, weight decay {cfg['weight_decay']}, ~{cfg['batch_tokens']} "
        f"tokens per step, gradient clip 1.0; prompt tokens weigh {cfg['prompt_loss_weights']} in the loss.",
        f"- Data mix (share of examples): {cfg['mix']}; chess levels {cfg['chess_levels']}; math levels "
        f"{cfg['math_levels']} (all four families); search hops {cfg['search_hops']}. Only content in "
        f"the *train* split of the envs' hash split is used.",
        f"- Model: hidden {model['hidden_size']}, {model['layers']} layers, "
        f"{model['heads']}/{model['kv_heads']} attention/KV heads, MLP {model['intermediate_size']}, tied "
        f"embeddings; tokenizer: byte-level BPE, {model['vocab_size']} tokens, digits split, ChatML.",
        "",
        "Formats (prompt -> reply), per domain:",
        "",
    ]
    for domain, formats in info["formats"].items():
        lines.append(f"- {domain}: " + ", ".join(f"`{f}` {100 * w:.0f}%" for f, w in formats.items()))
    lines += ["", "## Measured accuracy", ""]
    cal = info.get("calibration") or {}
    if cal:
        first = next(iter(cal.values()))
        lines += [
            f"mean@{first['k']} (k samples at temperature 1 per task) ± standard error over tasks, on the first "
            f"tasks of each env's default generated test split (`whale eval --split test --limit N --k "
            f"{first['k']} --seed 0 --trusted`):",
            "",
            "| env | harness | tasks | mean@k % | ± SE | pass@k % | by difficulty % |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, r in cal.items():
            diff = ", ".join(f"{d}: {100 * m:.1f}" for d, m in r["by_difficulty"].items())
            lines.append(
                f"| {r['env']} | {name} | {r['tasks']} | {100 * r['mean']:.1f} | {100 * r['se']:.1f} | "
                f"{100 * r['pass_at_k']:.1f} | {diff} |"
            )
        lines += [
            "",
            "Task sources: " + "; ".join(sorted({f"`{r['tasks_source']}`" for r in cal.values()})) + ".",
        ]
        gaps = harness_gaps(cal)
        if gaps:
            lines += [
                "",
                "Each stronger shipped harness against its domain's h0 (points and standard errors):",
                "",
            ]
            lines += [f"- {line}" for line in gaps]
    else:
        lines.append("Not measured (`--eval-tasks 0`).")
    lines += ["", "## What it can and cannot do", "", LIMITS]
    lines += ["", "## Files", "", "| file | sha256 |", "|---|---|"]
    lines += [f"| {name} | `{digest}` |" for name, digest in info["sha256"].items()]
    return "\n".join(lines) + "\n"


# ============================================================================ the command


def pretrain(config: PretrainConfig, command: str | None = None, console=None) -> dict[str, Any]:
    """Tokenizer, model, supervised pass, save, card (and calibration): the whole ``whale pretrain``."""
    import torch

    from whale_train.tiny import build_model, save, train_tokenizer

    config.validate()
    if config.threads:
        torch.set_num_threads(config.threads)
    out = Path(config.out)
    say = console.print if console is not None else (lambda *_a, **_k: None)
    t0 = time.monotonic()
    tokenizer = train_tokenizer(tokenizer_corpus(config), vocab_size=config.vocab_size)
    say(f"tokenizer: {len(tokenizer)} tokens ({time.monotonic() - t0:.0f} s)")
    model = build_model(tokenizer, config.size, seed=config.seed)
    n_params = sum(p.numel() for p in model.parameters())
    say(f"model: {config.size}, {n_params / 1e6:.2f}M parameters, {torch.get_num_threads()} threads")
    record = train(model, tokenizer, config, console=console)
    save(model, tokenizer, out)
    say(f"saved to {out} after {record.steps} steps ({record.seconds / 60:.1f} min)")
    c = model.config
    info: dict[str, Any] = {
        "command": command or command_line(config),
        "machine": f"a {os.cpu_count()}-core CPU machine ({_threads(torch.get_num_threads())})",
        "config": asdict(config),
        "model": {
            "architecture": type(model).__name__,
            "parameters": n_params,
            "hidden_size": c.hidden_size,
            "layers": c.num_hidden_layers,
            "heads": c.num_attention_heads,
            "kv_heads": c.num_key_value_heads,
            "intermediate_size": c.intermediate_size,
            "vocab_size": c.vocab_size,
        },
        "training": asdict(record),
        "formats": {"chess": CHESS_FORMATS, "math": MATH_FORMATS, "search": SEARCH_FORMATS},
        "calibration": {},
        "sha256": {name: sha256(out / name) for name in HASHED_FILES},
    }
    info["config"]["out"] = out.name
    write_card(out, info)
    if config.eval_tasks and not record.interrupted:

        def keep(name: str, result: dict[str, Any]) -> None:  # the card grows as results come in
            info["calibration"][name] = result
            write_card(out, info)

        info["calibration"] = {}
        info["calibration"] = calibrate(out, config, console=console, on_result=keep)
        write_card(out, info)
    say(f"model card: {out / 'README.md'}")
    return info


def _threads(n: int) -> str:
    return f"{n} torch thread" + ("" if n == 1 else "s")


def _field_help() -> dict[str, str]:
    """Each ``PretrainConfig`` field's line from its docstring (the CLI help)."""
    doc = PretrainConfig.__doc__ or ""
    helps: dict[str, str] = {}
    name = None
    for line in doc.splitlines():
        m = re.match(r"\s{8}(\w+): (.*)", line)
        if m:
            name = m.group(1)
            helps[name] = m.group(2).strip()
        elif name and re.match(r"\s{12}\S", line):
            helps[name] += " " + line.strip()
    return {k: v.replace("``", "") for k, v in helps.items()}


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``whale pretrain``: one option per ``PretrainConfig`` field."""
    p = subparsers.add_parser(
        "pretrain",
        help="train the tiny CPU default model from scratch on generated domain text",
        description="Train a byte-level BPE tokenizer and a tiny Qwen3-architecture model on text generated "
        "from the chess, math and search generators (several presentation formats per domain), save it "
        "with save_pretrained, and write a model card (README.md) with its measured accuracy. "
        "Ctrl-C stops training and saves what is done.",
    )
    helps = _field_help()
    for f in PretrainConfig.__dataclass_fields__.values():
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        kind = {"steps": int}.get(f.name, type(default))
        kwargs: dict[str, Any] = {"default": default, "type": kind, "help": helps.get(f.name, "")}
        if f.name == "out":
            kwargs = {"required": True, "help": helps["out"]}
        elif f.name == "size":
            kwargs["choices"] = ["tiny", "small"]
        elif f.name == "eval_harnesses":
            kwargs["choices"] = ["h0", "all"]
        if "default" in kwargs and kwargs["default"] is not None:
            kwargs["help"] += f" (default: {kwargs['default']})"
        p.add_argument(flag, **kwargs)
    p.set_defaults(func=cmd_pretrain)
    return p


def cmd_pretrain(args: argparse.Namespace) -> int:

    from rich.console import Console

    config = PretrainConfig(**{f: getattr(args, f) for f in PretrainConfig.__dataclass_fields__})
    try:
        config.validate()
    except ValueError as exc:
        from whale_train.cli import CLIError

        raise CLIError(str(exc)) from None
    pretrain(config, command=command_line(config), console=Console())
    return 0


def command_line(config: PretrainConfig) -> str:
    """The ``whale pretrain`` command that reproduces ``config``: the seed, the budget, and every option
    that differs from its default. An absolute ``--out`` is shown by its last part only."""
    import shlex

    out = Path(config.out)
    parts = ["whale", "pretrain", "--out", out.name if out.is_absolute() else config.out]
    parts += ["--seed", str(config.seed)]
    parts += ["--steps", str(config.steps)] if config.steps else ["--minutes", f"{config.minutes:g}"]
    defaults = PretrainConfig()
    for name in PretrainConfig.__dataclass_fields__:
        value = getattr(config, name)
        if name not in ("out", "seed", "steps", "minutes") and value != getattr(defaults, name):
            parts += ["--" + name.replace("_", "-"), f"{value:g}" if isinstance(value, float) else str(value)]
    return shlex.join(parts)
