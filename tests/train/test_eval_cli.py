"""`whale eval` end to end on each domain, and its clear errors."""

from __future__ import annotations

import json

import pytest

from whale_train.cli import main
from whale_train.rollout import read_jsonl

CASES = [
    ("whale/Chess-v0", "chess_puzzles/h0"),
    ("whale/Math-v0", "math/h0"),
    ("whale/SearchQA-v0", "search_qa/h0"),
]


@pytest.mark.parametrize(("env_id", "harness"), CASES)
def test_eval_runs_end_to_end_and_writes_results_and_traces(env_id, harness, fresh_model_dir, tmp_path):
    out = tmp_path / "eval"
    code = main(
        [
            "eval",
            "--env",
            env_id,
            "--harness",
            harness,
            "--model",
            fresh_model_dir,
            "--limit",
            "6",
            "--k",
            "2",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["env"] == env_id and results["harness"] == harness and results["k"] == 2
    assert results["tasks"] == 6 and results["episodes"] == 12
    assert 0.0 <= results["mean"] <= 1.0 and "by_difficulty" in results and "failures" in results
    trajs = read_jsonl(out / "traces.jsonl")
    assert len(trajs) == 12 and all(t.calls for t in trajs)
    assert all(c.completion_ids for t in trajs for c in t.calls)


def test_eval_errors_are_one_clear_line(fresh_model_dir, tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    assert main(["eval", "--env", "whale/Chess-v0", "--harness", str(bad), "--model", fresh_model_dir]) == 2
    assert "fails validation" in capsys.readouterr().err
    assert (
        main(["eval", "--env", "whale/Nope-v0", "--harness", "chess_puzzles/h0", "--model", fresh_model_dir])
        == 2
    )
    assert "unknown env" in capsys.readouterr().err
    assert (
        main(
            [
                "eval",
                "--env",
                "whale/Chess-v0",
                "--harness",
                "chess_puzzles/h0",
                "--model",
                str(tmp_path / "no"),
            ]
        )
        == 2
    )
    assert "cannot load model" in capsys.readouterr().err


def test_check_command_reports(capsys):
    assert main(["check", "--env", "whale/Math-v0", "--harness", "math/h0", "--n-tasks", "4"]) == 0
    assert "ok" in capsys.readouterr().out
