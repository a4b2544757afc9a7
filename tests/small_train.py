"""A ``whale train`` run just long enough to reach a harness phase, for the tests that check an env
(a user's, reasoning-gym's, a verifiers taskset) works under both operators on one ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.train.test_trainer import ledger
from whale_train.cli import main


def small_train_config(name: str, env: str, *, budget: int = 40, tasks: int = 8, **fields: Any) -> dict:
    """A train config of ``budget`` rollouts: short weight phases, one harness iteration of one candidate
    scored on ``tasks`` tasks (``tasks`` episodes in flight, half as many RSFT tasks per batch and test
    tasks); ``fields`` adds the rest (``env_options``, ``harness``, ``model``)."""
    return {
        "name": name,
        "env": env,
        **fields,
        "budget_rollouts": budget,
        "schedule": {"weight_epochs": 0.05, "harness_iterations": 1},
        "rsft": {"batch_tasks": tasks // 2, "samples": 2},
        "search": {
            "candidates": 1,
            "harness_tasks": tasks,
            "frontier_size": 1,
            "check_tasks": 2,
            "concurrency": tasks,
        },
        "eval": {"k": 1, "limit": tasks // 2},
        "concurrency": tasks,
    }


def run_train(tmp_path: Path, config: dict, *flags: str) -> list[dict]:
    """``whale train`` of ``config`` (written as ``tmp_path/<name>.yaml``) into ``tmp_path/t``, which must
    succeed; its ledger's events."""
    path = tmp_path / f"{config['name']}.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", str(path), "--out", str(tmp_path / "t"), *flags]) == 0
    return ledger(tmp_path / "t")
