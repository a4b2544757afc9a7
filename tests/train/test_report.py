"""``whale report`` on hand-made run folders: accepted candidates found from the search records, the
wall time from state.json, a note when the runs' evaluations differ, and the plots written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from whale_train.report import eval_note, lineage, read_ledger, run_summary, write_report


def make_run(root: Path, name: str, limit: int) -> Path:
    run = root / name
    (run / "archive" / "search" / "iterations").mkdir(parents=True)
    (run / "config.yaml").write_text(
        yaml.safe_dump({"name": name, "method": "whale", "eval": {"limit": limit, "k": 8}})
    )
    events = [
        {"event": "eval", "unit": 0, "rollouts_total": 0, "mean": 0.25, "se": 0.05},
        {"event": "unit", "unit": 0, "rollouts_total": 8, "phase": "weight", "seconds": 2.0},
        {"event": "unit", "unit": 1, "rollouts_total": 16, "phase": "harness", "seconds": 3.0},
        {"event": "eval", "unit": 2, "rollouts_total": 16, "mean": 0.5, "se": 0.05},
        {"event": "stop", "unit": 2, "rollouts_total": 16, "reason": "budget"},
    ]
    (run / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run / "state.json").write_text(json.dumps({"elapsed": 42.0}))
    for cid, parents in (("h0", []), ("i001-c0", ["h0"]), ("i001-c1", ["h0"])):
        (run / "archive" / cid / "evals").mkdir(parents=True)
        (run / "archive" / cid / "meta.json").write_text(
            json.dumps({"id": cid, "parents": parents, "status": "valid"})
        )
        (run / "archive" / cid / "evals" / "0.json").write_text(json.dumps({"mean": 0.5}))
    record = {"seq": 1, "kind": "iteration", "iteration": 1, "accepted": True, "incumbent": "i001-c1"}
    (run / "archive" / "search" / "iterations" / "1.json").write_text(json.dumps(record))
    return run


def test_accepted_candidates_come_from_the_search_records(tmp_path):
    rows = {r["id"]: r for r in lineage(make_run(tmp_path, "a", 4))}
    assert rows["i001-c1"]["accepted"] and not rows["i001-c0"]["accepted"]
    assert rows["h0"]["seed"] and not rows["i001-c0"]["seed"]


def test_wall_time_is_the_runs_and_differing_evaluations_get_a_note(tmp_path):
    a, b = make_run(tmp_path, "a", 4), make_run(tmp_path, "b", 6)
    assert run_summary(a)["seconds"] == 42.0  # state.json's elapsed, not the units' 5 s
    note = eval_note([run_summary(a), run_summary(b)])
    assert "a: 4 tasks" in note and "b: 6 tasks" in note
    assert eval_note([run_summary(a), run_summary(a)]) == ""
    report = write_report([a, b], tmp_path / "out")
    text = report.read_text()
    assert "**Note:** not comparable" in text and "i001-c1 (accepted)" in text
    for png in ("accuracy_vs_rollouts.png", "phase_timeline.png", "lineage_a.png"):
        assert (tmp_path / "out" / "plots" / png).read_bytes()[:4] == b"\x89PNG"


def test_a_cut_ledger_line_is_named(tmp_path):
    run = make_run(tmp_path, "a", 4)
    with open(run / "ledger.jsonl", "a") as fh:
        fh.write('{"event": "un')
    with pytest.raises(ValueError, match=r"ledger.jsonl:6: not a JSON line"):
        read_ledger(run)
