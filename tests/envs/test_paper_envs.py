"""Envs and h0 at the paper's settings: chess retry budgets, and each domain's paper_h0
driving a real env episode with a scripted model (what the reference's base harness does)."""

from __future__ import annotations

import threading

import chess
import gymnasium as gym
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harnesses.chess_puzzles.paper_h0 import ChessPaperH0, parse_move
from harnesses.math.paper_h0 import MathPaperH0, last_expression_printed
from harnesses.search_qa.paper_h0 import SYSTEM_PROMPT, SearchPaperH0
from whale_envs.chess.env import ChessEnv


def empty_square_move(fen: str) -> str:
    """A well-formed UCI move from an empty square: always illegal."""
    board = chess.Board(fen)
    empty = [s for s in chess.SQUARES if board.piece_at(s) is None]
    return chess.square_name(empty[0]) + chess.square_name(empty[1])


def test_chess_retry_budgets_end_the_episode():
    env = ChessEnv("lichess", format_retries=1, illegal_retries=1)
    _, info = env.reset(seed=0)
    assert (info["format_retries_left"], info["illegal_retries_left"]) == (1, 1)
    _, reward, done, _, info = env.step("hello")
    assert not done and info["error_kind"] == "malformed" and info["format_retries_left"] == 0
    _, reward, done, _, info = env.step(empty_square_move(info["fen"]))
    assert not done and info["error_kind"] == "illegal" and info["illegal_retries_left"] == 0
    obs, reward, done, _, info = env.step("still not a move")
    assert done and reward == 0.0 and not info["solved"] and "No format retries left (1)" in obs
    env.reset(seed=0)
    env.step(empty_square_move(env.board.fen()))
    obs, reward, done, _, _ = env.step(empty_square_move(env.board.fen()))
    assert done and reward == 0.0 and "No illegal-move retries left" in obs


def test_chess_without_budgets_only_the_turn_limit_counts():
    env = ChessEnv("lichess", max_turns=9)
    _, info = env.reset(seed=0)
    assert info["format_retries_left"] is None
    for turn in range(1, 9):
        _, _, done, truncated, _ = env.step("hello")
        assert not done and not truncated, turn
    _, _, done, truncated, _ = env.step("hello")
    assert truncated and not done
    with pytest.raises(ValueError, match="format_retries must be a non-negative integer"):
        ChessEnv("lichess", format_retries=-1)


class ScriptedLLM:
    """Answers from a script (a function of the prompt); records the prompts."""

    def __init__(self, reply, chat=True):
        self.reply, self.has_chat_template, self.prompts = reply, chat, []

    def complete(self, prompt, **params):
        self.prompts.append(prompt)
        return self.reply(prompt)


def test_chess_paper_h0_parses_as_the_reference():
    assert parse_move("I play <move>e2e4</move>") == "e2e4"
    assert parse_move("[G1F3] is best") == "g1f3"
    assert parse_move("maybe e2e4") == "e2e4"
    assert parse_move("<move>e2e4</move> or <move>d2d4</move>") is None  # ambiguous
    assert parse_move("e2e4, then e2e4 again") == "e2e4"
    assert parse_move("no idea") is None


def test_chess_paper_h0_solves_and_fails_under_the_budgets():
    env = ChessEnv("lichess", format_retries=1, illegal_retries=1, max_turns=9)
    env.reset(seed=0)
    line = list(env.puzzle.line)
    solver_moves = iter(line[0::2])
    llm = ScriptedLLM(lambda prompt: f"<move>{next(solver_moves)}</move>")
    task = env.task.id
    env.reset(options={"task_id": task})
    ChessPaperH0().run(_Reset(env, task), llm)
    assert env.solved and len(llm.prompts) == len(line[0::2])
    system, user = llm.prompts[0]
    assert system["role"] == "system" and "Solve the current chess puzzle position." in user["content"]
    garbage = ScriptedLLM(lambda prompt: "I resign")
    ChessPaperH0().run(_Reset(env, task), garbage)
    assert env.done and not env.solved and len(garbage.prompts) == 2  # one format retry, then failed


class _Reset:
    """The env handle of one episode: reset() starts the given task (the engine picks it in a rollout)."""

    def __init__(self, env, task_id):
        self.env, self.task_id = env, task_id

    def reset(self):
        return self.env.reset(options={"task_id": self.task_id})

    def step(self, action):
        return self.env.step(action)


def test_search_paper_h0_two_turns_top1_passage(tmp_path, monkeypatch):
    from whale_envs.search.server import BM25Backend, RetrievalServer
    from whale_envs.search.sources import load_corpus

    monkeypatch.setenv("WHALE_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "wiki.jsonl").write_text(
        '{"id": "0", "contents": "\\"Seine\\"\\nThe Seine flows through Paris."}\n'
        '{"id": "1", "contents": "\\"Spree\\"\\nThe Spree flows through Berlin."}\n'
    )
    rows = [
        {
            "id": "t0",
            "question": "which river flows through paris",
            "golden_answers": ["Seine"],
            "data_source": "nq",
        }
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "q.parquet")
    server = RetrievalServer(BM25Backend(load_corpus(tmp_path / "wiki.jsonl")), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = gym.make(
            "whale/SearchQA-v0", tasks=f"searchr1:{tmp_path / 'q.parquet'}", split="all", retriever=server.url,
            top_k=1, passage_chars=800, max_searches=1,
        ).unwrapped  # fmt: skip
        replies = iter(["<search>river through Paris</search>", "<answer>Seine</answer>"])
        llm = ScriptedLLM(lambda prompt: next(replies))
        SearchPaperH0().run(_Reset(env, "nq-t0"), llm)
        assert env.solved and len(llm.prompts) == 2
        assert llm.prompts[0][0] == {"role": "system", "content": SYSTEM_PROMPT}
        second = llm.prompts[1][1]["content"]
        assert (
            "<information>Seine\nThe Seine flows through Paris.</information>" in second
            and "Spree" not in second
        )
        direct = ScriptedLLM(lambda prompt: "<answer>Seine</answer>", chat=False)
        SearchPaperH0().run(_Reset(env, "nq-t0"), direct)  # answers at once: one turn
        assert env.solved and len(direct.prompts) == 1 and direct.prompts[0].startswith(SYSTEM_PROMPT)
    finally:
        server.close()


def test_math_paper_h0_tool_then_strict_box(tmp_path):
    rows = [{"data_source": "math_dapo", "prompt": [{"role": "user", "content": "What is 17*3?"}],
             "reward_model": {"ground_truth": "51"}, "extra_info": {"index": "q"}}]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    env = gym.make(
        "whale/Math-v0",
        tasks=f"dapo:{tmp_path / 'd.parquet'}",
        split="all",
        verifier="dapo",
        max_tool_calls=1,
    ).unwrapped
    replies = iter(["Let me compute.\n```python\n17*3\n```", "So the answer is \\boxed{51}"])
    llm = ScriptedLLM(lambda prompt: next(replies))
    MathPaperH0().run(_Reset(env, "q"), llm)
    assert env.verdict.solved and env.tool_calls == 1
    assert "Code output:\n51" in llm.prompts[1][0]["content"]
    assert last_expression_printed("x = 2\nx * 3\n") == "x = 2\nprint(x * 3)"
    no_box = ScriptedLLM(lambda prompt: "The answer is 51.")  # no code: one turn, scored as it is
    MathPaperH0().run(_Reset(env, "q"), no_box)
    assert env.done and not env.verdict.solved and len(no_box.prompts) == 1
