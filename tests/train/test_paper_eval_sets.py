"""A run scores the paper's separate test sets in its in-run evaluations: ``eval.tasks`` names
one or more task files (AIME 2024 and 2025 beside a DAPO-style training pool), each scored whole, with
the results per ``data_source`` in the eval event of the ledger, the trackers, the log and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.train.test_trainer import MODEL, ledger, smoke
from whale_train.config_io import ConfigError
from whale_train.report import write_report
from whale_train.tracking import event_metrics
from whale_train.trainer import Run, TrainConfig, eval_task_ids


def aime_files(tmp_path: Path) -> tuple[str, str]:
    """AIME 2024 as Maxwell-Jia/AIME_2024 releases it (ID 2024-I-1, Problem, Answer) and a 2025 file whose
    rows carry no year (id, problem, answer), both small and easy for the tiny model's sums."""
    a24 = [{"ID": f"2024-I-{i}", "Problem": f"What is {i} + {i}?", "Answer": str(2 * i)} for i in range(1, 4)]
    a25 = [{"id": i, "problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(1, 3)]
    p24, p25 = tmp_path / "aime2024.parquet", tmp_path / "aime2025.parquet"
    pq.write_table(pa.Table.from_pylist(a24), p24)
    pq.write_table(pa.Table.from_pylist(a25), p25)
    return f"aime:{p24}", f"aime:{p25}?year=2025"


def test_eval_sets_resolve_to_the_run_split_or_each_file_whole(tmp_path):
    a24, a25 = aime_files(tmp_path)
    own = smoke(MODEL)
    assert own.eval_sets == [{"tasks": own.tasks, "split": "test"}]
    both = smoke(MODEL, eval={"tasks": [a24, a25], "limit": 0})
    assert [s["split"] for s in both.eval_sets] == ["all", "all"]
    assert [s["tasks"] for s in both.eval_sets] == [a24, a25]
    ids = eval_task_ids(both)
    assert [len(x) for x in ids] == [3, 2]  # every task of each file, not the hash test split
    assert ids[1] == ["aime2025-1", "aime2025-2"]  # ?year= names a file without a year column
    one = smoke(MODEL, eval={"tasks": a24, "split": "test", "limit": 0})  # a split can still be asked for
    assert one.eval_sets[0]["split"] == "test"


def test_bad_eval_sets_are_one_line_naming_the_field(tmp_path):
    a24, _ = aime_files(tmp_path)
    with pytest.raises(ConfigError, match=r"eval\.tasks"):
        smoke(MODEL, eval={"tasks": []})
    with pytest.raises(ConfigError, match="unknown split"):
        smoke(MODEL, eval={"split": "dev"})
    # the same file twice: the ids collide, and the check says so before any rollout
    with pytest.raises(ValueError, match=r"in both .*aime2024\.parquet"):
        eval_task_ids(smoke(MODEL, eval={"tasks": [a24, a24 + "?year=2024"]}))
    with pytest.raises(ValueError, match="in both"):  # one spec twice
        eval_task_ids(smoke(MODEL, eval={"tasks": [a24, a24]}))


def test_a_run_scores_each_test_file_and_records_results_per_data_source(tmp_path):
    a24, a25 = aime_files(tmp_path)
    config = smoke(MODEL, method="weight-only", budget_rollouts=16, eval={"tasks": [a24, a25], "limit": 0})
    lines: list[str] = []
    Run(config, tmp_path / "run", log=lines.append).run()
    evals = [e for e in ledger(tmp_path / "run") if e["event"] == "eval"]
    assert len(evals) >= 2 and all(e["tasks"] == 5 for e in evals)
    per_source = evals[-1]["by_data_source"]
    assert set(per_source) == {"aime2024", "aime2025", "average"}
    assert per_source["average"] == pytest.approx((per_source["aime2024"] + per_source["aime2025"]) / 2)
    # the overall mean is over tasks (3 + 2), the average over sources: both recorded
    assert evals[-1]["mean"] == pytest.approx((3 * per_source["aime2024"] + 2 * per_source["aime2025"]) / 5)
    assert any("aime2024" in line and "aime2025" in line for line in lines)
    assert event_metrics(evals[-1])["test/aime2025"] == per_source["aime2025"]
    # the traces hold the test files' tasks, not the training pool's
    traces = next((tmp_path / "run" / "eval").glob("*.traces.jsonl")).read_text().splitlines()
    assert {json.loads(t)["task_id"] for t in traces} == {
        "aime-2024-I-1", "aime-2024-I-2", "aime-2024-I-3", "aime2025-1", "aime2025-2"}  # fmt: skip
    report = write_report([tmp_path / "run"]).read_text()
    assert "| run | aime2024 | aime2025 | average |" in report


def test_a_run_started_before_eval_tasks_existed_still_resumes(tmp_path):
    config = smoke(MODEL, method="weight-only", budget_rollouts=8)
    Run(config, tmp_path, log=lambda *_: None).run()
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    del saved["eval"]["tasks"]  # as a run of the previous release wrote its config
    saved["eval"]["split"] = "test"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    Run(config, tmp_path, resume=True, log=lambda *_: None)  # not "differs from the config given"
    other = TrainConfig.from_dict(
        {**config.to_dict(), "eval": {**config.to_dict()["eval"], "split": "harness"}}
    )
    with pytest.raises(ValueError, match="differs"):
        Run(other, tmp_path, resume=True, log=lambda *_: None)
