"""``report_to``: the same numbers reach TensorBoard, wandb (offline) and trackio (local), and a bad
tracker name is a config error. The trackers are real; nothing talks to a server."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from whale_train.tracking import Tracker, event_metrics, parse_report_to
from whale_train.trainer import TrainConfig

EVENTS = [
    {"event": "eval", "unit": 0, "rollouts_total": 0, "mean": 0.25, "se": 0.1},
    {
        "event": "unit",
        "unit": 0,
        "rollouts_total": 8,
        "phase": "weight",
        "rollouts": 8,
        "seconds": 1.5,
        "signals": {"train_reward": 0.5, "loss": 0.7, "skipped": False, "note": "x"},
    },
    {"event": "eval", "unit": 1, "rollouts_total": 8, "mean": 0.5, "se": 0.1},
]


def test_parse_report_to():
    assert parse_report_to("none") == [] and parse_report_to(None) == []
    assert parse_report_to("tensorboard,wandb") == ["tensorboard", "wandb"]
    assert parse_report_to(["trackio", "trackio"]) == ["trackio"]
    with pytest.raises(ValueError, match="neptune"):
        parse_report_to("neptune")
    with pytest.raises(ValueError, match="report_to"):
        TrainConfig.from_dict({"report_to": ["tensorboard", "mlflow"]})


def test_event_metrics_keep_numbers_only():
    m = event_metrics(EVENTS[1])
    assert m["weight/train_reward"] == 0.5 and m["rollouts/unit"] == 8
    assert event_metrics({"event": "switch", "rollouts_total": 8}) == {}


def test_tensorboard_events_hold_the_test_curve(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = Tracker("tensorboard", tmp_path, name="t")
    for e in EVENTS:
        tracker.log(event_metrics(e), e["rollouts_total"])
    tracker.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    curve = [(s.step, round(s.value, 3)) for s in acc.Scalars("test/mean_at_k")]
    assert curve == [(0, 0.25), (8, 0.5)]
    assert "weight/train_reward" in acc.Tags()["scalars"] and "weight/skipped" not in acc.Tags()["scalars"]


@pytest.mark.slow
def test_wandb_offline_and_trackio_local(tmp_path):
    """In a subprocess: both libraries keep process-wide state (trackio reads TRACKIO_DIR on import)."""
    script = textwrap.dedent(
        f"""
        import json, sys
        from whale_train.tracking import Tracker, event_metrics
        events = json.loads(sys.argv[1])
        tracker = Tracker(["wandb", "trackio"], {str(tmp_path)!r}, name="run-a", config={{"seed": 0}})
        for e in events:
            tracker.log(event_metrics(e), e["rollouts_total"])
        tracker.close()
        """
    )
    import json

    env = {**os.environ, "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true"}
    env.pop("TRACKIO_DIR", None)
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(EVENTS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    offline = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("*.wandb"))  # `wandb sync` uploads it later
    dbs = list((tmp_path / "trackio").rglob("*.db"))
    assert dbs, list((tmp_path / "trackio").rglob("*"))
    rows = []
    for db in dbs:
        with sqlite3.connect(db) as con:
            tables = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
            if "metrics" in tables:
                for (value,) in con.execute("select metrics from metrics"):
                    rows.append(value if isinstance(value, str) else bytes(value).decode("utf-8", "replace"))
    assert any("test/mean_at_k" in r for r in rows), rows
