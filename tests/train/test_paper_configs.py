"""configs/paper/: the four conditions of each domain load and validate, differ only in the
method, and build their env exactly as configured over small files placed at the paths they name."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harnesses.loader import load_harness
from tests.envs.test_paper_sources import dapo_rows, lichess_csv, searchr1_rows
from whale_train.trainer import TrainConfig

PAPER = Path(__file__).resolve().parents[2] / "configs" / "paper"
CONDITIONS = ("whale", "adaptive", "harness-only", "weight-only")
HARNESS_DIRS = {"search": "search_qa", "math": "math", "chess": "chess_puzzles"}
MODELS = {"search": "Qwen/Qwen3.5-2B", "math": "Qwen/Qwen3.5-2B", "chess": "Qwen/Qwen3.5-4B"}


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """The paper's files, small, at the relative paths the configs name (run from tmp_path)."""
    import zstandard

    monkeypatch.chdir(tmp_path)
    for sub in ("data/search_r1/nq_hotpotqa_train", "data/math", "data/chess"):
        (tmp_path / sub).mkdir(parents=True)
    rows = [dict(r, id=f"train_{i}") for i, r in enumerate(searchr1_rows() * 10)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "data/search_r1/nq_hotpotqa_train/train.parquet")
    pq.write_table(pa.Table.from_pylist(dapo_rows(1)), tmp_path / "data/math/dapo-math-17k.parquet")
    (tmp_path / "data/chess/lichess_db_puzzle.csv.zst").write_bytes(
        zstandard.ZstdCompressor().compress(lichess_csv().encode())
    )
    # the test sets: AIME 2024 as released (ID 2024-I-n), AIME 2025 without a year column, and the merged
    # seven-benchmark Search-R1 test file
    aime24 = [{"ID": f"2024-I-{i}", "Problem": f"p{i}", "Answer": str(i)} for i in range(1, 4)]
    aime25 = [{"id": i, "problem": f"q{i}", "answer": str(i)} for i in range(1, 3)]
    pq.write_table(pa.Table.from_pylist(aime24), tmp_path / "data/math/aime2024.parquet")
    pq.write_table(pa.Table.from_pylist(aime25), tmp_path / "data/math/aime2025.parquet")
    (tmp_path / "data/search_r1/test").mkdir(parents=True)
    test_rows = [
        dict(r, id=f"test_{j}", data_source=name) for j, r in enumerate(searchr1_rows()[:2]) for name in SEVEN
    ]
    pq.write_table(pa.Table.from_pylist(test_rows), tmp_path / "data/search_r1/test/test.parquet")
    return tmp_path


SEVEN = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")


@pytest.mark.parametrize("domain", sorted(MODELS))
def test_the_in_run_evaluations_score_the_papers_test_sets(domain, data_dir, monkeypatch):
    from whale_train.trainer import eval_task_ids

    if domain == "chess":  # a split secret under which the three-puzzle sample has test tasks (p1, p5)
        monkeypatch.setenv("WHALE_SPLIT_SECRET", "paper-chess-0")
    config = TrainConfig.load(PAPER / domain / "whale.yaml")
    ids = eval_task_ids(config)
    if domain == "math":  # AIME 2024 and 2025, each whole
        assert [len(x) for x in ids] == [3, 2] and ids[1][0].startswith("aime2025-")
        assert {s["split"] for s in config.eval_sets} == {"all"}
    elif domain == "search":  # each of the seven benchmarks its own set, reported apart
        env_sources = [gym.make(config.env, **kw).unwrapped.source for kw in config.eval_sets]
        names = [{s.get(i).meta["data_source"] for i in s.ids()} for s in env_sources]
        assert names == [{n} for n in SEVEN] and [len(x) for x in ids] == [2] * 7
    else:  # chess: the held-out test split of the Lichess pool
        assert config.eval.tasks is None and config.eval_sets[0]["split"] == "test"


@pytest.mark.parametrize("domain", sorted(MODELS))
def test_four_conditions_per_domain(domain):
    base = TrainConfig.load(PAPER / domain / "base.yaml").to_dict()
    for method in CONDITIONS:
        config = TrainConfig.load(PAPER / domain / f"{method}.yaml")  # validates
        assert config.method == method and config.model == MODELS[domain] and config.backend == "vllm"
        assert config.harness == f"{HARNESS_DIRS[domain]}/paper_h0"
        assert load_harness(config.harness).shipped
        assert config.search.candidates == 3 and config.search.harness_tasks == 256 and config.eval.k == 8
        differs = {k for k, v in config.to_dict().items() if base[k] != v}
        assert differs <= {"method", "name"}, differs


@pytest.mark.parametrize("domain", sorted(MODELS))
def test_configured_env_builds_over_the_paper_files(domain, data_dir):
    config = TrainConfig.load(PAPER / domain / "whale.yaml")
    env = gym.make(config.env, split="all", **config.env_kwargs).unwrapped
    obs, info = env.reset(seed=0)
    assert obs and env.task_ids
    if domain == "math":
        assert env.verifier == "dapo" and env.max_tool_calls == 1
        assert "Solve the following" not in info["question"]
    elif domain == "search":
        assert env.judge_mode == "paper" and env.top_k == 1 and env.judge.model == "gpt-5.4-mini"
        assert env.source.get(env.task_ids[0]).payload.retriever == "http://127.0.0.1:8000/retrieve"
    else:
        assert env.retry_budget == {"malformed": 1, "illegal": 1} and env.max_turns == 9
        assert all(env.source.get(i).meta["plies"] <= 9 for i in env.task_ids)
    json.dumps(config.to_dict())  # a run directory records it
